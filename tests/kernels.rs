//! tally-shaders' kernels against tally-model's plain Burn path (run on the CPU backend), on
//! random inputs with awkward shapes. Kernel outputs are poisoned with NaN before each run, so
//! an element the kernel forgets to write fails the test.
//!
//! They run on wgpu's default adapter: Mesa's lavapipe in CI (`apt-get install mesa-vulkan-drivers`);
//! with feature `cuda`, on CUDA (`cargo test -p tally-shaders --features cuda`, the GPU suite).

//! f16 runs in its own test binary (`kernels_f16.rs`): a CubeCL backend of another float type on
//! the same device changes the dtype that device gives new tensors, for the whole process.

#[path = "common/gpu.rs"]
mod gpu;
mod kernel_cases;

use burn::tensor::{Tensor, TensorPrimitive};
use kernel_cases::*;
use tally_model::lm_head::label_logprobs;
use tally_model::weight::TokenTable;
use tally_model::LabelTable;
use tally_model::{AttentionRoute, Matmul, ScoringBackend};
use tally_shaders::{AttentionKernel, KvStaging, PrefixSplits, StreamedLabelLogprobs, TilePacking, TileShape};

/// Every kernel (the tile kernels in registers: float32) against the CPU, the flash kernel with
/// one, two and three key steps in flight.
fn check_attention(case: Case, seed: u64) {
    let expected = case.expected(seed);
    let stages = |stages: usize| TileShape::default().with_stages(stages).expect("a built shape");
    let tiled = AttentionKernel::Tiled(TileShape::default());
    let [flash_one_stage, flash, flash_three_stages] = [1, 2, 3].map(|n| AttentionKernel::Flash(stages(n)));
    // No fallback to the row kernel at these shapes: each case checks the kernel it names. Two
    // stages of float32 K/V at head_dim 128 are more than lavapipe's 32 KiB of shared memory,
    // three at 64: there the flash kernel keeps fewer steps in flight, and says so.
    let most_stages_fitting = |most: usize| (1..=most).rev().find(|&n| tally_shaders::tile_fits(stages(n), &client(), case.head_dim, burn::tensor::DType::F32)).expect("one stage fits");
    let stages_text = |n: usize| if n == 1 { "1 stage".to_string() } else { format!("{n} stages") };
    assert_eq!(case.launched::<f32>(tiled), "tiled, registers", "{}", case.name());
    assert_eq!(case.launched::<f32>(flash), format!("flash, registers, {}", stages_text(most_stages_fitting(2))), "{}", case.name());
    assert_eq!(case.launched::<f32>(flash_three_stages), format!("flash, registers, {}", stages_text(most_stages_fitting(3))), "{}", case.name());
    assert_eq!(case.launched::<f32>(flash_one_stage), "flash, registers, 1 stage", "{}", case.name());
    for kernel in [AttentionKernel::Rows, tiled, flash, flash_one_stage, flash_three_stages] {
        assert_close(&case.kernel::<f32>(seed, kernel), &expected, 1e-4, &format!("{kernel:?}, {}", case.name()));
    }
}

/// The test device's compute client.
fn client() -> burn_cubecl::cubecl::client::ComputeClient<GpuRuntime> {
    <GpuRuntime as burn_cubecl::cubecl::Runtime>::client(&Default::default())
}


fn attention_one_token_prefix_and_tile_edge_items() {
    // Items of 1, 17 and 65 tokens straddle the 16-key tiles and 64-row cubes.
    check_attention(Case { groups: vec![(1, vec![1, 17, 65, 2])], q_heads: 4, kv_heads: 4, head_dim: 16, ..Default::default() }, 1);
}

fn attention_long_prefix_gqa4_head_dim_64() {
    check_attention(Case { groups: vec![(2050, vec![20, 7, 65, 1, 33])], q_heads: 8, kv_heads: 2, head_dim: 64, ..Default::default() }, 2);
}

fn attention_qwen3_heads_head_dim_128_several_groups() {
    // Qwen3-0.6B's heads (16 q / 8 kv, head_dim 128); groups with different prefixes, one empty.
    check_attention(Case { groups: vec![(2020, vec![20, 20, 3]), (0, vec![5, 1]), (37, vec![64, 16, 17])], q_heads: 16, kv_heads: 8, head_dim: 128, ..Default::default() }, 3);
}

fn attention_500_uneven_items() {
    let items: Vec<usize> = (0..500).map(|i| 1 + (i * 7) % 23).collect();
    check_attention(Case { groups: vec![(130, items)], q_heads: 4, kv_heads: 2, head_dim: 16, ..Default::default() }, 4);
}

fn attention_query_prefill_is_one_causal_item() {
    // How the query itself runs: one item, no prefix (the first chunk) or the earlier chunks.
    check_attention(Case { groups: vec![(0, vec![300])], q_heads: 2, kv_heads: 1, head_dim: 64, ..Default::default() }, 5);
    check_attention(Case { groups: vec![(512, vec![129])], q_heads: 2, kv_heads: 1, head_dim: 64, ..Default::default() }, 6);
}

fn attention_tiles_mix_whole_items_and_pieces_of_long_ones() {
    // 64-token tiles at GQA 2: short items share tiles, a 150-token item is cut in three and
    // the next item shares its last piece's tile; a group boundary closes a tile.
    check_attention(Case { groups: vec![(9, vec![3, 150, 5, 30, 64, 1]), (4, vec![2, 2])], q_heads: 4, kv_heads: 2, head_dim: 16, ..Default::default() }, 8);
}

fn attention_just_under_at_and_past_the_tiled_kernels_tiles() {
    // The tiled kernel's sizes: 16 keys a step, 16 rows a plane, 64 rows a cube (16 tokens at
    // GQA 4, 64 at GQA 1), so prefixes and items of 15/16/17 and 63/64/65 tokens; a GQA group
    // of 3 leaves a cube's last row empty (21 tokens × 3), one of 64 fills a cube with a token.
    check_attention(Case { groups: vec![(15, vec![15, 16, 17]), (16, vec![1]), (17, vec![16, 16])], q_heads: 4, kv_heads: 1, head_dim: 16, ..Default::default() }, 11);
    check_attention(Case { groups: vec![(63, vec![63, 64, 65]), (64, vec![64]), (65, vec![1, 63])], q_heads: 2, kv_heads: 2, head_dim: 32, ..Default::default() }, 12);
    check_attention(Case { groups: vec![(31, vec![21, 22, 20, 1])], q_heads: 6, kv_heads: 2, head_dim: 24, ..Default::default() }, 13);
    check_attention(Case { groups: vec![(33, vec![2, 3])], q_heads: 64, kv_heads: 1, head_dim: 16, ..Default::default() }, 14);
    // Walks of one, two and three 16-key steps from no prefix (16 tokens a tile at GQA 4): the
    // three-stage loop stages two steps before its first and reads two past its last.
    check_attention(Case { groups: vec![(0, vec![1, 16, 17, 33]), (2, vec![1])], q_heads: 4, kv_heads: 1, head_dim: 16, ..Default::default() }, 15);
}

fn attention_head_sizes_off_the_flash_kernels_blocks() {
    // The flash kernel's fragments hold 8 dimensions a block: head sizes of 12 and 20 (even, so
    // the tiled kernel still takes them) send it to the row kernel, which must still be right.
    for head_dim in [12, 20] {
        let case = Case { groups: vec![(17, vec![16, 17, 1])], q_heads: 4, kv_heads: 2, head_dim, ..Default::default() };
        let expected = case.expected(31);
        let (tiled, flash) = (AttentionKernel::Tiled(TileShape::default()), AttentionKernel::Flash(TileShape::default()));
        assert_eq!(case.launched::<f32>(tiled), "tiled, registers", "{}", case.name());
        assert_eq!(case.launched::<f32>(flash), "rows", "{}", case.name());
        for kernel in [tiled, flash] {
            assert_close(&case.kernel::<f32>(31, kernel), &expected, 1e-4, &format!("{kernel:?}, {}", case.name()));
        }
    }
}

