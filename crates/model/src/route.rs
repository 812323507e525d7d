//! Which implementation runs a step of the model when several can: leaf types the decoder, the
//! backend trait and the server share.

pub use tally_core::TileShape;

/// How multi-item attention runs when the hot paths are the backend's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionRoute {
    /// The backend's row kernel: on CubeCL backends tally's multi-item kernel with one query row
    /// per unit (tiles of other items never computed); elsewhere the cascade.
    #[default]
    Kernel,
    /// The backend's tiled kernel: on CubeCL backends tiles of query rows × keys of this shape
    /// multiplied as matrices, on tensor cores on CUDA in bf16/f16, in registers elsewhere; on
    /// the CPU the cascade.
    Tiled(TileShape),
    /// The cascade in plain Burn ops: the prefix part as one batched matmul per KV head (tensor
    /// cores where the backend's matmul uses them), each item's own part padded and causal, the
    /// two merged by their log-sum-exps.
    Cascade,
}

/// How the layers' elementwise steps (residual add + RMSNorm, the q/k norm with RoPE,
/// `silu(gate) · up`) run when the hot paths are the backend's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ElementwiseRoute {
    /// Burn's ops, which Burn's fusion layer fuses on `--backend wgpu|cuda`.
    #[default]
    Burn,
    /// The backend's fused kernels (tally-shaders on CubeCL backends; Burn's ops on the CPU):
    /// one launch per residual add + norm, per q/k rotation and per SwiGLU, each row read once.
    Kernels,
}
