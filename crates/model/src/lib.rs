//! tally-model: Qwen3 in Burn, generic over the backend, shaped for scoring.
//!
//! - [`config`]: `config.json` (transformers 4.x and 5.x layouts).
//! - [`weights`]: safetensors checkpoints, single or sharded, f32/bf16/f16.
//! - [`qwen3`]: the model: prefill a shared query once, then score many items in one pass.
//! - [`layout`]: how the items of a pass are packed (CSR offsets, prefix groups).
//! - [`backend`]: the hot paths as backend operations ([`ScoringBackend`]):
//!   - [`attention`]: multi-item attention (prefix + per-item causal) in plain Burn ops;
//!   - [`lm_head`]: label logits and the streamed full-vocabulary log-sum-exp, plain Burn;
//!   - `cube` (feature `cubecl`): the same two on CubeCL backends, with tally-shaders' kernels.
//! - [`presets`] / [`random`]: Qwen3 shapes and seeded random checkpoints for benchmarks.

pub mod attention;
pub mod backend;
pub mod config;
#[cfg(feature = "cubecl")]
mod cube;
pub mod layout;
pub mod lm_head;
pub mod presets;
pub mod qwen3;
pub mod random;
pub mod weights;

pub use backend::ScoringBackend;
pub use config::Qwen3Config;
pub use layout::ItemLayout;
pub use lm_head::LabelTable;
pub use qwen3::{ItemGroup, LoadError, PrefixCache, Qwen3, PREFILL_CHUNK};