fn attention_staging_past_one_vector_a_unit() {
    // The tile kernels stage K/V a vector (4 floats here) a unit at a time: at head_dim 24 a
    // 16-key step is 96 vectors for a 64-row cube's 128 units (just under one each), a 32-key
    // step 192 (one each and half a second round), at both stage counts.
    let case = Case { groups: vec![(70, vec![16, 17, 33, 1]), (31, vec![5])], q_heads: 4, kv_heads: 2, head_dim: 24, ..Default::default() };
    let expected = case.expected(41);
    for keys in [16, 32] {
        let shape = TileShape::new(64, keys).expect("a built shape");
        let one_stage = shape.with_stages(1).expect("a built shape");
        // f32 is never on tensor cores, so a flash call asking for cp.async reads into registers.
        let copy_async = shape.with_staging(KvStaging::CopyAsync);
        let two_blocks = shape.with_warp_rows(32).expect("64 rows hold warps of 32");
        // The staged query may not leave room for two stages (lavapipe's 32 KiB at 32 keys).
        let two_blocks_stages = if tally_shaders::tile_fits(two_blocks, &client(), case.head_dim, burn::tensor::DType::F32) { "2 stages" } else { "1 stage" };
        let two_blocks_launched = format!("flash, registers, {two_blocks_stages}, 32 rows a warp");
        // Three stages read step `s + 2` at step `s`; they may not fit either (32 keys).
        let three_stages = shape.with_stages(3).expect("a built shape");
        let three_stages_launched = if tally_shaders::tile_fits(three_stages, &client(), case.head_dim, burn::tensor::DType::F32) { "flash, registers, 3 stages" } else { "flash, registers, 2 stages" };
        for (kernel, launched) in [
            (AttentionKernel::Tiled(shape), "tiled, registers"),
            (AttentionKernel::Flash(shape), "flash, registers, 2 stages"),
            (AttentionKernel::Flash(copy_async), "flash, registers, 2 stages"),
            (AttentionKernel::Flash(one_stage), "flash, registers, 1 stage"),
            (AttentionKernel::Flash(two_blocks), two_blocks_launched.as_str()),
            (AttentionKernel::Flash(three_stages), three_stages_launched),
        ] {
            assert_eq!(case.launched::<f32>(kernel), launched, "{kernel:?}, {}", case.name());
            assert_close(&case.kernel::<f32>(41, kernel), &expected, 1e-4, &format!("{kernel:?}, {}", case.name()));
        }
    }
}

fn attention_every_tile_shape() {
    // Items across every tile size's edges (16/17, 31/33, 64/65, 130); prefixes just under, at
    // and past the largest key step (63/64/65: a prefix's last step full, so unmasked, or not).
    let case = Case { groups: vec![(40, vec![16, 17, 33, 1, 64, 65, 130]), (1, vec![31, 2]), (63, vec![2]), (64, vec![17]), (65, vec![1])], q_heads: 4, kv_heads: 2, head_dim: 32, ..Default::default() };
    let expected = case.expected(21);
    let client = client();
    for shape in every_tile_shape() {
        if !tally_shaders::tile_fits(shape, &client, case.head_dim, burn::tensor::DType::F32) {
            // Still checked: the call falls back to fewer stages or the row kernel.
            eprintln!("note: tile {shape} needs more shared memory than this adapter has");
        }
        // The tiled kernel stages one step at a time, whatever the shape's stages; the flash
        // kernel's warps take 16 rows, and 32 where the tile has them.
        let mut kernels = if shape.stages == 1 { vec![AttentionKernel::Tiled(shape), AttentionKernel::Flash(shape)] } else { vec![AttentionKernel::Flash(shape)] };
        kernels.extend(shape.with_warp_rows(32).map(AttentionKernel::Flash));
        for kernel in kernels {
            assert_close(&case.kernel::<f32>(21, kernel), &expected, 1e-4, &format!("{kernel:?} ({}), {}", case.launched::<f32>(kernel), case.name()));
        }
    }
}

fn attention_reads_keys_and_values_where_the_qkv_projection_wrote_them() {
    // The model's values are a view of the fused QKV output, one row a token (its keys too,
    // before their norm): the kernels read keys and values at such a stride, without a copy. Rows padded by 1 element leave a stride no vector divides (K/V staged an element
    // at a time), by 4 one that 4-wide vectors still divide.
    let cases = [
        // Items under, at and past a 32-token tile (64 rows at GQA 2) and the 16-key steps.
        Case { groups: vec![(40, vec![16, 17, 32, 33, 1]), (0, vec![5])], q_heads: 4, kv_heads: 2, head_dim: 32, ..Default::default() },
        Case { groups: vec![(17, vec![64, 65, 2])], q_heads: 16, kv_heads: 8, head_dim: 128, ..Default::default() },
    ];
    for case in cases {
        let expected = case.expected(51);
        let row = (case.q_heads + 2 * case.kv_heads) * case.head_dim;
        for padding in [0, 1, 4] {
            for kernel in [AttentionKernel::Rows, AttentionKernel::Tiled(TileShape::default()), AttentionKernel::Flash(TileShape::default()), AttentionKernel::Flash(TileShape::default().with_stages(1).expect("a built shape"))] {
                let (got, value_stride) = case.kernel_on_fused_rows::<f32>(51, kernel, padding);
                assert_eq!(value_stride, row + padding, "the values reach the kernel as a view, {}", case.name());
                assert_close(&got, &expected, 1e-4, &format!("{kernel:?} ({}), rows padded by {padding}, {}", case.launched::<f32>(kernel), case.name()));
            }
        }
    }
}

fn attention_on_filled_tiles_cuts_items_at_tile_edges() {
    // `--tile-packing filled`: items cut wherever a tile ends, so a tile may begin inside an
    // item (its rows still see that item's earlier keys) and hold pieces of three. Items of 20
    // tokens (S1's) at 32 tokens a tile (64 rows, GQA 2), around odd ones and a second prefix.
    let mut items = vec![20; 13];
    items.extend([1, 17, 65, 31, 32, 33]);
    let case = Case { groups: vec![(70, items), (0, vec![5, 40]), (3, vec![64])], q_heads: 4, kv_heads: 2, head_dim: 32, ..Default::default() };
    let expected = case.expected(71);
    let filled = |shape: TileShape| shape.with_packing(TilePacking::Filled);
    let shape = TileShape::default();
    let kernels = [
        AttentionKernel::Tiled(filled(shape.with_stages(1).expect("a built shape"))),
        AttentionKernel::Flash(filled(shape)),
        AttentionKernel::Flash(filled(shape.with_stages(1).expect("a built shape"))),
        AttentionKernel::Flash(filled(shape.with_warp_rows(32).expect("64 rows hold warps of 32"))),
        AttentionKernel::Flash(filled(TileShape::new(32, 32).expect("a built shape"))),
        AttentionKernel::Flash(filled(TileShape::new(32, 32).and_then(|shape| shape.with_stages(3)).expect("a built shape"))),
    ];
    for kernel in kernels {
        assert_close(&case.kernel::<f32>(71, kernel), &expected, 1e-4, &format!("{kernel:?} ({}), {}", case.launched::<f32>(kernel), case.name()));
    }
}

fn attention_rescales_where_later_keys_pass_the_running_maximum() {
    // The flash kernel moves a row's running maximum only when a step's scores pass it by more
    // than its slack (`RESCALE_SLACK` in scaled scores), and then rescales what the row has summed. Keys
    // i.i.d. never get that far past the first step's maximum: here the prefix's keys grow
    // along it, and the test first checks that its rows do.
    let case = Case { groups: vec![(300, vec![20, 7, 1]), (40, vec![3])], q_heads: 4, kv_heads: 2, head_dim: 32, rising_keys: true };
    let seed = 91;
    let (queries, _, _, prefixes) = case.inputs(seed);
    let (d, group, prefix_len) = (case.head_dim, case.q_heads / case.kv_heads, case.groups[0].0);
    let step = TileShape::default().keys;
    // The first item's rows (its tokens × query heads) against the first prefix.
    let rows = case.groups[0].1[0] * case.q_heads;
    let passing = (0..rows)
        .filter(|row| {
            let (query, kv_head) = (&queries[row * d..][..d], row % case.q_heads / group);
            let score = |key: usize| prefixes[0].0[(kv_head * prefix_len + key) * d..][..d].iter().zip(query).map(|(k, q)| k * q).sum::<f32>() / (d as f32).sqrt();
            let first_step = (0..step).map(score).fold(f32::MIN, f32::max);
            (step..prefix_len).map(score).fold(f32::MIN, f32::max) > first_step + tally_shaders::RESCALE_SLACK
        })
        .count();
    assert!(passing * 2 > rows, "only {passing} of {rows} rows pass their first step's maximum by the slack");
    let expected = case.expected(seed);
    let shape = TileShape::default();
    for kernel in [
        AttentionKernel::Flash(shape),
        AttentionKernel::Flash(shape.with_stages(1).expect("a built shape")),
        AttentionKernel::Flash(shape.with_stages(3).expect("a built shape")),
        AttentionKernel::Flash(shape.with_warp_rows(32).expect("64 rows hold warps of 32")),
        AttentionKernel::Flash(TileShape::new(32, 32).expect("a built shape")),
    ] {
        assert_close(&case.kernel::<f32>(seed, kernel), &expected, 1e-4, &format!("{kernel:?} ({}), {}", case.launched::<f32>(kernel), case.name()));
    }
}

