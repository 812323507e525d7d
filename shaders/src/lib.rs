//! tally-shaders: the CubeCL kernels of tally's hot paths, for every CubeCL backend (CUDA, wgpu,
//! WebGPU). They work on `burn-cubecl` tensors; `tally-model` wires them in behind its
//! `ScoringBackend` trait, and its plain Burn path is the reference they are tested against.
//!
//! - [`attention`]: multi-item attention over packed items (CSR offsets): each item token sees
//!   its prefix and its own item causally; other items' tiles are never loaded.
//! - [`label_logprobs`]: the label log-probabilities with a log-sum-exp streamed over
//!   vocabulary chunks, label gather fused in.
//! - [`f32_matmul`]: a float32 matmul that stays float32 on devices whose tensor cores would
//!   round it to tf32.

pub mod attention;
pub mod f32_matmul;
mod grid;
pub mod label_logprobs;

pub use attention::{AttentionTiles, MultiItemAttention};
pub use f32_matmul::{f32_matmul, matmul_rounds_to_tf32};
pub use label_logprobs::StreamedLabelLogprobs;
