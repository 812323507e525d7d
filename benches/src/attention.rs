//! `tally bench attention`: one layer's multi-item attention as tally runs it (the CubeCL
//! kernel on wgpu/CUDA, the cascade of plain ops on the CPU) against the usual way of packing
//! items — one sequence of query + all items with a dense `[rows, keys]` mask — on the same
//! backend, same inputs, same run. Defaults are seed scenario 1 with Qwen3-0.6B's heads.

use anyhow::{ensure, Result};
use clap::Args;
use burn::tensor::{activation::softmax, backend::Backend, ElementConversion, Tensor, TensorData};
use serde_json::{json, Value};
use tally_model::{AttentionRoute, ItemLayout, PrefixKv, Routes, ScoringBackend, TileShape};

use crate::rng::Rng;
use crate::timing::median_seconds;
use crate::RunsOn;

/// Defaults: seed scenario 1 (2,020-token query, 500 items of 20 tokens), Qwen3-0.6B's heads.
#[derive(Args)]
pub struct AttentionArgs {
    #[arg(long, default_value_t = 2020)]
    pub prefix: usize,
    #[arg(long, default_value_t = 500)]
    pub items: usize,
    #[arg(long, default_value_t = 20)]
    pub item_len: usize,
    #[arg(long, default_value_t = 16)]
    pub q_heads: usize,
    #[arg(long, default_value_t = 8)]
    pub kv_heads: usize,
    #[arg(long, default_value_t = 128)]
    pub head_dim: usize,
    /// Timed runs of each variant (after one warm-up); the median is reported.
    #[arg(long, default_value_t = 5)]
    pub iterations: usize,
    /// Where to write the JSON result (also printed).
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

/// Times one layer's attention on backend `B`, every route against dense-masked attention.
/// `tile`: the tile routes' (tiled, flash) tile shape.
pub fn run<B: ScoringBackend>(args: &AttentionArgs, device: B::Device, runs_on: &RunsOn, tile: TileShape) -> Result<Value> {
    let a = args;
    ensure!(a.items > 0 && a.item_len > 0 && a.iterations > 0, "--items, --item-len and --iterations must be positive");
    ensure!(a.kv_heads > 0 && a.q_heads.is_multiple_of(a.kv_heads), "--q-heads must be a multiple of --kv-heads");
    let (tokens, group) = (a.items * a.item_len, a.q_heads / a.kv_heads);
    let mut rng = Rng::new(1);
    let mut random = |shape: [usize; 3]| -> Tensor<B, 3> {
        let values: Vec<f32> = (0..shape.iter().product()).map(|_| rng.unit() as f32 * 2.0 - 1.0).collect();
        Tensor::from_data(TensorData::new(values, shape), &device)
    };
    let queries = random([tokens, a.q_heads, a.head_dim]);
    let keys = random([tokens, a.kv_heads, a.head_dim]);
    let values = random([tokens, a.kv_heads, a.head_dim]);
    let prefix = PrefixKv { keys: random([a.kv_heads, a.prefix, a.head_dim]), values: random([a.kv_heads, a.prefix, a.head_dim]) };
    let item_lens = vec![a.item_len; a.items];
    let layout = ItemLayout::new([(a.prefix, item_lens.as_slice())]);

    // Planned once per pass in the model, so timed apart from the per-layer run.
    let spans = [(0, a.prefix)];
    let plan = |route| B::plan_attention(route, &layout, &spans, group, &device);
    let (kernel_route, tiled_route, flash_route) = (AttentionRoute::Kernel, AttentionRoute::Tiled(tile), AttentionRoute::Flash(tile));
    let (planned_kernel, planned_tiled, planned_flash, planned_cascade) = (plan(kernel_route), plan(tiled_route), plan(flash_route), plan(AttentionRoute::Cascade));
    let multi_item = || planned_kernel.run(queries.clone(), keys.clone(), values.clone(), &prefix);
    let tiled = || planned_tiled.run(queries.clone(), keys.clone(), values.clone(), &prefix);
    let flash = || planned_flash.run(queries.clone(), keys.clone(), values.clone(), &prefix);
    let cascade = || planned_cascade.run(queries.clone(), keys.clone(), values.clone(), &prefix);
    let mask = dense_mask::<B>(a.prefix, &layout, group, &device);
    let dense = || dense_masked_attention(queries.clone(), keys.clone(), values.clone(), &prefix, mask.clone());

    // Same answer first: a benchmark of a wrong kernel is worth nothing.
    for (name, output) in [("kernel", multi_item()), ("tiled", tiled()), ("flash", flash()), ("cascade", cascade())] {
        let difference = (output - dense()).abs().max().into_scalar().elem::<f32>();
        ensure!(difference < 1e-2, "the {name} route and dense attention disagree by {difference}");
    }
    let multi_item_ms = median_seconds(a.iterations, || multi_item().sum().into_scalar()) * 1e3;
    let tiled_ms = median_seconds(a.iterations, || tiled().sum().into_scalar()) * 1e3;
    let flash_ms = median_seconds(a.iterations, || flash().sum().into_scalar()) * 1e3;
    let cascade_ms = median_seconds(a.iterations, || cascade().sum().into_scalar()) * 1e3;
    let dense_ms = median_seconds(a.iterations, || dense().sum().into_scalar()) * 1e3;
    let kernel_plan_ms = median_seconds(a.iterations, || plan(kernel_route)) * 1e3;
    let cascade_plan_ms = median_seconds(a.iterations, || plan(AttentionRoute::Cascade)) * 1e3;

    // Useful work: each row sees the prefix and its own item up to itself (QKᵀ and PV).
    let visible_keys: usize = (0..a.item_len).map(|k| a.prefix + k + 1).sum::<usize>() * a.items;
    let flop = 4.0 * (visible_keys * a.q_heads * a.head_dim) as f64;
    let tflops = |ms: f64| flop / (ms * 1e-3) / 1e12;
    let runs = |attention| B::routes(Routes { attention, ..Routes::default() }).attention.to_string();
    Ok(json!({
        "benchmark": "multi-item attention, one layer",
        "backend": runs_on.backend,
        "dtype": runs_on.dtype,
        "device": runs_on.device,
        "shape": {"prefix": a.prefix, "items": a.items, "item_len": a.item_len, "q_heads": a.q_heads, "kv_heads": a.kv_heads, "head_dim": a.head_dim},
        "iterations": a.iterations,
        "multi_item_ms": multi_item_ms,
        "dense_masked_ms": dense_ms,
        "tiled_ms": tiled_ms,
        "flash_ms": flash_ms,
        "tile": tile.to_string(),
        // What the backend runs for each route asked (the CPU runs its one kernel for both),
        // and which kernel each launched at this shape (a tile falls back where it can't fit).
        "routes_run": {"kernel": runs(kernel_route), "tiled": runs(tiled_route), "flash": runs(flash_route)},
        "launched": {"kernel": planned_kernel.launched(a.head_dim), "tiled": planned_tiled.launched(a.head_dim), "flash": planned_flash.launched(a.head_dim), "cascade": planned_cascade.launched(a.head_dim)},
        "cascade_ms": cascade_ms,
        "kernel_plan_ms": kernel_plan_ms,
        "cascade_plan_ms": cascade_plan_ms,
        "speedup": dense_ms / multi_item_ms,
        "useful_tflop": flop / 1e12,
        "multi_item_tflops": tflops(multi_item_ms),
        "tiled_tflops": tflops(tiled_ms),
        "flash_tflops": tflops(flash_ms),
        "cascade_tflops": tflops(cascade_ms),
        "dense_masked_tflops_useful": tflops(dense_ms),
    }))
}

/// `[rows · group, prefix + tokens]` additive mask of the packed sequence `query + items`:
/// every item row sees the prefix and its own item causally.
fn dense_mask<B: Backend>(prefix: usize, layout: &ItemLayout, group: usize, device: &B::Device) -> Tensor<B, 2> {
    let tokens = layout.tokens();
    let mut mask = vec![f32::NEG_INFINITY; tokens * group * (prefix + tokens)];
    for item in 0..layout.items() {
        let start = layout.offsets()[item];
        for row in start..start + layout.item_len(item) {
            for head in 0..group {
                let line = &mut mask[(row * group + head) * (prefix + tokens)..][..prefix + tokens];
                line[..prefix].fill(0.0);
                line[prefix + start..=prefix + row].fill(0.0);
            }
        }
    }
    Tensor::from_data(TensorData::new(mask, [tokens * group, prefix + tokens]), device)
}

/// Attention of the packed sequence with a dense mask, GQA by grouping query heads per KV head.
fn dense_masked_attention<B: Backend>(queries: Tensor<B, 3>, keys: Tensor<B, 3>, values: Tensor<B, 3>, prefix: &PrefixKv<B>, mask: Tensor<B, 2>) -> Tensor<B, 3> {
    let [tokens, q_heads, head_dim] = queries.dims();
    let kv_heads = keys.dims()[1];
    let group = q_heads / kv_heads;
    let all_keys = Tensor::cat(vec![prefix.keys.clone(), keys.swap_dims(0, 1)], 1);
    let all_values = Tensor::cat(vec![prefix.values.clone(), values.swap_dims(0, 1)], 1);
    let queries = queries.reshape([tokens, kv_heads, group, head_dim]).swap_dims(0, 1).reshape([kv_heads, tokens * group, head_dim]);
    let scores = queries.matmul(all_keys.swap_dims(1, 2)).mul_scalar((head_dim as f64).powf(-0.5)) + mask.unsqueeze::<3>();
    let output = softmax(scores, 2).matmul(all_values);
    output.reshape([kv_heads, tokens, group, head_dim]).swap_dims(0, 1).reshape([tokens, q_heads, head_dim])
}
