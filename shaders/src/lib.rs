//! tally-shaders: the CubeCL kernels of tally's hot paths, for every CubeCL backend (CUDA, wgpu,
//! WebGPU). They work on `burn-cubecl` tensors; `tally-model` wires them in behind its
//! `ScoringBackend` trait, and its plain Burn path is the reference they are tested against.
//!
//! - [`attention`]: multi-item attention over packed items (CSR offsets): each item token sees
//!   its prefix and its own item causally; other items' tiles are never loaded.
//! - [`label_logprobs`]: the label log-probabilities with a log-sum-exp streamed over
//!   vocabulary chunks, label gather fused in.
//! - [`rms_norm`]: residual add + RMSNorm in one pass over each row; [`rope`]: the q/k norm
//!   and RoPE in one; [`swiglu`]: `silu(gate) · up` straight from the fused gate/up projection;
//!   [`softmax`]: the cascade's row softmax with its log-sum-exp (`cube_reduce` is their
//!   shared tree reduction).
//! - [`stored_matrix`]: weights kept compact on the device (quantised groups, 16-bit floats in
//!   32-bit words) and the kernel that expands rows of them to float.
//! - [`block_matmul`]: a matmul with no shared memory or barriers (software adapters' fastest).
//! - [`f32_matmul`]: a float32 matmul that stays float32 on devices whose tensor cores would
//!   round it to tf32.
//! - [`autotune`]: the shapes a warm-up meets so CubeCL has compiled and tuned for each class.
//! - [`matmul_route`]: which kernel or library multiplies; [`cublas`] (feature `cublas`): the
//!   cuBLASLt route; [`cuda`]: CUDA's runtime type and free memory for generic code.
//! - [`matmul_choice`]: on the block route, the kernel each shape class uses;
//!   [`matmul_tuning`]: choosing it by timing candidates checked against a float64 product.

pub mod attention;
pub mod autotune;
pub mod block_matmul;
#[cfg(any(feature = "cublas", test))]
mod blas_layout;
mod cube_reduce;
#[cfg(feature = "cublas")]
pub mod cublas;
#[cfg(feature = "cublas")]
pub mod cuda;
pub mod f32_matmul;
mod grid;
pub mod label_logprobs;
pub mod matmul_choice;
pub mod matmul_route;
pub mod matmul_tuning;
pub mod rms_norm;
pub mod rope;
pub mod softmax;
pub mod stored_matrix;
pub mod swiglu;
mod vectors;

pub use block_matmul::{block_matmul, RegisterBlock};
pub use attention::{fragment_loads, tensor_core_tiles, tile_fits, AttentionKernel, AttentionTiles, FragmentLoads, KvStaging, MultiItemAttention, PrefixSplits, TilePacking, TileShape, RESCALE_SLACK};
pub use f32_matmul::{f32_matmul, matmul_rounds_to_tf32};
pub use label_logprobs::StreamedLabelLogprobs;
pub use matmul_choice::{chosen_matmul, force_matmul, matmul_choices, set_matmul_choice, unchosen_matmul_shapes, MatmulKernel, MatmulShape};
pub use matmul_route::{cublas_matmul, routes_to_block, routes_to_cublas, set_matmul_route, set_wide_products_in_float32, wide_product_dtype, MatmulRoute};
pub use rms_norm::add_rms_norm;
pub use rope::norm_rope;
pub use softmax::softmax_lse;
pub use stored_matrix::{RowPick, Scales, StoredFormat, StoredRows, WordWriter};
pub use swiglu::silu_mul;

/// Bytes free on `device` now, where the runtime can tell: CUDA, in a build with feature
/// `cublas` (cudarc); `None` elsewhere.
pub fn free_device_memory<R: burn_cubecl::CubeRuntime>(device: &R::Device) -> Option<u64> {
    #[cfg(feature = "cublas")]
    return cuda::free_memory::<R>(device);
    #[cfg(not(feature = "cublas"))]
    {
        let _ = device;
        None
    }
}
