//! The decoder's weights from a checkpoint: each tensor by [`TensorName`], q/k/v and gate/up fused
//! into one matrix each; kept as the file stores them where the backend multiplies that
//! ([`ScoringBackend::block_weight`]), else dequantised, each Linear transposed to `[in, out]`,
//! and copied to the device.

use burn::tensor::{Tensor, TensorData};

use super::{DecoderLayer, DecoderModel};
use crate::backend::ScoringBackend;
use crate::blocks::BlockMatrix;
use crate::config::ModelConfig;
use crate::route::Routes;
use crate::tensor_names::{LayerTensor, TensorName};
use crate::weight::{Linear, TokenTable};
use crate::weights::{TensorSource, WeightsError};

impl<B: ScoringBackend> DecoderModel<B> {
    /// Builds the model from opened files (see [`ModelFiles::open`](crate::ModelFiles::open)).
    /// `progress(done, total)` is called as layers are read (dequantised, transposed, copied to
    /// the device).
    pub fn load(config: ModelConfig, weights: &dyn TensorSource, device: &B::Device, progress: &mut dyn FnMut(usize, usize)) -> Result<Self, WeightsError> {
        let c = &config;
        let (hidden, head_dim) = (c.hidden_size, c.head_dim);
        let vector = |name: TensorName, len: usize| -> Result<Tensor<B, 1>, WeightsError> {
            Ok(Tensor::from_data(TensorData::new(weights.read(name, &[len])?, [len]), device))
        };
        let matrix = |name: TensorName, rows: usize, cols: usize| -> Result<Tensor<B, 2>, WeightsError> {
            Ok(Tensor::from_data(TensorData::new(weights.read(name, &[rows, cols])?, [rows, cols]), device))
        };
        // The matrices `names` (`[rows, cols]` each) stacked, as the backend multiplies them
        // from the file's blocks: `None` where it does not, or one of them is float32.
        let blocks = |names: &[(TensorName, usize)], cols: usize| -> Result<Option<B::BlockWeight>, WeightsError> {
            let mut segments = Vec::with_capacity(names.len());
            for &(name, rows) in names {
                match weights.read_blocks(name, [rows, cols])? {
                    Some(segment) => segments.push(segment),
                    None => return Ok(None),
                }
            }
            Ok(BlockMatrix::new(cols, segments).and_then(|matrix| B::block_weight(matrix, device)))
        };
        // HF stores Linear weights as [out, in]; as float, tally multiplies `x · W` with W as [in, out].
        let linear = |names: &[(TensorName, usize)], inputs: usize| -> Result<Linear<B>, WeightsError> {
            if let Some(stored) = blocks(names, inputs)? {
                return Ok(Linear::Blocks(stored));
            }
            let mut stacked = Vec::new();
            for &(name, outputs) in names {
                stacked.extend(weights.read(name, &[outputs, inputs])?);
            }
            let outputs: usize = names.iter().map(|(_, rows)| rows).sum();
            Ok(Linear::Float(Tensor::from_data(TensorData::new(transpose(&stacked, outputs, inputs), [inputs, outputs]), device)))
        };
        let token_table = |name: TensorName| -> Result<TokenTable<B>, WeightsError> {
            Ok(match blocks(&[(name, c.vocab_size)], hidden)? {
                Some(stored) => TokenTable::Blocks(stored),
                None => TokenTable::Float(matrix(name, c.vocab_size, hidden)?),
            })
        };

        let q_width = c.num_attention_heads * head_dim;
        let kv_width = c.num_key_value_heads * head_dim;
        let total = c.num_hidden_layers + 1;
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let weight = |tensor| TensorName::layer(i, tensor);
                let bias = |tensor| TensorName::layer_bias(i, tensor);
                let qkv_bias = c.attention_bias.then(|| -> Result<_, WeightsError> {
                    let mut fused = weights.read(bias(LayerTensor::QProj), &[q_width])?;
                    fused.extend(weights.read(bias(LayerTensor::KProj), &[kv_width])?);
                    fused.extend(weights.read(bias(LayerTensor::VProj), &[kv_width])?);
                    Ok(Tensor::from_data(TensorData::new(fused, [q_width + 2 * kv_width]), device))
                });
                let qk_norm = c.qk_norm.then(|| -> Result<_, WeightsError> {
                    Ok((vector(weight(LayerTensor::QNorm), head_dim)?, vector(weight(LayerTensor::KNorm), head_dim)?))
                });
                progress(i, total);
                Ok(DecoderLayer {
                    input_norm: vector(weight(LayerTensor::InputNorm), hidden)?,
                    qkv_proj: linear(
                        &[
                            (weight(LayerTensor::QProj), q_width),
                            (weight(LayerTensor::KProj), kv_width),
                            (weight(LayerTensor::VProj), kv_width),
                        ],
                        hidden,
                    )?,
                    qkv_bias: qkv_bias.transpose()?,
                    qk_norm: qk_norm.transpose()?,
                    o_proj: linear(&[(weight(LayerTensor::OProj), hidden)], q_width)?,
                    post_attention_norm: vector(weight(LayerTensor::PostAttentionNorm), hidden)?,
                    gate_up_proj: linear(
                        &[
                            (weight(LayerTensor::GateProj), c.intermediate_size),
                            (weight(LayerTensor::UpProj), c.intermediate_size),
                        ],
                        hidden,
                    )?,
                    down_proj: linear(&[(weight(LayerTensor::DownProj), hidden)], c.intermediate_size)?,
                })
            })
            .collect::<Result<Vec<_>, WeightsError>>()?;

        // Some checkpoints ship `lm_head.weight` even when tied; the config decides.
        let lm_head = if c.tie_word_embeddings { None } else { Some(token_table(TensorName::LmHead)?) };
        let model = DecoderModel {
            device: device.clone(),
            embed_tokens: token_table(TensorName::Embeddings)?,
            final_norm: vector(TensorName::FinalNorm, hidden)?,
            layers,
            lm_head,
            config,
            routes: B::routes(Routes::default()),
        };
        progress(total, total);
        Ok(model)
    }
}

