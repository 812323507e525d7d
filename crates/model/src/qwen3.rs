//! Qwen3 for scoring: a shared-prefix forward and a multi-item extend that returns only the
//! final hidden state at the last token of each item. No KV cache beyond the prefix, no
//! sampling, no per-token logits.

use std::path::{Path, PathBuf};

use burn::tensor::{activation::silu, backend::Backend, Int, Tensor, TensorData};

use crate::attention::PrefixKv;
use crate::backend::ScoringBackend;
use crate::config::{ConfigError, Qwen3Config};
use crate::layout::ItemLayout;
use crate::lm_head::{self, LabelTable};
use crate::weights::{Checkpoint, WeightsError};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {source}")]
    Config { path: PathBuf, source: ConfigError },
    #[error(transparent)]
    Weights(#[from] WeightsError),
}

/// Query tokens per prefill chunk. A prefix cached at a multiple of this length resumes with
/// the same chunk boundaries as a fresh prefill, so a cache hit is bit-identical to a miss.
pub const PREFILL_CHUNK: usize = 512;

pub struct Qwen3<B: Backend> {
    config: Qwen3Config,
    /// `[vocab, hidden]`; also the LM head when embeddings are tied.
    embed_tokens: Tensor<B, 2>,
    layers: Vec<DecoderLayer<B>>,
    final_norm: Tensor<B, 1>,
    /// `[vocab, hidden]`, `None` when tied to `embed_tokens`.
    lm_head: Option<Tensor<B, 2>>,
}

struct DecoderLayer<B: Backend> {
    input_norm: Tensor<B, 1>,
    /// q, k and v projections fused: `[hidden, (q_heads + 2·kv_heads)·head_dim]`.
    qkv_proj: Tensor<B, 2>,
    q_norm: Tensor<B, 1>,
    k_norm: Tensor<B, 1>,
    o_proj: Tensor<B, 2>,
    post_attention_norm: Tensor<B, 1>,
    /// gate and up projections fused: `[hidden, 2·intermediate]`.
    gate_up_proj: Tensor<B, 2>,
    down_proj: Tensor<B, 2>,
}

/// Items that share one prefix: the items of one request in a pass over several requests.
pub struct ItemGroup<'a, B: Backend> {
    pub prefix: &'a PrefixCache<B>,
    pub items: Vec<&'a [u32]>,
}

/// The query's K/V for every layer, computed once and shared by all items of a request.
#[derive(Clone, Debug)]
pub struct PrefixCache<B: Backend> {
    layers: Vec<PrefixKv<B>>,
    len: usize,
}

impl<B: Backend> PrefixCache<B> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device memory held by the K/V tensors.
    pub fn size_bytes(&self) -> usize {
        self.layers.iter().map(|kv| 2 * kv.keys.shape().num_elements() * kv.keys.dtype().size()).sum()
    }

    /// This prefix followed by `len` more tokens whose per-layer K/V is `next`.
    fn extended(self, next: Vec<PrefixKv<B>>, len: usize) -> Self {
        let layers = self
            .layers
            .into_iter()
            .zip(next)
            .map(|(old, new)| PrefixKv {
                keys: Tensor::cat(vec![old.keys, new.keys], 1),
                values: Tensor::cat(vec![old.values, new.values], 1),
            })
            .collect();
        PrefixCache { layers, len: self.len + len }
    }
}

impl<B: ScoringBackend> Qwen3<B> {
    /// Loads a HF-layout directory: `config.json` plus `model.safetensors` or a sharded index.
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self, LoadError> {
        let config_path = dir.join("config.json");
        let json = std::fs::read_to_string(&config_path).map_err(|source| LoadError::Io { path: config_path.clone(), source })?;
        let config = Qwen3Config::from_json(&json).map_err(|source| LoadError::Config { path: config_path, source })?;
        let checkpoint = Checkpoint::open(dir)?;
        Self::from_checkpoint(config, &checkpoint, device)
    }

