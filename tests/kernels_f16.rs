//! The kernels with 16-bit tensors (f16 on every backend; bf16 too on CUDA): the attention
//! kernel with f16 inputs and output (f32 inside), the cascade in f16 and its softmax between
//! dtypes, and (CUDA) cuBLASLt's float32 products of 16-bit operands. In a process of its own:
//! see `kernels.rs`.

#[path = "common/gpu.rs"]
mod gpu;
mod kernel_cases;

use burn::tensor::{DType, Tensor};
use kernel_cases::{assert_close, tensor, Case, Fused, Gpu, FRAGMENT_LOADS, KV_STAGINGS};
use tally_model::AttentionRoute;
use tally_shaders::{tensor_core_tiles, AttentionKernel, FragmentLoads, KvStaging, PrefixSplits, TilePacking, TileShape};

fn attention_in_f16_accumulates_in_f32() {
    // f16 inputs and output, f32 inside: only the roundings of f16 remain.
    assert_eq!(tensor::<Gpu<half::f16>, 1>(&[1.0], [1]).dtype(), DType::F16, "the kernel must see f16 tensors");
    let device = Default::default();
    let tensor_cores = tensor_core_tiles(&<kernel_cases::GpuRuntime as burn_cubecl::cubecl::Runtime>::client(&device), DType::F16);
    // On CUDA the tile kernels multiply f16 tiles on tensor cores (the path bfloat16 models
    // take); elsewhere in registers. The shapes straddle their 16-key steps and 16-row planes.
    println!("tile kernels in f16 on tensor cores: {tensor_cores}");
    let cases = [
        Case { groups: vec![(700, vec![20, 65, 1]), (3, vec![17])], q_heads: 8, kv_heads: 4, head_dim: 64, ..Default::default() },
        Case { groups: vec![(2020, vec![20, 20, 3]), (0, vec![5, 1]), (37, vec![64, 16, 17])], q_heads: 16, kv_heads: 8, head_dim: 128, ..Default::default() },
        Case { groups: vec![(15, vec![15, 16, 17]), (1, vec![1]), (17, vec![33])], q_heads: 6, kv_heads: 2, head_dim: 16, ..Default::default() },
        // Prefixes at the 64-key step (its last step full: unmasked) and just under it; items of
        // 16/17 tokens (32/34 rows: a 32-row warp's edge) — cp.async and 32 rows a warp on
        // tensor cores, which the float32 cases never reach.
        Case { groups: vec![(64, vec![16, 17]), (128, vec![15, 33]), (63, vec![1])], q_heads: 8, kv_heads: 4, head_dim: 64, ..Default::default() },
    ];
    for (seed, case) in cases.iter().enumerate() {
        let expected = case.expected(seed as u64);
        // Both ways of reading fragments, at the default tile and at the largest (8 planes,
        // 64-key steps: four `ldmatrix.x4` of keys per 16 dimensions); the flash kernel's next
        // step staged every way (cp.async on tensor cores, with one barrier a step or two a
        // buffer; off them each is the register read-ahead, run once), its warps taking 16 rows or 32;
        // and with three stages (the next step's scores a step ahead), with `ldmatrix` and
        // cp.async (the register read-ahead off tensor cores).
        let tiles = [TileShape::default(), TileShape::new(128, 64).expect("a built shape")]
            .into_iter()
            .flat_map(|shape| FRAGMENT_LOADS.map(|loads| shape.with_loads(loads)));
        let stagings = if tensor_cores { &KV_STAGINGS[..] } else { &KV_STAGINGS[..2] };
        let kernels = std::iter::once(AttentionKernel::Rows).chain(tiles.flat_map(|tile| {
            let flash = stagings.iter().flat_map(move |&staging| {
                let tile = tile.with_staging(staging);
                [Some(tile), tile.with_warp_rows(32)].into_iter().flatten().map(AttentionKernel::Flash)
            });
            let three_stages = tile.with_stages(3).filter(|tile| tile.loads == FragmentLoads::Ldmatrix).map(|tile| tile.with_staging(KvStaging::CopyAsync));
            let three_stages = three_stages.into_iter().flat_map(|tile| [Some(tile), tile.with_warp_rows(32)]).flatten().map(AttentionKernel::Flash);
            std::iter::once(AttentionKernel::Tiled(tile)).chain(flash).chain(three_stages)
        }));
        for kernel in kernels {
            let launched = case.launched::<half::f16>(kernel);
            if kernel != AttentionKernel::Rows && tensor_cores {
                assert!(launched.contains("tensor cores"), "{kernel:?} ran as {launched}, {}", case.name());
            }
            let asks_copy_async = matches!(kernel, AttentionKernel::Flash(tile) if tile.staging.copies_async());
            assert_eq!(launched.contains("cp-async"), asks_copy_async && tensor_cores, "{kernel:?} ran as {launched}, {}", case.name());
            assert_close(&case.kernel::<half::f16>(seed as u64, kernel), &expected, 1e-2, &format!("f16, {kernel:?} ({launched}), {}", case.name()));
        }
    }
}

