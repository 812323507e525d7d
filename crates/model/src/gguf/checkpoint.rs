//! A GGUF file as a tally checkpoint: the architecture from its metadata, its tensors under
//! Hugging Face names (dequantised, Llama's q/k rows un-permuted), and its tokenizer vocabulary.

use super::{GgufError, GgufFile};
use crate::config::{Family, ModelConfig, RopeConfig, RopeScaling};
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
    pub fn open(path: &std::path::Path) -> Result<Self, WeightsError> {
        Self::new(GgufFile::open(path)?)
    }

    pub fn new(file: GgufFile) -> Result<Self, WeightsError> {
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

    /// The GGUF name of a Hugging Face tensor name.
    fn gguf_name(name: &str) -> Option<String> {
        let fixed = match name {
            "model.embed_tokens.weight" => Some("token_embd.weight"),
            "model.norm.weight" => Some("output_norm.weight"),
            "lm_head.weight" => Some("output.weight"),
            _ => None,
        };
        if let Some(fixed) = fixed {
            return Some(fixed.to_owned());
        }
        let rest = name.strip_prefix("model.layers.")?;
        let (layer, part) = rest.split_once('.')?;
        let (module, kind) = part.rsplit_once('.')?;
        let module = match module {
            "input_layernorm" => "attn_norm",
            "self_attn.q_proj" => "attn_q",
            "self_attn.k_proj" => "attn_k",
            "self_attn.v_proj" => "attn_v",
            "self_attn.o_proj" => "attn_output",
            "self_attn.q_norm" => "attn_q_norm",
            "self_attn.k_norm" => "attn_k_norm",
            "post_attention_layernorm" => "ffn_norm",
            "mlp.gate_proj" => "ffn_gate",
            "mlp.up_proj" => "ffn_up",
            "mlp.down_proj" => "ffn_down",
            _ => return None,
        };
        Some(format!("blk.{layer}.{module}.{kind}"))
    }
}

impl TensorSource for GgufCheckpoint {
    fn read(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>, WeightsError> {
        let gguf_name = Self::gguf_name(name).unwrap_or_else(|| name.to_owned());
        let missing = || WeightsError::MissingTensor { name: format!("{gguf_name} ({name})") };
        let info = self.file.tensor(&gguf_name).ok_or_else(missing)?;
        // A 1-D expectation matches `[n]`; GGUF may also store vectors as `[1, n]`.
        let shape = info.shape();
        if shape != expected && !(expected.len() == 1 && info.elements() == expected[0] && shape.len() <= 2) {
            return Err(WeightsError::Shape { name: gguf_name, path: self.file.path().to_owned(), found: shape, expected: expected.to_vec() });
        }
        let values = self.file.read_f32(info);
        // convert_hf_to_gguf permutes Llama's q/k rows for ggml's interleaved RoPE; tally
        // rotates halves as transformers does, so the permutation is undone.
        let heads = match name.rsplit('.').nth(1) {
            _ if self.config.family != Family::Llama => None,
            Some("q_proj") => Some(self.config.num_attention_heads),
            Some("k_proj") => Some(self.config.num_key_value_heads),
            _ => None,
        };
        Ok(match heads {
            Some(heads) => unpermute_rows(&values, heads, expected[0] / heads, values.len() / expected[0]),
            None => values,
        })
    }
}

/// Inverse of llama.cpp's q/k permutation: GGUF row `h·d + 2j + s` is HF row `h·d + s·d/2 + j`.
fn unpermute_rows(values: &[f32], heads: usize, head_dim: usize, width: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let mut out = vec![0.0; values.len()];
    for h in 0..heads {
        for j in 0..half {
            for s in 0..2 {
                let from = (h * head_dim + 2 * j + s) * width;
                let to = (h * head_dim + s * half + j) * width;
                out[to..to + width].copy_from_slice(&values[from..from + width]);
            }
        }
    }
    out
}

fn config_from_metadata(f: &GgufFile) -> Result<ModelConfig, WeightsError> {
    let arch = f.string("general.architecture")?;
    // GGUF names each family as `config.json`'s `model_type` does.
    let family = Family::from_model_type(arch).ok_or_else(|| WeightsError::Architecture { path: f.path().to_owned(), arch: arch.to_owned() })?;
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
    let embedding = f.tensor("token_embd.weight").ok_or_else(|| WeightsError::MissingTensor { name: "token_embd.weight".into() })?;
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
        tie_word_embeddings: f.tensor("output.weight").is_none(),
        qk_norm: f.tensor("blk.0.attn_q_norm.weight").is_some(),
        attention_bias: f.tensor("blk.0.attn_q.bias").is_some(),
    };
    config.check().map_err(|e| GgufError::Metadata { path: f.path().to_owned(), key: format!("{arch}.*"), problem: e.to_string() })?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_hf_names_to_gguf_names() {
        for (hf, gguf) in [
            ("model.embed_tokens.weight", "token_embd.weight"),
            ("lm_head.weight", "output.weight"),
            ("model.layers.12.self_attn.q_proj.bias", "blk.12.attn_q.bias"),
            ("model.layers.0.self_attn.k_norm.weight", "blk.0.attn_k_norm.weight"),
            ("model.layers.3.post_attention_layernorm.weight", "blk.3.ffn_norm.weight"),
            ("model.layers.3.mlp.down_proj.weight", "blk.3.ffn_down.weight"),
        ] {
            assert_eq!(GgufCheckpoint::gguf_name(hf).as_deref(), Some(gguf));
        }
        assert_eq!(GgufCheckpoint::gguf_name("model.layers.0.self_attn.rotary_emb"), None);
    }

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
        assert_eq!(unpermute_rows(&permuted, heads, head_dim, width), hf);
    }
}
