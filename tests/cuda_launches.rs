//! What `tally serve --backend cuda` launches, counted without a GPU on the offline CUDA runtime
//! (`common/offline_cuda.rs`: an H100's properties, CubeCL's CUDA compiler, launches counted and
//! compiled instead of run), through the engine as the server runs it: Qwen3-0.6B's shape in
//! bfloat16, passes of up to 32,768 tokens (what an H100's memory gives), each route on the
//! backend the server picks for it (`--fusion auto`): straight to CubeCL where the elementwise
//! steps are tally's kernels, through Burn's fusion where they are Burn's ops.
//!
//! - **Nothing compiles after the warm-up.** On the GPU a kernel's first launch is an NVRTC
//!   compile (unless the PTX cache has it) and a matmul's first shape class an autotune, in the
//!   request's latency. After [`Scorer::warm_up`], requests of the shapes a server meets (S1, S2,
//!   a batch of the load benchmark's requests, odd sizes, `item_first`) must launch only kernels
//!   already compiled, CubeK's matmuls and Burn's reductions aside (counted: their kernels are
//!   picked from each exact size). Checked on the row kernel with Burn's elementwise ops (the
//!   default), the flash kernel with the fused elementwise kernels, the tiled kernel, and a
//!   128x64 flash tile with Burn's label ops; the cascade's are counted.
//! - **What the warm-up compiles from cold**, on the CUDA default and on flash + elementwise
//!   kernels: CubeK's matmuls (autotune candidates included), tally's kernels, Burn's. On the
//!   GPU each is an NVRTC compile, most of the cold start.
//! - **The launch census of one warm S1 request**: launches per request by kernel type (one
//!   pass: the query's new 20-token suffix runs as rows of the item pass), and the host's time to issue them (Burn's fusion
//!   and CubeCL's launch path, without the driver's ~2–4 µs a launch): where the host, not the
//!   GPU, would bound a request; the flash route also through Burn's fusion (`--fusion on`),
//!   whose host time it costs. The time is an upper bound on a host of few cores, where
//!   CubeCL's device threads and the caller wait for each other spinning. Printed; with
//!   `TALLY_CUDA_LAUNCHES_REPORT=FILE` also written as JSON (committed as
//!   `benches/results/cuda-launches-s1.json`).
//! - **The launch census of load batches**: batches of 1 to 64 of the load benchmark's requests
//!   (new 300-token queries, 10 items each), and what each request adds to its batch
//!   (`TALLY_CUDA_LAUNCHES_LOAD_REPORT=FILE`; committed as `cuda-launches-load.json`).
//!
//! Matmuls run on `--matmul cubecl` here (cuBLASLt needs a device); each cubek matmul launch
//! counted is one cuBLASLt call on `--matmul cublas`.

#[path = "common/offline_cuda.rs"]
mod offline_cuda;

use std::time::Instant;

use burn_cubecl::CubeBackend;
use burn_fusion::Fusion;
use cubecl_runtime::config::{cache::CacheConfig, CubeClRuntimeConfig, RuntimeConfig};
use half::bf16;
use offline_cuda::{Counts, OfflineCuda, OfflineDevice};
use tally_core::{ModelLimits, PassBudget, ScoreInput};
use tally_engine::{Scorer, ScorerOptions};
use tally_model::{AttentionRoute, ElementwiseRoute, LabelRoute, Routes, ScoringBackend, TileShape};

/// What `tally serve --backend cuda` runs in bfloat16 on the offline runtime with tally's
/// elementwise kernels (`--fusion auto`: off)...
type Unfused = CubeBackend<OfflineCuda<1>, bf16, i32, u8>;
/// ...and with Burn's elementwise ops, or `--fusion on`.
type Fused = Fusion<Unfused>;

/// Whether the server runs `routes` through Burn's fusion (`--fusion auto`).
fn served_fused(routes: Routes) -> bool {
    routes.elementwise == ElementwiseRoute::Burn
}

/// The largest pass the server takes from an H100's free memory (`MAX_DEVICE_PASS_TOKENS`).
const PASS_TOKENS: usize = tally_core::plan::MAX_DEVICE_PASS_TOKENS;

