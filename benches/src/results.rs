//! A results folder (the GPU suite's, or any folder of `tally bench` and `pytorch_peers.py`
//! JSON) read into what [`crate::chart`] draws and [`crate::summary`] tabulates.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;
use tally_engine::tile_tuning::s1;

/// The goals (H100, Qwen3-0.6B shape, bf16), drawn as lines.
pub const SCENARIO_GOALS: [(&str, f64); 2] = [("s1", 10_000.0), ("s2", 15_000.0)];
/// One layer's attention at S1's shape (issue: ≤ 0.9 ms, ≥ 200 TFLOP/s useful).
pub const ATTENTION_GOAL_MS: f64 = 0.9;
pub const LOAD_P99_BAR_MS: f64 = 500.0;
/// `tally serve` ready (listening after its warm-up) from empty caches, and from the caches an
/// earlier start left (issue: ≤ 60 s cold, ≤ 10 s warm-cached).
pub const COLD_START_GOAL_S: f64 = 60.0;
pub const CACHED_START_GOAL_S: f64 = 10.0;

/// One bar: a run's items/s on one scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    pub scenario: String,
    pub label: String,
    pub items_per_second: f64,
    /// The backend tally ran on (`cuda`, `wgpu`, `cpu`); empty for a peer.
    pub backend: String,
    /// A PyTorch peer rather than tally.
    pub peer: bool,
    /// The most tokens a pass took (tally's runs record it).
    pub pass_tokens: Option<u64>,
    /// The tile attention kernels' tile and variant (tally's runs record it).
    pub tile: Option<String>,
    /// What a warm request ran (tally's runs of two requests or more record it).
    pub warm_request: Option<WarmRequest>,
}

/// What one warm request of a scenario ran, on average.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WarmRequest {
    /// Query tokens prefilled (what the prefix cache did not hold).
    pub prefill_tokens: f64,
    /// Passes for the query alone (absent from results older than the query tails).
    pub prefill_passes: Option<f64>,
    pub item_passes: f64,
}

/// One layer's attention on one route (`bench attention`): what ran and how long it took.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionBar {
    pub label: String,
    pub ms: f64,
    /// The useful work's rate (the FLOPs of each row's visible keys only), where recorded.
    pub tflops: Option<f64>,
    /// The run's dtype as its JSON spells it (`bfloat16`).
    pub dtype: String,
    /// At S1's shape (its query and its 500 items; results before the shape was recorded are).
    pub s1_shape: bool,
}

/// One `bench load` run: the rate it sustained and its tail latency.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadPoint {
    pub items_per_second: f64,
    pub p99_ms: f64,
    /// What the server ran apart from its defaults (`bench load --server-label`); `None`: the
    /// defaults, whose points make the curve.
    pub server_label: Option<String>,
}

/// One `tally serve` start (the suite's coldstart stage, and each server its load stage starts):
/// how long until it answered `/health`.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerStart {
    /// The server's routes and what its caches held (`empty`: compiles and autotuning from
    /// scratch).
    pub label: String,
    pub seconds: f64,
    /// Of which the warm-up, as its log says (absent where it did not).
    pub warm_up_seconds: Option<f64>,
    /// Started with nothing cached: every kernel compiled, every matmul autotuned.
    pub empty_caches: bool,
}

impl ServerStart {
    /// [`COLD_START_GOAL_S`] from empty caches, else [`CACHED_START_GOAL_S`].
    pub fn goal_seconds(&self) -> f64 {
        if self.empty_caches {
            COLD_START_GOAL_S
        } else {
            CACHED_START_GOAL_S
        }
    }
}

/// One fixture run: every case of one route against its float64 reference.
#[derive(Clone, Debug, PartialEq)]
pub struct FixtureRun {
    /// Backend, dtype and routes, as `check_fixtures.py` names them.
    pub label: String,
    /// The dtype as the result spells it (`bfloat16`).
    pub dtype: String,
    pub passed: usize,
    pub cases: usize,
    /// The largest relative error against the reference, of the cases that ran.
    pub worst_error: f64,
    pub tolerance: f64,
}

