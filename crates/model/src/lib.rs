//! tally-model: Qwen3, Llama and Qwen2 decoders in Burn, generic over the backend, shaped for
//! scoring.
//!
//! - [`source`]: finds a model on disk (Hugging Face directory or GGUF file) and its tokenizer,
//!   or takes its files as bytes (the browser).
//! - [`config`]: the architecture, from `config.json` (transformers 4.x and 5.x) or GGUF metadata.
//! - [`weights`] / [`gguf`]: tensors from safetensors (single or sharded, f32/bf16/f16) or GGUF
//!   (F32 to Q6_K, dequantised at load), each named by [`tensor_names`]' one table.
//! - [`decoder`]: the model: prefill a shared query once ([`query_kv`]), then score many items
//!   in one pass.
//! - [`layout`]: how the items of a pass are packed (CSR offsets, query groups).
//! - Leaf types the model and the backends share: [`kv`] (a prefix's K/V), [`labels`] (the
//!   labels of a pass), [`route`] (which implementation runs each hot path, [`Routes`]) and
//!   [`matmul`] (who multiplies, [`Matmul`]).
//! - [`backend`]: the seam, [`ScoringBackend`]: the hot paths as backend operations, plain Burn
//!   by default (the CPU), tally-shaders' kernels on CubeCL backends (feature `cubecl`):
//!   - [`attention`]: multi-item attention (query + per-item causal) in plain Burn ops, the cascade;
//!   - [`lm_head`]: label logits and the streamed full-vocabulary log-sum-exp, plain Burn;
//!   - [`elementwise`]: residual add + RMSNorm, q/k norm + RoPE and SwiGLU's product, plain Burn.
//! - [`presets`] / [`random`]: released shapes and seeded random checkpoints for benchmarks.

pub mod attention;
pub mod backend;
pub mod blocks;
pub mod config;
pub mod decoder;
pub mod elementwise;
pub mod file_data;
pub mod gguf;
pub mod kv;
pub mod labels;
pub mod layout;
pub mod lm_head;
pub mod matmul;
pub mod presets;
pub mod query_kv;
pub mod random;
mod rope;
pub mod route;
pub mod source;
pub mod tensor_names;
pub mod weight;
pub mod weights;

pub use backend::{DeviceRead, DeviceReadError, PlannedAttention, ScoringBackend};
#[cfg(feature = "cubecl")]
pub use tally_shaders::{set_matmul_route, set_wide_products_in_float32, MatmulRoute};
/// The cuBLASLt route's availability check and per-shape profile.
#[cfg(feature = "cublas")]
pub use tally_shaders::cublas;
/// CUDA's free memory and profiler switch, for code that only knows it has a device.
#[cfg(feature = "cublas")]
pub use tally_shaders::cuda;
pub use config::{Family, ModelConfig};
pub use decoder::DecoderModel;
pub use weight::WeightStorage;
pub use weights::WeightForm;
pub use kv::PrefixKv;
pub use matmul::Matmul;
pub use route::{AttentionRoute, ElementwiseRoute, FragmentLoads, KvStaging, LabelRoute, PrefixSplits, Routes, TilePacking, TileShape};
pub use layout::ItemLayout;
pub use labels::LabelTable;
pub use query_kv::{ItemGroup, QueryBatch, QueryKv, PREFILL_CHUNK};
pub use file_data::{FileData, RangedBytes};
pub use source::{LoadError, ModelFiles, OpenedModel, TokenizerSource};