fn attention_with_the_prefix_walk_cut_into_parts() {
    // `--prefix-splits`: each tile's prefix walk over `parts` cubes, each part's rows written
    // normalised with their log-sum-exp and merged. Parts of 129 steps (2,050 keys at 16 a
    // step), of a few (37 and 130 keys), and past a short prefix's steps: a 1-token prefix in
    // 5 parts leaves three parts with no key at all and the last with the own keys alone, an
    // empty prefix (a query's own prefill) every part but the last. Rising keys: the later parts'
    // rows sum from far larger maxima than the earlier ones', so the merge's weights differ by
    // orders of magnitude. Then one head of 16 (4 vectors a token): 63, 64 and 65 tokens, just
    // under, at and past one 64-row tile and the merge's 256-unit cube, on prefixes of 1, 2 and
    // 3 steps, just under, at and past 2 and 3 parts. One, two and three stages.
    let edge = |prefix: usize, tokens: usize| Case { groups: vec![(prefix, vec![tokens])], q_heads: 1, kv_heads: 1, head_dim: 16, ..Default::default() };
    let cases = [
        Case { groups: vec![(1, vec![1, 17, 65, 2])], q_heads: 4, kv_heads: 4, head_dim: 16, ..Default::default() },
        Case { groups: vec![(2050, vec![20, 7, 65, 1, 33])], q_heads: 8, kv_heads: 2, head_dim: 64, ..Default::default() },
        Case { groups: vec![(130, vec![3, 150, 5]), (0, vec![5, 1]), (37, vec![64, 16, 17])], q_heads: 4, kv_heads: 2, head_dim: 16, ..Default::default() },
        Case { groups: vec![(300, vec![20, 7, 1]), (40, vec![3])], q_heads: 4, kv_heads: 2, head_dim: 32, rising_keys: true },
        edge(16, 63),
        edge(32, 64),
        edge(33, 65),
    ];
    for (seed, case) in cases.into_iter().enumerate() {
        let seed = 101 + seed as u64;
        let expected = case.expected(seed);
        for parts in [2, 3, 5] {
            for stages in [1, 2, 3] {
                let shape = TileShape::default().with_stages(stages).expect("a built shape").with_splits(PrefixSplits::Parts(parts));
                let kernel = AttentionKernel::Flash(shape);
                let launched = case.launched::<f32>(kernel);
                assert!(launched.ends_with(&format!("prefix in {parts} parts")), "{launched}");
                assert_close(&case.kernel::<f32>(seed, kernel), &expected, 1e-4, &format!("{kernel:?} ({launched}), {}", case.name()));
            }
        }
        // `auto` needs the device's SM count, which wgpu does not give: the walk stays whole.
        let auto = AttentionKernel::Flash(TileShape::default().with_splits(PrefixSplits::Auto));
        assert_close(&case.kernel::<f32>(seed, auto), &expected, 1e-4, &format!("{auto:?}, {}", case.name()));
    }
}

fn attention_through_the_fusion_backend_matches() {
    // The default `Wgpu`/`Cuda` types go through Burn's fusion layer: the wiring in tally-model.
    let case = Case { groups: vec![(40, vec![3, 9]), (7, vec![18])], q_heads: 4, kv_heads: 2, head_dim: 32, ..Default::default() };
    for route in [AttentionRoute::Kernel, AttentionRoute::Tiled(TileShape::default()), AttentionRoute::Flash(TileShape::default())] {
        assert_close(&case.routed_on::<Fused>(7, route), &case.expected(7), 1e-4, &format!("fused, {route:?}"));
    }
}

/// Residual add + RMSNorm against float64 on the host, with and without the add, at row widths
/// just under, at and past the kernel's unit counts (a power of two up to 256 units a row, two
/// vectors each), read in vectors of 4, 2 and 1 (widths 1,024, 18, 257), rows past the largest
/// one-dimensional grid (a cube a row), a 3-D input (the q/k norms' `[tokens, heads,
/// head_dim]`) and bfloat16-sized values.
fn add_rms_norm_matches_float64() {
    let eps = 1e-6;
    for (seed, &(rows, width)) in [(1, 1), (3, 15), (5, 16), (2, 17), (4, 18), (7, 255), (4, 256), (3, 257), (9, 576), (2, 1024), (2, 2048), (3, 4097), (600, 64), (70_001, 8)].iter().enumerate() {
        let seed = 300 + seed as u64;
        let (x, delta, gain) = (random(seed, rows * width, 3.0), random(seed + 1, rows * width, 3.0), random(seed + 2, width, 1.5));
        let mut expected_sum = vec![0f32; rows * width];
        let mut expected_normed = vec![0f32; rows * width];
        let mut expected_plain = vec![0f32; rows * width];
        for row in 0..rows {
            let range = row * width..(row + 1) * width;
            let sum: Vec<f64> = range.clone().map(|i| x[i] as f64 + delta[i] as f64).collect();
            let rms = |values: &[f64]| (values.iter().map(|v| v * v).sum::<f64>() / width as f64 + eps).sqrt();
            let plain: Vec<f64> = range.clone().map(|i| x[i] as f64).collect();
            let (rms_sum, rms_plain) = (rms(&sum), rms(&plain));
            for (j, i) in range.enumerate() {
                expected_sum[i] = sum[j] as f32;
                expected_normed[i] = (sum[j] / rms_sum * gain[j] as f64) as f32;
                expected_plain[i] = (plain[j] / rms_plain * gain[j] as f64) as f32;
            }
        }
        let what = format!("{rows} rows of {width}");
        let gain_tensor = cube(tensor::<Gpu, 1>(&gain, [width]));
        let (sum, normed) = tally_shaders::add_rms_norm(cube(tensor::<Gpu, 2>(&x, [rows, width])), Some(cube(tensor::<Gpu, 2>(&delta, [rows, width]))), gain_tensor.clone(), eps);
        let host_of = |t| host(Tensor::<Gpu, 2>::from_primitive(TensorPrimitive::Float(t)));
        assert_close(&host_of(sum), &expected_sum, 1e-6, &format!("sum, {what}"));
        assert_close(&host_of(normed), &expected_normed, 1e-5, &format!("add + norm, {what}"));
        let (_, normed) = tally_shaders::add_rms_norm(cube(tensor::<Gpu, 2>(&x, [rows, width])), None, gain_tensor, eps);
        assert_close(&host_of(normed), &expected_plain, 1e-5, &format!("norm alone, {what}"));
    }
    // The q/k norms: rows are (token, head) pairs of a 3-D tensor.
    let (tokens, heads, head_dim) = (37, 3, 64);
    let x = random(320, tokens * heads * head_dim, 2.0);
    let gain = random(321, head_dim, 1.0);
    let expected = tally_model::elementwise::rms_norm(tensor::<Reference, 3>(&x, [tokens, heads, head_dim]), &tensor(&gain, [head_dim]), eps);
    let (_, normed) = tally_shaders::add_rms_norm(cube(tensor::<Gpu, 3>(&x, [tokens, heads, head_dim])), None, cube(tensor::<Gpu, 1>(&gain, [head_dim])), eps);
    assert_close(&host(Tensor::<Gpu, 3>::from_primitive(TensorPrimitive::Float(normed))), &host(expected), 1e-5, "q/k norm shape");
}

/// The q/k norm + RoPE (and RoPE alone) against float64 on the host: head sizes 16, 24, 64 and
/// 128 (half a head in vectors of 4: 2, 3, 8 and 16 units a row), 20 (vectors of 2) and 6 (of
/// 1); rows under a 256-unit cube, exactly one (64 × 2 heads of 16: 128 rows a cube), and past
/// it with the last one part full (300 × 2 of 16; 37 × 3 of 24: 85 rows a cube); heads read where they lie in a wider q/k/v projection, first
/// (as the queries) or after as many columns (as the keys, at an offset); positions in the
/// thousands.
fn norm_rope_matches_float64() {
    let eps = 1e-6;
    let cases = [(5, 2, 16), (64, 2, 16), (300, 2, 16), (37, 3, 24), (20, 4, 64), (9, 2, 128), (11, 3, 20), (13, 5, 6)];
    for (seed, &(tokens, heads, head_dim)) in cases.iter().enumerate() {
        let seed = 500 + seed as u64;
        let width = heads * head_dim;
        // The q/k/v projection: two blocks of these heads' columns.
        let projection = random(seed, tokens * 2 * width, 2.0);
        let gain = random(seed + 1, head_dim, 1.5);
        let half = head_dim / 2;
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for token in 0..tokens {
            let position = (token * 97 + 3) as f64;
            let angles: Vec<f64> = (0..half).map(|i| position * 10_000f64.powf(-(i as f64) / half as f64)).collect();
            cos.extend(angles.iter().chain(&angles).map(|a| a.cos() as f32));
            sin.extend(angles.iter().chain(&angles).map(|a| a.sin() as f32));
        }
        for (norm, column) in [(true, 0), (false, 0), (true, width)] {
            let mut expected = vec![0f32; tokens * width];
            for token in 0..tokens {
                for head in 0..heads {
                    let x: Vec<f64> = (0..head_dim).map(|e| projection[token * 2 * width + column + head * head_dim + e] as f64).collect();
                    let rms = (x.iter().map(|v| v * v).sum::<f64>() / head_dim as f64 + eps).sqrt();
                    let n: Vec<f64> = (0..head_dim).map(|e| if norm { x[e] / rms * gain[e] as f64 } else { x[e] }).collect();
                    for e in 0..head_dim {
                        let rotated = if e < half { -n[e + half] } else { n[e - half] };
                        let table = token * head_dim + e;
                        expected[(token * heads + head) * head_dim + e] = (n[e] * cos[table] as f64 + rotated * sin[table] as f64) as f32;
                    }
                }
            }
            let x = tensor::<Gpu, 2>(&projection, [tokens, 2 * width]).narrow(1, column, width).reshape([tokens, heads, head_dim]);
            let gain = norm.then(|| cube(tensor::<Gpu, 1>(&gain, [head_dim])));
            let output = tally_shaders::norm_rope(cube(x), gain, cube(tensor::<Gpu, 3>(&cos, [tokens, 1, head_dim])), cube(tensor::<Gpu, 3>(&sin, [tokens, 1, head_dim])), eps);
            let what = format!("{tokens} tokens × {heads} heads × {head_dim} from column {column}, norm {norm}");
            assert_close(&host(Tensor::<Gpu, 3>::from_primitive(TensorPrimitive::Float(output))), &expected, 1e-5, &what);
        }
    }
}

