//! A GGUF file as a tally checkpoint: the architecture from its metadata, its tensors by their
//! GGUF names (dequantised, Llama's q/k rows un-permuted), and its tokenizer vocabulary.

use super::{GgufError, GgufFile, TensorInfo};
use crate::blocks::BlockRows;
use crate::config::{Family, ModelConfig, RopeConfig, RopeScaling};
use crate::tensor_names::{LayerTensor, TensorName};
use crate::weights::{TensorSource, WeightsError};

pub struct GgufCheckpoint {
    file: GgufFile,
    config: ModelConfig,
}

/// The tokenizer as GGUF stores it (`tokenizer.ggml.*`); the engine builds a tokenizer from it.
#[derive(Debug, Clone)]
pub struct GgufVocabulary {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer (`smollm`, `qwen2`, `llama-bpe`, …).
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    /// `"left right"` pairs, highest priority first.
    pub merges: Vec<String>,
    /// Per token: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    pub token_types: Vec<i64>,
    pub bos_token_id: Option<u32>,
    /// Whether a BOS token starts every sequence.
    pub add_bos: bool,
}

impl GgufCheckpoint {
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(path: &std::path::Path) -> Result<Self, GgufError> {
        Self::new(GgufFile::open(path)?)
    }

    pub fn new(file: GgufFile) -> Result<Self, GgufError> {
        let config = config_from_metadata(&file)?;
        Ok(GgufCheckpoint { file, config })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The tokenizer vocabulary; `None` when the file has none (token-id requests only).
    pub fn vocabulary(&self) -> Result<Option<GgufVocabulary>, GgufError> {
        let f = &self.file;
        if f.metadata("tokenizer.ggml.model").is_none() {
            return Ok(None);
        }
        let id = |key: &str| f.optional_usize(key).map(|id| id.and_then(|id| u32::try_from(id).ok()));
        Ok(Some(GgufVocabulary {
            model: f.string("tokenizer.ggml.model")?.to_owned(),
            pre: f.metadata("tokenizer.ggml.pre").is_some().then(|| f.string("tokenizer.ggml.pre").map(str::to_owned)).transpose()?,
            tokens: f.strings("tokenizer.ggml.tokens")?.into_iter().map(str::to_owned).collect(),
            merges: match f.metadata("tokenizer.ggml.merges") {
                Some(_) => f.strings("tokenizer.ggml.merges")?.into_iter().map(str::to_owned).collect(),
                None => Vec::new(),
            },
            token_types: f.optional_ints("tokenizer.ggml.token_type")?.unwrap_or_default(),
            bos_token_id: id("tokenizer.ggml.bos_token_id")?,
            // llama.cpp's default: add BOS unless the file says otherwise.
            add_bos: f.optional_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(true),
        }))
    }
}

impl GgufCheckpoint {
    /// The tensor `name`, its shape checked against `expected` (Hugging Face's).
    fn tensor(&self, name: TensorName, expected: &[usize]) -> Result<&TensorInfo, WeightsError> {
        let gguf_name = name.gguf();
        let missing = || WeightsError::MissingTensor { name: format!("{gguf_name} ({name})") };
        let info = self.file.tensor(&gguf_name).ok_or_else(missing)?;
        // A 1-D expectation matches `[n]`; GGUF may also store vectors as `[1, n]`.
        let shape = info.shape();
        if shape != expected && !(expected.len() == 1 && info.elements() == expected[0] && shape.len() <= 2) {
            return Err(WeightsError::Shape { name: gguf_name, path: self.file.path().to_owned(), found: shape, expected: expected.to_vec() });
        }
        Ok(info)
    }

    /// Where Hugging Face's row `r` of `name` is stored: convert_hf_to_gguf permutes Llama's q/k
    /// rows for ggml's interleaved RoPE; tally rotates halves as transformers does, so the
    /// permutation is undone. `None`: in order.
    fn stored_row_order(&self, name: TensorName, rows: usize) -> Option<Vec<u32>> {
        let heads = match name {
            _ if self.config.family != Family::Llama => return None,
            TensorName::Layer { tensor: LayerTensor::QProj, .. } => self.config.num_attention_heads,
            TensorName::Layer { tensor: LayerTensor::KProj, .. } => self.config.num_key_value_heads,
            _ => return None,
        };
        Some(unpermuted_order(heads, rows / heads))
    }
}

impl TensorSource for GgufCheckpoint {
    fn read(&self, name: TensorName, expected: &[usize]) -> Result<Vec<f32>, WeightsError> {
        let values = self.file.read_f32(self.tensor(name, expected)?);
        Ok(match self.stored_row_order(name, expected[0]) {
            Some(order) => rows_in_order(&values, &order),
            None => values,
        })
    }

