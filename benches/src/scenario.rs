//! `tally bench scenario`: the seed benchmark's scoring workloads, end to end through the engine
//! (token ids in, scores out), reported in the seed report's columns.

use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use anyhow::{ensure, Result};
use clap::Args;
use serde_json::{json, Value};
use tally_core::{Items, Query, ScoreRequest};
use tally_engine::{tile_tuning::s1, Scorer};
use tally_model::ScoringBackend;

use crate::rng::Rng;
use crate::RunsOn;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// 2,000-token static prefix + 20-token dynamic suffix, items of 20 tokens.
    S1,
    /// 1,900-token static prefix + 10-token dynamic suffix, items of 10 tokens.
    S2,
}

#[derive(Args)]
pub struct ScenarioArgs {
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long, value_enum)]
    pub scenario: Scenario,
    /// Requests to run; the first is the cold one, the rest give the warm median.
    #[arg(long, default_value_t = 5)]
    pub requests: usize,
    #[arg(long, default_value_t = s1::ITEMS)]
    pub items: usize,
    /// Most padded item tokens per pass (default: as `tally serve` sizes them).
    #[arg(long)]
    pub max_batch_tokens: Option<usize>,
    /// Where to write the JSON result.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// After the timed requests, one more (not in the timings): the last request's query again
    /// (a prefix-cache hit, so only the item passes run) with new items, the device synced before
    /// and after it so that a per-kernel profile covers it alone: CubeCL's
    /// (`CUBECL_DEBUG_OPTION=profile`, which prints and resets its table at each sync) and, on
    /// CUDA, the cuBLASLt GEMM table (reset as the request starts).
    #[arg(long)]
    pub profiled_request: bool,
    /// The profiled request (implied) inside CUDA's profiler range (cuProfilerStart/Stop), for
    /// `ncu --profile-from-start off`. CUDA only.
    #[arg(long)]
    pub cuda_profiler_range: bool,
}

impl ScenarioArgs {
    /// The prefix cache for this run: room for the static prefix.
    pub fn prefix_cache_bytes(&self) -> usize {
        1 << 30
    }
}

/// What brackets the profiled request (`--profiled-request`), from the code that knows the backend.
pub struct ProfiledRequestEdges<'a> {
    /// Waits for every launch so far (CubeCL prints and resets its profile table at a sync).
    pub sync: &'a dyn Fn() -> Result<()>,
    /// On CUDA: starts (`true`) or stops the profiler's range, the cuBLASLt table reset at the start.
    pub cuda: Option<&'a dyn Fn(bool) -> Result<()>>,
}