/// `silu(gate) · up` from the fused projection against float64 on the host, with vector counts
/// just under, at and past the kernel's 256 units a cube (vectors of 1: 255, 257; of 4: 1,024,
/// 1,028), across rows, and in vectors of 2 (6).
fn silu_mul_matches_float64() {
    for (seed, &(rows, intermediate)) in [(1, 1), (1, 255), (1, 256), (1, 257), (1, 1024), (1, 1028), (3, 85), (5, 6), (7, 1536), (300, 17)].iter().enumerate() {
        let gate_up = random(400 + seed as u64, rows * 2 * intermediate, 6.0);
        let expected: Vec<f32> = (0..rows * intermediate)
            .map(|i| {
                let (row, column) = (i / intermediate, i % intermediate);
                let gate = gate_up[row * 2 * intermediate + column] as f64;
                let up = gate_up[row * 2 * intermediate + intermediate + column] as f64;
                (gate / (1.0 + (-gate).exp()) * up) as f32
            })
            .collect();
        let output = tally_shaders::silu_mul(cube(tensor::<Gpu, 2>(&gate_up, [rows, 2 * intermediate])));
        assert_close(&host(Tensor::<Gpu, 2>::from_primitive(TensorPrimitive::Float(output))), &expected, 1e-5, &format!("{rows} rows of {intermediate}"));
    }
}

/// The cascade's row softmax with its log-sum-exp against float64 on the host: row widths just
/// under, at and past the kernel's unit counts (a power of two up to 256 a row), S1's 2,020-key
/// prefix, and rows past the largest one-dimensional grid (a cube a row: S1's prefix part has
/// 160,000); scores up to ±40 (an exponential of them overflows float32 unless the
/// maximum comes off first) and masked (−∞) keys as the causal bias makes them, every row
/// keeping one finite score.
fn softmax_lse_matches_float64() {
    for (seed, &(rows, width)) in [(1, 1), (3, 2), (5, 15), (2, 16), (4, 17), (7, 255), (3, 256), (2, 257), (9, 2020), (2, 5000), (600, 20), (65_537, 3)].iter().enumerate() {
        let mut scores = random(700 + seed as u64, rows * width, 40.0);
        for row in 0..rows {
            // Row r masks its keys past r % width: the causal bias's pattern.
            for key in row % width + 1..width {
                scores[row * width + key] = f32::NEG_INFINITY;
            }
        }
        let (mut expected_weights, mut expected_lse) = (vec![0f32; rows * width], vec![0f32; rows]);
        for row in 0..rows {
            let values: Vec<f64> = scores[row * width..(row + 1) * width].iter().map(|&v| v as f64).collect();
            let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + values.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
            expected_lse[row] = lse as f32;
            for (key, value) in values.iter().enumerate() {
                expected_weights[row * width + key] = (value - lse).exp() as f32;
            }
        }
        let (weights, lse) = tally_shaders::softmax_lse(cube(tensor::<Gpu, 2>(&scores, [rows, width])), burn::tensor::DType::F32);
        let host_of = |t| host(Tensor::<Gpu, 2>::from_primitive(TensorPrimitive::Float(t)));
        let what = format!("{rows} rows of {width}");
        assert_close(&host_of(weights), &expected_weights, 1e-5, &format!("weights, {what}"));
        assert_close(&host_of(lse), &expected_lse, 1e-5, &format!("log-sum-exp, {what}"));
    }
}

/// Label log-probabilities over a vocabulary of three chunks (the last one partial), labels in
/// the first, middle and last chunk and on a chunk edge; rows with different label counts.
fn label_logprobs_stream_the_vocabulary() {
    let (rows, hidden, vocab) = (37, 48, 2 * tally_model::lm_head::VOCAB_CHUNK + 1000);
    let hidden_values = random(11, rows * hidden, 1.0);
    let head_values = random(12, vocab * hidden, 0.5);
    let first: &[u32] = &[0, 16_383, 16_384, vocab as u32 - 1];
    let second: &[u32] = &[9_454, 2_753];
    let label_rows: Vec<&[u32]> = (0..rows).map(|r| if r % 3 == 0 { second } else { first }).collect();
    let labels = LabelTable::new(&label_rows);

    let expected = host(label_logprobs::<Reference>(tensor(&hidden_values, [rows, hidden]), &TokenTable::Float(tensor(&head_values, [vocab, hidden])), &labels));

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

/// Rows with more labels than the label kernel's cube has units (256): every label of every row
/// is scored, in both softmax modes, through both CubeCL backend types, at 1, 255, 256, 257,
/// 1,000 and the server's default maximum (4,096) labels, against the CPU. Until the kernel
/// looped over its label slots, each label past the 256th came back as probability 0.
fn every_label_is_scored_past_the_kernels_units() {
    let (rows, hidden, vocab) = (5, 16, 2 * tally_model::lm_head::VOCAB_CHUNK + 1000);
    let hidden_values = random(13, rows * hidden, 1.0);
    let head_values = random(14, vocab * hidden, 0.5);
    let (cpu_hidden, cpu_head) = (tensor::<Reference, 2>(&hidden_values, [rows, hidden]), tensor::<Reference, 2>(&head_values, [vocab, hidden]));
    for count in [1, 255, 256, 257, 1000, 4096] {
        // Distinct ids spread over the whole vocabulary (7,919 is prime, vocab is not its multiple);
        // the last row has fewer labels than the others.
        let ids: Vec<u32> = (0..count).map(|j| ((j * 7_919 + 3) % vocab) as u32).collect();
        let short = &ids[..count.div_ceil(2)];
        let label_rows: Vec<&[u32]> = (0..rows).map(|r| if r == rows - 1 { short } else { &ids[..] }).collect();
        let labels = LabelTable::new(&label_rows);
        let full_vocab = host(label_logprobs::<Reference>(cpu_hidden.clone(), &TokenTable::Float(cpu_head.clone()), &labels));
        let logits = host(tally_model::lm_head::label_logits::<Reference>(cpu_hidden.clone(), &TokenTable::Float(cpu_head.clone()), &labels));
        assert!(full_vocab.iter().all(|v| v.is_finite() && *v > -100.0), "{count} labels: the reference is finite");

        let what = |path: &str| format!("{count} labels, {path}");
        let (h, w) = (tensor::<Gpu, 2>(&hidden_values, [rows, hidden]), tensor::<Gpu, 2>(&head_values, [vocab, hidden]));
        assert_close(&host(Gpu::label_logprobs(h.clone(), w.clone(), &labels)), &full_vocab, 1e-4, &what("full vocabulary, cube backend"));
        assert_close(&host(tally_model::lm_head::label_logits::<Gpu>(h, &TokenTable::Float(w), &labels)), &logits, 1e-4, &what("label logits, cube backend"));
        let (h, w) = (tensor::<Fused, 2>(&hidden_values, [rows, hidden]), tensor::<Fused, 2>(&head_values, [vocab, hidden]));
        assert_close(&host(Fused::label_logprobs(h.clone(), w.clone(), &labels)), &full_vocab, 1e-4, &what("full vocabulary, fusion"));
        assert_close(&host(tally_model::lm_head::label_logits::<Fused>(h, &TokenTable::Float(w), &labels)), &logits, 1e-4, &what("label logits, fusion"));
    }
}

/// More label cells (4,097 rows × 4,096 labels) than one grid dimension of 256-unit cubes
/// covers (65,535 × 256): the finishing kernel's grid folds into two dimensions.
fn label_logprobs_past_the_largest_one_dimensional_grid() {
    let (rows, hidden, vocab) = (4_097, 8, 4_096);
    let hidden_values = random(15, rows * hidden, 1.0);
    let head_values = random(16, vocab * hidden, 0.5);
    let ids: Vec<u32> = (0..vocab as u32).rev().collect();
    let labels = LabelTable::new(&vec![&ids[..]; rows]);
    assert!(rows * labels.width() > 65_535 * 256);
    let expected = host(label_logprobs::<Reference>(tensor(&hidden_values, [rows, hidden]), &TokenTable::Float(tensor(&head_values, [vocab, hidden])), &labels));
    let got = host(<Gpu>::label_logprobs(tensor(&hidden_values, [rows, hidden]), tensor(&head_values, [vocab, hidden]), &labels));
    assert_close(&got, &expected, 1e-4, "16.8 M label cells");
}

/// The cascade in Burn's ops, and with tally's softmax kernel (the elementwise kernels' route),
/// on the cube backend and through fusion, against float64.
fn the_cascade_on_the_gpu_matches_the_cpu() {
    // Items of different lengths, padded to the longest inside the cascade. The single KV head
    // with 8 items was off by 0.5 through fusion (burn-fusion 0.21 mis-fused the softmax's
    // division after the matmul; see `softmax_times_values`); head_dim 24 against a long prefix
    // was off by 0.5 on both (cubek's `DoubleUnit` matmul with an inner dimension of 24; see
    // `matmuls_with_an_odd_multiple_of_8_inside_are_right`). The 600-key prefix is that defect's
    // other shape (weights · values).
    let cases = [
        Case { groups: vec![(1500, vec![1]), (1000, vec![2])], q_heads: 4, kv_heads: 1, head_dim: 24, ..Default::default() },
        Case { groups: vec![(600, vec![5, 3])], q_heads: 4, kv_heads: 2, head_dim: 16, ..Default::default() },
        Case { groups: vec![(5, vec![1, 2, 3])], q_heads: 4, kv_heads: 2, head_dim: 16, ..Default::default() },
        Case { groups: vec![(50, vec![1, 2, 3, 4, 5, 6, 7, 8])], q_heads: 4, kv_heads: 2, head_dim: 16, ..Default::default() },
        Case { groups: vec![(50, vec![1, 2, 3, 4, 5, 6, 7, 8])], q_heads: 2, kv_heads: 1, head_dim: 16, ..Default::default() },
        Case { groups: vec![(9, vec![3, 40, 5]), (0, vec![2, 2])], q_heads: 4, kv_heads: 1, head_dim: 32, ..Default::default() },
    ];
    for case in cases {
        let expected = case.expected(11);
        assert_close(&case.plain_on::<Gpu>(11), &expected, 1e-4, &format!("cube backend, {}", case.name()));
        assert_close(&case.plain_on::<Fused>(11), &expected, 1e-4, &format!("fusion, {}", case.name()));
        assert_close(&case.routed_on::<Gpu>(11, AttentionRoute::Cascade), &expected, 1e-4, &format!("cube backend, softmax kernel, {}", case.name()));
        assert_close(&case.routed_on::<Fused>(11, AttentionRoute::Cascade), &expected, 1e-4, &format!("fusion, softmax kernel, {}", case.name()));
    }
}

/// `lhs · rhsᵀ` (or `lhs · rhs`) in float64 on the host, batched over the first dimension.
fn host_matmul(lhs: &[f32], rhs: &[f32], [batch, m, k, n]: [usize; 4], rhs_transposed: bool) -> Vec<f32> {
    let mut out = Vec::with_capacity(batch * m * n);
    for b in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let rhs_at = |l: usize| if rhs_transposed { rhs[(b * n + j) * k + l] } else { rhs[(b * k + l) * n + j] };
                out.push((0..k).map(|l| lhs[(b * m + i) * k + l] as f64 * rhs_at(l) as f64).sum::<f64>() as f32);
            }
        }
    }
    out
}

