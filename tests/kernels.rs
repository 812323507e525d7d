//! tally-shaders' kernels against tally-model's plain Burn path (run on the CPU backend), on
//! random inputs with awkward shapes. Kernel outputs are poisoned with NaN before each run, so
//! an element the kernel forgets to write fails the test.
//!
//! They run on wgpu's default adapter: Mesa's lavapipe in CI (`apt-get install mesa-vulkan-drivers`).

use burn::backend::NdArray;
use burn::tensor::{backend::Backend, Tensor, TensorData, TensorPrimitive};
use burn::backend::wgpu::WgpuRuntime;
use burn_cubecl::{tensor::CubeTensor, CubeBackend, CubeRuntime, FloatElement};
use tally_model::attention::{multi_item_attention, PrefixKv};
use tally_model::lm_head::{label_logprobs, LabelTable};
use tally_model::{ItemLayout, ScoringBackend};
use tally_shaders::{MultiItemAttention, StreamedLabelLogprobs};

type Reference = NdArray<f32>;
type Wgpu<F = f32> = CubeBackend<WgpuRuntime, F, i32, u32>;
type Gpu = Wgpu;

/// Seeded uniform values in `[-scale, scale)`.
fn random(seed: u64, count: usize, scale: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn tensor<B: Backend, const D: usize>(values: &[f32], shape: [usize; D]) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(values.to_vec(), shape), &Default::default())
}

fn host<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    tensor.into_data().convert::<f32>().to_vec().unwrap()
}

fn cube<R: CubeRuntime, F: FloatElement, const D: usize>(tensor: Tensor<CubeBackend<R, F, i32, u32>, D>) -> CubeTensor<R> {
    tensor.into_primitive().tensor()
}

fn poisoned<F: FloatElement, const D: usize>(shape: [usize; D]) -> CubeTensor<WgpuRuntime> {
    let count = shape.iter().product();
    cube(tensor::<Wgpu<F>, D>(&vec![f32::NAN; count], shape))
}

/// `max |got − expected| / max |expected|`; NaN anywhere fails.
fn assert_close(got: &[f32], expected: &[f32], tolerance: f32, what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: lengths");
    assert!(got.iter().all(|v| v.is_finite()), "{what}: the kernel left elements unwritten or non-finite: {:?} vs {:?}", &got[..got.len().min(12)], &expected[..expected.len().min(12)]);
    let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    let error = got.iter().zip(expected).fold(0f32, |m, (g, e)| m.max((g - e).abs())) / scale;
    assert!(error <= tolerance, "{what}: relative error {error:e} > {tolerance:e}");
}

