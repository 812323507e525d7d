//! Seeded random checkpoints (Qwen3, Llama, Qwen2): written in HF layout (bf16 safetensors, sharded
//! when large, transformers 5.x config.json), so benchmarks run on real shapes without a download,
//! or opened in memory ([`random_model`]: the browser's load-time kernel check, which has no disk).
//!
//! Weights are sharp rather than std 0.02 — unit embeddings, fan-in-scaled projections, norm gains
//! in [0.5, 1.5] — so activations and attention look like a trained model's, not like noise.

use std::borrow::Cow;
use std::path::Path;

use safetensors::{Dtype, View};
use serde_json::json;

use crate::blocks::{BlockBytes, BlockRows};
use crate::config::{ModelConfig, RopeScaling};
use crate::gguf::TensorType;
use crate::file_data::FileData;
use crate::source::{OpenedModel, TokenizerSource};
use crate::weights::{Checkpoint, TensorSource, WeightsError};
use crate::tensor_names::{LayerTensor, TensorName};

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("cannot write safetensors: {0}")]
    Safetensors(#[from] safetensors::SafeTensorError),
    #[error("cannot open the random weights: {0}")]
    Open(#[from] WeightsError),
}

/// SplitMix64: seeded, fast, and good enough for random weights.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f64 {
        (-2.0 * self.uniform().ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()
    }
}