/// `[batch, m, k]` and `[batch, k, n]`, the latter as a transposed view of `[batch, n, k]` if asked.
fn matmul_operands<B: burn::tensor::backend::Backend>(lhs: &[f32], rhs: &[f32], [batch, m, k, n]: [usize; 4], rhs_transposed: bool) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let rhs = if rhs_transposed { tensor::<B, 3>(rhs, [batch, n, k]).swap_dims(1, 2) } else { tensor(rhs, [batch, k, n]) };
    (tensor(lhs, [batch, m, k]), rhs)
}

/// `B::matmul` (and `f32_matmul` if `direct`) against a float64 product for each case:
/// ([batch, m, k, n], right-hand side transposed).
fn check_matmuls(cases: &[([usize; 4], bool)], direct: bool) {
    for (seed, &([batch, m, k, n], rhs_transposed)) in cases.iter().enumerate() {
        let lhs = random(30 + seed as u64, batch * m * k, 1.0);
        let rhs = random(40 + seed as u64, batch * k * n, 1.0);
        let expected = host_matmul(&lhs, &rhs, [batch, m, k, n], rhs_transposed);
        let what = format!("[{batch}, {m}, {k}] x [{batch}, {k}, {n}], transposed {rhs_transposed}");

        let (a, b) = matmul_operands::<Gpu>(&lhs, &rhs, [batch, m, k, n], rhs_transposed);
        if direct {
            let product = tally_shaders::f32_matmul(cube(a.clone()), cube(b.clone()));
            assert_close(&host(Tensor::<Gpu, 3>::from_primitive(TensorPrimitive::Float(product))), &expected, 2e-5, &format!("f32_matmul, {what}"));
        }
        assert_close(&host(Gpu::matmul(a, b)), &expected, 2e-5, &format!("cube backend, {what}"));

        let (a, b) = matmul_operands::<Fused>(&lhs, &rhs, [batch, m, k, n], rhs_transposed);
        assert_close(&host(Fused::matmul(a, b)), &expected, 2e-5, &format!("fusion, {what}"));
    }
}

/// The model's matmuls in float32 are float32: `f32_matmul` itself, and `ScoringBackend::matmul`
/// on both CubeCL backend types (which take it where the device has tf32, as on CUDA). tf32
/// rounds operands to 10 mantissa bits, ~3e-4 relative here: far outside the tolerance.
fn float32_matmuls_stay_float32() {
    // A linear, an LM-head chunk (transposed view), the cascade's batched scores (head_dim 24)
    // and weights · values (1,000 keys).
    check_matmuls(&[([1, 37, 576, 200], false), ([1, 37, 48, 1000], true), ([2, 28, 24, 700], true), ([2, 28, 1000, 64], false)], true);
}

/// The cuBLASLt route (`--matmul cublas`, CUDA only), with its GEMMs on CubeCL's stream and
/// host-synced: called directly, and as `ScoringBackend::matmul` on both CubeCL backend types
/// with the route picked, float32 kept float32 (`CUBLAS_COMPUTE_32F`), on the shapes above plus
/// rows, columns and inner dimensions of one; then GEMMs chained with CubeCL kernels and nothing
/// read back in between.
#[cfg(feature = "cuda")]
fn cublas_matmuls_match_a_float64_product() {
    use tally_shaders::cublas::{set_ordering, CublasOrdering};
    assert!(tally_shaders::cublas::available(), "libcublasLt must load on a CUDA machine");
    for ordering in [CublasOrdering::Stream, CublasOrdering::HostSync] {
        set_ordering(ordering);
        cublas_products(ordering);
        cublas_chain(ordering);
        if ordering == CublasOrdering::Stream {
            // The chain's 6 GEMMs are in the profile, timed by their events: one whose events
            // were never read would leave the shape's time at zero, and its rate infinite.
            let table = tally_shaders::cublas::profile_table().expect("GEMMs ran");
            assert!(table.starts_with("cuBLASLt GEMMs (on CubeCL's stream"), "{table}");
            let row = table.lines().find(|line| line.starts_with("| 300 | 96 | 96 | 1 |")).unwrap_or_else(|| panic!("the chain's shape: {table}"));
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            assert_eq!(cells[5], "6", "{table}");
            assert!(cells[7].parse::<f64>().is_ok_and(f64::is_finite), "{table}");
        }
    }
    set_ordering(CublasOrdering::Stream);
    cublas_algorithm_search();
}