/// One attention problem: groups of (prefix length, item lengths), heads and head size.
struct Case {
    groups: Vec<(usize, Vec<usize>)>,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Case {
    fn name(&self) -> String {
        let prefixes: Vec<usize> = self.groups.iter().map(|(p, _)| *p).collect();
        let items: usize = self.groups.iter().map(|(_, items)| items.len()).sum();
        format!("prefixes {prefixes:?}, {items} items, {}q/{}kv heads, head_dim {}", self.q_heads, self.kv_heads, self.head_dim)
    }

    fn layout(&self) -> ItemLayout {
        ItemLayout::new(self.groups.iter().map(|(prefix, items)| (*prefix, items.as_slice())))
    }

    /// (queries, keys, values, per-group prefix keys and values), host-side, seeded.
    #[allow(clippy::type_complexity)]
    fn inputs(&self, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<(Vec<f32>, Vec<f32>)>) {
        let tokens = self.layout().tokens();
        let (q, kv, d) = (self.q_heads, self.kv_heads, self.head_dim);
        // Sharp scores: a scale of 2 makes softmax rows far from uniform.
        let prefixes = self
            .groups
            .iter()
            .enumerate()
            .map(|(g, (len, _))| (random(seed + 10 + g as u64, kv * len * d, 2.0), random(seed + 20 + g as u64, kv * len * d, 1.0)))
            .collect();
        (random(seed, tokens * q * d, 2.0), random(seed + 1, tokens * kv * d, 2.0), random(seed + 2, tokens * kv * d, 1.0), prefixes)
    }

    /// The plain Burn path on the CPU: the reference.
    fn expected(&self, seed: u64) -> Vec<f32> {
        let (queries, keys, values, prefixes) = self.inputs(seed);
        let layout = self.layout();
        let (t, q, kv, d) = (layout.tokens(), self.q_heads, self.kv_heads, self.head_dim);
        let prefixes: Vec<PrefixKv<Reference>> = self
            .groups
            .iter()
            .zip(&prefixes)
            .map(|((len, _), (k, v))| PrefixKv { keys: tensor(k, [kv, *len, d]), values: tensor(v, [kv, *len, d]) })
            .collect();
        let prefixes: Vec<&PrefixKv<Reference>> = prefixes.iter().collect();
        let output = multi_item_attention(tensor(&queries, [t, q, d]), tensor(&keys, [t, kv, d]), tensor(&values, [t, kv, d]), &prefixes, &layout);
        host(output)
    }

    /// The kernel in float type `F`, called directly with a poisoned output.
    fn kernel<F: FloatElement>(&self, seed: u64) -> Vec<f32> {
        let (queries, keys, values, prefixes) = self.inputs(seed);
        let layout = self.layout();
        let (t, q, kv, d) = (layout.tokens(), self.q_heads, self.kv_heads, self.head_dim);
        // Prefixes end to end along the token axis ([kv, Σ len, d]); at least one token.
        let total: usize = self.groups.iter().map(|(len, _)| len).sum();
        let mut starts = Vec::new();
        let (mut joined_keys, mut joined_values) = (vec![0.0; kv * total.max(1) * d], vec![0.0; kv * total.max(1) * d]);
        let mut start = 0;
        for ((len, _), (k, v)) in self.groups.iter().zip(&prefixes) {
            for head in 0..kv {
                let to = (head * total.max(1) + start) * d;
                joined_keys[to..to + len * d].copy_from_slice(&k[head * len * d..(head + 1) * len * d]);
                joined_values[to..to + len * d].copy_from_slice(&v[head * len * d..(head + 1) * len * d]);
            }
            starts.push(start);
            start += len;
        }
        let item_prefixes = layout.item_groups().map(|g| (starts[g], self.groups[g].0)).collect();
        let output = poisoned::<F, 3>([t, q, d]);
        MultiItemAttention {
            queries: cube(tensor::<Wgpu<F>, 3>(&queries, [t, q, d])),
            keys: cube(tensor::<Wgpu<F>, 3>(&keys, [t, kv, d])),
            values: cube(tensor::<Wgpu<F>, 3>(&values, [t, kv, d])),
            prefix_keys: cube(tensor::<Wgpu<F>, 3>(&joined_keys, [kv, total.max(1), d])),
            prefix_values: cube(tensor::<Wgpu<F>, 3>(&joined_values, [kv, total.max(1), d])),
            item_offsets: layout.offsets().to_vec(),
            item_prefixes,
        }
        .run_into(&output);
        host(Tensor::<Wgpu<F>, 3>::from_primitive(TensorPrimitive::Float(output)))
    }
}

fn check_attention(case: Case, seed: u64) {
    let name = case.name();
    assert_close(&case.kernel::<f32>(seed), &case.expected(seed), 1e-4, &name);
}

#[test]
fn attention_in_f16_accumulates_in_f32() {
    // f16 inputs and output, f32 inside: only the roundings of f16 remain.
    let case = Case { groups: vec![(700, vec![20, 65, 1]), (3, vec![17])], q_heads: 8, kv_heads: 4, head_dim: 64 };
    assert_close(&case.kernel::<half::f16>(9), &case.expected(9), 1e-2, "f16");
}

#[test]
fn attention_one_token_prefix_and_tile_edge_items() {
    // Items of 1, 17 and 65 tokens straddle the 16-key tiles and 64-row cubes.
    check_attention(Case { groups: vec![(1, vec![1, 17, 65, 2])], q_heads: 4, kv_heads: 4, head_dim: 16 }, 1);
}

#[test]
fn attention_long_prefix_gqa4_head_dim_64() {
    check_attention(Case { groups: vec![(2050, vec![20, 7, 65, 1, 33])], q_heads: 8, kv_heads: 2, head_dim: 64 }, 2);
}

#[test]
fn attention_qwen3_heads_head_dim_128_several_groups() {
    // Qwen3-0.6B's heads (16 q / 8 kv, head_dim 128); groups with different prefixes, one empty.
    check_attention(Case { groups: vec![(2020, vec![20, 20, 3]), (0, vec![5, 1]), (37, vec![64, 16, 17])], q_heads: 16, kv_heads: 8, head_dim: 128 }, 3);
}

#[test]
fn attention_500_uneven_items() {
    let items: Vec<usize> = (0..500).map(|i| 1 + (i * 7) % 23).collect();
    check_attention(Case { groups: vec![(130, items)], q_heads: 4, kv_heads: 2, head_dim: 16 }, 4);
}

#[test]
fn attention_query_prefill_is_one_causal_item() {
    // How the query itself runs: one item, no prefix (the first chunk) or the earlier chunks.
    check_attention(Case { groups: vec![(0, vec![300])], q_heads: 2, kv_heads: 1, head_dim: 64 }, 5);
    check_attention(Case { groups: vec![(512, vec![129])], q_heads: 2, kv_heads: 1, head_dim: 64 }, 6);
}

#[test]
fn attention_tiles_mix_whole_items_and_pieces_of_long_ones() {
    // 64-token tiles at GQA 2: short items share tiles, a 150-token item is cut in three and
    // the next item shares its last piece's tile; a group boundary closes a tile.
    check_attention(Case { groups: vec![(9, vec![3, 150, 5, 30, 64, 1]), (4, vec![2, 2])], q_heads: 4, kv_heads: 2, head_dim: 16 }, 8);
}

#[test]
fn attention_through_the_fusion_backend_matches() {
    // The default `Wgpu` type goes through Burn's fusion layer: the wiring in tally-model.
    type Fused = burn::backend::Wgpu<f32>;
    let case = Case { groups: vec![(40, vec![3, 9]), (7, vec![18])], q_heads: 4, kv_heads: 2, head_dim: 32 };
    let (queries, keys, values, prefixes) = case.inputs(7);
    let layout = case.layout();
    let (t, q, kv, d) = (layout.tokens(), case.q_heads, case.kv_heads, case.head_dim);
    let prefixes: Vec<PrefixKv<Fused>> =
        case.groups.iter().zip(&prefixes).map(|((len, _), (k, v))| PrefixKv { keys: tensor(k, [kv, *len, d]), values: tensor(v, [kv, *len, d]) }).collect();
    let prefixes: Vec<&PrefixKv<Fused>> = prefixes.iter().collect();
    let output = Fused::multi_item_attention(tensor(&queries, [t, q, d]), tensor(&keys, [t, kv, d]), tensor(&values, [t, kv, d]), &prefixes, &layout);
    assert_close(&host(output), &case.expected(7), 1e-4, "fused wgpu");
}

/// Label log-probabilities over a vocabulary of three chunks (the last one partial), labels in
/// the first, middle and last chunk and on a chunk edge; rows with different label counts.
#[test]
fn label_logprobs_stream_the_vocabulary() {
    let (rows, hidden, vocab) = (37, 48, 2 * tally_model::lm_head::VOCAB_CHUNK + 1000);
    let hidden_values = random(11, rows * hidden, 1.0);
    let head_values = random(12, vocab * hidden, 0.5);
    let first: &[u32] = &[0, 16_383, 16_384, vocab as u32 - 1];
    let second: &[u32] = &[9_454, 2_753];
    let label_rows: Vec<&[u32]> = (0..rows).map(|r| if r % 3 == 0 { second } else { first }).collect();
    let labels = LabelTable::new(&label_rows);

    let device = Default::default();
    let expected = host(label_logprobs::<Reference>(tensor(&hidden_values, [rows, hidden]), tensor(&head_values, [vocab, hidden]), labels.to_tensor(&device)));

    let gpu_hidden = tensor::<Gpu, 2>(&hidden_values, [rows, hidden]);
    let gpu_head = tensor::<Gpu, 2>(&head_values, [vocab, hidden]);
    let mut stream = StreamedLabelLogprobs::new(labels.to_tensor::<Gpu>(&Default::default()).into_primitive());
    for start in (0..vocab).step_by(tally_model::lm_head::VOCAB_CHUNK) {
        let chunk = tally_model::lm_head::VOCAB_CHUNK.min(vocab - start);
        stream.add_chunk(cube(gpu_hidden.clone().matmul(gpu_head.clone().narrow(0, start, chunk).transpose())));
    }
    let output = poisoned::<f32, 2>([rows, labels.width()]);
    stream.finish_into(&output);
    let got = host(Tensor::<Gpu, 2>::from_primitive(TensorPrimitive::Float(output)));
    assert_close(&got, &expected, 1e-4, "label log-probabilities");
}
