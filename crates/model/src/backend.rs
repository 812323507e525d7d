//! The two hot paths of scoring, as backend operations: plain Burn ops by default (the CPU
//! path and the reference), CubeCL kernels on CubeCL backends (feature `cubecl`, see
//! [`crate::cube`]).

use burn::tensor::{backend::Backend, Tensor};

use crate::attention::{self, PrefixKv};
use crate::layout::ItemLayout;
use crate::lm_head::{self, LabelTable};

/// A Burn backend tally can score on.
pub trait ScoringBackend: Backend {
    /// Multi-item attention over packed items: see [`attention::multi_item_attention`].
    fn multi_item_attention(
        queries: Tensor<Self, 3>,
        keys: Tensor<Self, 3>,
        values: Tensor<Self, 3>,
        prefixes: &[&PrefixKv<Self>],
        layout: &ItemLayout,
    ) -> Tensor<Self, 3> {
        attention::multi_item_attention(queries, keys, values, prefixes, layout)
    }

    /// Full-vocabulary log-probabilities of each row's labels: see [`lm_head::label_logprobs`].
    fn label_logprobs(hidden: Tensor<Self, 2>, head: Tensor<Self, 2>, labels: &LabelTable) -> Tensor<Self, 2> {
        lm_head::label_logprobs(hidden, head, labels)
    }
}

#[cfg(feature = "ndarray")]
impl ScoringBackend for burn::backend::NdArray<f32> {}