/// Runs the scenario on a scorer loaded with [`ScenarioArgs::prefix_cache_bytes`]; prints the table
/// and returns the result.
pub fn run<B: ScoringBackend>(args: &ScenarioArgs, mut scorer: Scorer<B>, runs_on: &RunsOn, edges: ProfiledRequestEdges) -> Result<Value> {
    let (static_tokens, suffix_tokens, item_tokens) = match args.scenario {
    Scenario::S1 => (s1::STATIC_PREFIX_TOKENS, s1::SUFFIX_TOKENS, s1::ITEM_TOKENS),
    Scenario::S2 => (1900, 10, 10),
    };
    ensure!(args.requests > 0 && args.items > 0, "--requests and --items must be positive");
    ensure!(!args.cuda_profiler_range || edges.cuda.is_some(), "--cuda-profiler-range needs --backend cuda (in a build with feature `cuda`)");
    let vocab = scorer.preparer().limits().vocab_size as u64;
    // "Yes" / "No" in the Qwen3 tokenizer when the vocabulary has them.
    let labels: Vec<i64> = if vocab > 9454 { vec![9454, 2753] } else { vec![0, 1] };
    let mut rng = Rng::new(0);
    let mut ids = |n: usize| rng.ids(n, vocab);
    let static_prefix = ids(static_tokens);
    let request = |query: &[i64], items: Vec<Vec<i64>>| ScoreRequest { query: Query::Ids(query.to_vec()), items: Items::Ids(items), label_token_ids: labels.clone(), apply_softmax: false, item_first: false, model: None };

    let stats = scorer.stats();
    // What the warm requests ran: tokens prefilled (the suffix, where the prefix cache holds the
    // static part), passes for the query alone (none where the suffix runs in the item pass) and
    // item passes, from the engine's counters after the cold request.
    let mut after_cold = (0, 0, 0);
    let mut seconds = Vec::with_capacity(args.requests);
    let mut query = Vec::new();
    for request_index in 0..args.requests {
        // Same static prefix, a new dynamic suffix and new items for every request.
        query = [static_prefix.clone(), ids(suffix_tokens)].concat();
        let items: Vec<Vec<i64>> = (0..args.items).map(|_| ids(item_tokens)).collect();
        let start = Instant::now();
        let input = scorer.preparer().prepare(&request(&query, items))?;
        let scores = scorer.score_batch(&[&input])?.remove(0);
        seconds.push(start.elapsed().as_secs_f64());
        ensure!(scores.len() == args.items && scores.iter().flatten().all(|p| p.is_finite()), "scoring returned malformed scores");
        if request_index == 0 {
            after_cold = (stats.prefill_tokens.load(Relaxed), stats.prefill_passes.load(Relaxed), stats.pass_items.count());
        }
    }
    let warm_requests = (args.requests - 1) as f64;
    let warm_prefill_tokens = (args.requests > 1).then(|| (stats.prefill_tokens.load(Relaxed) - after_cold.0) as f64 / warm_requests);
    let warm_prefill_passes = (args.requests > 1).then(|| (stats.prefill_passes.load(Relaxed) - after_cold.1) as f64 / warm_requests);
    let warm_passes = (args.requests > 1).then(|| (stats.pass_items.count() - after_cold.2) as f64 / warm_requests);
    if args.profiled_request || args.cuda_profiler_range {
        let items: Vec<Vec<i64>> = (0..args.items).map(|_| ids(item_tokens)).collect();
        let input = scorer.preparer().prepare(&request(&query, items))?;
        let cuda = |active: bool| edges.cuda.map_or(Ok(()), |cuda| cuda(active));
        (edges.sync)()?;
        cuda(true)?;
        // Scores are read back before it returns, so every launch of the request has finished.
        let scores = scorer.score_batch(&[&input]);
        cuda(false)?;
        (edges.sync)()?;
        ensure!(scores?.remove(0).len() == args.items, "scoring returned malformed scores");
        let range = if edges.cuda.is_some() { ", inside CUDA's profiler range" } else { "" };
        println!("profiled: one more request, its query a prefix-cache hit, between two device syncs{range}");
    }

    let row = |s: f64| json!({"items_per_second": args.items as f64 / s, "ms_per_item": s * 1e3 / args.items as f64, "total_seconds": s});
    let mut warm = seconds[1..].to_vec();
    warm.sort_by(f64::total_cmp);
    let warm_median = warm.get(warm.len() / 2).copied();
    println!(
        "scenario {:?}: {} items/request × {item_tokens} tokens, query {} tokens ({static_tokens} static) | backend {}{} | {} attention, {} matmuls, {} elementwise | {}",
        args.scenario,
        args.items,
        static_tokens + suffix_tokens,
        runs_on.backend,
        if runs_on.fused { ", fused" } else { "" },
        runs_on.attention,
        runs_on.matmul,
        runs_on.elementwise,
        runs_on.device
    );
    println!("{:<12} {:>14} {:>14} {:>12}", "request", "items/s", "ms per item", "total s");
    let print = |name: &str, s: f64| println!("{name:<12} {:>14.1} {:>14.3} {:>12.3}", args.items as f64 / s, s * 1e3 / args.items as f64, s);
    print("cold", seconds[0]);
    if let Some(s) = warm_median {
        print("warm median", s);
    }
    if let (Some(tokens), Some(prefill_passes), Some(passes)) = (warm_prefill_tokens, warm_prefill_passes, warm_passes) {
        println!("a warm request: {tokens:.0} query tokens prefilled, {prefill_passes:.1} prefill passes, {passes:.1} item passes");
    }
    let tile_tuning = scorer.tile_tuning().map(ToString::to_string);
    if let Some(tuning) = &tile_tuning {
        println!("{tuning}");
    }
    Ok(json!({
        "benchmark": "scenario",
        "scenario": format!("{:?}", args.scenario).to_lowercase(),
        "backend": runs_on.backend,
        "attention": runs_on.attention,
        "matmul": runs_on.matmul,
        "elementwise": runs_on.elementwise,
        "tile": runs_on.tile,
        // The candidates timed at start-up and the one kept (`--tile-tuning`), where they were.
        "tile_tuning": tile_tuning,
        "flush_denormals": runs_on.flush_denormals,
        "fused": runs_on.fused,
        "max_batch_tokens": scorer.max_pass_tokens(),
        "dtype": runs_on.dtype,
        "device": runs_on.device,
        "model": args.model.file_name().map(|n| n.to_string_lossy().into_owned()),
        "items_per_request": args.items,
        "query_tokens": static_tokens + suffix_tokens,
        "static_prefix_tokens": static_tokens,
        "item_tokens": item_tokens,
        "request_seconds": seconds,
        "cold": row(seconds[0]),
        "warm_median": warm_median.map(row),
        "warm_prefill_tokens_per_request": warm_prefill_tokens,
        "warm_prefill_passes_per_request": warm_prefill_passes,
        "warm_item_passes_per_request": warm_passes,
    }))
}