struct Bf16Tensor {
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &Bf16Tensor {
    fn dtype(&self) -> Dtype {
        Dtype::BF16
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn tensor(shape: Vec<usize>, mut value: impl FnMut() -> f64) -> Bf16Tensor {
    let count: usize = shape.iter().product();
    let bytes = (0..count).flat_map(|_| half::bf16::from_f64(value()).to_le_bytes()).collect();
    Bf16Tensor { shape, bytes }
}

/// A model of `config`'s shapes with seeded random bf16 weights, in memory, without a tokenizer.
pub fn random_model(config: &ModelConfig, seed: u64) -> Result<OpenedModel, WriteError> {
    let weights = random_weights(config, seed);
    let bytes = safetensors::serialize(weights.iter().map(|(n, t)| (n.as_str(), t)), None)?;
    let checkpoint = Checkpoint::from_data(vec![("model.safetensors".to_owned(), FileData::Owned(bytes.into()))])?;
    Ok(OpenedModel { config: config.clone(), weights: Box::new(checkpoint), tokenizer: TokenizerSource::None })
}

/// [`random_model`] with its matrices stored in quantised and 16-bit formats, as a GGUF stores
/// them — embeddings (and head) and down in Q8_0, q/k/v in Q4_1, o in Q4_0, gate in BF16, up
/// in F16 — so block kernels have each of their formats to read but the K-quants' float32
/// scales. Read as float, each matrix gives exactly the values its blocks hold.
pub fn random_quantised_model(config: &ModelConfig, seed: u64) -> Result<OpenedModel, WriteError> {
    let model = random_model(config, seed)?;
    Ok(OpenedModel { weights: Box::new(Quantised(model.weights)), ..model })
}

/// Matrices re-stored in [`Quantised::kind`]'s formats (where rows are whole blocks of it).
struct Quantised(Box<dyn TensorSource>);

impl Quantised {
    fn kind(name: TensorName) -> TensorType {
        match name {
            TensorName::Layer { tensor: LayerTensor::QProj | LayerTensor::KProj | LayerTensor::VProj, .. } => TensorType::Q4_1,
            TensorName::Layer { tensor: LayerTensor::OProj, .. } => TensorType::Q4_0,
            TensorName::Layer { tensor: LayerTensor::GateProj, .. } => TensorType::BF16,
            TensorName::Layer { tensor: LayerTensor::UpProj, .. } => TensorType::F16,
            _ => TensorType::Q8_0,
        }
    }

    /// The matrix's bytes in its format; `None` for vectors, or rows that are not whole blocks.
    fn blocks(&self, name: TensorName, expected: &[usize]) -> Result<Option<Vec<u8>>, WeightsError> {
        if expected.len() != 2 {
            return Ok(None);
        }
        let kind = Self::kind(name);
        Ok(kind.byte_len(expected[1]).and_then(|_| kind.quantize(&self.0.read(name, expected).ok()?)))
    }
}

impl TensorSource for Quantised {
    fn read(&self, name: TensorName, expected: &[usize]) -> Result<Vec<f32>, WeightsError> {
        match self.blocks(name, expected)? {
            Some(bytes) => Ok(Self::kind(name).dequantize(&bytes, expected.iter().product()).expect("a type tally reads")),
            None => self.0.read(name, expected),
        }
    }

    fn read_blocks(&self, name: TensorName, expected: [usize; 2]) -> Result<Option<BlockRows>, WeightsError> {
        Ok(self.blocks(name, &expected)?.and_then(|bytes| BlockRows::new(Self::kind(name), BlockBytes::Owned(bytes.into()), expected[0])))
    }
}

/// Every weight of `config` by its HF name, seeded, in name order.
fn random_weights(config: &ModelConfig, seed: u64) -> Vec<(String, Bf16Tensor)> {
    let c = config;
    let mut rng = Rng(seed);
    let (h, d) = (c.hidden_size, c.head_dim);
    let mut weights: Vec<(String, Bf16Tensor)> = Vec::new();
    let mut linear = |name: TensorName, outputs: usize, inputs: usize, gain: f64, rng: &mut Rng| {
        let std = gain / (inputs as f64).sqrt();
        weights.push((name.hf(), tensor(vec![outputs, inputs], || std * rng.normal())));
    };
    let mut plain: Vec<(String, Bf16Tensor)> = Vec::new();
    let mut gains = |name: TensorName, len: usize, lo: f64, hi: f64, rng: &mut Rng| plain.push((name.hf(), tensor(vec![len], || lo + (hi - lo) * rng.uniform())));

    gains(TensorName::FinalNorm, h, 0.5, 1.5, &mut rng);
    for layer in 0..c.num_hidden_layers {
        let weight = |tensor| TensorName::layer(layer, tensor);
        gains(weight(LayerTensor::InputNorm), h, 0.5, 1.5, &mut rng);
        gains(weight(LayerTensor::PostAttentionNorm), h, 0.5, 1.5, &mut rng);
        if c.qk_norm {
            gains(weight(LayerTensor::QNorm), d, 1.0, 2.0, &mut rng);
            gains(weight(LayerTensor::KNorm), d, 1.0, 2.0, &mut rng);
        }
        if c.attention_bias {
            for (proj, width) in [(LayerTensor::QProj, c.num_attention_heads * d), (LayerTensor::KProj, c.num_key_value_heads * d), (LayerTensor::VProj, c.num_key_value_heads * d)] {
                gains(TensorName::layer_bias(layer, proj), width, -0.5, 0.5, &mut rng);
            }
        }
        linear(weight(LayerTensor::QProj), c.num_attention_heads * d, h, 1.0, &mut rng);
        linear(weight(LayerTensor::KProj), c.num_key_value_heads * d, h, 1.0, &mut rng);
        linear(weight(LayerTensor::VProj), c.num_key_value_heads * d, h, 1.0, &mut rng);
        linear(weight(LayerTensor::OProj), h, c.num_attention_heads * d, 1.0 / (c.num_hidden_layers as f64).sqrt(), &mut rng);
        linear(weight(LayerTensor::GateProj), c.intermediate_size, h, 1.0, &mut rng);
        linear(weight(LayerTensor::UpProj), c.intermediate_size, h, 1.0, &mut rng);
        linear(weight(LayerTensor::DownProj), h, c.intermediate_size, 1.0 / (c.num_hidden_layers as f64).sqrt(), &mut rng);
    }
    if !c.tie_word_embeddings {
        linear(TensorName::LmHead, c.vocab_size, h, 3.0, &mut rng);
    }
    // Tied heads scale the embeddings so logits spread about 3 units (the input side is
    // RMS-normalised by the first layer anyway); untied ones keep unit embeddings.
    let embed_std = if c.tie_word_embeddings { 3.0 / (h as f64).sqrt() } else { 1.0 };
    weights.push((TensorName::Embeddings.hf(), tensor(vec![c.vocab_size, h], || embed_std * rng.normal())));
    weights.extend(plain);

    weights.sort_by(|a, b| a.0.cmp(&b.0));
    weights
}

/// Writes `config.json` and bf16 weights into `dir`; shards of at most `max_shard_bytes` with a
/// `model.safetensors.index.json` when the weights do not fit in one.
pub fn write_random_checkpoint(dir: &Path, config: &ModelConfig, seed: u64, max_shard_bytes: usize) -> Result<(), WriteError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| WriteError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let c = config;
    let weights = random_weights(config, seed);

    // Greedy sharding in name order.
    let mut shards: Vec<Vec<&(String, Bf16Tensor)>> = vec![Vec::new()];
    let mut shard_bytes = 0;
    for entry in &weights {
        let bytes = entry.1.bytes.len();
        if shard_bytes + bytes > max_shard_bytes && !shards.last().is_some_and(Vec::is_empty) {
            shards.push(Vec::new());
            shard_bytes = 0;
        }
        shards.last_mut().expect("at least one shard").push(entry);
        shard_bytes += bytes;
    }
    let metadata = Some([("format".to_owned(), "pt".to_owned())].into_iter().collect());
    if shards.len() == 1 {
        let path = dir.join("model.safetensors");
        safetensors::serialize_to_file(shards[0].iter().map(|(n, t)| (n.as_str(), t)), metadata, &path)?;
    } else {
        let mut weight_map = serde_json::Map::new();
        for (i, shard) in shards.iter().enumerate() {
            let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, shards.len());
            safetensors::serialize_to_file(shard.iter().map(|(n, t)| (n.as_str(), t)), metadata.clone(), &dir.join(&file))?;
            weight_map.extend(shard.iter().map(|(name, _)| (name.clone(), json!(file))));
        }
        let total: usize = weights.iter().map(|(_, t)| t.bytes.len()).sum();
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let path = dir.join("model.safetensors.index.json");
        std::fs::write(&path, serde_json::to_string_pretty(&index).expect("JSON") + "\n").map_err(io(&path))?;
    }
    let path = dir.join("config.json");
    std::fs::write(&path, serde_json::to_string_pretty(&hf_config(c)).expect("JSON") + "\n").map_err(io(&path))?;
    Ok(())
}

/// `config.json` in the transformers 5.x layout.
fn hf_config(c: &ModelConfig) -> serde_json::Value {
    let mut rope = json!({"rope_theta": c.rope.theta, "rope_type": "default"});
    match c.rope.scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => rope = json!({"rope_theta": c.rope.theta, "rope_type": "linear", "factor": factor}),
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
            rope = json!({"rope_theta": c.rope.theta, "rope_type": "llama3", "factor": factor, "low_freq_factor": low_freq_factor,
                "high_freq_factor": high_freq_factor, "original_max_position_embeddings": original_max_position_embeddings})
        }
        RopeScaling::Factors(_) => unreachable!("presets describe scaling by its parameters"),
    }
    json!({
        "architectures": [c.family.architecture()],
        "model_type": c.family.model_type(),
        "hidden_act": "silu",
        "attention_bias": c.attention_bias,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_parameters": rope,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings,
        "dtype": "bfloat16",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::TensorSource;

    /// The in-memory model holds what a written checkpoint of the same seed holds.
    #[test]
    fn a_random_model_in_memory_is_the_written_one() {
        let config = crate::presets::preset("tiny").unwrap();
        let dir = std::env::temp_dir().join(format!("tally-random-memory-{}", std::process::id()));
        write_random_checkpoint(&dir, &config, 5, usize::MAX).unwrap();
        let written = Checkpoint::open(&dir).unwrap();
        let in_memory = random_model(&config, 5).unwrap();
        assert_eq!(in_memory.config, config);
        for (name, shape) in [(TensorName::layer(1, LayerTensor::DownProj), vec![64, config.intermediate_size]), (TensorName::FinalNorm, vec![64])] {
            assert_eq!(in_memory.weights.read(name, &shape).unwrap(), written.read(name, &shape).unwrap(), "{name:?}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// The quantised model's matrices are stored blocks whose values are what reading it as
    /// float gives, and close to the bf16 model's.
    #[test]
    fn a_quantised_random_model_stores_what_it_reads() {
        let config = crate::presets::preset("tiny").unwrap();
        let (float, quantised) = (random_model(&config, 5).unwrap(), random_quantised_model(&config, 5).unwrap());
        let q_rows = config.num_attention_heads * config.head_dim;
        for (name, kind) in [(TensorName::layer(0, LayerTensor::QProj), TensorType::Q4_1), (TensorName::layer(1, LayerTensor::OProj), TensorType::Q4_0), (TensorName::layer(0, LayerTensor::GateProj), TensorType::BF16)] {
            let shape = match kind {
                TensorType::Q4_0 => [64, q_rows],
                TensorType::BF16 => [config.intermediate_size, 64],
                _ => [q_rows, 64],
            };
            let blocks = quantised.weights.read_blocks(name, shape).unwrap().expect("stored as blocks");
            assert_eq!(blocks.kind(), kind);
            let matrix = crate::blocks::BlockMatrix::new(shape[1], vec![blocks]).unwrap();
            let read = quantised.weights.read(name, &shape).unwrap();
            assert_eq!(matrix.dequantize_rows(0..shape[0]), read, "{name:?}");
            let original = float.weights.read(name, &shape).unwrap();
            let largest = original.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(read.iter().zip(&original).all(|(a, b)| (a - b).abs() <= largest / 7.0), "{name:?}: within a 4-bit step");
        }
        let gains = TensorName::layer(0, LayerTensor::InputNorm);
        assert_eq!(quantised.weights.read(gains, &[64]).unwrap(), float.weights.read(gains, &[64]).unwrap(), "vectors stay as they are");
    }

    #[test]
    fn every_preset_config_reads_back_as_written() {
        for name in crate::presets::PRESETS {
            let config = crate::presets::preset(name).unwrap();
            let read = ModelConfig::from_json(&hf_config(&config).to_string()).unwrap();
            assert_eq!(read, config, "{name}");
        }
    }

    #[test]
    fn a_written_checkpoint_reads_back_whole_and_sharded() {
        let config = crate::presets::preset("tiny").unwrap();
        for max_shard_bytes in [usize::MAX, 1 << 20] {
            let dir = std::env::temp_dir().join(format!("tally-random-{}-{max_shard_bytes}", std::process::id()));
            write_random_checkpoint(&dir, &config, 7, max_shard_bytes).unwrap();
            let read = ModelConfig::from_json(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
            assert_eq!(read, config);
            let checkpoint = Checkpoint::open(&dir).unwrap();
            let gains = checkpoint.read(TensorName::layer(1, LayerTensor::InputNorm), &[64]).unwrap();
            assert!(gains.iter().all(|g| (0.49..=1.51).contains(g)));
            let embed = checkpoint.read(TensorName::Embeddings, &[151_936, 64]).unwrap();
            let mean_square = embed.iter().map(|v| f64::from(v * v)).sum::<f64>() / embed.len() as f64;
            assert!((mean_square / (9.0 / 64.0) - 1.0).abs() < 0.05, "{mean_square}");
            assert_eq!(dir.join("model.safetensors.index.json").is_file(), max_shard_bytes != usize::MAX);
            std::fs::remove_dir_all(dir).unwrap();
        }
    }
}