/// The routes checked: the CUDA default, and the flash kernel with the fused elementwise kernels.
fn routes() -> [(&'static str, Routes); 2] {
    let flash = Routes { attention: AttentionRoute::Flash(TileShape::default()), elementwise: ElementwiseRoute::Kernels, labels: LabelRoute::Kernel };
    [("kernel attention, burn elementwise", Routes::default()), ("flash attention, elementwise kernels", flash)]
}

/// The other routes the suite runs, checked for compilations after the warm-up only.
fn other_routes() -> [(&'static str, Routes); 2] {
    let with = |attention| Routes { attention, ..Routes::default() };
    [
        ("tiled attention, burn elementwise", with(AttentionRoute::Tiled(TileShape::default()))),
        ("flash attention 128x64, burn elementwise, burn labels", Routes { labels: LabelRoute::Burn, ..with(AttentionRoute::Flash(TileShape::new(128, 64).expect("a tile shape"))) }),
    ]
}

/// The cascade, in plain Burn ops, reported but not held to it: Burn's fusion picks its
/// elementwise and copy kernels' vector widths from the score matrices' exact widths (prefix
/// and item lengths), so new requests compile new ones, as CubeK's matmuls do.
const CASCADE: (&str, Routes) = ("cascade attention, burn elementwise", Routes { attention: AttentionRoute::Cascade, elementwise: ElementwiseRoute::Burn, labels: LabelRoute::Kernel });

/// The server's scorer on backend `B` over offline device `device` (fresh: nothing compiled,
/// nothing tuned, unless another scorer used that device first).
fn scorer<B: ScoringBackend<Device = OfflineDevice<1>>>(device: u16, layers: usize) -> Scorer<B> {
    let mut config = tally_model::presets::preset("qwen3-0.6b").expect("a preset");
    config.num_hidden_layers = layers;
    let opened = tally_model::random::random_model(&config, 0).expect("random weights");
    let options = ScorerOptions { pass_budget: PassBudget { max_tokens: PASS_TOKENS, ..PassBudget::default() }, prefix_cache_bytes: 1 << 30, ..ScorerOptions::default() };
    Scorer::from_opened(opened, "qwen3-0.6b".into(), &OfflineDevice { index: device }, options, &mut |_, _| {}).expect("the model loads")
}

/// Deterministic token ids: `len` of them, different for each `seed`.
fn ids(seed: usize, len: usize, vocab: usize) -> Vec<u32> {
    (0..len).map(|i| ((seed * 104_729 + i * 7_919 + 13) % vocab) as u32).collect()
}

/// A request: a query of `query` tokens (the first `shared` of them the same in every request),
/// items of the given lengths.
fn input(limits: ModelLimits, seed: usize, shared: usize, query: usize, items: &[usize], item_first: bool) -> ScoreInput {
    let vocab = limits.vocab_size;
    let query = [ids(0, shared.min(query), vocab), ids(seed, query.saturating_sub(shared), vocab)].concat();
    let items = items.iter().enumerate().map(|(i, &len)| ids(seed * 1_000 + i + 1, len, vocab)).collect();
    ScoreInput::new(query, items, vec![9_454, 2_753], false, item_first, limits).expect("a valid request")
}

/// S1: a 2,000-token static prefix and a 20-token suffix, 500 items of 20 tokens.
fn s1(limits: ModelLimits, seed: usize) -> ScoreInput {
    input(limits, seed, 2_000, 2_020, &[20; 500], false)
}

/// The batches a server meets after its warm-up, by name.
fn traffic(limits: ModelLimits) -> Vec<(&'static str, Vec<ScoreInput>)> {
    let odd_items: Vec<usize> = (0..37).map(|i| [1, 2, 17, 65, 129][i % 5]).collect();
    vec![
        ("S1", vec![s1(limits, 1)]),
        ("S2", vec![input(limits, 2, 1_900, 1_910, &[10; 500], false)]),
        ("20 requests of the load benchmark's shape in one batch", (0..20).map(|r| input(limits, 100 + r, 0, 300, &[20; 10], false)).collect()),
        ("a 3,001-token query, items of 1 to 129 tokens", vec![input(limits, 4, 0, 3_001, &odd_items[..7], false)]),
        ("a one-token query, items of 1 to 129 tokens", vec![input(limits, 3, 0, 1, &odd_items, false)]),
        ("a one-token query, one item of one token", vec![input(limits, 6, 0, 1, &[1], false)]),
        ("item_first", vec![input(limits, 5, 0, 40, &[3, 30, 300], true)]),
    ]
}

fn describe(compiles: &[(&str, u64)]) -> String {
    compiles.iter().map(|(kernel, n)| format!("  {n} × {kernel}")).collect::<Vec<_>>().join("\n")
}

/// The kernels whose ids hold choices made from each problem's exact sizes, finer than the
/// autotune's shape classes, so a warm-up cannot meet them all: CubeK's matmuls (instruction
/// shape by `m : n`, stage rows by `m`, bounds checks by divisibility) and Burn's reductions,
/// fused or not (cube and plane counts from the number of rows reduced; which strategy runs is
/// the autotune's pick, so which ids a request meets varies with the timings).
fn is_sized_by_exact_shape(kernel: &str) -> bool {
    is_cubek_matmul(kernel) || is_burn_reduction(kernel)
}

fn is_cubek_matmul(kernel: &str) -> bool {
    kernel.starts_with("cubek_matmul::")
}

/// Burn's reductions, fused or not.
fn is_burn_reduction(kernel: &str) -> bool {
    kernel.starts_with("cubek_reduce::") || kernel.starts_with("burn_cubecl_fusion::optim::reduce")
}

/// `counts`' compilations: the kernels sized by exact shape, and every other kernel.
fn compiles(counts: &Counts) -> (Vec<(&'static str, u64)>, Vec<(&'static str, u64)>) {
    counts.compiles.iter().map(|(&kernel, &n)| (kernel, n)).partition(|(kernel, _)| is_sized_by_exact_shape(kernel))
}

/// After the warm-up, the traffic compiles nothing but kernels sized by exact shape, on each
/// route but the cascade (counted only).
fn nothing_compiles_after_the_warm_up() {
    let mut fused = scorer::<Fused>(1, 3);
    let mut unfused = scorer::<Unfused>(1, 3);
    for (name, routes) in routes().into_iter().chain(other_routes()).chain([CASCADE]) {
        if served_fused(routes) {
            compiles_nothing_after_the_warm_up(&mut fused, name, routes);
        } else {
            compiles_nothing_after_the_warm_up(&mut unfused, name, routes);
        }
    }
    assert!(offline_cuda::failed().is_empty(), "launches CubeCL could not generate or CUDA would refuse:\n{}", offline_cuda::failed().join("\n\n"));
}

fn compiles_nothing_after_the_warm_up<B: ScoringBackend>(scorer: &mut Scorer<B>, name: &str, routes: Routes) {
    let limits = scorer.preparer().limits();
    let held_to_it = routes != CASCADE.1;
    scorer.set_routes(routes);
    let steps = scorer.warmup_steps();
    assert!(!steps.is_empty(), "a CubeCL backend warms up");
    scorer.warm_up(&steps, &mut |_, _, _| {}).expect("the warm-up runs");
    for (what, batch) in traffic(limits) {
        let before = offline_cuda::counts();
        scorer.score_batch(&batch.iter().collect::<Vec<_>>()).expect("the batch is scored");
        let new = offline_cuda::counts().since(&before);
        assert!(new.total_launches() > 0, "{name}, {what}: nothing launched");
        let (sized, others) = compiles(&new);
        assert!(others.is_empty() || !held_to_it, "{name}, {what}: compiled after the warm-up (on the GPU: NVRTC in the request's latency):\n{}", describe(&others));
        let count = |compiles: &[(&str, u64)]| compiles.iter().map(|c| c.1).sum::<u64>();
        println!("{name}, {what}: {} launches; compiled {} kernels sized by exact shape (CubeK's matmuls, none on --matmul cublas; Burn's reductions) and {} others", new.total_launches(), count(&sized), count(&others));
    }
}

/// What the warm-up compiles from cold on the two routes of [`routes`], each on a device of its
/// own. On the GPU each compile is an NVRTC call unless the PTX cache has it, and each matmul
/// shape class an autotune that compiles and times every candidate: together, most of the cold
/// start the issue wants under 60 s.
fn what_the_warm_up_compiles_from_cold() {
    let [default, flash] = routes();
    let default = warm_up_compiles(scorer::<Fused>(2, 3), default);
    let flash = warm_up_compiles(scorer::<Unfused>(3, 3), flash);
    // The flash route's layers are tally's kernels where the default's are Burn's fused
    // elementwise ops and reductions, each compiled per fusion trace and size class.
    assert!(flash.burn < default.burn, "the flash and elementwise kernels route compiles fewer of Burn's kernels in its warm-up: {flash:?} against {default:?}");
    // Every norm on that route is tally's kernel, the final one too.
    assert_eq!(flash.burn_reductions, 0, "the elementwise kernels route compiled Burn's reductions: {flash:?}");
}

/// Kernels a warm-up compiled, by whose they are.
#[derive(Debug)]
struct WarmUpCompiles {
    cubek_matmuls: u64,
    tally: u64,
    burn: u64,
    /// Of `burn`: [Burn's reductions](is_burn_reduction).
    burn_reductions: u64,
}

fn warm_up_compiles<B: ScoringBackend>(mut scorer: Scorer<B>, (name, routes): (&str, Routes)) -> WarmUpCompiles {
    scorer.set_routes(routes);
    let steps = scorer.warmup_steps();
    let before = offline_cuda::counts();
    let start = Instant::now();
    scorer.warm_up(&steps, &mut |_, _, _| {}).expect("the warm-up runs");
    let seconds = start.elapsed().as_secs_f64();
    let new = offline_cuda::counts().since(&before);
    let compiled = |whose: &dyn Fn(&str) -> bool| new.compiles.iter().filter(|(kernel, _)| whose(kernel)).map(|(_, &n)| n).sum::<u64>();
    let compiles = WarmUpCompiles {
        cubek_matmuls: compiled(&is_cubek_matmul),
        tally: compiled(&offline_cuda::is_tallys),
        burn: compiled(&|kernel| !is_cubek_matmul(kernel) && !offline_cuda::is_tallys(kernel)),
        burn_reductions: compiled(&is_burn_reduction),
    };
    let WarmUpCompiles { cubek_matmuls, tally, burn, .. } = compiles;
    println!(
        "{name}: the warm-up's {} steps launched {} kernels and compiled {}: {cubek_matmuls} of CubeK's matmuls (autotune candidates included; none on --matmul cublas), {tally} of tally's, {burn} of Burn's and CubeCL's others ({seconds:.1} s here, NVRTC not included)",
        steps.len(),
        new.total_launches(),
        cubek_matmuls + tally + burn,
    );
    let mut others: Vec<(String, u64)> = new.compiles.iter().filter(|(kernel, _)| !is_cubek_matmul(kernel)).map(|(kernel, &n)| (short_name(kernel), n)).collect();
    others.sort_by_key(|(kernel, n)| (std::cmp::Reverse(*n), kernel.clone()));
    println!("  compiled besides the matmuls: {}", others.iter().map(|(kernel, n)| format!("{n} {kernel}")).collect::<Vec<_>>().join(", "));
    compiles
}

/// A kernel type's name without its path and generic arguments: `ElemwiseFuse`.
fn short_name(kernel: &str) -> String {
    let bare = kernel.split('<').next().unwrap_or(kernel);
    bare.rsplit("::").next().unwrap_or(bare).to_owned()
}

/// The launches of one warm S1 request on Qwen3-0.6B's 28 layers, by kernel type, and the host
/// time to issue them: each route on the backend the server runs it on, and the flash route
/// through Burn's fusion too (`--fusion on`).
fn the_launch_census_of_a_warm_s1_request() {
    let [default, flash] = routes();
    let report = vec![
        s1_census(&mut scorer::<Fused>(1, 28), default, true),
        s1_census(&mut scorer::<Unfused>(5, 28), flash, false),
        s1_census(&mut scorer::<Fused>(6, 28), flash, true),
    ];
    let host_ms = |run: &serde_json::Value| run["host_ms_per_request"].as_f64().expect("timed");
    println!("\nflash attention, elementwise kernels: {:.1} ms of host time a warm S1 request unfused (the server's default), {:.1} ms through Burn's fusion", host_ms(&report[1]), host_ms(&report[2]));
    if let Some(path) = std::env::var_os("TALLY_CUDA_LAUNCHES_REPORT") {
        let json = serde_json::json!({
            "benchmark": "cuda-launches",
            "what": "one warm S1 request (2,000 of its 2,020 query tokens from the prefix cache, the 20-token suffix run as rows of the one item pass with the 500 items of 20 tokens) through the engine on the offline CUDA runtime: launches by kernel type and the host's time to issue them, without the driver's launch cost",
            "model": "qwen3-0.6b shape, 28 layers, bfloat16, --matmul cubecl; each route unfused or through Burn's fusion as `fused` says",
            "host": std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|info| info.lines().find_map(|l| l.strip_prefix("model name")?.split(':').nth(1).map(|s| s.trim().to_owned()))),
            "host_cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "host_time_caveat": "the caller's thread and CubeCL's two device threads, which wait for each other spinning (ChannelDeviceHandle::submit_inner), share the host's cores: on a 2-core machine the spinning takes much of the time, so host_ms is an upper bound, not a prediction for the GPU machine's 16 cores; the launch counts do not depend on the host",
            "runs": report,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).expect("the report is written");
    }
}

/// One route's S1 census on `scorer`'s backend (`fused`: whether that is Burn's fusion), as the
/// report's JSON.
fn s1_census<B: ScoringBackend>(scorer: &mut Scorer<B>, (name, routes): (&str, Routes), fused: bool) -> serde_json::Value {
    let limits = scorer.preparer().limits();
    scorer.set_routes(routes);
    let name = format!("{name}{}", if fused { ", through Burn's fusion" } else { ", unfused" });
    // A cold request compiles and tunes, a second warms the prefix cache's hit path; the
    // third and later are timed.
    for seed in 0..2 {
        scorer.score_batch(&[&s1(limits, seed)]).expect("S1 is scored");
    }
    let mut seconds = Vec::new();
    let before = offline_cuda::counts();
    const TIMED: usize = 3;
    for seed in 0..TIMED {
        let request = s1(limits, 10 + seed);
        let start = Instant::now();
        scorer.score_batch(&[&request]).expect("S1 is scored");
        seconds.push(start.elapsed().as_secs_f64());
    }
    let counts = offline_cuda::counts().since(&before);
    assert!(counts.compiles.is_empty(), "{name}: warm S1 requests compiled:\n{}", describe(&counts.compiles.iter().map(|(&k, &n)| (k, n)).collect::<Vec<_>>()));
    seconds.sort_by(f64::total_cmp);
    let host_ms = seconds[TIMED / 2] * 1e3;
    let per_request = |n: u64| n / TIMED as u64;
    let launches = per_request(counts.total_launches());
    assert_eq!(counts.total_launches() % TIMED as u64, 0, "{name}: every S1 request launches the same kernels");
    println!("\n{name}: {launches} launches a warm S1 request, issued in {host_ms:.1} ms of host time (median of {TIMED})");
    let mut kernels: Vec<(&str, u64)> = counts.launches.iter().map(|(&k, &n)| (k, per_request(n))).collect();
    kernels.sort_by_key(|&(kernel, n)| (std::cmp::Reverse(n), kernel));
    for (kernel, n) in &kernels {
        println!("{n:>6}  {kernel}");
    }
    serde_json::json!({
        "routes": name,
        "fused": fused,
        "launches_per_request": launches,
        "host_ms_per_request": host_ms,
        "launches_by_kernel": kernels.iter().map(|&(kernel, n)| serde_json::json!({"kernel": kernel, "launches": n})).collect::<Vec<_>>(),
    })
}

/// Batches of the load benchmark's requests (SGLang PR 9748's shape: a new 300-token query and
/// 10 items of 20 tokens each), at 1 to 64 requests a batch (64 fill one pass): launches by
/// kernel type and host time, per batch. What a request adds is the slope between sizes: the
/// work done per query (joining its K/V into each layer's prefix, caching it) where the GPU
/// would rather run one pass of many.
fn the_launch_census_of_load_batches() {
    const SIZES: [usize; 4] = [1, 8, 32, 64];
    let mut scorer = scorer::<Unfused>(4, 28);
    let limits = scorer.preparer().limits();
    let (name, routes) = routes()[1];
    scorer.set_routes(routes);
    let batch = |size: usize, seed: usize| (0..size).map(|r| input(limits, seed * 1_000 + r, 0, 300, &[20; 10], false)).collect::<Vec<_>>();
    let mut runs = Vec::new();
    for size in SIZES {
        // The first batch of a size compiles and tunes its matmul shapes; the second is counted.
        // Every query is new (no batch shares a seed), as in `bench load`.
        scorer.score_batch(&batch(size, 2 * size).iter().collect::<Vec<_>>()).expect("a load batch is scored");
        let requests = batch(size, 2 * size + 1);
        let before = offline_cuda::counts();
        let start = Instant::now();
        scorer.score_batch(&requests.iter().collect::<Vec<_>>()).expect("a load batch is scored");
        let host_ms = start.elapsed().as_secs_f64() * 1e3;
        let counts = offline_cuda::counts().since(&before);
        assert!(counts.compiles.iter().all(|(kernel, _)| is_sized_by_exact_shape(kernel)), "{name}: a warm load batch of {size} compiled:\n{}", describe(&counts.compiles.iter().map(|(&k, &n)| (k, n)).collect::<Vec<_>>()));
        let launches = counts.total_launches();
        println!("\n{name}: {size} load requests in a batch: {launches} launches ({:.1} a request), issued in {host_ms:.1} ms of host time", launches as f64 / size as f64);
        let mut kernels: Vec<(&str, u64)> = counts.launches.iter().map(|(&k, &n)| (k, n)).collect();
        kernels.sort_by_key(|&(kernel, n)| (std::cmp::Reverse(n), kernel));
        for (kernel, n) in kernels.iter().take(8) {
            println!("{n:>7}  {}", short_name(kernel));
        }
        runs.push((size, launches, host_ms, kernels.iter().map(|&(kernel, n)| serde_json::json!({"kernel": short_name(kernel), "launches": n})).collect::<Vec<_>>()));
    }
    let (first, last) = (&runs[0], &runs[runs.len() - 1]);
    let per_request = (last.1 - first.1) as f64 / (last.0 - first.0) as f64;
    println!("\n{name}: each load request adds {per_request:.1} launches to its batch");
    if let Some(path) = std::env::var_os("TALLY_CUDA_LAUNCHES_LOAD_REPORT") {
        let json = serde_json::json!({
            "benchmark": "cuda-launches-load",
            "what": "warm batches of the load benchmark's requests (a new 300-token query, 10 items of 20 tokens) through the engine on the offline CUDA runtime: launches by kernel type and the host's time to issue them, without the driver's launch cost; launches_added_per_request is the slope from the smallest batch to the largest",
            "model": "qwen3-0.6b shape, 28 layers, bfloat16, unfused (the server's default with tally's elementwise kernels), --matmul cubecl, prefix cache of 1 GiB",
            "routes": name,
            "host_cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "host_time_caveat": "as in cuda-launches-s1.json: an upper bound on a 2-core host; the launch counts do not depend on the host",
            "launches_added_per_request": per_request,
            "batches": runs.iter().map(|(size, launches, host_ms, kernels)| serde_json::json!({"requests": size, "launches": launches, "host_ms": host_ms, "launches_by_kernel": kernels})).collect::<Vec<_>>(),
        });
        std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).expect("the report is written");
    }
}

fn main() {
    // A kernel CubeCL cannot generate panics on the device's stream thread, where the offline
    // server catches it and the test reports it; its backtrace would only bury the report.
    let report_panic = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !std::thread::current().name().is_some_and(|name| name.starts_with("DSD-")) {
            report_panic(info);
        }
    }));
    // Every run tunes from cold, as on a clean machine: CubeCL's autotune cache would otherwise
    // persist in the crate's `target/` and change which kernels a later run compiles.
    let autotune_cache = std::env::temp_dir().join(format!("tally-cuda-launches-{}", std::process::id()));
    let mut config = CubeClRuntimeConfig::default();
    config.autotune.cache = CacheConfig::File(autotune_cache.clone());
    CubeClRuntimeConfig::set(config);
    let mut args = libtest_mimic::Arguments::from_args();
    // The counts are the process's: one trial at a time.
    args.test_threads = Some(1);
    let trials = vec![
        libtest_mimic::Trial::test("nothing_compiles_after_the_warm_up", || {
            nothing_compiles_after_the_warm_up();
            Ok(())
        }),
        libtest_mimic::Trial::test("what_the_warm_up_compiles_from_cold", || {
            what_the_warm_up_compiles_from_cold();
            Ok(())
        }),
        libtest_mimic::Trial::test("the_launch_census_of_a_warm_s1_request", || {
            the_launch_census_of_a_warm_s1_request();
            Ok(())
        }),
        libtest_mimic::Trial::test("the_launch_census_of_load_batches", || {
            the_launch_census_of_load_batches();
            Ok(())
        }),
    ];
    let conclusion = libtest_mimic::run(&args, trials);
    let _ = std::fs::remove_dir_all(autotune_cache);
    conclusion.exit()
}