/// `--cublas-algos`: a shape class's first GEMM times the heuristic's first candidates on its
/// own buffers and keeps the fastest, whose product is still the product; a later GEMM of the
/// class (another `m` under the same power of two) reuses the kept algorithm without a search.
/// On both orderings, with shapes no other test multiplies (plans are cached for the process).
#[cfg(feature = "cuda")]
fn cublas_algorithm_search() {
    use tally_shaders::cublas::{profile_table, set_algo_candidates, set_ordering, CublasOrdering};
    set_algo_candidates(4);
    for (ordering, n) in [(CublasOrdering::Stream, 520), (CublasOrdering::HostSync, 264)] {
        set_ordering(ordering);
        for (seed, m) in [(90, 300), (91, 400)] {
            let (batch, k) = (1, 136);
            let lhs = random(seed, batch * m * k, 1.0);
            let rhs = random(seed + 10, batch * k * n, 1.0);
            let expected = host_matmul(&lhs, &rhs, [batch, m, k, n], true);
            let (a, b) = matmul_operands::<Gpu>(&lhs, &rhs, [batch, m, k, n], true);
            let product = tally_shaders::cublas::matmul(cube(a), cube(b), burn::tensor::DType::F32).expect("cuBLASLt multiplies these shapes");
            assert_close(&host(Tensor::<Gpu, 3>::from_primitive(TensorPrimitive::Float(product))), &expected, 2e-5, &format!("cuBLASLt after an algorithm search, m {m}, n {n}, {ordering:?}"));
        }
        let table = profile_table().expect("GEMMs ran");
        let searched = |m: usize| table.lines().skip_while(|line| !line.starts_with("cuBLASLt algorithm searches")).any(|line| line.starts_with(&format!("| {m} | {n} | 136 | 1 |")));
        assert!(searched(300), "the class's first GEMM is searched ({ordering:?}):\n{table}");
        assert!(!searched(400), "the class's second GEMM reuses the kept algorithm ({ordering:?}):\n{table}");
    }
    set_ordering(CublasOrdering::Stream);
    set_algo_candidates(1);
}

#[cfg(feature = "cuda")]
fn cublas_products(ordering: tally_shaders::cublas::CublasOrdering) {
    use tally_shaders::{set_matmul_route, MatmulRoute};
    let cases = [([1, 37, 576, 200], false), ([1, 37, 48, 1000], true), ([2, 28, 24, 700], true), ([2, 28, 1000, 64], false), ([1, 1, 64, 33], false), ([3, 17, 1, 5], true), ([2, 9, 40, 1], false)];
    for (seed, &([batch, m, k, n], rhs_transposed)) in cases.iter().enumerate() {
        let lhs = random(50 + seed as u64, batch * m * k, 1.0);
        let rhs = random(60 + seed as u64, batch * k * n, 1.0);
        let expected = host_matmul(&lhs, &rhs, [batch, m, k, n], rhs_transposed);
        let what = format!("[{batch}, {m}, {k}] x [{batch}, {k}, {n}], transposed {rhs_transposed}, {ordering:?}");
        let (a, b) = matmul_operands::<Gpu>(&lhs, &rhs, [batch, m, k, n], rhs_transposed);
        let product = tally_shaders::cublas::matmul(cube(a.clone()), cube(b.clone()), burn::tensor::DType::F32).expect("cuBLASLt multiplies these shapes");
        assert_close(&host(Tensor::<Gpu, 3>::from_primitive(TensorPrimitive::Float(product))), &expected, 2e-5, &format!("cuBLASLt, {what}"));

        let _cubecl_after = CubeclAfter;
        set_matmul_route(MatmulRoute::Cublas);
        assert_close(&host(Gpu::matmul(a, b)), &expected, 2e-5, &format!("cube backend on cuBLASLt, {what}"));
        let (a, b) = matmul_operands::<Fused>(&lhs, &rhs, [batch, m, k, n], rhs_transposed);
        assert_close(&host(Fused::matmul(a, b)), &expected, 2e-5, &format!("fusion on cuBLASLt, {what}"));
    }
}

/// `x ← (x/2 + 1/4) · Wᵢ` six times through `ScoringBackend::matmul` on cuBLASLt, read back
/// only at the end: each GEMM must see the CubeCL kernel before it and the next kernel must see
/// the GEMM, while the buffers of dropped steps are handed out again. Against float64.
#[cfg(feature = "cuda")]
fn cublas_chain(ordering: tally_shaders::cublas::CublasOrdering) {
    use tally_shaders::{set_matmul_route, MatmulRoute};
    let (rows, width, steps) = (300, 96, 6);
    let weights: Vec<Vec<f32>> = (0..steps).map(|step| random(80 + step as u64, width * width, 0.2)).collect();
    let mut expected = random(79, rows * width, 1.0);
    let _cubecl_after = CubeclAfter;
    set_matmul_route(MatmulRoute::Cublas);
    let mut x = tensor::<Gpu, 2>(&expected, [rows, width]);
    for weight in &weights {
        let scaled: Vec<f32> = expected.iter().map(|v| v * 0.5 + 0.25).collect();
        expected = host_matmul(&scaled, weight, [1, rows, width, width], false);
        x = Gpu::matmul(x.mul_scalar(0.5).add_scalar(0.25), tensor(weight, [width, width]));
    }
    assert_close(&host(x), &expected, 1e-4, &format!("{steps} GEMMs chained with CubeCL kernels, {ordering:?}"));
}

/// tally's register-block matmul (`--matmul block`) against a float64 product, for every block
/// it has: rows and columns of one, just under, at and past the block; just under, at and past
/// the blocks one cube takes, and many cubes; inner dimensions of one and of a model, the
/// right-hand side as a weight and as the LM head's transposed view. Then through
/// `ScoringBackend::matmul` on both CubeCL backend types with the route picked, a batched product
/// (which the kernel declines) included.
fn block_matmuls_match_a_float64_product_at_every_block_edge() {
    use tally_shaders::{block_matmul, set_matmul_route, MatmulRoute, RegisterBlock};
    let operands = |lhs: &[f32], rhs: &[f32], [m, k, n]: [usize; 3], rhs_transposed: bool| {
        let rhs = if rhs_transposed { tensor::<Gpu, 2>(rhs, [n, k]).transpose() } else { tensor(rhs, [k, n]) };
        (tensor::<Gpu, 2>(lhs, [m, k]), rhs)
    };
    let mut seed = 70;
    for block in RegisterBlock::CANDIDATES {
        let (rows, columns) = (block.rows, block.columns);
        let edges = |size: usize| [1, size - 1, size, size + 1];
        let mut shapes: Vec<[usize; 3]> = edges(rows).into_iter().flat_map(|m| edges(columns).map(|n| [m, 9, n])).collect();
        shapes.extend([[37, 576, 200], [rows * 9 + 1, 1, columns * 70 + 3], [16, 1536, 576]]);
        // One row of blocks just under, at and past the blocks one cube takes (64 units).
        shapes.extend([63, 64, 65].map(|blocks| [rows, 5, columns * blocks]));
        for [m, k, n] in shapes {
            for rhs_transposed in [false, true] {
                seed += 1;
                let (lhs, rhs) = (random(seed, m * k, 1.0), random(seed + 500, k * n, 1.0));
                let expected = host_matmul(&lhs, &rhs, [1, m, k, n], rhs_transposed);
                let (a, b) = operands(&lhs, &rhs, [m, k, n], rhs_transposed);
                let product = block_matmul(&cube(a), &cube(b), block).expect("2-D float32 operands");
                let what = format!("block {rows}x{columns}: [{m}, {k}] x [{k}, {n}], transposed {rhs_transposed}");
                assert_close(&host(Tensor::<Gpu, 2>::from_primitive(TensorPrimitive::Float(product))), &expected, 2e-5, &what);
            }
        }
    }
    let _cubecl_after = CubeclAfter;
    set_matmul_route(MatmulRoute::Block);
    for (i, ([m, k, n], rhs_transposed)) in [([37, 576, 200], false), ([5, 576, 1000], true)].into_iter().enumerate() {
        let (lhs, rhs) = (random(90 + i as u64, m * k, 1.0), random(95 + i as u64, k * n, 1.0));
        let expected = host_matmul(&lhs, &rhs, [1, m, k, n], rhs_transposed);
        let (a, b) = operands(&lhs, &rhs, [m, k, n], rhs_transposed);
        let what = format!("[{m}, {k}] x [{k}, {n}], transposed {rhs_transposed}");
        assert_close(&host(Gpu::matmul(a, b)), &expected, 2e-5, &format!("cube backend on the block route, {what}"));
        let rhs = if rhs_transposed { tensor::<Fused, 2>(&rhs, [n, k]).transpose() } else { tensor(&rhs, [k, n]) };
        assert_close(&host(Fused::matmul(tensor::<Fused, 2>(&lhs, [m, k]), rhs)), &expected, 2e-5, &format!("fusion on the block route, {what}"));
    }
    check_matmuls(&[([1, 37, 576, 200], false), ([1, 37, 48, 1000], true), ([1, 9, 8, 17], false), ([2, 28, 24, 70], true)], false);
}

