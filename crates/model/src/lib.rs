//! tally-model: Qwen3, Llama and Qwen2 decoders in Burn, generic over the backend, shaped for
//! scoring.
//!
//! - [`source`]: finds a model on disk (Hugging Face directory or GGUF file) and its tokenizer,
//!   or takes its files as bytes (the browser).
//! - [`config`]: the architecture, from `config.json` (transformers 4.x and 5.x) or GGUF metadata.
//! - [`weights`] / [`gguf`]: tensors from safetensors (single or sharded, f32/bf16/f16) or GGUF
//!   (F32 to Q6_K, dequantised at load).
//! - [`decoder`]: the model: prefill a shared query once ([`query_kv`]), then score many items
//!   in one pass.
//! - [`layout`]: how the items of a pass are packed (CSR offsets, query groups).
//! - [`route`]: which multi-item attention ([`AttentionRoute`]) and which elementwise steps
//!   ([`ElementwiseRoute`]) run.
//! - [`backend`]: the hot paths as backend operations ([`ScoringBackend`]):
//!   - [`attention`]: multi-item attention (query + per-item causal) in plain Burn ops;
//!   - [`lm_head`]: label logits and the streamed full-vocabulary log-sum-exp, plain Burn;
//!   - [`elementwise`]: residual add + RMSNorm, q/k norm + RoPE and SwiGLU's product, plain Burn;
//!   - `cube` (feature `cubecl`): the same two on CubeCL backends, with tally-shaders' kernels.
//! - [`presets`] / [`random`]: released shapes and seeded random checkpoints for benchmarks.

pub mod attention;
pub mod backend;
pub mod config;
#[cfg(feature = "cubecl")]
mod cube;
pub mod decoder;
pub mod elementwise;
pub mod file_data;
pub mod gguf;
pub mod layout;
pub mod lm_head;
pub mod presets;
pub mod query_kv;
pub mod random;
mod rope;
pub mod route;
pub mod source;
pub mod weights;

pub use backend::ScoringBackend;
#[cfg(feature = "cubecl")]
pub use tally_shaders::{set_matmul_route, MatmulRoute};
/// The cuBLASLt route's availability check and per-shape profile.
#[cfg(feature = "cublas")]
pub use tally_shaders::cublas;
pub use config::{Family, ModelConfig};
pub use decoder::{DecoderModel, HotPaths};
pub use route::{AttentionRoute, ElementwiseRoute, TileShape};
pub use layout::ItemLayout;
pub use lm_head::LabelTable;
pub use query_kv::{ItemGroup, LayerPrefixes, QueryBatch, QueryKv, PREFILL_CHUNK};
pub use file_data::{FileData, RangedBytes};
pub use source::{LoadError, ModelFiles, OpenedModel, TokenizerSource};