fn attention_in_f16_reads_values_where_the_qkv_projection_wrote_them() {
    // As the model runs it: queries, keys and values views of one fused row a token. On CUDA the
    // default flash tile (cp.async, 32 rows a warp) on tensor cores. Rows padded by 8 elements
    // keep 16-byte vectors; by 2, vectors of one 32-bit word; by 1, a stride of half a word,
    // which no tile kernel reads (the row kernel does).
    let case = Case { groups: vec![(130, vec![16, 17, 1, 20, 20, 20, 20]), (0, vec![33])], q_heads: 16, kv_heads: 8, head_dim: 128, ..Default::default() };
    let expected = case.expected(61);
    let tile = TileShape::new(128, 64).expect("a built shape").with_staging(KvStaging::CopyAsync);
    // CUDA's default tile, the same with filled tiles (items cut at tile edges) and with two
    // barriers a buffer.
    let cuda_default = tile.with_warp_rows(32).expect("128 rows hold warps of 32");
    let split = cuda_default.with_staging(KvStaging::CopyAsyncSplit);
    // Three stages with 16 rows a warp on filled tiles, as the GPU suite's `ahead` variant runs
    // them.
    let ahead = tile.with_stages(3).expect("a built shape").with_packing(TilePacking::Filled);
    // The prefix walk in parts (merged by log-sum-exp; the f16 outputs of each part are
    // weighed in float32) on CUDA's default tile and on `ahead`'s: 130 keys in 3 steps of 64,
    // four parts (the last with the own keys alone), and the empty prefix.
    let parts = |shape: TileShape| shape.with_splits(PrefixSplits::Parts(4));
    let kernels = [
        AttentionKernel::Rows,
        AttentionKernel::Flash(tile),
        AttentionKernel::Flash(cuda_default),
        AttentionKernel::Flash(cuda_default.with_packing(TilePacking::Filled)),
        AttentionKernel::Flash(split),
        AttentionKernel::Flash(ahead),
        AttentionKernel::Flash(parts(cuda_default)),
        AttentionKernel::Flash(parts(ahead)),
    ];
    for padding in [0, 1, 2, 8] {
        for kernel in kernels {
            let (got, value_stride) = case.kernel_on_fused_rows::<half::f16>(61, kernel, padding);
            assert_eq!(value_stride, 32 * 128 + padding, "the values reach the kernel as a view");
            assert_close(&got, &expected, 1e-2, &format!("f16, {kernel:?} ({}), rows padded by {padding}, {}", case.launched::<half::f16>(kernel), case.name()));
        }
    }
}