/// The page's checked matmul choice: among candidates that include one writing zeros, one
/// writing nothing (handing back pooled memory, after a right candidate) and one leaving a term
/// out of every sum (an error of ~1/576 of the sum of the products' magnitudes),
/// only the right ones are timed and the chosen one is the fastest of them. Then the real
/// candidates are tuned on SmolLM2's projection and head shapes, and every kernel found right,
/// forced through `ScoringBackend::matmul` on the block route, matches a float64 product at rows
/// inside the class; the chosen one serves the class.
fn checked_matmul_choice_keeps_only_right_candidates() {
    use burn_cubecl::ops::numeric::{empty_device_contiguous_dtype, zeros_client};
    use burn_cubecl::tensor::CubeTensor;
    use tally_shaders::matmul_choice::{ClassDtype, MatmulShape};
    use tally_shaders::matmul_tuning::{time_checked, tune_matmul, Candidate, Outcome};
    use tally_shaders::{block_matmul, force_matmul, matmul_choices, set_matmul_route, MatmulKernel, MatmulRoute, RegisterBlock};
    let _cubecl_after = CubeclAfter;
    let device = Default::default();
    let block = |lhs: &CubeTensor<GpuRuntime>, rhs: &CubeTensor<GpuRuntime>| block_matmul(lhs, rhs, RegisterBlock::DEFAULT);
    let zeros = |lhs: &CubeTensor<GpuRuntime>, rhs: &CubeTensor<GpuRuntime>| {
        let shape = [lhs.meta.shape()[0], rhs.meta.shape()[1]];
        Some(zeros_client(lhs.client.clone(), lhs.device.clone(), shape.into(), lhs.dtype))
    };
    let last_term_left_out = |lhs: &CubeTensor<GpuRuntime>, rhs: &CubeTensor<GpuRuntime>| {
        let inner = lhs.meta.shape()[1] - 1;
        let narrowed = |t: &CubeTensor<GpuRuntime>, dim| cube(Tensor::<Gpu, 2>::from_primitive(TensorPrimitive::Float(t.clone())).narrow(dim, 0, inner));
        block_matmul(&narrowed(lhs, 1), &narrowed(rhs, 0), RegisterBlock { rows: 4, columns: 4 })
    };
    // Hands back memory from the pool unwritten: after a right candidate, where its product may lie.
    let writes_nothing = |lhs: &CubeTensor<GpuRuntime>, rhs: &CubeTensor<GpuRuntime>| {
        let shape = [lhs.meta.shape()[0], rhs.meta.shape()[1]];
        Some(empty_device_contiguous_dtype(lhs.client.clone(), lhs.device.clone(), shape.into(), lhs.dtype))
    };
    let candidates: Vec<Candidate<GpuRuntime>> =
        vec![("zeros".into(), &zeros), ("block-8x8".into(), &block), ("writes nothing".into(), &writes_nothing), ("last term left out".into(), &last_term_left_out)];
    let qkv = MatmulShape { rows: 16, inner: 576, columns: 960, rhs_transposed: false, dtype: ClassDtype::F32 };
    let trial = futures_lite::future::block_on(time_checked::<GpuRuntime>(&device, qkv, &candidates));
    let outcomes: Vec<&Outcome> = trial.trials.iter().map(|t| &t.outcome).collect();
    assert!(matches!(outcomes[..], [Outcome::Wrong { .. }, Outcome::Right { .. }, Outcome::Wrong { .. }, Outcome::Wrong { .. }]), "{outcomes:?}");
    assert_eq!(trial.chosen, Some(1));

    let head = MatmulShape { rows: 64, inner: 576, columns: 1000, rhs_transposed: true, dtype: ClassDtype::F32 };
    set_matmul_route(MatmulRoute::Block);
    // An inner width that is an odd multiple of 8 with a transposed right-hand side: cubek 0.2's
    // `DoubleUnit` multiplies it wrong (see `autotuned_matmul`).
    let odd_eights = MatmulShape { rows: 16, inner: 24, columns: 1000, rhs_transposed: true, dtype: ClassDtype::F32 };
    for (shape, rows) in [(qkv, [1, 13, 16]), (head, [17, 40, 64]), (odd_eights, [3, 9, 16])] {
        let trial = futures_lite::future::block_on(tune_matmul::<GpuRuntime>(&device, shape));
        let right: Vec<(MatmulKernel, f64)> = trial.trials.iter().filter_map(|t| match t.outcome {
            Outcome::Right { millis, .. } => Some((t.name.parse().unwrap(), millis)),
            _ => None,
        }).collect();
        if shape == odd_eights {
            let double_unit = trial.trials.iter().find(|t| t.name == "cubek-double-unit-small").unwrap();
            assert!(matches!(double_unit.outcome, Outcome::Wrong { .. } | Outcome::Declined), "cubek 0.2's DoubleUnit defect is caught ({:?}); if cubek was upgraded and fixed it, `autotuned_matmul`'s padding may go", double_unit.outcome);
        }
        let chosen = MatmulKernel::CANDIDATES[trial.chosen.expect("some candidate is right")];
        assert!(right.iter().all(|&(_, millis)| millis >= right.iter().find(|(k, _)| *k == chosen).unwrap().1), "{chosen} is the fastest right one");
        assert!(matmul_choices().contains(&(shape, chosen)), "the choice serves the class");
        let forced = right.iter().map(|&(kernel, _)| Some(kernel)).chain([None]);
        for (kernel, m) in forced.zip(rows.into_iter().cycle()) {
            force_matmul(kernel);
            let (k, n) = (shape.inner, shape.columns);
            let (lhs, rhs) = (random(200 + m as u64, m * k, 1.0), random(300 + m as u64, k * n, 1.0));
            let expected = host_matmul(&lhs, &rhs, [1, m, k, n], shape.rhs_transposed);
            let rhs = if shape.rhs_transposed { tensor::<Gpu, 2>(&rhs, [n, k]).transpose() } else { tensor(&rhs, [k, n]) };
            let what = format!("{} on {shape} at {m} rows", kernel.map_or(format!("the choice ({chosen})"), |k| k.to_string()));
            assert_close(&host(Gpu::matmul(tensor::<Gpu, 2>(&lhs, [m, k]), rhs)), &expected, 2e-5, &what);
        }
    }
}

/// cubek 0.2's `DoubleUnit` matmul is wrong when the inner dimension is an odd multiple of 8 and
/// the operands are batched or the right-hand side transposed; autotune picks it on lavapipe for
/// these shapes (each was 0.07 – 1 off through `Tensor::matmul`). `ScoringBackend::matmul` pads
/// the inner dimension past it.
fn matmuls_with_an_odd_multiple_of_8_inside_are_right() {
    check_matmuls(&[([2, 8, 600, 32], false), ([2, 2, 1000, 16], false), ([3, 13, 200, 24], false), ([1, 4, 24, 1000], true), ([2, 16, 40, 64], true)], false);
}

#[cfg(feature = "cuda")]
mod mma_fragments {
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::cmma::MmaDefinition;
    use burn_cubecl::cubecl::ir::MatrixIdent;
    use burn_cubecl::cubecl::prelude::*;

    /// Per lane: A's 8 elements, B's 4 and C's 4, each as (row, column): 32 values.
    #[cube(launch)]
    pub fn fragment_positions(out: &mut Tensor<u32>) {
        let def = MmaDefinition::<half::bf16, half::bf16, f32>::new(16usize, 8usize, 16usize);
        let lane = UNIT_POS_X;
        let base = (lane * 32) as usize;
        #[unroll]
        for n in 0..8u32 {
            let (row, col) = def.position_of_nth(lane, n, MatrixIdent::A);
            out[base + (n * 2) as usize] = row;
            out[base + (n * 2 + 1) as usize] = col;
        }
        #[unroll]
        for n in 0..4u32 {
            let (row, col) = def.position_of_nth(lane, n, MatrixIdent::B);
            out[base + (16 + n * 2) as usize] = row;
            out[base + (16 + n * 2 + 1) as usize] = col;
            let (row, col) = def.position_of_nth(lane, n, MatrixIdent::Accumulator);
            out[base + (24 + n * 2) as usize] = row;
            out[base + (24 + n * 2 + 1) as usize] = col;
        }
    }
}

/// Where CubeCL puts each lane's elements of an `mma.sync` m16n8k16 bf16 fragment
/// (`position_of_nth`, which the tiled kernel's tensor-core tile fills and reads by) is PTX's
/// documented layout ("Matrix Fragments for mma.m16n8k16", PTX ISA): lane `l` holds, with
/// `g = l / 4` and `t = l % 4`, A's rows g and g + 8 at columns 2t, 2t + 1 and those + 8, B's
/// rows (k) 2t, 2t + 1 and those + 8 at column g, and C's rows g and g + 8 at columns 2t, 2t + 1.
#[cfg(feature = "cuda")]
fn mma_fragment_layout_is_ptxs() {
    use burn::tensor::{Int, TensorData};
    use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim, Runtime};

    let device = Default::default();
    let out: Tensor<Gpu, 1, Int> = tensor::<Gpu, 1>(&vec![0.0; 32 * 32], [32 * 32]).int().cast(burn::tensor::DType::U32);
    mma_fragments::fragment_positions::launch::<GpuRuntime>(&GpuRuntime::client(&device), CubeCount::Static(1, 1, 1), CubeDim::new_1d(32), out.clone().into_primitive().into_tensor_arg());
    let got: Vec<u32> = out.into_data().convert::<u32>().to_vec().unwrap();
    let mut expected = Vec::new();
    for lane in 0..32u32 {
        let (g, t) = (lane / 4, lane % 4);
        for n in 0..8u32 {
            expected.extend([g + 8 * ((n / 2) % 2), 2 * t + n % 2 + 8 * (n / 4)]);
        }
        for n in 0..4u32 {
            expected.extend([2 * t + n % 2 + 8 * (n / 2), g]);
        }
        for n in 0..4u32 {
            expected.extend([g + 8 * (n / 2), 2 * t + n % 2]);
        }
    }
    assert_eq!(TensorData::new(got, [32, 32]), TensorData::new(expected, [32, 32]), "fragment positions per lane (A, then B, then C, as row, column)");
}

