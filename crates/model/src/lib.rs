//! tally-model: Qwen3 in Burn, generic over the backend, shaped for scoring.
//!
//! - [`config`]: `config.json` (transformers 4.x and 5.x layouts).
//! - [`weights`]: safetensors checkpoints, single or sharded, f32/bf16/f16.
//! - [`qwen3`]: the model: prefill a shared query once, then score many items in one pass.
//! - [`attention`]: multi-item attention (prefix + per-item causal) in plain Burn ops.
//! - [`presets`] / [`random`]: Qwen3 shapes and seeded random checkpoints for benchmarks.

pub mod attention;
pub mod config;
pub mod presets;
pub mod random;
pub mod qwen3;
pub mod weights;

pub use config::Qwen3Config;
pub use qwen3::{ItemGroup, LoadError, PrefixCache, Qwen3, PREFILL_CHUNK};