/// Both ways the tensor-core tiles read key and value `B` fragments (`ldmatrix`, and one read
/// per element where CubeCL's `position_of_nth` says) give every lane the elements PTX's
/// m16n8k16 layout puts there: keysᵀ (k = dimension, n = key) and values (k = key, n =
/// dimension), lane `l` (`g = l / 4`, `t = l % 4`) holding k = 2t, 2t + 1, 2t + 8, 2t + 9 at
/// n = g in one fragment and at n = g + 8 in the next; and the staged rows as a query `A`
/// fragment (m = row, k = dimension: rows g, g + 8 at k = 2t, 2t + 1, then at 2t + 8, 2t + 9). If only `ldmatrix` fails, its lane
/// addressing is wrong; if both do, CubeCL's layout moved (see `mma_fragment_layout_is_ptxs`).
#[cfg(feature = "cuda")]
fn tensor_core_fragment_loads_are_ptxs() {
    use burn::tensor::TensorPrimitive;
    // Element (key, dimension) of the tile is 64 · key + dimension: exact in f16.
    let value = |key: u32, dim: u32| (64 * key + dim) as f32;
    let tile: Vec<f32> = (0..16 * 16).map(|i| value(i / 16, i % 16)).collect();
    let mut expected = Vec::new();
    for lane in 0..32u32 {
        let (g, t) = (lane / 4, lane % 4);
        let ks = [2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9];
        expected.extend([g, g + 8].iter().flat_map(|&key| ks.map(|dim| value(key, dim))));
        expected.extend([g, g + 8].iter().flat_map(|&dim| ks.map(|key| value(key, dim))));
        expected.extend([2 * t, 2 * t + 8].iter().flat_map(|&k| [(g, k), (g, k + 1), (g + 8, k), (g + 8, k + 1)].map(|(row, dim)| value(row, dim))));
    }
    for loads in FRAGMENT_LOADS {
        let staged = tensor::<Gpu<half::f16>, 2>(&tile, [16, 16]).into_primitive().tensor();
        let read = burn::tensor::Tensor::<Gpu<half::f16>, 1>::from_primitive(TensorPrimitive::Float(tally_shaders::fragment_loads(staged, loads)));
        assert_eq!(kernel_cases::host(read), expected, "{loads:?}: per lane, the keys' two fragments, the values' two, then the query's");
    }
}

/// The cascade's softmax kernel between dtypes, against float64: float32 scores (what cuBLASLt
/// writes from 16-bit operands) and f16 ones, weights in f16 (what the matmul after reads), the
/// log-sum-exp in float32 — an f16 one (2⁻¹¹ relative) would miss its tolerance 40-fold. Rows
/// of one key, just under, at and past the kernel's 256 units a row, and of S1's 2,020 prefix
/// keys; masked keys as the causal bias makes them.
fn softmax_lse_writes_f16_weights_and_a_float32_lse() {
    let device = Default::default();
    for (seed, (rows, width)) in [(7, 1), (31, 255), (32, 256), (33, 257), (300, 2020)].into_iter().enumerate() {
        let mut scores = kernel_cases::random(900 + seed as u64, rows * width, 20.0);
        for row in 0..rows {
            for key in (row % width + 1..width).step_by(3) {
                scores[row * width + key] = f32::NEG_INFINITY;
            }
        }
        for scores_dtype in [DType::F32, DType::F16] {
            // The scores as the kernel reads them: f16 ones rounded first.
            let seen: Vec<f64> = scores.iter().map(|&s| if scores_dtype == DType::F16 { half::f16::from_f32(s).to_f64() } else { s as f64 }).collect();
            let (mut expected_weights, mut expected_lse) = (Vec::with_capacity(rows * width), Vec::with_capacity(rows));
            for row in seen.chunks_exact(width) {
                let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let lse = max + row.iter().map(|s| (s - max).exp()).sum::<f64>().ln();
                expected_lse.push(lse as f32);
                expected_weights.extend(row.iter().map(|s| (s - lse).exp() as f32));
            }
            let input = Tensor::<Gpu<half::f16>, 2>::from_data(burn::tensor::TensorData::new(scores.clone(), [rows, width]), (&device, scores_dtype));
            assert_eq!(input.dtype(), scores_dtype, "the kernel must see {scores_dtype:?} scores");
            let (weights, lse) = tally_shaders::softmax_lse(input.into_primitive().tensor(), DType::F16);
            assert_eq!((weights.dtype, lse.dtype), (DType::F16, DType::F32));
            let host_of = |t| kernel_cases::host(Tensor::<Gpu<half::f16>, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(t)));
            let what = format!("{rows} rows of {width}, {scores_dtype:?} scores");
            assert_close(&host_of(weights), &expected_weights, 1e-3, &format!("f16 weights, {what}"));
            assert_close(&host_of(lse), &expected_lse, 1e-6, &format!("float32 log-sum-exp, {what}"));
        }
    }
}