/// `values` (`rows × cols`, row-major) transposed, through a 32 × 32 tile: each block is read a
/// row at a time into the tile and written out a row of the result at a time, so every cache line
/// is read and written whole. Element by element, every write of a tall matrix missed the cache
/// (and a power-of-two row length sends those writes to one cache set): half of loading a 0.6B
/// model as float.
fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const BLOCK: usize = 32;
    let mut out = vec![0.0; values.len()];
    let mut tile = [[0f32; BLOCK]; BLOCK];
    for r0 in (0..rows).step_by(BLOCK) {
        let height = BLOCK.min(rows - r0);
        for c0 in (0..cols).step_by(BLOCK) {
            let width = BLOCK.min(cols - c0);
            for i in 0..height {
                let source = &values[(r0 + i) * cols + c0..][..width];
                for (j, &value) in source.iter().enumerate() {
                    tile[j][i] = value;
                }
            }
            for (j, tile_row) in tile.iter().enumerate().take(width) {
                out[(c0 + j) * rows + r0..][..height].copy_from_slice(&tile_row[..height]);
            }
        }
    }
    out
}

#[cfg(test)]
mod transpose_tests {
    /// Sizes just under, at and past the block, and not square.
    #[test]
    fn transposes_across_block_edges() {
        for (rows, cols) in [(1, 1), (31, 32), (32, 33), (33, 70), (70, 1), (1, 65)] {
            let values: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let out = super::transpose(&values, rows, cols);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(out[c * rows + r], values[r * cols + c], "{rows}x{cols} at ({r}, {c})");
                }
            }
        }
    }
}

#[cfg(all(test, feature = "ndarray"))]
mod tests {
    use std::path::PathBuf;

    use burn::backend::NdArray;

    use crate::gguf::GgufFile;
    use crate::{DecoderModel, ModelFiles, WeightStorage};

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models").join(name)
    }

    fn storage(path: &std::path::Path) -> WeightStorage {
        let opened = ModelFiles::locate(path).unwrap().open().unwrap();
        DecoderModel::<NdArray<f32>>::load(opened.config, opened.weights.as_ref(), &Default::default(), &mut |_, _| {}).unwrap().weight_storage()
    }

    /// On the CPU every matrix of a GGUF stays as the file stores it (Q4_0 … Q8_0, F16, BF16 and
    /// mixed within a fused projection), byte for byte; so do f16/bf16 safetensors; float32
    /// ones are read as float.
    #[test]
    fn the_cpu_keeps_a_gguf_s_matrices_as_stored() {
        let path = fixture("llama-gguf/llama-gguf.gguf");
        let file = GgufFile::open(&path).unwrap();
        let layers = file.usize("llama.block_count").unwrap();
        let matrix_bytes: usize = ["token_embd.weight", "output.weight"]
            .into_iter()
            .map(str::to_owned)
            .chain((0..layers).flat_map(|i| ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"].map(|t| format!("blk.{i}.{t}.weight"))))
            .map(|name| file.tensor(&name).unwrap_or_else(|| panic!("{name}")).len)
            .sum();
        // Embeddings and head, then q/k/v, o, gate/up and down per layer.
        assert_eq!(storage(&path), WeightStorage { stored: 2 + 4 * layers, stored_bytes: matrix_bytes, float: 0 });
        let float32 = storage(&fixture("tied-gqa"));
        assert_eq!((float32.stored, float32.stored_bytes), (0, 0));
        assert!(float32.float > 4);
        let half = storage(&fixture("untied-f16"));
        assert_eq!((half.stored, half.float), (float32.float + 1, 0), "untied: one more matrix, the head");
    }
}
