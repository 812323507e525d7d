//! The seam between the model and the backends: [`ScoringBackend`], what a Burn backend offers
//! scoring beyond Burn's ops. Every method but the block weights' has a plain-Burn default (the
//! reference), so a backend without kernels implements only how it holds weight matrices
//! ([`cpu`], burn-ndarray: panels dequantised on the host); CubeCL backends put tally-shaders'
//! kernels behind it (`cube`, feature `cubecl`; `stored`: weights packed on the device). A new kernel or library (a
//! tensor-core attention, cuBLAS) is one more route a backend's impl answers, not a branch in
//! the decoder.

#[cfg(feature = "cubecl")]
mod cube;
#[cfg(feature = "ndarray")]
mod cpu;
#[cfg(feature = "cubecl")]
pub mod stored;

use std::future::Future;
use std::ops::Range;
use std::pin::Pin;

use burn::tensor::{backend::Backend, DType, Tensor, TensorData};

use crate::attention::{self, PaddedPlan};
use crate::blocks::BlockMatrix;
use crate::elementwise;
use crate::kv::PrefixKv;
use crate::labels::LabelTable;
use crate::layout::ItemLayout;
use crate::lm_head;
use crate::matmul::Matmul;
use crate::route::Routes;
use crate::weight::TokenTable;

/// A tensor on its way to the host ([`ScoringBackend::start_read`]).
pub type DeviceRead = Pin<Box<dyn Future<Output = Result<TensorData, DeviceReadError>>>>;

/// The device could not hand a tensor back.
#[derive(Debug, thiserror::Error)]
#[error("cannot read results back from the device: {0}")]
pub struct DeviceReadError(pub String);

/// A weight matrix kept in its file's format, as a backend holds it ([`ScoringBackend::BlockWeight`]).
pub trait BlockWeight: Clone + Send + Sync + 'static {
    fn rows(&self) -> usize;
    /// Bytes as held (the file's format, or the kernels' packing of it).
    fn stored_bytes(&self) -> usize;
}

/// A Burn backend tally can score on.
pub trait ScoringBackend: Matmul {
    /// Weight matrices as this backend multiplies them from their file's blocks.
    type BlockWeight: BlockWeight;

    /// `matrix` as this backend multiplies it, or `None` where it cannot (a format its kernels
    /// lack): the loader then dequantises the tensor to float.
    fn block_weight(matrix: BlockMatrix, device: &Self::Device) -> Option<Self::BlockWeight>;

    /// `x · w[rows]ᵀ`: `[m, in]` → `[m, rows.len()]`.
    fn block_matmul(x: Tensor<Self, 2>, w: &Self::BlockWeight, rows: Range<usize>) -> Tensor<Self, 2>;

    /// Rows `ids` of `w` as float, `[ids.len(), in]`.
    fn block_rows(w: &Self::BlockWeight, ids: &[u32], device: &Self::Device) -> Tensor<Self, 2>;

    /// The routes this backend runs when `requested` is asked for: its kernels where it has
    /// them, plain Burn ops where it has none. Asked once, when the routes are set; the decoder
    /// then follows the answer. Default: plain Burn ops everywhere.
    fn routes(_requested: Routes) -> Routes {
        Routes::PLAIN
    }

    /// Multi-item attention of one pass on `routes.attention` (routes [`Self::routes`] gave; the
    /// cascade's softmax follows `routes.elementwise`), planned once and run by every layer.
    /// `prefix_spans[g]`: (first token, length) of group `g`'s prefix in the joined prefix K/V
    /// every layer passes ([`PrefixKv::join`]); `group`: query heads per KV head. Default: the
    /// cascade in plain Burn ops.
    fn plan_attention(_routes: Routes, layout: &ItemLayout, prefix_spans: &[(usize, usize)], group: usize, device: &Self::Device) -> Box<dyn PlannedAttention<Self>> {
        Box::new(PaddedPlan::<Self>::new(layout, prefix_spans, group, device))
    }