/// The elementwise kernels with f16 tensors (vectors of 4 on wgpu, 8 on CUDA: the widths the
/// model's bf16 and f16 rows are read in), against float64 of the f16-rounded inputs: residual
/// add + RMSNorm over 1,024-wide rows, the q/k norm + RoPE of 128-wide heads read as the keys
/// lie (after the queries' columns), and `silu(gate) · up` over 3,072 columns. Float32 inside,
/// so only the output's rounding (2⁻¹¹) remains.
fn elementwise_kernels_in_f16() {
    let f16_of = |values: &[f32]| -> Vec<f32> { values.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect() };
    fn on_gpu<const D: usize>(values: &[f32], shape: [usize; D]) -> burn_cubecl::tensor::CubeTensor<kernel_cases::GpuRuntime> {
        kernel_cases::cube(tensor::<Gpu<half::f16>, D>(values, shape))
    }
    fn host_of<const D: usize>(t: burn_cubecl::tensor::CubeTensor<kernel_cases::GpuRuntime>) -> Vec<f32> {
        kernel_cases::host(Tensor::<Gpu<half::f16>, D>::from_primitive(burn::tensor::TensorPrimitive::Float(t)))
    }
    let eps = 1e-6;

    let (rows, width) = (33, 1024);
    let (x, delta, gain) = (f16_of(&kernel_cases::random(950, rows * width, 3.0)), f16_of(&kernel_cases::random(951, rows * width, 3.0)), f16_of(&kernel_cases::random(952, width, 1.5)));
    let sum: Vec<f64> = x.iter().zip(&delta).map(|(&a, &b)| a as f64 + b as f64).collect();
    let mut expected = Vec::with_capacity(rows * width);
    for row in sum.chunks_exact(width) {
        let rms = (row.iter().map(|v| v * v).sum::<f64>() / width as f64 + eps).sqrt();
        expected.extend(row.iter().zip(&gain).map(|(v, &g)| (v / rms * g as f64) as f32));
    }
    let (got_sum, normed) = tally_shaders::add_rms_norm(on_gpu(&x, [rows, width]), Some(on_gpu(&delta, [rows, width])), on_gpu(&gain, [width]), eps);
    assert_eq!(normed.dtype, DType::F16);
    assert_close(&host_of::<2>(got_sum), &sum.iter().map(|&v| v as f32).collect::<Vec<_>>(), 1e-3, "f16 residual sum");
    assert_close(&host_of::<2>(normed), &expected, 1e-3, "f16 add + RMSNorm");

    let (tokens, heads, head_dim) = (21, 4, 128);
    let (width, half) = (heads * head_dim, head_dim / 2);
    let projection = f16_of(&kernel_cases::random(953, tokens * 2 * width, 2.0));
    let gain = f16_of(&kernel_cases::random(954, head_dim, 1.5));
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for token in 0..tokens {
        let angles: Vec<f64> = (0..half).map(|i| (token * 131 + 5) as f64 * 10_000f64.powf(-(i as f64) / half as f64)).collect();
        cos.extend(f16_of(&angles.iter().chain(&angles).map(|a| a.cos() as f32).collect::<Vec<_>>()));
        sin.extend(f16_of(&angles.iter().chain(&angles).map(|a| a.sin() as f32).collect::<Vec<_>>()));
    }
    let mut expected = vec![0f32; tokens * width];
    for token in 0..tokens {
        for head in 0..heads {
            let x: Vec<f64> = (0..head_dim).map(|e| projection[token * 2 * width + width + head * head_dim + e] as f64).collect();
            let rms = (x.iter().map(|v| v * v).sum::<f64>() / head_dim as f64 + eps).sqrt();
            let n: Vec<f64> = x.iter().zip(&gain).map(|(v, &g)| v / rms * g as f64).collect();
            for e in 0..head_dim {
                let rotated = if e < half { -n[e + half] } else { n[e - half] };
                let table = token * head_dim + e;
                expected[(token * heads + head) * head_dim + e] = (n[e] * cos[table] as f64 + rotated * sin[table] as f64) as f32;
            }
        }
    }
    let keys = tensor::<Gpu<half::f16>, 2>(&projection, [tokens, 2 * width]).narrow(1, width, width).reshape([tokens, heads, head_dim]);
    let table = |values: &[f32]| on_gpu(values, [tokens, 1, head_dim]);
    let output = tally_shaders::norm_rope(kernel_cases::cube(keys), Some(on_gpu(&gain, [head_dim])), table(&cos), table(&sin), eps);
    assert_close(&host_of::<3>(output), &expected, 1e-3, "f16 q/k norm + RoPE");

    let (rows, intermediate) = (9, 3072);
    let gate_up = f16_of(&kernel_cases::random(955, rows * 2 * intermediate, 6.0));
    let expected: Vec<f32> = (0..rows * intermediate)
        .map(|i| {
            let (gate, up) = (gate_up[i / intermediate * 2 * intermediate + i % intermediate] as f64, gate_up[i / intermediate * 2 * intermediate + intermediate + i % intermediate] as f64);
            (gate / (1.0 + (-gate).exp()) * up) as f32
        })
        .collect();
    let output = tally_shaders::silu_mul(on_gpu(&gate_up, [rows, 2 * intermediate]));
    assert_close(&host_of::<2>(output), &expected, 1e-3, "f16 silu(gate) · up");
}