/// Seeded random rows of `kind`, `cols` values each, as the file would store them: random bytes
/// with each f16 scale's (or half's) top exponent bit cleared, so every value is finite
/// (subnormal scales and halves included).
fn random_stored_rows(kind: tally_model::gguf::TensorType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    use tally_model::gguf::TensorType;
    let (values, size) = kind.block().expect("a known type");
    let mut bytes: Vec<u8> = random(seed, rows * cols / values * size, 1.0).iter().map(|v| (v.to_bits() >> 3) as u8).collect();
    let scale_highs: &[usize] = match kind {
        TensorType::F16 | TensorType::BF16 => &[1],
        TensorType::Q4_0 | TensorType::Q5_0 | TensorType::Q8_0 => &[1],
        TensorType::Q6K => &[209],
        _ => &[1, 3],
    };
    for block in bytes.chunks_exact_mut(size) {
        for &at in scale_highs {
            block[at] &= 0b1011_1111;
        }
        // bf16 has float32's exponents: keep them off float32's subnormals too, which GPUs flush.
        if kind == TensorType::BF16 {
            block[1] |= 0b0010_0000;
        }
    }
    bytes
}

/// Weights kept compact on the device (`tally_model::backend::stored`): every GGUF type tally
/// reads, stacked with a reordered Q8_0 segment as a fused projection is, expanded by token id
/// (ids out of order, repeated) and multiplied — as expanded panels and expanded in registers
/// (the block route: x rows 1, 5 and 9 about its 8-row blocks; 11 and 9 weight rows about its
/// 8-column ones) — with one device buffer, with buffers of 1–3 rows and panels of 2 rows (so panels cross buffers and segments), rows of the kernel's
/// cube (256 words) just under, at and past it — against the CPU's dequantisation, which
/// tally's GGUF fixtures check against the `gguf` package: rows exactly, products within
/// float32 rounding of the float64 product. Then through the fusion backend.
fn stored_matrices_expand_exactly_and_multiply_across_pieces_and_panels() {
    use tally_model::backend::stored::{Limits, StoredMatrix};
    use tally_shaders::{set_matmul_route, MatmulRoute};
    let _cubecl_after = CubeclAfter;
    use tally_model::blocks::{BlockBytes, BlockMatrix, BlockRows};
    use tally_model::gguf::TensorType;
    let cols = 256;
    let small = Limits { piece_bytes: 1, panel_bytes: 1 };
    let mut seed = 700;
    for kind in [TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1, TensorType::Q8_0, TensorType::Q4K, TensorType::Q5K, TensorType::Q6K, TensorType::F16, TensorType::BF16] {
        // 4-bit rows of 256 are 32 words of values: 7, 8 and 9 rows are just under, at and past a cube.
        for rows in [7, 8, 9] {
            seed += 1;
            let segment = |kind, rows, seed| BlockRows::new(kind, BlockBytes::Owned(random_stored_rows(kind, rows, cols, seed).into()), rows).expect("a stored type");
            let q8 = segment(TensorType::Q8_0, 4, seed + 1).reordered(vec![2, 0, 3, 1]);
            let matrix = BlockMatrix::new(cols, vec![segment(kind, rows, seed), q8]).expect("whole blocks");
            let total = matrix.rows();
            let cpu = matrix.dequantize_rows(0..total);
            let what = |limits: &str| format!("{kind} ({rows} + 4 rows), {limits}");
            for (limits, name) in [(Limits::DEFAULT, "one buffer"), (Limits { piece_bytes: 480, panel_bytes: 2 * 4 * cols }, "480-byte buffers (3 rows of 4 bits, 1 of 8 or 16), 2-row panels"), (small, "one-row buffers and panels")] {
                let stored = StoredMatrix::<GpuRuntime>::pack(&matrix, burn::tensor::DType::F32, limits, &<GpuRuntime as burn_cubecl::cubecl::Runtime>::client(&Default::default()), &Default::default()).expect("every type packs");
                if name != "one buffer" {
                    assert!(stored.piece_rows().len() > 2, "{}: pieces {:?}", what(name), stored.piece_rows());
                }
                let ids: Vec<u32> = vec![total as u32 - 1, 0, 3, rows as u32, 3, 1];
                let expected: Vec<f32> = ids.iter().flat_map(|&id| cpu[id as usize * cols..(id as usize + 1) * cols].to_vec()).collect();
                let got = host(<Gpu>::block_rows(&stored, &ids, &Default::default()));
                assert_close(&got, &expected, 0.0, &format!("{}: rows {ids:?}", what(name)));
                // Expanded panels and the routed matmul; then expanded in registers (the block route).
                for route in [MatmulRoute::Cubecl, MatmulRoute::Block] {
                    set_matmul_route(route);
                    for m in [1, 5, 9] {
                        let x = random(seed + 9, m * cols, 1.0);
                        for range in [0..total, 2..total - 1] {
                            let reference: Vec<f32> = cpu[range.start * cols..range.end * cols].to_vec();
                            let expected = host_matmul(&x, &reference, [1, m, cols, range.len()], true);
                            let got = host(<Gpu>::block_matmul(tensor(&x, [m, cols]), &stored, range.clone()));
                            assert_close(&got, &expected, 2e-5, &format!("{}, {route:?} route: x [{m}, {cols}] · rows {range:?}", what(name)));
                        }
                    }
                }
                set_matmul_route(MatmulRoute::Cubecl);
            }
        }
    }
    // Through fusion: the wrapped backend's stored matrix, settled inputs and a fresh output.
    let matrix = BlockMatrix::new(cols, vec![BlockRows::new(TensorType::Q4_1, BlockBytes::Owned(random_stored_rows(TensorType::Q4_1, 9, cols, 1).into()), 9).unwrap()]).unwrap();
    let stored = <Fused>::block_weight(matrix.clone(), &Default::default()).expect("Q4_1 packs");
    let x = random(2, 3 * cols, 1.0);
    let expected = host_matmul(&x, &matrix.dequantize_rows(0..9), [1, 3, cols, 9], true);
    assert_close(&host(<Fused>::block_matmul(tensor(&x, [3, cols]), &stored, 0..9)), &expected, 2e-5, "through fusion");
    assert_close(&host(<Fused>::block_rows(&stored, &[8, 2], &Default::default())), &matrix.dequantize_rows([8, 2].into_iter()), 0.0, "rows through fusion");
}

fn main() {
    #[allow(unused_mut)] // without feature `cuda`
    let mut tests = gpu::named![
        attention_one_token_prefix_and_tile_edge_items,
        attention_long_prefix_gqa4_head_dim_64,
        attention_qwen3_heads_head_dim_128_several_groups,
        attention_500_uneven_items,
        attention_query_prefill_is_one_causal_item,
        attention_tiles_mix_whole_items_and_pieces_of_long_ones,
        attention_just_under_at_and_past_the_tiled_kernels_tiles,
        attention_head_sizes_off_the_flash_kernels_blocks,
        attention_staging_past_one_vector_a_unit,
        attention_every_tile_shape,
        attention_reads_keys_and_values_where_the_qkv_projection_wrote_them,
        attention_on_filled_tiles_cuts_items_at_tile_edges,
        attention_rescales_where_later_keys_pass_the_running_maximum,
        attention_with_the_prefix_walk_cut_into_parts,
        attention_through_the_fusion_backend_matches,
        add_rms_norm_matches_float64,
        norm_rope_matches_float64,
        silu_mul_matches_float64,
        softmax_lse_matches_float64,
        label_logprobs_stream_the_vocabulary,
        every_label_is_scored_past_the_kernels_units,
        label_logprobs_past_the_largest_one_dimensional_grid,
        the_cascade_on_the_gpu_matches_the_cpu,
        float32_matmuls_stay_float32,
        matmuls_with_an_odd_multiple_of_8_inside_are_right,
        block_matmuls_match_a_float64_product_at_every_block_edge,
        checked_matmul_choice_keeps_only_right_candidates,
        stored_matrices_expand_exactly_and_multiply_across_pieces_and_panels,
    ];
    #[cfg(feature = "cuda")]
    tests.extend(gpu::named![cublas_matmuls_match_a_float64_product, mma_fragment_layout_is_ptxs]);
    gpu::run(tests)
}