    fn read_blocks(&self, name: TensorName, expected: [usize; 2]) -> Result<Option<BlockRows>, WeightsError> {
        let info = self.tensor(name, &expected)?;
        let Some(rows) = self.file.stored_bytes(info).and_then(|bytes| BlockRows::new(info.kind, bytes, expected[0])) else {
            return Ok(None);
        };
        Ok(Some(match self.stored_row_order(name, expected[0]) {
            Some(order) => rows.reordered(order),
            None => rows,
        }))
    }
}

/// Row `r` of the result is row `order[r]` of `values` (`order.len()` rows).
fn rows_in_order(values: &[f32], order: &[u32]) -> Vec<f32> {
    let width = values.len() / order.len();
    order.iter().flat_map(|&stored| &values[stored as usize * width..(stored as usize + 1) * width]).copied().collect()
}

/// Llama's q/k rows as GGUF stores them: HF row `h·d + s·d/2 + j` is stored row `h·d + 2j + s`
/// (`heads` heads of `head_dim` rows).
fn unpermuted_order(heads: usize, head_dim: usize) -> Vec<u32> {
    let half = head_dim / 2;
    (0..heads * head_dim)
        .map(|row| {
            let (h, within) = (row / head_dim, row % head_dim);
            let (s, j) = (within / half, within % half);
            (h * head_dim + 2 * j + s) as u32
        })
        .collect()
}

fn config_from_metadata(f: &GgufFile) -> Result<ModelConfig, GgufError> {
    let arch = f.string("general.architecture")?;
    // GGUF names each family as `config.json`'s `model_type` does.
    let family = Family::from_model_type(arch).ok_or_else(|| GgufError::Architecture { path: f.path().to_owned(), arch: arch.to_owned() })?;
    let key = |name: &str| format!("{arch}.{name}");
    let hidden = f.usize(&key("embedding_length"))?;
    let heads = f.usize(&key("attention.head_count"))?;
    let head_dim = match f.optional_usize(&key("attention.key_length"))? {
        Some(dim) => dim,
        None if heads > 0 => hidden / heads,
        None => 0,
    };
    if let Some(rotary) = f.optional_usize(&key("rope.dimension_count"))? {
        if rotary != head_dim {
            return Err(GgufError::Metadata {
                path: f.path().to_owned(),
                key: key("rope.dimension_count"),
                problem: format!("{rotary}, but partial rotary embeddings (head_dim {head_dim}) are not supported"),
            }
            .into());
        }
    }
    let embedding_name = TensorName::Embeddings.gguf();
    let embedding = f.tensor(&embedding_name).ok_or_else(|| GgufError::MissingTensor { path: f.path().to_owned(), name: embedding_name.clone() })?;
    let scaling = if let Some(info) = f.tensor("rope_freqs.weight") {
        RopeScaling::Factors(f.read_f32(info).into_iter().map(f64::from).collect())
    } else {
        let scaling_type = match f.metadata(&key("rope.scaling.type")) {
            Some(_) => f.string(&key("rope.scaling.type"))?,
            None => "none",
        };
        match scaling_type {
            "none" => RopeScaling::None,
            "linear" => RopeScaling::Linear { factor: f.optional_f64(&key("rope.scaling.factor"))?.unwrap_or(1.0) },
            other => {
                return Err(GgufError::Metadata { path: f.path().to_owned(), key: key("rope.scaling.type"), problem: format!("`{other}`, which is not supported") }.into())
            }
        }
    };
    let config = ModelConfig {
        family,
        vocab_size: embedding.dims.get(1).copied().unwrap_or(0),
        hidden_size: hidden,
        intermediate_size: f.usize(&key("feed_forward_length"))?,
        num_hidden_layers: f.usize(&key("block_count"))?,
        num_attention_heads: heads,
        num_key_value_heads: f.optional_usize(&key("attention.head_count_kv"))?.unwrap_or(heads),
        head_dim,
        rms_norm_eps: f.optional_f64(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5),
        rope: RopeConfig { theta: f.optional_f64(&key("rope.freq_base"))?.unwrap_or(10_000.0), scaling },
        max_position_embeddings: f.usize(&key("context_length"))?,
        tie_word_embeddings: f.tensor(&TensorName::LmHead.gguf()).is_none(),
        qk_norm: f.tensor(&TensorName::layer(0, LayerTensor::QNorm).gguf()).is_some(),
        attention_bias: f.tensor(&TensorName::layer_bias(0, LayerTensor::QProj).gguf()).is_some(),
    };
    config.check().map_err(|e| GgufError::Metadata { path: f.path().to_owned(), key: format!("{arch}.*"), problem: e.to_string() })?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's forward permutation, `w.reshape(heads, 2, d/2, in).swapaxes(1, 2)`, undone.
    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        let (heads, head_dim, width) = (3, 8, 2);
        let hf: Vec<f32> = (0..heads * head_dim * width).map(|v| v as f32).collect();
        let mut permuted = vec![0.0; hf.len()];
        for h in 0..heads {
            for s in 0..2 {
                for j in 0..head_dim / 2 {
                    for c in 0..width {
                        permuted[((h * head_dim / 2 + j) * 2 + s) * width + c] = hf[((h * 2 + s) * head_dim / 2 + j) * width + c];
                    }
                }
            }
        }
        assert_ne!(permuted, hf);
        assert_eq!(rows_in_order(&permuted, &unpermuted_order(heads, head_dim)), hf);
    }
}