/// The cascade in f16, its softmax in Burn's ops and in tally's kernel, on the cube backend and
/// through fusion (on CUDA also with cuBLASLt's matmuls, their scores float32 and f16),
/// against the float32 CPU reference: the log-sum-exps and the merge run in float32, so only
/// f16's roundings of inputs, weights and outputs remain.
fn the_cascade_in_f16_merges_in_float32() {
    let cases = [
        Case { groups: vec![(2020, vec![20, 20, 3]), (0, vec![5, 1]), (37, vec![64, 16, 17])], q_heads: 16, kv_heads: 8, head_dim: 128, ..Default::default() },
        Case { groups: vec![(600, vec![5, 3]), (1, vec![1])], q_heads: 4, kv_heads: 2, head_dim: 16, ..Default::default() },
    ];
    use tally_shaders::MatmulRoute;
    // (matmul route, float32 scores where cuBLASLt can write them).
    #[cfg(feature = "cuda")]
    let matmuls = [(MatmulRoute::Cubecl, true), (MatmulRoute::Cublas, true), (MatmulRoute::Cublas, false)];
    #[cfg(not(feature = "cuda"))]
    let matmuls = [(MatmulRoute::Cubecl, true)];
    for (seed, case) in cases.iter().enumerate() {
        let seed = 40 + seed as u64;
        let expected = case.expected(seed);
        for (matmul, float32_scores) in matmuls {
            let _cubecl_after = kernel_cases::CubeclAfter;
            tally_shaders::set_matmul_route(matmul);
            tally_shaders::set_wide_products_in_float32(float32_scores);
            let what = |backend: &str| format!("{backend}, {matmul:?} matmuls, float32 scores {float32_scores}, {}", case.name());
            assert_close(&case.plain_on::<Gpu<half::f16>>(seed), &expected, 1e-2, &what("cube backend, Burn's softmax"));
            assert_close(&case.routed_on::<Gpu<half::f16>>(seed, AttentionRoute::Cascade), &expected, 1e-2, &what("cube backend, softmax kernel"));
            assert_close(&case.plain_on::<Fused<half::f16>>(seed), &expected, 1e-2, &what("fusion, Burn's softmax"));
            assert_close(&case.routed_on::<Fused<half::f16>>(seed, AttentionRoute::Cascade), &expected, 1e-2, &what("fusion, softmax kernel"));
        }
    }
}

