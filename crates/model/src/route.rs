//! Which implementation runs each hot path of the model when several can ([`Routes`]): leaf
//! types the decoder, the backend trait, the server and the browser share. A backend turns the
//! routes asked for into the routes it runs ([`crate::ScoringBackend::routes`]), once, and the
//! decoder follows them.

pub use tally_core::{FragmentLoads, KvStaging, PrefixSplits, TilePacking, TileShape};

/// How multi-item attention runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionRoute {
    /// The backend's row kernel: on CubeCL backends tally's multi-item kernel with one query row
    /// per unit (tiles of other items never computed).
    #[default]
    Kernel,
    /// The backend's tiled kernel: on CubeCL backends tiles of query rows × keys of this shape
    /// multiplied as matrices, on tensor cores on CUDA in bf16/f16, in registers elsewhere.
    Tiled(TileShape),
    /// The flash kernel: the tiled kernel's tiles with the scores, softmax and weights in
    /// registers (FlashAttention-2's loop); tensor cores on CUDA in bf16/f16.
    Flash(TileShape),
    /// The cascade in plain Burn ops: the prefix part as one batched matmul per KV head (tensor
    /// cores where the backend's matmul uses them), each item's own part padded and causal, the
    /// two merged by their log-sum-exps. Runs on every backend.
    Cascade,
}

impl AttentionRoute {
    /// Whether a pass's attention scores go through device memory as matrices: the cascade's
    /// batched matmuls over the prefix. There a pass's score cells take memory (they bound a
    /// pass) and the prefix length is a matmul dimension (it is a shape class the GPU's matmul
    /// autotuning meets). The kernels keep a tile of scores at a time, on chip.
    pub fn scores_in_memory(self) -> bool {
        match self {
            AttentionRoute::Cascade => true,
            AttentionRoute::Kernel | AttentionRoute::Tiled(_) | AttentionRoute::Flash(_) => false,
        }
    }
}

/// How the layers' elementwise steps (residual add + RMSNorm, the q/k norm with RoPE,
/// `silu(gate) · up`) run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ElementwiseRoute {
    /// Burn's ops, which Burn's fusion layer fuses on `--backend wgpu|cuda`.
    #[default]
    Burn,
    /// The backend's fused kernels (tally-shaders on CubeCL backends): one launch per residual
    /// add + norm, per q/k rotation and per SwiGLU, each row read once.
    Kernels,
}

/// How the full-vocabulary label log-probabilities (the LM head's log-sum-exp) run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LabelRoute {
    /// The backend's kernel (tally-shaders on CubeCL backends): the log-sum-exp streamed over
    /// vocabulary chunks with the labels' gather fused in.
    #[default]
    Kernel,
    /// Burn's ops, chunk by chunk (the `lm_head` module's `label_logprobs`).
    Burn,
}

/// The route of every hot path. The default asks for the backend's kernels (attention's row
/// kernel, Burn's elementwise ops, the streamed label kernel); [`Routes::PLAIN`] for plain Burn
/// ops everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Routes {
    pub attention: AttentionRoute,
    pub elementwise: ElementwiseRoute,
    pub labels: LabelRoute,
}

impl Routes {
    /// Plain Burn ops on every hot path: what a backend without kernels runs (the CPU), the
    /// reference, and the browser's fallback where its WebGPU computes a kernel wrong.
    pub const PLAIN: Routes = Routes { attention: AttentionRoute::Cascade, elementwise: ElementwiseRoute::Burn, labels: LabelRoute::Burn };
}

/// `kernel`, `tiled 64x16`, `flash 64x16` or `cascade`, as the CLI names them.
impl std::fmt::Display for AttentionRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttentionRoute::Kernel => f.write_str("kernel"),
            AttentionRoute::Tiled(shape) => write!(f, "tiled {shape}"),
            AttentionRoute::Flash(shape) => write!(f, "flash {shape}"),
            AttentionRoute::Cascade => f.write_str("cascade"),
        }
    }
}

impl std::fmt::Display for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let elementwise = match self.elementwise {
            ElementwiseRoute::Burn => "burn",
            ElementwiseRoute::Kernels => "kernels",
        };
        let labels = match self.labels {
            LabelRoute::Kernel => "kernel",
            LabelRoute::Burn => "burn",
        };
        write!(f, "attention {}, elementwise {elementwise}, labels {labels}", self.attention)
    }
}
