//! `tally bench attention`: one layer's multi-item attention as tally runs it (the CubeCL
//! kernel on wgpu/CUDA, the cascade of plain ops on the CPU) against the usual way of packing
//! items — one sequence of query + all items with a dense `[rows, keys]` mask — on the same
//! backend, same inputs, same run. Defaults are seed scenario 1 with Qwen3-0.6B's heads.

use anyhow::{ensure, Result};
use clap::Args;
use burn::tensor::{activation::softmax, backend::Backend, ElementConversion, Tensor, TensorData};
use serde_json::{json, Value};
use tally_engine::tile_tuning::s1;
use tally_model::{AttentionRoute, ElementwiseRoute, ItemLayout, LabelRoute, PlannedAttention, PrefixKv, Routes, ScoringBackend, TileShape};

use crate::rng::Rng;
use crate::timing::{median_seconds, median_seconds_back_to_back};
use crate::RunsOn;

/// Defaults: seed scenario 1 (2,020-token query, 500 items of 20 tokens), Qwen3-0.6B's heads.
#[derive(Args)]
pub struct AttentionArgs {
    #[arg(long, default_value_t = s1::QUERY_TOKENS)]
    pub prefix: usize,
    #[arg(long, default_value_t = s1::ITEMS)]
    pub items: usize,
    #[arg(long, default_value_t = s1::ITEM_TOKENS)]
    pub item_len: usize,
    #[arg(long, default_value_t = 16)]
    pub q_heads: usize,
    #[arg(long, default_value_t = 8)]
    pub kv_heads: usize,
    #[arg(long, default_value_t = 128)]
    pub head_dim: usize,
    /// Runs of each variant a timing: issued back to back and waited for once (`<route>_ms`,
    /// the median of three such groups), and one at a time, each waited for
    /// (`<route>_synced_ms`, the median); each after one warm-up run.
    #[arg(long, default_value_t = 5)]
    pub iterations: usize,
    /// The routes to check and time, beside dense attention (a variant of the flash kernel
    /// needs only `flash`: each route compiles its kernels and tunes its matmuls).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "kernel,tiled,flash,cascade")]
    pub routes: Vec<Route>,
    /// Where to write the JSON result (also printed).
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

/// A route `bench attention` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Route {
    /// The row kernel (`multi_item_*` in the result).
    Kernel,
    Tiled,
    Flash,
    Cascade,
}

impl Route {
    const ALL: [Route; 4] = [Route::Kernel, Route::Tiled, Route::Flash, Route::Cascade];

    /// Its name in the result's `launched` and `routes_run`.
    fn name(self) -> &'static str {
        match self {
            Route::Kernel => "kernel",
            Route::Tiled => "tiled",
            Route::Flash => "flash",
            Route::Cascade => "cascade",
        }
    }

    /// Its keys' stem in the result (`<key>_ms`, `<key>_tflops`).
    fn key(self) -> &'static str {
        match self {
            Route::Kernel => "multi_item",
            other => other.name(),
        }
    }

    fn attention(self, tile: TileShape) -> AttentionRoute {
        match self {
            Route::Kernel => AttentionRoute::Kernel,
            Route::Tiled => AttentionRoute::Tiled(tile),
            Route::Flash => AttentionRoute::Flash(tile),
            Route::Cascade => AttentionRoute::Cascade,
        }
    }
}

