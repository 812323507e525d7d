//! `tally serve --backend wgpu` over real HTTP: four models' float64 fixtures through the CubeCL
//! kernels (also on a flash tile the server timed and picked, and on one an earlier start picked), and
//! every label scored up to the server's maximum. On wgpu's default adapter (lavapipe in CI),
//! under the GPU tests' harness (`common/gpu.rs`): ignored, visibly, where there is none.

mod common;

use std::path::Path;

use common::server::Server;
use common::{assert_close, cases, cases_by_model, expected, gpu, model};
use serde_json::json;

/// The fixture models the wgpu server is checked on against the float64 reference: GGUF weights
/// kept compact on the device (Q4/Q8 and K-quants), bfloat16 safetensors, a request of 120
/// items packed into passes, items with no query, softmax over the labels. Each of the other
/// models' forward passes runs on wgpu in `models_on_gpu` (through fusion, as the server runs it)
/// against the CPU backend, which `http.rs` checks against every fixture: a server per model
/// here cost CI ~26 s each on lavapipe.
const MODELS_SERVED_ON_WGPU: [&str; 4] = ["llama-gguf", "qwen2-gguf", "tied-gqa", "untied-wide-heads"];

/// Fixtures through the CubeCL kernels on wgpu's default adapter (lavapipe in CI), on
/// [`MODELS_SERVED_ON_WGPU`]: one server per model, so kernels compile and autotune once per
/// model. The first server warms up before it serves (a small pass budget keeps that short on
/// lavapipe), its probes saying so meanwhile; its answers must be as right as the others'.
fn the_wgpu_backend_matches_the_reference() {
    let cases = cases();
    let served: Vec<_> = cases_by_model(&cases).into_iter().filter(|(model_name, _)| MODELS_SERVED_ON_WGPU.contains(model_name)).collect();
    assert_eq!(served.len(), MODELS_SERVED_ON_WGPU.len(), "a model of MODELS_SERVED_ON_WGPU has no fixture case");
    for (index, (model_name, model_cases)) in served.into_iter().enumerate() {
        let server = if index == 0 {
            let mut server = Server::start_listening(model_name, &["--backend", "wgpu", "--max-batch-tokens", "64"]);
            probes_say_not_ready_until_warmed_up(&mut server);
            assert!(server.startup_log.iter().any(|line| line.contains("warmed up in")), "no warm-up before serving:\n{}", server.startup_log.join("\n"));
            server
        } else {
            Server::start(model_name, &["--backend", "wgpu", "--no-warmup"])
        };
        for case in model_cases {
            assert_close(&server.score(&case["request"]), &expected(case), 1e-3, &format!("wgpu, {model_name}"));
        }
    }
}