    fn from_checkpoint(config: Qwen3Config, ckpt: &Checkpoint, device: &B::Device) -> Result<Self, LoadError> {
        let c = &config;
        let (hidden, head_dim) = (c.hidden_size, c.head_dim);
        let vector = |name: &str, len: usize| -> Result<Tensor<B, 1>, WeightsError> {
            Ok(Tensor::from_data(TensorData::new(ckpt.read(name, &[len])?, [len]), device))
        };
        let matrix = |name: &str, rows: usize, cols: usize| -> Result<Tensor<B, 2>, WeightsError> {
            Ok(Tensor::from_data(TensorData::new(ckpt.read(name, &[rows, cols])?, [rows, cols]), device))
        };
        // HF stores Linear weights as [out, in]; tally multiplies `x · W` with W as [in, out].
        let linear = |names: &[(&str, usize)], inputs: usize| -> Result<Tensor<B, 2>, WeightsError> {
            let mut stacked = Vec::new();
            for &(name, outputs) in names {
                stacked.extend(ckpt.read(name, &[outputs, inputs])?);
            }
            let outputs: usize = names.iter().map(|(_, rows)| rows).sum();
            Ok(Tensor::from_data(TensorData::new(transpose(&stacked, outputs, inputs), [inputs, outputs]), device))
        };

        let q_width = c.num_attention_heads * head_dim;
        let kv_width = c.num_key_value_heads * head_dim;
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let p = format!("model.layers.{i}.");
                Ok(DecoderLayer {
                    input_norm: vector(&format!("{p}input_layernorm.weight"), hidden)?,
                    qkv_proj: linear(
                        &[
                            (&format!("{p}self_attn.q_proj.weight"), q_width),
                            (&format!("{p}self_attn.k_proj.weight"), kv_width),
                            (&format!("{p}self_attn.v_proj.weight"), kv_width),
                        ],
                        hidden,
                    )?,
                    q_norm: vector(&format!("{p}self_attn.q_norm.weight"), head_dim)?,
                    k_norm: vector(&format!("{p}self_attn.k_norm.weight"), head_dim)?,
                    o_proj: linear(&[(&format!("{p}self_attn.o_proj.weight"), hidden)], q_width)?,
                    post_attention_norm: vector(&format!("{p}post_attention_layernorm.weight"), hidden)?,
                    gate_up_proj: linear(
                        &[
                            (&format!("{p}mlp.gate_proj.weight"), c.intermediate_size),
                            (&format!("{p}mlp.up_proj.weight"), c.intermediate_size),
                        ],
                        hidden,
                    )?,
                    down_proj: linear(&[(&format!("{p}mlp.down_proj.weight"), hidden)], c.intermediate_size)?,
                })
            })
            .collect::<Result<Vec<_>, WeightsError>>()?;

        // Some checkpoints ship `lm_head.weight` even when tied; the config decides.
        let lm_head = if c.tie_word_embeddings { None } else { Some(matrix("lm_head.weight", c.vocab_size, hidden)?) };
        Ok(Qwen3 {
            embed_tokens: matrix("model.embed_tokens.weight", c.vocab_size, hidden)?,
            final_norm: vector("model.norm.weight", hidden)?,
            layers,
            lm_head,
            config,
        })
    }

    pub fn config(&self) -> &Qwen3Config {
        &self.config
    }

    pub fn device(&self) -> B::Device {
        self.embed_tokens.device()
    }

    /// A prefix of length zero: items then attend only to themselves (used for `item_first`).
    pub fn empty_prefix(&self) -> PrefixCache<B> {
        let device = self.device();
        let empty = Tensor::<B, 3>::zeros([self.config.num_key_value_heads, 0, self.config.head_dim], &device);
        let layer = PrefixKv { keys: empty.clone(), values: empty };
        PrefixCache { layers: vec![layer; self.config.num_hidden_layers], len: 0 }
    }

    /// Runs the query through every layer once and keeps its K/V. The query goes in chunks, each
    /// attending to the K/V of the chunks before it (a one-item pass over that prefix), so
    /// attention memory grows with `chunk × query`, not `query²`.
    pub fn prefill(&self, tokens: &[u32]) -> PrefixCache<B> {
        self.prefill_from(self.empty_prefix(), tokens)
    }

    /// Extends a prefix by `tokens`, as if `prefix + tokens` had been prefilled from scratch
    /// (exactly so when `prefix.len()` is a multiple of [`PREFILL_CHUNK`]).
    pub fn prefill_from(&self, prefix: PrefixCache<B>, tokens: &[u32]) -> PrefixCache<B> {
        let mut cache = prefix;
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            let mut chunk_kv = Vec::with_capacity(self.layers.len());
            let layout = ItemLayout::new([(cache.len(), &[chunk.len()][..])]);
            self.forward(chunk, &layout, &[&cache], Some(&mut chunk_kv));
            cache = cache.extended(chunk_kv, chunk.len());
        }
        cache
    }

    /// Final-normed hidden state at the last token of each item, `[items, hidden]`, items in
    /// group order. Item token `k` sits at position `prefix.len() + k` and sees its group's
    /// prefix and its own item only. Groups of different requests share the pass's matmuls.
    pub fn last_hidden(&self, groups: &[ItemGroup<'_, B>]) -> Tensor<B, 2> {
        let lens: Vec<Vec<usize>> = groups.iter().map(|g| g.items.iter().map(|item| item.len()).collect()).collect();
        let layout = ItemLayout::new(groups.iter().zip(&lens).map(|(g, lens)| (g.prefix.len(), lens.as_slice())));
        let tokens: Vec<u32> = groups.iter().flat_map(|g| g.items.iter().flat_map(|item| item.iter().copied())).collect();
        let prefixes: Vec<&PrefixCache<B>> = groups.iter().map(|g| g.prefix).collect();
        let hidden = self.forward(&tokens, &layout, &prefixes, None);
        let last_rows: Vec<i64> = layout.last_rows().into_iter().map(|row| row as i64).collect();
        let last_rows = Tensor::<B, 1, Int>::from_data(TensorData::new(last_rows, [layout.items()]), &self.device());
        rms_norm(hidden.select(0, last_rows), &self.final_norm, self.config.rms_norm_eps)
    }

    /// Logits of each row's labels, `[rows, labels.width()]`.
    pub fn label_logits(&self, hidden: Tensor<B, 2>, labels: &LabelTable) -> Tensor<B, 2> {
        lm_head::label_logits(hidden, self.head(), labels.to_tensor(&self.device()))
    }

    /// Full-vocabulary log-probabilities of each row's labels, `[rows, labels.width()]`.
    pub fn label_logprobs(&self, hidden: Tensor<B, 2>, labels: &LabelTable) -> Tensor<B, 2> {
        B::label_logprobs(hidden, self.head(), labels.to_tensor(&self.device()))
    }

    fn head(&self) -> Tensor<B, 2> {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens).clone()
    }

    /// Runs the packed tokens of `layout` through all layers; returns `[tokens, hidden]`.
    /// `prefixes[g]` is group `g`'s prefix. With `keep_kv`, the (single) sequence's K/V per
    /// layer is pushed there, in prefix layout.
    fn forward(&self, tokens: &[u32], layout: &ItemLayout, prefixes: &[&PrefixCache<B>], mut keep_kv: Option<&mut Vec<PrefixKv<B>>>) -> Tensor<B, 2> {
        let c = &self.config;
        let device = self.device();
        let count = tokens.len();
        let ids: Vec<i64> = tokens.iter().map(|&id| id as i64).collect();
        let ids = Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [count]), &device);
        let mut x = self.embed_tokens.clone().select(0, ids);
        let rope = Rope::new(&layout.positions(), c.head_dim, c.rope_theta, &device);
        let (q_width, kv_width) = (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim);

        for (index, layer) in self.layers.iter().enumerate() {
            let h = rms_norm(x.clone(), &layer.input_norm, c.rms_norm_eps);
            let qkv = h.matmul(layer.qkv_proj.clone());
            let heads = |t: Tensor<B, 2>, n: usize| t.reshape([count, n, c.head_dim]);
            let q = heads(qkv.clone().narrow(1, 0, q_width), c.num_attention_heads);
            let k = heads(qkv.clone().narrow(1, q_width, kv_width), c.num_key_value_heads);
            let v = heads(qkv.narrow(1, q_width + kv_width, kv_width), c.num_key_value_heads);
            let q = rope.apply(rms_norm(q, &layer.q_norm, c.rms_norm_eps));
            let k = rope.apply(rms_norm(k, &layer.k_norm, c.rms_norm_eps));
            if let Some(kept) = keep_kv.as_deref_mut() {
                kept.push(PrefixKv { keys: k.clone().swap_dims(0, 1), values: v.clone().swap_dims(0, 1) });
            }
            let layer_prefixes: Vec<&PrefixKv<B>> = prefixes.iter().map(|prefix| &prefix.layers[index]).collect();
            let attended = B::multi_item_attention(q, k, v, &layer_prefixes, layout);
            x = x + attended.reshape([count, q_width]).matmul(layer.o_proj.clone());

            let h = rms_norm(x.clone(), &layer.post_attention_norm, c.rms_norm_eps);
            let gate_up = h.matmul(layer.gate_up_proj.clone());
            let gate = gate_up.clone().narrow(1, 0, c.intermediate_size);
            let up = gate_up.narrow(1, c.intermediate_size, c.intermediate_size);
            x = x + (silu(gate) * up).matmul(layer.down_proj.clone());
        }
        x
    }
}