/// Times one layer's attention on backend `B`, the routes asked against dense-masked attention.
/// `tile`: the tile routes' (tiled, flash) tile shape; `elementwise`: the cascade's softmax.
pub fn run<B: ScoringBackend>(args: &AttentionArgs, device: B::Device, runs_on: &RunsOn, tile: TileShape, elementwise: ElementwiseRoute) -> Result<Value> {
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
    // The cascade's softmax follows the elementwise route, as in the model.
    let plan = |attention| B::plan_attention(Routes { attention, elementwise, labels: LabelRoute::Kernel }, &layout, &spans, group, &device);
    let mask = dense_mask::<B>(a.prefix, &layout, group, &device);
    let dense = || dense_masked_attention(queries.clone(), keys.clone(), values.clone(), &prefix, mask.clone());
    let routes: Vec<Route> = Route::ALL.into_iter().filter(|route| a.routes.contains(route)).collect();
    let planned: Vec<_> = routes.iter().map(|route| plan(route.attention(tile))).collect();
    let run = |planned: &dyn PlannedAttention<B>| planned.run(queries.clone(), keys.clone(), values.clone(), &prefix);

    // Same answer first: a benchmark of a wrong kernel is worth nothing.
    for (route, planned) in routes.iter().zip(&planned) {
        let difference = (run(planned.as_ref()) - dense()).abs().max().into_scalar().elem::<f32>();
        ensure!(difference < 1e-2, "the {} route and dense attention disagree by {difference}", route.name());
    }
    // A layer's attention is one launch among a pass's hundreds, nothing waiting between them:
    // `<route>_ms` times runs issued back to back, one wait a group of them. A run waited for
    // alone (`<route>_synced_ms`, what this benchmark reported before 2026-11-28) adds the
    // host's issue and a round trip to the device (a sum and its readback).
    let wait = || B::sync(&device).map_err(|e| anyhow::anyhow!("the device failed: {e:?}"));
    let back_to_back_ms = |f: &dyn Fn() -> Tensor<B, 3>| -> Result<f64> { Ok(median_seconds_back_to_back(3, a.iterations, f, wait)? * 1e3) };
    let synced_ms = |f: &dyn Fn() -> Tensor<B, 3>| median_seconds(a.iterations, || f().sum().into_scalar()) * 1e3;
    let dense_ms = back_to_back_ms(&dense)?;
    let dense_synced_ms = synced_ms(&dense);

    // Useful work: each row sees the prefix and its own item up to itself (QKᵀ and PV).
    let visible_keys: usize = (0..a.item_len).map(|k| a.prefix + k + 1).sum::<usize>() * a.items;
    let flop = 4.0 * (visible_keys * a.q_heads * a.head_dim) as f64;
    let tflops = |ms: f64| flop / (ms * 1e-3) / 1e12;
    let runs = |attention| B::routes(Routes { attention, ..Routes::default() }).attention.to_string();
    let mut result = json!({
        "benchmark": "multi-item attention, one layer",
        "backend": runs_on.backend,
        "dtype": runs_on.dtype,
        "device": runs_on.device,
        "shape": {"prefix": a.prefix, "items": a.items, "item_len": a.item_len, "q_heads": a.q_heads, "kv_heads": a.kv_heads, "head_dim": a.head_dim},
        "iterations": a.iterations,
        "dense_masked_ms": dense_ms,
        "dense_masked_synced_ms": dense_synced_ms,
        "tile": tile.to_string(),
        "flush_denormals": runs_on.flush_denormals,
        "fused": runs_on.fused,
        "useful_tflop": flop / 1e12,
        "dense_masked_tflops_useful": tflops(dense_ms),
        // What the backend runs for each route asked (the CPU runs its one kernel for both),
        // and which kernel each launched at this shape (a tile falls back where it can't fit).
        "routes_run": {},
        "launched": {},
    });
    for (route, planned) in routes.iter().zip(&planned) {
        let ms = back_to_back_ms(&|| run(planned.as_ref()))?;
        result[format!("{}_ms", route.key())] = json!(ms);
        result[format!("{}_synced_ms", route.key())] = json!(synced_ms(&|| run(planned.as_ref())));
        result[format!("{}_tflops", route.key())] = json!(tflops(ms));
        result["routes_run"][route.name()] = json!(runs(route.attention(tile)));
        result["launched"][route.name()] = json!(planned.launched(a.head_dim));
        if matches!(route, Route::Kernel | Route::Cascade) {
            result[format!("{}_plan_ms", route.name())] = json!(median_seconds(a.iterations, || plan(route.attention(tile))) * 1e3);
        }
        if *route == Route::Kernel {
            result["speedup"] = json!(dense_ms / ms);
        }
    }
    Ok(result)
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
