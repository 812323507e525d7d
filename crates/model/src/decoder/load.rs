//! The decoder's weights from a checkpoint: Hugging Face tensor names, each Linear transposed to
//! `[in, out]`, q/k/v and gate/up fused into one matrix each, and copied to the device.

use burn::tensor::{Tensor, TensorData};

use super::{DecoderLayer, DecoderModel, HotPaths};
use crate::backend::ScoringBackend;
use crate::config::ModelConfig;
use crate::route::{AttentionRoute, ElementwiseRoute};
use crate::weights::{TensorSource, WeightsError};

impl<B: ScoringBackend> DecoderModel<B> {
    /// Builds the model from opened files (see [`ModelFiles::open`](crate::ModelFiles::open)).
    /// `progress(done, total)` is called as layers are read (dequantised, transposed, copied to
    /// the device).
    pub fn load(config: ModelConfig, weights: &dyn TensorSource, device: &B::Device, progress: &mut dyn FnMut(usize, usize)) -> Result<Self, WeightsError> {
        let c = &config;
        let (hidden, head_dim) = (c.hidden_size, c.head_dim);
        let vector = |name: &str, len: usize| -> Result<Tensor<B, 1>, WeightsError> {
            Ok(Tensor::from_data(TensorData::new(weights.read(name, &[len])?, [len]), device))
        };
        let matrix = |name: &str, rows: usize, cols: usize| -> Result<Tensor<B, 2>, WeightsError> {
            Ok(Tensor::from_data(TensorData::new(weights.read(name, &[rows, cols])?, [rows, cols]), device))
        };
        // HF stores Linear weights as [out, in]; tally multiplies `x · W` with W as [in, out].
        let linear = |names: &[(&str, usize)], inputs: usize| -> Result<Tensor<B, 2>, WeightsError> {
            let mut stacked = Vec::new();
            for &(name, outputs) in names {
                stacked.extend(weights.read(name, &[outputs, inputs])?);
            }
            let outputs: usize = names.iter().map(|(_, rows)| rows).sum();
            Ok(Tensor::from_data(TensorData::new(transpose(&stacked, outputs, inputs), [inputs, outputs]), device))
        };

        let q_width = c.num_attention_heads * head_dim;
        let kv_width = c.num_key_value_heads * head_dim;
        let total = c.num_hidden_layers + 1;
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let p = format!("model.layers.{i}.");
                let qkv_bias = c.attention_bias.then(|| -> Result<_, WeightsError> {
                    let mut fused = weights.read(&format!("{p}self_attn.q_proj.bias"), &[q_width])?;
                    fused.extend(weights.read(&format!("{p}self_attn.k_proj.bias"), &[kv_width])?);
                    fused.extend(weights.read(&format!("{p}self_attn.v_proj.bias"), &[kv_width])?);
                    Ok(Tensor::from_data(TensorData::new(fused, [q_width + 2 * kv_width]), device))
                });
                let qk_norm = c.qk_norm.then(|| -> Result<_, WeightsError> {
                    Ok((vector(&format!("{p}self_attn.q_norm.weight"), head_dim)?, vector(&format!("{p}self_attn.k_norm.weight"), head_dim)?))
                });
                progress(i, total);
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
                    qkv_bias: qkv_bias.transpose()?,
                    qk_norm: qk_norm.transpose()?,
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
        let model = DecoderModel {
            embed_tokens: matrix("model.embed_tokens.weight", c.vocab_size, hidden)?,
            final_norm: vector("model.norm.weight", hidden)?,
            layers,
            lm_head,
            config,
            hot_paths: HotPaths::default(),
            attention_route: AttentionRoute::default(),
            elementwise_route: ElementwiseRoute::default(),
        };
        progress(total, total);
        Ok(model)
    }
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