/// While a server loads and warms up: alive (`/live` 200), not ready (`/health` 503 saying
/// `loading`, then `warming_up`), the API refused with 503 JSON; ready once warmed up.
fn probes_say_not_ready_until_warmed_up(server: &mut Server) {
    let mut phases: Vec<String> = Vec::new();
    loop {
        assert_eq!(server.get("/live").0, 200, "alive while starting");
        let (status, body) = server.get("/health");
        let phase = serde_json::from_str::<serde_json::Value>(&body).unwrap()["status"].as_str().unwrap().to_owned();
        if phase == "ok" {
            assert_eq!(status, 200);
            break;
        }
        assert_eq!(status, 503, "{body}");
        if phases.last() != Some(&phase) {
            let (status, error) = server.post("/v1/score", r#"{"query": [1], "items": [[2]], "label_token_ids": [3]}"#);
            assert_eq!((status, error["object"].as_str()), (503, Some("error")), "{error}");
            phases.push(phase);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(phases.ends_with(&["warming_up".to_owned()]) && phases.iter().all(|p| p == "loading" || p == "warming_up"), "phases before ready: {phases:?}");
    server.wait_ready().unwrap();
}

/// The user's case: a model of Qwen3's full vocabulary on wgpu, with more labels than the label
/// kernel has units per row (256), up to the server's configured maximum, in both softmax modes:
/// every probability as the CPU backend gives it, none left at 0.
fn every_label_is_scored_on_wgpu_up_to_the_servers_maximum() {
    let max_labels = 4096;
    let limit = max_labels.to_string();
    let cpu = Server::start("wide-vocab", &["--backend", "cpu", "--max-labels-per-request", &limit]);
    let gpu = Server::start("wide-vocab", &["--backend", "wgpu", "--no-warmup", "--max-labels-per-request", &limit]);
    let vocab = 151_936;
    for count in [1, 255, 256, 257, 1000, max_labels] {
        // Distinct ids spread over the whole vocabulary.
        let labels: Vec<u64> = (0..count as u64).map(|j| (j * 7_919 + 3) % vocab).collect();
        for apply_softmax in [false, true] {
            let request = json!({"query": [9, 8, 7, 6, 5, 4, 3], "items": [[11, 12, 13], [21], [31, 32, 33, 34, 35]], "label_token_ids": labels, "apply_softmax": apply_softmax});
            let (expected, got) = (cpu.score(&request), gpu.score(&request));
            let what = format!("{count} labels, apply_softmax {apply_softmax}");
            assert!(got.iter().flatten().all(|&p| p > 0.0), "{what}: a label scored 0");
            assert_close(&got, &expected, 1e-3, &what);
        }
    }
}

/// S1's shape, 500 items of 20 tokens after a 2,020-token query, with a pass budget of its
/// 10,000 item tokens: one pass on the attention kernels (their scores stay on chip), on the CPU
/// and on wgpu; at least two on the cascade (20.4 M attention cells, past its bound of 16.8 M,
/// and on wgpu within the adapter's largest buffer: the whole pass's scores once asked lavapipe
/// for 265 MB and the server answered 500); the same scores on every route.
fn a_request_of_s1s_shape_is_one_pass_on_the_attention_kernels() {
    let vocab = 512;
    let query: Vec<u32> = (0..2020).map(|i| (i * 7 + 3) % vocab).collect();
    let items: Vec<Vec<u32>> = (0..500).map(|i| (0..20).map(|j| (i * 31 + j * 11 + 5) % vocab).collect()).collect();
    let request = json!({"query": query, "items": items, "label_token_ids": [0, 1, vocab - 1]});
    // A cold autotune of these shapes on lavapipe took 132 s over the three wgpu servers, and
    // past the default 120 s request timeout when CI ran the other tests beside it: the
    // minimal autotune and a longer timeout, since what is tested is passes and scores.
    let budget = ["--max-batch-tokens", "10000", "--no-warmup", "--request-timeout-secs", "900"];
    let autotune = [("CUBECL_AUTOTUNE_LEVEL", Path::new("minimal"))];
    let passes = |server: &Server| (server.metric("tally_pass_items_count"), server.metric("tally_pass_items_sum"));
    let cpu = Server::start("tied-gqa", &budget);
    let expected = cpu.score(&request);
    assert_eq!(passes(&cpu), (1.0, 500.0), "the CPU's attention kernel's passes");
    for (backend, attention) in [("cpu", "cascade"), ("wgpu", "flash"), ("wgpu", "kernel"), ("wgpu", "cascade")] {
        let start = std::time::Instant::now();
        let args = [&["--backend", backend, "--attention", attention][..], &budget].concat();
        let server = Server::start_with(model("tied-gqa").to_str().unwrap(), &args, &autotune);
        assert_close(&server.score(&request), &expected, 1e-3, &format!("{backend} {attention} against the CPU's kernel"));
        let (count, items) = passes(&server);
        assert_eq!(items, 500.0);
        if attention == "cascade" {
            assert!(count >= 2.0, "{backend} cascade: {count} passes");
        } else {
            assert_eq!(count, 1.0, "{backend} {attention}'s passes");
        }
        eprintln!("  {backend} {attention}: {:.1} s", start.elapsed().as_secs_f64());
    }
}

/// `--tile-tuning on` on wgpu: the server times the flash kernel's candidate tiles before it
/// serves, logs each one's time and the tile it keeps, and answers as right as any tile; it
/// keeps the pick under `$XDG_CACHE_HOME/tally/`, where a second start on the same model takes
/// it untimed.
fn a_server_that_tunes_its_flash_tile_answers_as_the_reference() {
    let cases = cases();
    let (model_name, model_cases) = cases_by_model(&cases).into_iter().next().expect("fixture cases");
    let cache = tempfile::tempdir().unwrap();
    let model_path = model(model_name);
    let flags = ["--backend", "wgpu", "--attention", "flash", "--tile-tuning", "on", "--no-warmup", "--max-batch-tokens", "64"];
    let start = || Server::start_with(model_path.to_str().unwrap(), &flags, &[("XDG_CACHE_HOME", cache.path())]);
    let tuning_line = |server: &Server| {
        let log = server.startup_log.join("\n");
        server.startup_log.iter().find(|line| line.contains("flash tile")).cloned().unwrap_or_else(|| panic!("no tile tuning in the log:\n{log}"))
    };
    let server = start();
    let tuning = tuning_line(&server);
    // wgpu's three candidates, each timed or left out with the reason.
    for candidate in ["64x16, 2 stages, ldmatrix", "64x16, 2 stages, ldmatrix, filled tiles", "32x32, 2 stages, ldmatrix"] {
        assert!(tuning.contains(&format!(" {candidate} ")), "{candidate} not in {tuning}");
    }
    assert!(tuning.contains(" ms;") && tuning.contains("timed in"), "no times in {tuning}");
    for case in model_cases.iter().copied() {
        assert_close(&server.score(&case["request"]), &expected(case), 1e-3, &format!("wgpu, tuned flash tile, {model_name}"));
    }
    drop(server);
    assert!(cache.path().join("tally/flash-tiles.json").is_file(), "the pick is kept");

    let again = start();
    let kept = tuning_line(&again);
    assert!(kept.contains("kept in") && kept.contains("timed at an earlier start"), "the second start times again: {kept}");
    let picked = |line: &str| line.split(" (one layer").next().and_then(|head| head.split("flash tile ").nth(1)).map(str::to_owned);
    assert_eq!(picked(&kept), picked(&tuning), "the same tile");
    for case in model_cases.iter().copied() {
        assert_close(&again.score(&case["request"]), &expected(case), 1e-3, &format!("wgpu, kept flash tile, {model_name}"));
    }
}

fn main() {
    gpu::run(gpu::named![
        the_wgpu_backend_matches_the_reference,
        a_server_that_tunes_its_flash_tile_answers_as_the_reference,
        every_label_is_scored_on_wgpu_up_to_the_servers_maximum,
        a_request_of_s1s_shape_is_one_pass_on_the_attention_kernels
    ])
}