/// Rotary embedding in HF's rotate-half layout, as `[tokens, 1, head_dim]` tables broadcast
/// over heads.
struct Rope<B: Backend> {
    cos: Tensor<B, 3>,
    sin: Tensor<B, 3>,
}

impl<B: Backend> Rope<B> {
    fn new(positions: &[usize], head_dim: usize, theta: f64, device: &B::Device) -> Self {
        let half = head_dim / 2;
        // Positions repeat across items (prefix_len + k): compute each distinct one once.
        let mut distinct = positions.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let (mut cos_rows, mut sin_rows) = (Vec::new(), Vec::new());
        for &position in &distinct {
            // Angles in f64: at positions in the thousands, f32 angles lose the low frequencies' digits.
            let angles: Vec<f64> = (0..half).map(|i| position as f64 * theta.powf(-2.0 * i as f64 / head_dim as f64)).collect();
            cos_rows.extend(angles.iter().chain(&angles).map(|a| a.cos() as f32));
            sin_rows.extend(angles.iter().chain(&angles).map(|a| a.sin() as f32));
        }
        let table = |rows: &[f32]| {
            let values: Vec<f32> = positions
                .iter()
                .flat_map(|p| {
                    let row = distinct.binary_search(p).expect("every position is in the table");
                    &rows[row * head_dim..(row + 1) * head_dim]
                })
                .copied()
                .collect();
            Tensor::from_data(TensorData::new(values, [positions.len(), 1, head_dim]), device)
        };
        Rope { cos: table(&cos_rows), sin: table(&sin_rows) }
    }

    /// `x·cos + rotate_half(x)·sin` for `x: [tokens, heads, head_dim]`.
    fn apply(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let half = x.dims()[2] / 2;
        let rotated = Tensor::cat(vec![x.clone().narrow(2, half, half).neg(), x.clone().narrow(2, 0, half)], 2);
        x * self.cos.clone() + rotated * self.sin.clone()
    }
}

/// RMSNorm over the last dimension with a learned gain.
fn rms_norm<B: Backend, const D: usize>(x: Tensor<B, D>, gain: &Tensor<B, 1>, eps: f64) -> Tensor<B, D> {
    let rms = (x.clone().powi_scalar(2).mean_dim(D - 1) + eps).sqrt();
    x / rms * gain.clone().unsqueeze::<D>()
}

fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; values.len()];
    for (r, row) in values.chunks_exact(cols).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            out[c * rows + r] = v;
        }
    }
    out
}