    /// Row counts of passes that meet every shape class this backend compiles kernels or tunes
    /// matmuls for, for passes of up to `largest` rows, smallest first: what a warm-up runs
    /// before traffic. Default: none, nothing is compiled or tuned at run time (the CPU).
    fn warmup_rows(_largest: usize) -> Vec<usize> {
        Vec::new()
    }

    /// Bytes free on `device` for the passes to come, where the backend can tell (CUDA); the
    /// engine sizes its passes from it.
    fn free_memory(_device: &Self::Device) -> Option<u64> {
        None
    }

    /// The largest single buffer `device` allocates, where that bounds what a pass may hold
    /// (CubeCL's page limit: wgpu's storage-buffer binding size, 128 MiB on some adapters).
    fn max_buffer_bytes(_device: &Self::Device) -> Option<u64> {
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

    /// The cascade's row softmax with its log-sum-exp (the weights in `weights_dtype`, the
    /// log-sum-exp in float32): see [`attention::softmax_lse`].
    fn softmax_lse(scores: Tensor<Self, 2>, weights_dtype: DType) -> (Tensor<Self, 2>, Tensor<Self, 2>) {
        attention::softmax_lse(scores, weights_dtype)
    }

    /// Full-vocabulary log-probabilities of each row's labels: see [`lm_head::label_logprobs`].
    fn label_logprobs(hidden: Tensor<Self, 2>, head: Tensor<Self, 2>, labels: &LabelTable) -> Tensor<Self, 2> {
        lm_head::label_logprobs(hidden, &TokenTable::Float(head), labels)
    }

    /// `tensor`'s values, copied to the host. Where the backend can, the copy is queued at once,
    /// behind the work that produces `tensor`, so work issued after this call does not delay
    /// it: the engine issues a pass before it waits for the one before (see the engine's
    /// `BatchRun`). Default: Burn's read, which starts when first awaited, behind everything
    /// issued by then (the same values, only no overlap).
    fn start_read<const D: usize>(tensor: Tensor<Self, D>) -> DeviceRead {
        Box::pin(async move { tensor.into_data_async().await.map_err(|error| DeviceReadError(format!("{error:?}"))) })
    }

    /// Whether issuing work returns before the work is done (a device's queue) and
    /// [`Self::start_read`] queues its copy at once: then the host can build and issue the next
    /// pass while the device runs the last. Default false: ops run as they are issued (the CPU),
    /// where issuing the next batch first would only hold back the answers of the last.
    fn overlaps_issue_with_work() -> bool {
        false
    }
}

/// Multi-item attention of one pass, as planned by [`ScoringBackend::plan_attention`].
pub trait PlannedAttention<B: Backend> {
    /// `queries`: `[tokens, q_heads, head_dim]`; `keys`/`values`: `[tokens, kv_heads,
    /// head_dim]`, packed as planned; `prefix`: every group's prefix end to end, at the planned
    /// spans. Returns `[tokens, q_heads, head_dim]`.
    fn run(&self, queries: Tensor<B, 3>, keys: Tensor<B, 3>, values: Tensor<B, 3>, prefix: &PrefixKv<B>) -> Tensor<B, 3>;

    /// What a call at `head_dim` runs, in words, for benchmarks to record (a kernel may fall back
    /// from the route asked for where a device cannot hold its tile).
    fn launched(&self, head_dim: usize) -> String;
}

/// The cascade, on any backend.
impl<B: Matmul> PlannedAttention<B> for PaddedPlan<B> {
    fn run(&self, queries: Tensor<B, 3>, keys: Tensor<B, 3>, values: Tensor<B, 3>, prefix: &PrefixKv<B>) -> Tensor<B, 3> {
        attention::multi_item_attention(queries, keys, values, prefix, self)
    }

    fn launched(&self, _head_dim: usize) -> String {
        let softmax = if self.has_softmax_kernel() { "Burn ops, tally's softmax kernel" } else { "plain Burn ops" };
        let dtype = <B::FloatElem as burn::tensor::Element>::dtype();
        if dtype != DType::F32 && B::wide_dtype(dtype) == DType::F32 {
            format!("cascade ({softmax}, float32 scores)")
        } else {
            format!("cascade ({softmax})")
        }
    }
}