/// What a results folder holds, ready to draw or tabulate.
#[derive(Debug, Default)]
pub struct Results {
    pub bars: Vec<Bar>,
    /// Fastest first; a route run alike in several files (the row kernel, the cascade) once.
    pub attention: Vec<AttentionBar>,
    pub load: Vec<LoadPoint>,
    /// Each fixture run (`benches/gpu/check_fixtures.py`), in file order.
    pub fixtures: Vec<FixtureRun>,
    /// Each server start timed, in file order.
    pub starts: Vec<ServerStart>,
    /// The device line of the first result that names one.
    pub device: Option<String>,
}

impl Results {
    /// Reads every `*.json` in `dir`; files of other kinds are skipped.
    pub fn read(dir: &Path) -> Result<Results> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read the results folder {}", dir.display()))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
            .collect();
        paths.sort();
        let mut results = Results::default();
        for path in paths {
            let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
            let value: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
            results.add(&value);
        }
        results.name_runs_apart();
        results.load.sort_by(|a, b| a.items_per_second.total_cmp(&b.items_per_second));
        results.attention.sort_by(|a, b| a.ms.total_cmp(&b.ms));
        Ok(results)
    }

    fn add(&mut self, result: &Value) {
        let text = |key: &str| result[key].as_str().unwrap_or("").to_owned();
        if self.device.is_none() {
            self.device = result["device"].as_str().map(str::to_owned);
        }
        match result["benchmark"].as_str() {
            Some("scenario") => {
                let timing = if result["warm_median"].is_object() { &result["warm_median"] } else { &result["cold"] };
                if let Some(rate) = timing["items_per_second"].as_f64() {
                    // The matmul route when not CubeCL's autotuned one (cuBLASLt, the register-block kernel).
                    let matmul = match text("matmul").as_str() {
                        "" | "cubecl" => String::new(),
                        other => format!(" {other}"),
                    };
                    let elementwise = if text("elementwise") == "kernels" { " ew-kernels" } else { "" };
                    // GPU runs before `--fusion` (session 41) were all fused and say nothing of
                    // it; the CPU has no fusion layer.
                    let unfused = if result["fused"].as_bool() == Some(false) && text("backend") != "cpu" { " unfused" } else { "" };
                    // A tile timed at start-up may be a variant's own: the run says it picked it.
                    let tuned = if result["tile_tuning"].is_string() { " tuned" } else { "" };
                    let label = format!("tally {} {} {}{tuned}{matmul}{elementwise}{unfused}{}", text("backend"), short_dtype(&text("dtype")), text("attention"), flushed(result));
                    let pass_tokens = result["max_batch_tokens"].as_u64();
                    let tile = result["tile"].as_str().map(str::to_owned);
                    let warm_request = match (result["warm_prefill_tokens_per_request"].as_f64(), result["warm_item_passes_per_request"].as_f64()) {
                        (Some(prefill_tokens), Some(item_passes)) => Some(WarmRequest { prefill_tokens, prefill_passes: result["warm_prefill_passes_per_request"].as_f64(), item_passes }),
                        _ => None,
                    };
                    self.bars.push(Bar { scenario: text("scenario"), label: label.trim_end().to_owned(), items_per_second: rate, backend: text("backend"), peer: false, pass_tokens, tile, warm_request });
                }
            }
            Some("multi-item attention, one layer") => {
                // The tile routes carry their tile's size; what launched says the rest (loads,
                // stages). A route the same in several files (the row kernel and the cascade in
                // every file of a dtype) is drawn once.
                let size = text("tile").split(',').next().unwrap_or_default().to_owned();
                // A shape other than S1's items is named: its time is no S1 layer's.
                let other_items = result["shape"]["items"].as_u64().filter(|&items| items != s1::ITEMS as u64);
                let items = other_items.map_or(String::new(), |items| format!(", {items} items"));
                let s1_shape = other_items.is_none() && result["shape"]["prefix"].as_u64().is_none_or(|prefix| prefix == s1::QUERY_TOKENS as u64);
                for (route, key) in [("kernel", "multi_item"), ("tiled", "tiled"), ("flash", "flash"), ("cascade", "cascade")] {
                    let Some(ms) = result[format!("{key}_ms")].as_f64() else { continue };
                    let tflops = result[format!("{key}_tflops")].as_f64();
                    let launched = result["launched"][route].as_str().unwrap_or(route);
                    let tile = if matches!(route, "tiled" | "flash") { format!(" {size}") } else { String::new() };
                    let label = format!("{route} {}{tile}{items}{}: {launched}", short_dtype(&text("dtype")), flushed(result));
                    if !self.attention.iter().any(|bar| bar.label == label) {
                        self.attention.push(AttentionBar { label, ms, tflops, dtype: text("dtype"), s1_shape });
                    }
                }
            }
            Some("load") => {
                if let (Some(rate), Some(p99)) = (result["items_per_second"].as_f64(), result["latency_ms"]["p99"].as_f64()) {
                    self.load.push(LoadPoint { items_per_second: rate, p99_ms: p99, server_label: result["server_label"].as_str().map(str::to_owned) });
                }
            }
            Some("coldstart") => {
                if let Some(seconds) = result["seconds_to_ready"].as_f64() {
                    let caches = text("caches");
                    let label = format!("{} {}, {}, {caches} caches", text("backend"), short_dtype(&text("dtype")), text("routes"));
                    self.starts.push(ServerStart { label, seconds, warm_up_seconds: result["warm_up_seconds"].as_f64(), empty_caches: caches == "empty" });
                }
            }
            Some(name) if name.starts_with("PyTorch peers") => {
                let Some(peers) = result["peers"].as_object() else { return };
                for (peer, timing) in peers {
                    if let Some(rate) = timing["items_per_second"].as_f64() {
                        let label = format!("PyTorch {} {}", peer.replace('_', " "), short_dtype(&text("dtype")));
                        self.bars.push(Bar { scenario: text("scenario"), label, items_per_second: rate, backend: String::new(), peer: true, pass_tokens: None, tile: None, warm_request: None });
                    }
                }
            }
            // check_fixtures.py's results name no benchmark: they are the ones with cases.
            None if result["cases"].is_array() => {
                let cases = result["cases"].as_array().map(Vec::as_slice).unwrap_or_default();
                // Packed and (where checked) per-item scores against float64.
                let errors = cases.iter().flat_map(|case| [&case["reference_rel_error"], &case["single_reference_rel_error"]]);
                let worst_error = errors.filter_map(serde_json::Value::as_f64).fold(0.0, f64::max);
                let passed = cases.iter().filter(|case| case["ok"].as_bool() == Some(true)).count();
                let routes = [text("backend"), short_dtype(&text("dtype")).to_owned(), text("attention"), text("matmul"), text("elementwise")];
                let label = routes.iter().filter(|part| !part.is_empty()).cloned().collect::<Vec<_>>().join(" ");
                let tolerance = result["tolerance"].as_f64().unwrap_or(f64::NAN);
                self.fixtures.push(FixtureRun { label, dtype: text("dtype"), passed, cases: cases.len(), worst_error, tolerance });
            }
            _ => {}
        }
    }

    /// Runs alike but for their attention tile (the flash kernel's variants), then alike but for
    /// their pass budget (the suite's S1 split into smaller passes beside the one pass the
    /// device gives it), get what sets them apart in their labels.
    fn name_runs_apart(&mut self) {
        self.name_apart_by(|bar| bar.tile.clone());
        self.name_apart_by(|bar| bar.pass_tokens.map(|tokens| format!("{tokens}-token passes")));
    }

    /// Bars of one scenario and label whose `detail`s differ get their detail appended.
    fn name_apart_by(&mut self, detail: impl Fn(&Bar) -> Option<String>) {
        let keys: Vec<(String, String, Option<String>)> = self.bars.iter().map(|bar| (bar.scenario.clone(), bar.label.clone(), detail(bar))).collect();
        for bar in &mut self.bars {
            let mut details = keys.iter().filter(|(scenario, label, _)| *scenario == bar.scenario && *label == bar.label).map(|(_, _, detail)| detail);
            let first = details.next().cloned().flatten();
            let differ = details.any(|other| *other != first);
            if let (true, Some(detail)) = (differ, detail(bar)) {
                bar.label = format!("{}, {detail}", bar.label);
            }
        }
    }

    /// The bars of each scenario present, scenarios in order (s1 before s2).
    pub fn by_scenario(&self) -> Vec<(&str, Vec<&Bar>)> {
        let mut names: Vec<&str> = self.bars.iter().map(|bar| bar.scenario.as_str()).collect();
        names.sort();
        names.dedup();
        names.into_iter().map(|name| (name, self.bars.iter().filter(|bar| bar.scenario == name).collect())).collect()
    }
}