/// cuBLASLt's float32 products of 16-bit operands (`Matmul::matmul_wide`, the cascade's prefix
/// scores): f16 and bf16 operands, batched, the right-hand side a transposed view as the keys
/// are, against float64 products of the rounded operands at float32's accuracy — a 16-bit
/// product would be 2⁻¹¹ or 2⁻⁸ off; then through both CubeCL backend types' seam.
#[cfg(feature = "cuda")]
fn cublas_writes_float32_products_of_16_bit_operands() {
    use tally_model::Matmul;
    let device = Default::default();
    let (batch, m, k, n) = (2, 300, 128, 2020);
    let lhs = kernel_cases::random(60, batch * m * k, 1.0);
    let rhs = kernel_cases::random(61, batch * n * k, 1.0);
    for dtype in [DType::F16, DType::BF16] {
        let round = |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| if dtype == DType::F16 { half::f16::from_f32(x).to_f32() } else { half::bf16::from_f32(x).to_f32() }).collect() };
        let (lhs_seen, rhs_seen) = (round(&lhs), round(&rhs));
        let mut expected = Vec::with_capacity(batch * m * n);
        for b in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    expected.push((0..k).map(|l| lhs_seen[(b * m + i) * k + l] as f64 * rhs_seen[(b * n + j) * k + l] as f64).sum::<f64>() as f32);
                }
            }
        }
        let operands = || {
            let lhs = Tensor::<Gpu<half::f16>, 3>::from_data(burn::tensor::TensorData::new(lhs.clone(), [batch, m, k]), (&device, dtype));
            let rhs = Tensor::<Gpu<half::f16>, 3>::from_data(burn::tensor::TensorData::new(rhs.clone(), [batch, n, k]), (&device, dtype)).swap_dims(1, 2);
            (lhs, rhs)
        };
        let (a, b) = operands();
        let product = tally_shaders::cublas::matmul(a.into_primitive().tensor(), b.into_primitive().tensor(), DType::F32).expect("cuBLASLt multiplies these shapes");
        assert_eq!(product.dtype, DType::F32);
        let host_of = |t| kernel_cases::host(Tensor::<Gpu<half::f16>, 3>::from_primitive(burn::tensor::TensorPrimitive::Float(t)));
        assert_close(&host_of(product), &expected, 1e-5, &format!("cuBLASLt, {dtype:?} operands, float32 product"));

        let _cubecl_after = kernel_cases::CubeclAfter;
        tally_shaders::set_matmul_route(tally_shaders::MatmulRoute::Cublas);
        let (a, b) = operands();
        let wide = Gpu::<half::f16>::matmul_wide(a, b);
        assert_eq!(wide.dtype(), DType::F32, "the cube backend's wide matmul on cuBLASLt");
        assert_close(&kernel_cases::host(wide), &expected, 1e-5, &format!("cube backend's matmul_wide, {dtype:?}"));
        let fused = |v: &[f32], shape: [usize; 3]| Tensor::<Fused<half::f16>, 3>::from_data(burn::tensor::TensorData::new(v.to_vec(), shape), (&device, dtype));
        let wide = Fused::<half::f16>::matmul_wide(fused(&lhs, [batch, m, k]), fused(&rhs, [batch, n, k]).swap_dims(1, 2));
        assert_eq!(wide.dtype(), DType::F32, "fusion's wide matmul on cuBLASLt");
        assert_close(&kernel_cases::host(wide), &expected, 1e-5, &format!("fusion's matmul_wide, {dtype:?}"));
    }
}

fn main() {
    #[allow(unused_mut)] // more tests on CUDA
    let mut tests = gpu::named![attention_in_f16_accumulates_in_f32, attention_in_f16_reads_values_where_the_qkv_projection_wrote_them, elementwise_kernels_in_f16, softmax_lse_writes_f16_weights_and_a_float32_lse, the_cascade_in_f16_merges_in_float32];
    #[cfg(feature = "cuda")]
    tests.extend(gpu::named![tensor_core_fragment_loads_are_ptxs, cublas_writes_float32_products_of_16_bit_operands]);
    gpu::run(tests)
}
