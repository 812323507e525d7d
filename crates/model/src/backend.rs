//! The two hot paths of scoring, as backend operations: plain Burn ops on the CPU (the
//! reference), CubeCL kernels on CubeCL backends (feature `cubecl`, see [`crate::cube`]).

use burn::tensor::{backend::Backend, DType, Tensor};

use crate::attention::{self, PaddedPlan};
use crate::elementwise;
use crate::route::AttentionRoute;
use crate::layout::ItemLayout;
use crate::lm_head::{self, LabelTable};
use crate::query_kv::LayerPrefixes;

/// A Burn backend tally can score on.
pub trait ScoringBackend: Backend {
    /// What the backend's multi-item attention prepares once per pass and reuses in every
    /// layer (the kernel's tile tables, on the device).
    type AttentionPlan;

    /// Plans multi-item attention for the items of `layout` on `route`'s kernel (never
    /// [`AttentionRoute::Cascade`], which is plain Burn ops). `prefix_spans[g]`: (first token,
    /// length) of group `g`'s prefix in the joined prefix K/V ([`LayerPrefixes::joined`]);
    /// `group`: query heads per KV head.
    fn plan_attention(route: AttentionRoute, layout: &ItemLayout, prefix_spans: &[(usize, usize)], group: usize, device: &Self::Device) -> Self::AttentionPlan;

    /// Multi-item attention over packed items as planned: see [`attention::multi_item_attention`].
    fn multi_item_attention(
        queries: Tensor<Self, 3>,
        keys: Tensor<Self, 3>,
        values: Tensor<Self, 3>,
        prefixes: &LayerPrefixes<'_, Self>,
        plan: &Self::AttentionPlan,
    ) -> Tensor<Self, 3>;

    /// `lhs · rhs` (batched over leading dimensions): every matmul of the model, the linears,
    /// the LM head and the cascade's, goes through here, so one place picks who multiplies:
    /// CubeCL backends replace Burn's matmul with cuBLASLt (`--matmul cublas`, CUDA) and where
    /// it would round float32 to tf32.
    fn matmul<const D: usize>(lhs: Tensor<Self, D>, rhs: Tensor<Self, D>) -> Tensor<Self, D> {
        lhs.matmul(rhs)
    }

    /// Whether [`Self::matmul`] of `dtype` operands on `device` is another route than the
    /// backend's own matmul (which fusion could fuse into its neighbours).
    fn replaces_matmul(_dtype: DType, _device: &Self::Device) -> bool {
        false
    }

    /// Bytes free on `device` for the passes to come, where the backend can tell (CUDA); the
    /// engine sizes its passes from it.
    fn free_memory(_device: &Self::Device) -> Option<u64> {
        None
    }

    /// `(x + delta, rms_norm(x + delta) · gain)` over the last dimension, `(x, rms_norm(x) ·
    /// gain)` without `delta`: see [`elementwise::add_rms_norm`].
    fn add_rms_norm<const D: usize>(x: Tensor<Self, D>, delta: Option<Tensor<Self, D>>, gain: &Tensor<Self, 1>, eps: f64) -> (Tensor<Self, D>, Tensor<Self, D>) {
        elementwise::add_rms_norm(x, delta, gain, eps)
    }

    /// `rope(rms_norm(x) · gain)`, or `rope(x)` without `gain`: see [`elementwise::norm_rope`].
    fn norm_rope(x: Tensor<Self, 3>, gain: Option<&Tensor<Self, 1>>, cos: &Tensor<Self, 3>, sin: &Tensor<Self, 3>, eps: f64) -> Tensor<Self, 3> {
        elementwise::norm_rope(x, gain, cos, sin, eps)
    }

    /// `silu(gate) · up` of the fused gate/up projection: see [`elementwise::silu_mul`].
    fn silu_mul(gate_up: Tensor<Self, 2>) -> Tensor<Self, 2> {
        elementwise::silu_mul(gate_up)
    }

    /// Full-vocabulary log-probabilities of each row's labels: see [`lm_head::label_logprobs`].
    fn label_logprobs(hidden: Tensor<Self, 2>, head: Tensor<Self, 2>, labels: &LabelTable) -> Tensor<Self, 2> {
        lm_head::label_logprobs(hidden, head, labels)
    }
}

#[cfg(feature = "ndarray")]
impl ScoringBackend for burn::backend::NdArray<f32> {
    type AttentionPlan = PaddedPlan<Self>;

    fn plan_attention(_route: AttentionRoute, layout: &ItemLayout, _prefix_spans: &[(usize, usize)], group: usize, device: &Self::Device) -> PaddedPlan<Self> {
        PaddedPlan::new(layout, group, device)
    }

    fn multi_item_attention(queries: Tensor<Self, 3>, keys: Tensor<Self, 3>, values: Tensor<Self, 3>, prefixes: &LayerPrefixes<'_, Self>, plan: &PaddedPlan<Self>) -> Tensor<Self, 3> {
        attention::multi_item_attention(queries, keys, values, &prefixes.per_group(), plan)
    }
}

/// Multi-item attention of one pass, planned once for all layers: the backend's route, or the
/// cascade in plain Burn ops.
pub(crate) enum AttentionPlan<B: ScoringBackend> {
    Backend(B::AttentionPlan),
    Cascade(PaddedPlan<B>),
}

impl<B: ScoringBackend> AttentionPlan<B> {
    pub(crate) fn new(route: AttentionRoute, layout: &ItemLayout, prefix_spans: &[(usize, usize)], group: usize, device: &B::Device) -> Self {
        match route {
            AttentionRoute::Kernel | AttentionRoute::Tiled(_) => AttentionPlan::Backend(B::plan_attention(route, layout, prefix_spans, group, device)),
            AttentionRoute::Cascade => AttentionPlan::Cascade(PaddedPlan::new(layout, group, device)),
        }
    }

    pub(crate) fn run(&self, queries: Tensor<B, 3>, keys: Tensor<B, 3>, values: Tensor<B, 3>, prefixes: &LayerPrefixes<'_, B>) -> Tensor<B, 3> {
        match self {
            AttentionPlan::Backend(plan) => B::multi_item_attention(queries, keys, values, prefixes, plan),
            AttentionPlan::Cascade(plan) => attention::multi_item_attention(queries, keys, values, &prefixes.per_group(), plan),
        }
    }
}