/// " ftz" for a run whose CUDA kernels flushed denormals to zero.
fn flushed(result: &Value) -> &'static str {
    if result["flush_denormals"].as_bool() == Some(true) { " ftz" } else { "" }
}

pub fn short_dtype(dtype: &str) -> &str {
    match dtype {
        "bfloat16" => "bf16",
        "float16" => "f16",
        "float32" => "f32",
        other => other,
    }
}

#[cfg(test)]
pub(crate) mod test_folders {
    use std::path::PathBuf;

    use serde_json::{json, Value};

    /// A fresh folder per test (they run in parallel).
    pub fn folder(test: &str, results: &[(&str, Value)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tally-chart-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, value) in results {
            std::fs::write(dir.join(name), value.to_string()).unwrap();
        }
        std::fs::write(dir.join("suite.log"), "not a result").unwrap();
        dir
    }

    pub fn suite_like(test: &str) -> PathBuf {
        folder(test, &[
            ("scenario-s1.json", json!({"benchmark": "scenario", "scenario": "s1", "backend": "cuda", "dtype": "bfloat16", "attention": "kernel", "device": "H100", "cold": {"items_per_second": 2.0}, "warm_median": {"items_per_second": 849.0}, "warm_prefill_tokens_per_request": 20.0, "warm_prefill_passes_per_request": 0.0, "warm_item_passes_per_request": 1.0})),
            ("scenario-s2-cold.json", json!({"benchmark": "scenario", "scenario": "s2", "backend": "cpu", "dtype": "float32", "attention": "cascade", "matmul": "cubecl", "cold": {"items_per_second": 30.0}, "warm_median": null})),
            ("scenario-s2-block.json", json!({"benchmark": "scenario", "scenario": "s2", "backend": "wgpu", "dtype": "float32", "attention": "kernel", "matmul": "block", "warm_median": {"items_per_second": 40.0}})),
            ("peers-s1.json", json!({"benchmark": "PyTorch peers (HF transformers, SDPA)", "scenario": "s1", "dtype": "bfloat16", "peers": {"packed_mask": {"items_per_second": 2410.0}, "padded": {"items_per_second": 82.0}}})),
            ("load-qps300.json", json!({"benchmark": "load", "items_per_second": 3000.0, "latency_ms": {"p50": 90.0, "p99": 400.0}})),
            ("load-qps100.json", json!({"benchmark": "load", "items_per_second": 1000.0, "latency_ms": {"p50": 50.0, "p99": 120.0}})),
            ("load-qps300-no-overlap.json", json!({"benchmark": "load", "server_label": "--no-overlap", "items_per_second": 2500.0, "latency_ms": {"p50": 90.0, "p99": 700.0}})),
            ("attention.json", json!({"benchmark": "multi-item attention, one layer", "dtype": "bfloat16", "tile": "64x16, 2 stages, ldmatrix", "multi_item_ms": 14.9, "flash_ms": 0.8, "launched": {"flash": "flash, tensor cores, ldmatrix, 2 stages"}})),
            ("fixtures-cuda-bfloat16-flash-cublas.json", json!({"backend": "cuda", "dtype": "bfloat16", "attention": "flash", "matmul": "cublas", "elementwise": "burn", "tolerance": 0.03, "cases": [{"case": "a", "reference_rel_error": 0.004, "single_reference_rel_error": 0.006, "ok": true}, {"case": "b", "reference_rel_error": 0.02, "single_reference_rel_error": 0.05, "ok": false}, {"case": "c", "error": "HTTP 500", "ok": false}], "failed": 2})),
            ("attention-few-items.json", json!({"benchmark": "multi-item attention, one layer", "dtype": "bfloat16", "tile": "64x16, 2 stages, ldmatrix", "shape": {"items": 10}, "flash_ms": 0.05, "launched": {"flash": "flash, tensor cores, ldmatrix, 2 stages"}})),
            ("attention-tile.json", json!({"benchmark": "multi-item attention, one layer", "dtype": "bfloat16", "tile": "128x32, 2 stages, ldmatrix", "multi_item_ms": 14.9, "flash_ms": 0.6, "flash_tflops": 277.3, "launched": {"flash": "flash, tensor cores, ldmatrix, 2 stages"}})),
            ("coldstart-defaults-empty.json", json!({"benchmark": "coldstart", "routes": "defaults", "caches": "empty", "seconds_to_ready": 15.0, "warm_up_seconds": 8.2, "backend": "cuda", "dtype": "bfloat16"})),
            ("coldstart-load-server.json", json!({"benchmark": "coldstart", "routes": "defaults", "caches": "kept", "seconds_to_ready": 10.6, "backend": "cuda", "dtype": "bfloat16"})),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_results_folder_becomes_bars_and_load_points() {
        let results = Results::read(&test_folders::suite_like("read")).unwrap();
        assert_eq!(results.device.as_deref(), Some("H100"));
        let bar = |label: &str| results.bars.iter().find(|b| b.label == label).unwrap_or_else(|| panic!("no bar {label}: {:?}", results.bars)).clone();
        let warm_request = Some(WarmRequest { prefill_tokens: 20.0, prefill_passes: Some(0.0), item_passes: 1.0 });
        assert_eq!(bar("tally cuda bf16 kernel"), Bar { scenario: "s1".into(), label: "tally cuda bf16 kernel".into(), items_per_second: 849.0, backend: "cuda".into(), peer: false, pass_tokens: None, tile: None, warm_request });
        // No warm request: the cold one stands in.
        assert_eq!(bar("tally cpu f32 cascade").items_per_second, 30.0);
        assert_eq!(bar("tally wgpu f32 kernel block").items_per_second, 40.0);
        assert!(bar("PyTorch packed mask bf16").peer);
        assert_eq!(bar("PyTorch padded bf16").items_per_second, 82.0);
        assert_eq!(results.bars.len(), 5, "attention results are not scenario bars");
        // The row kernel's time, the same in both files, once; each flash tile its own; fastest first.
        let attention: Vec<(&str, f64)> = results.attention.iter().map(|bar| (bar.label.as_str(), bar.ms)).collect();
        assert_eq!(attention, [
            ("flash bf16 64x16, 10 items: flash, tensor cores, ldmatrix, 2 stages", 0.05),
            ("flash bf16 128x32: flash, tensor cores, ldmatrix, 2 stages", 0.6),
            ("flash bf16 64x16: flash, tensor cores, ldmatrix, 2 stages", 0.8),
            ("kernel bf16: kernel", 14.9),
        ]);
        let point = |items_per_second, p99_ms, server_label: Option<&str>| LoadPoint { items_per_second, p99_ms, server_label: server_label.map(str::to_owned) };
        assert_eq!(results.load, vec![point(1000.0, 120.0, None), point(2500.0, 700.0, Some("--no-overlap")), point(3000.0, 400.0, None)]);
        let scenarios: Vec<(&str, usize)> = results.by_scenario().into_iter().map(|(name, bars)| (name, bars.len())).collect();
        assert_eq!(scenarios, [("s1", 3), ("s2", 2)]);
        // A case that could not run counts against the passes, not in the worst error; a
        // per-item score's error counts as a packed one's does (case b's 0.05).
        assert_eq!(results.fixtures, [FixtureRun { label: "cuda bf16 flash cublas burn".into(), dtype: "bfloat16".into(), passed: 1, cases: 3, worst_error: 0.05, tolerance: 0.03 }]);
        let s1_shape: Vec<bool> = results.attention.iter().map(|bar| bar.s1_shape).collect();
        assert_eq!(s1_shape, [false, true, true, true], "the 10-item run is not at S1's shape");
        // From empty caches the cold goal, from kept ones the cached goal.
        let start = |label: &str, seconds, warm_up_seconds, empty_caches| ServerStart { label: label.into(), seconds, warm_up_seconds, empty_caches };
        assert_eq!(results.starts, [start("cuda bf16, defaults, empty caches", 15.0, Some(8.2), true), start("cuda bf16, defaults, kept caches", 10.6, None, false)]);
        assert_eq!(results.starts.iter().map(ServerStart::goal_seconds).collect::<Vec<_>>(), [60.0, 10.0]);
    }

    #[test]
    fn runs_alike_but_for_their_passes_are_named_apart() {
        let run = |tokens: u64, attention: &str, rate: f64| json!({"benchmark": "scenario", "scenario": "s1", "backend": "cuda", "dtype": "bfloat16", "attention": attention, "max_batch_tokens": tokens, "warm_median": {"items_per_second": rate}});
        let dir = test_folders::folder("passes", &[("one-pass.json", run(60_000, "flash", 9000.0)), ("split.json", run(8192, "flash", 7000.0)), ("kernel.json", run(60_000, "kernel", 900.0))]);
        let labels: Vec<String> = Results::read(&dir).unwrap().bars.into_iter().map(|bar| bar.label).collect();
        assert_eq!(labels, ["tally cuda bf16 kernel", "tally cuda bf16 flash, 60000-token passes", "tally cuda bf16 flash, 8192-token passes"]);
    }

    #[test]
    fn the_flash_kernels_variants_are_named_apart_by_their_tiles() {
        let run = |tile: &str, flushed: bool, rate: f64| json!({"benchmark": "scenario", "scenario": "s1", "backend": "cuda", "dtype": "bfloat16", "attention": "flash", "tile": tile, "flush_denormals": flushed, "max_batch_tokens": 32768, "warm_median": {"items_per_second": rate}});
        let default = "128x64, 2 stages, ldmatrix";
        let warp32 = "128x64, 2 stages, ldmatrix, cp-async, 32 rows a warp";
        let dir = test_folders::folder("variants", &[
            ("a-default.json", run(default, false, 3000.0)),
            ("b-warp32.json", run(warp32, false, 4000.0)),
            ("c-warp32-ftz.json", run(warp32, true, 4500.0)),
            ("d-split.json", json!({"benchmark": "scenario", "scenario": "s1", "backend": "cuda", "dtype": "bfloat16", "attention": "flash", "tile": default, "max_batch_tokens": 8192, "warm_median": {"items_per_second": 2500.0}})),
            ("e-unfused.json", json!({"benchmark": "scenario", "scenario": "s1", "backend": "cuda", "dtype": "bfloat16", "attention": "flash", "tile": warp32, "flush_denormals": true, "fused": false, "max_batch_tokens": 32768, "warm_median": {"items_per_second": 5000.0}})),
            // The tile a start-up tuning kept, the same as a variant's: apart by the tuning.
            ("f-tuned.json", json!({"benchmark": "scenario", "scenario": "s1", "backend": "cuda", "dtype": "bfloat16", "attention": "flash", "tile": warp32, "tile_tuning": "flash tile …", "flush_denormals": true, "fused": false, "max_batch_tokens": 32768, "warm_median": {"items_per_second": 5100.0}})),
        ]);
        let labels: Vec<String> = Results::read(&dir).unwrap().bars.into_iter().map(|bar| bar.label).collect();
        assert_eq!(labels, [
            format!("tally cuda bf16 flash, {default}, 32768-token passes"),
            format!("tally cuda bf16 flash, {warp32}"),
            "tally cuda bf16 flash ftz".to_owned(),
            format!("tally cuda bf16 flash, {default}, 8192-token passes"),
            "tally cuda bf16 flash unfused ftz".to_owned(),
            "tally cuda bf16 flash tuned unfused ftz".to_owned(),
        ]);
    }

    #[test]
    fn a_missing_folder_is_an_error() {
        let dir = test_folders::folder("missing", &[]);
        assert!(Results::read(&dir.join("missing")).unwrap_err().to_string().contains("cannot read the results folder"));
    }
}
