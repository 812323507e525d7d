//! `tally make-model`, `tally bench scenario` and `tally bench soak`, the GPU suite's canary and
//! the scripts that tabulate its profiles: the benchmark harness runs on the CPU with small
//! shapes, so GPU sessions only have to run it.

mod common;

use common::tally;
use serde_json::{json, Value};

#[test]
fn make_model_writes_a_loadable_checkpoint_and_the_scenario_bench_runs_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    let tokenizer = common::model("wide-vocab").join("tokenizer.json");
    let out = tally(&["make-model", "--preset", "tiny", "--out", model.to_str().unwrap(), "--seed", "3", "--tokenizer", tokenizer.to_str().unwrap(), "--max-shard-mib", "8"], "");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(model.join("model.safetensors.index.json").is_file(), "a 20 MB checkpoint with 8 MiB shards is sharded");

    let scored = tally(&["score", "--model", model.to_str().unwrap(), "--query", "Is this relevant?", "--item", "Yes it is", "--label", "Yes", "--label", "No"], "");
    assert!(scored.status.success(), "{}", String::from_utf8_lossy(&scored.stderr));

    let result = dir.path().join("s2.json");
    let bench = tally(&["bench", "scenario", "--model", model.to_str().unwrap(), "--scenario", "s2", "--requests", "2", "--items", "8", "--out", result.to_str().unwrap()], "");
    assert!(bench.status.success(), "{}", String::from_utf8_lossy(&bench.stderr));
    let report = String::from_utf8(bench.stdout).unwrap();
    assert!(report.contains("cold") && report.contains("warm median"), "{report}");
    let result: Value = serde_json::from_str(&std::fs::read_to_string(result).unwrap()).unwrap();
    assert_eq!((&result["scenario"], &result["query_tokens"], &result["item_tokens"]), (&json!("s2"), &json!(1910), &json!(10)));
    assert_eq!(result["request_seconds"].as_array().unwrap().len(), 2);
    assert!(result["warm_median"]["items_per_second"].as_f64().unwrap() > 0.0);
    assert!(result["device"].as_str().is_some_and(|d| !d.is_empty()));
    // The warm request shares the 1,900-token static prefix: only its 10-token suffix is
    // prefilled, in the item pass (no pass for the query alone), and its 8 items take one pass.
    let warm = ["warm_prefill_tokens_per_request", "warm_prefill_passes_per_request", "warm_item_passes_per_request"].map(|key| result[key].clone());
    assert_eq!(warm, [json!(10.0), json!(0.0), json!(1.0)]);
    assert!(report.contains("a warm request: 10 query tokens prefilled, 0.0 prefill passes, 1.0 item passes"), "{report}");
}

/// The GPU suite's canary, rehearsed on the CPU: a flash variant that cannot run fails it, and
/// the scenario stage after it leaves that variant out and narrows every tuning to the
/// candidates that passed; that stage passes, and the suite's exit counts the canary alone.
#[test]
fn the_gpu_suites_canary_leaves_a_failing_tile_out_of_the_later_stages() {
    let dir = tempfile::tempdir().unwrap();
    let suite = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/gpu/suite.sh");
    let run = std::process::Command::new(suite)
        .envs([
            ("TALLY_SUITE_DRY_RUN", "1"),
            ("TALLY_BIN", env!("CARGO_BIN_EXE_tally")),
            ("TALLY_SUITE_WORK", dir.path().join("work").to_str().unwrap()),
            ("OUT", dir.path().join("out").to_str().unwrap()),
            ("TALLY_SUITE_STAGES", "canary scenario"),
            ("TALLY_SUITE_SCENARIOS", "s1"),
            ("TALLY_SUITE_ATTENTIONS", "flash"),
            ("TALLY_SUITE_SCENARIO_EXTRAS", ""),
            // warps12 under a tile size no build has: it cannot run.
            ("TALLY_SUITE_FLASH_VARIANTS", "untuned=--tile-tuning,off filled=--tile-packing,filled warps12=--tile-rows,17"),
        ])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&run.stdout);
    assert_eq!(run.status.code(), Some(1), "one stage failed, the canary: {log}");
    assert!(log.contains("canary: warps12 failed") && log.contains("canary: filled agrees with dense attention"), "{log}");
    assert!(log.contains("canary: the later stages leave out warps12; their flags: --tile-candidates default,filled,split-barriers,ahead,ahead12"), "{log}");
    let results = dir.path().join("work/results");
    let stages = std::fs::read_to_string(results.join("stages.jsonl")).unwrap();
    assert!(stages.contains(r#""stage":"canary","status":"failed""#) && stages.contains(r#""stage":"scenario","status":"ok""#), "{stages}");
    let scenario = |variant: &str| results.join(format!("scenario-s1-cpu-float32-flash-cubecl-{variant}.json"));
    assert!(scenario("untuned").is_file() && scenario("filled").is_file(), "{log}");
    assert!(!scenario("warps12").exists(), "the failed variant ran after all: {log}");
}

#[test]
fn make_model_rejects_an_unknown_preset() {
    let dir = tempfile::tempdir().unwrap();
    let out = tally(&["make-model", "--preset", "qwen9-1t", "--out", dir.path().to_str().unwrap()], "");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown preset \"qwen9-1t\"; choose one of tiny, qwen3-0.6b"));
}

/// A seconds-long soak through the child-server harness the end-to-end tests share: the server
/// starts, is overloaded with valid and invalid requests, loses none and exits 0 on SIGTERM.
#[test]
fn a_short_soak_loses_nothing_and_the_server_drains_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("soak.json");
    let model = common::model("tied-gqa");
    let args = ["bench", "soak", "--model", model.to_str().unwrap(), "--minutes", "0.05", "--calibrate-secs", "1", "--clients", "2", "--out", result.to_str().unwrap()];
    let soak = tally(&args, "");
    assert!(soak.status.success(), "{}", String::from_utf8_lossy(&soak.stderr));
    let result: Value = serde_json::from_str(&std::fs::read_to_string(result).unwrap()).unwrap();
    assert_eq!((&result["requests_lost"], &result["wrong_answers"]), (&json!(0), &json!(0)), "{result:#}");
    assert_eq!(result["server_exit"]["code"], json!(0), "{result:#}");
    assert!(result["valid_scored"].as_u64().unwrap() > 0 && result["rss_mib"]["max"].as_f64().unwrap() > 0.0, "{result:#}");
}

/// `--cuda-profiler-range` (the GPU suite's ncu stage) is refused up front where there is no
/// CUDA profiler, before any request runs, with a message that says why.
#[test]
fn the_scenario_refuses_a_cuda_profiler_range_off_cuda() {
    let model = common::model("tied-gqa");
    let out = tally(&["bench", "scenario", "--model", model.to_str().unwrap(), "--scenario", "s2", "--requests", "1", "--items", "2", "--cuda-profiler-range"], "");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--cuda-profiler-range needs --backend cuda"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("cold"), "no request should have run");
}

/// `benches/gpu/ncu_table.py` on a details page as ncu writes it (its own messages first,
/// thousands separators, durations in two units, `n/a`, a tensor-pipe metric on one kernel and
/// a DRAM rate on the other, stall reasons on one):
/// launches grouped by kernel, sorted by time, throughputs averaged weighted by duration.
#[test]
fn the_ncu_table_groups_launches_by_kernel_and_weights_by_duration() {
    let header = r#""ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value""#;
    let row = |id: u32, kernel: &str, metric: &str, unit: &str, value: &str| {
        format!(r#""{id}","7","tally","h","{kernel}","1","13","(128, 1, 1)","(313, 8, 1)","0","9.0","S","{metric}","{unit}","{value}""#)
    };
    let (flash, gemm) = ("flash_attention_kernel_f_bf16_n_8", "sm90_xmma_gemm_bf16bf16");
    let lines = [
        "==PROF== Connected to process 7".to_owned(),
        "scenario S1: the program's own output".to_owned(),
        header.to_owned(),
        row(0, flash, "Duration", "nsecond", "612,000"),
        row(0, flash, "Compute (SM) Throughput", "%", "70.5"),
        row(0, flash, "Memory Throughput", "%", "40"),
        row(0, flash, "Registers Per Thread", "register/thread", "168"),
        row(0, flash, "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "%", "55"),
        row(1, gemm, "Duration", "usecond", "150.5"),
        row(1, gemm, "Compute (SM) Throughput", "%", "n/a"),
        row(1, gemm, "dram__bytes.sum.per_second", "byte/second", "2,512,000,000,000"),
        row(0, flash, "Warp Cycles Per Issued Instruction", "cycle", "20"),
        row(0, flash, "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", "", "2"),
        row(0, flash, "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio", "", "9"),
        row(0, flash, "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio", "", "3"),
        row(0, flash, "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio", "", "1"),
        row(2, flash, "Duration", "nsecond", "588,000"),
        row(2, flash, "Compute (SM) Throughput", "%", "20.5"),
        row(2, flash, "Memory Throughput", "%", "30"),
        row(2, flash, "Warp Cycles Per Issued Instruction", "cycle", "10"),
        row(2, flash, "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", "", "6"),
        row(2, flash, "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio", "", "1"),
    ];
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("details.csv");
    std::fs::write(&csv, lines.join("\n")).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../benches/gpu/ncu_table.py");
    let out = std::process::Command::new("python3").arg(script).arg(&csv).output().expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("3 profiled launches of 2 kernels, 1.35 ms in all"), "{table}");
    let rows: Vec<&str> = table.lines().filter(|line| line.starts_with("| 1 ") || line.starts_with("| 2 ")).collect();
    // flash: 2 launches, 1.2 ms, 88.9 %; SM (70.5·612 + 20.5·588) / 1200 = 46.0, memory 35.1:
    // both under 60 %, so latency-bound; its tensor pipe 55 %; 168 registers.
    assert!(rows[0].starts_with(&format!("| 1 | `{flash}` | 2 | 1.200 | 88.9 % | 600.0 | 46.0 | 35.1 | — | — | — | 55.0 | latency |")), "{table}");
    assert!(rows[0].contains("| 168 | (128, 1, 1) | (313, 8, 1) |"), "{table}");
    // Its stalls, weighted by duration: cycles per issue (20·612 + 10·588) / 1200 = 15.1;
    // barrier (9·612 + 1·588) / 1200 = 5.1, long scoreboard 4.0, math pipe 3 (its one launch).
    assert!(rows[0].ends_with("| 15.1 | barrier 5.1, long_scoreboard 4.0, math_pipe_throttle 3.0 |"), "{table}");
    // The GEMM: no throughput but its DRAM rate, 2.512e12 bytes/s.
    assert!(rows[1].starts_with(&format!("| 2 | `{gemm}` | 1 | 0.150 | 11.1 % | 150.5 | — | — | — | — | 2512 | — | — |")), "{table}");

    std::fs::write(&csv, "==ERROR== the application exited before any kernel was profiled\n").unwrap();
    let out = std::process::Command::new("python3").arg(script).arg(&csv).output().expect("python3 runs");
    assert!(!out.status.success(), "a report with no launches is a failed stage");
}

/// `benches/gpu/ncu_source.py` on a source page as ncu exports it (the kernel's name row, a `#`
/// column, absolute addresses, per-reason columns and their not-issued twins, a shared-memory
/// excess column): the key loop found by its backward branch (the branch to itself after
/// `EXIT` is no loop), samples split before, in and after it and by kind of instruction inside
/// it, the hottest instruction named with its reasons, the bank conflicts counted.
#[test]
fn the_source_report_splits_a_kernels_samples_by_region_kind_and_instruction() {
    let base = 0x7f00_0000_1000u64;
    let header = r##""#","Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","Instructions Executed","L1 Wavefronts Shared Excessive","stall_long_sb","stall_wait","stall_selected","stall_long_sb (Not Issued)","stall_wait (Not Issued)","stall_selected (Not Issued)""##;
    // (offset, instruction, long_sb, wait, selected, executed, excess): samples = the reasons' sum.
    let program: [(u64, String, u32, u32, u32, u32, u32); 8] = [
        (0x00, "S2R R0, SR_TID.X".into(), 10, 0, 2, 4, 0),
        (0x10, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR10], R35".into(), 300, 0, 10, 40, 0),
        (0x20, "LDSM.16.M88.4 R4, [R2+0x400]".into(), 0, 20, 10, 40, 12),
        (0x30, "HMMA.16816.F32.BF16 R8, R4, R6, R8".into(), 0, 120, 40, 40, 0),
        (0x40, "MUFU.EX2 R12, R12".into(), 0, 60, 20, 40, 0),
        (0x50, format!("@P0 BRA {:#x}", base + 0x10), 0, 5, 5, 40, 0),
        (0x60, "EXIT".into(), 0, 0, 3, 4, 0),
        (0x70, format!("BRA {:#x}", base + 0x70), 0, 0, 0, 0, 0),
    ];
    // Sampled, or as a page reads whose SourceCounters section was left out: every count 0.
    let page = |sampled: bool| {
        let mut lines = vec![r#""Kernel Name","flash_attention_kernel_f_bf16_n_8_w_4""#.to_owned(), header.to_owned()];
        for (n, (offset, text, long_sb, wait, selected, executed, excess)) in program.iter().enumerate() {
            let counts = [long_sb + wait + selected, long_sb + wait, *executed, *excess, *long_sb, *wait, *selected, *long_sb, *wait, 0];
            let counts: Vec<String> = counts.iter().map(|count| format!(r#""{}""#, if sampled { *count } else { 0 })).collect();
            lines.push(format!(r#""{n}","{:#x}","      {text} ",{}"#, base + offset, counts.join(",")));
        }
        lines.join("\n")
    };
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("source.csv");
    std::fs::write(&csv, page(true)).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../benches/gpu/ncu_source.py");
    let out = std::process::Command::new("python3").arg(script).arg(&csv).args(["--kernel", "attention", "--top", "2"]).output().expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = String::from_utf8(out.stdout).unwrap();
    // 605 samples in all, 90 of them issued (selected).
    assert!(report.contains("8 SASS instructions, 605 warp samples (85.1 % not issued)"), "{report}");
    assert!(report.contains("| long_sb | 310 | 51.2 % |"), "{report}");
    // The loop is 0x10..0x50: 595 samples; 12 before it (S2R), 3 after (EXIT).
    assert!(report.contains("| before the key loop | 1 | 12 | 2.0 % | 4 | long_sb 83.3 %, selected 16.7 % |"), "{report}");
    assert!(report.contains("| the key loop (0x10..0x50, its backward branch) | 5 | 590 | 97.5 % | 200 |"), "{report}");
    assert!(report.contains("| after the key loop | 2 | 3 | 0.5 % | 4 | selected 100.0 % |"), "{report}");
    assert!(report.contains("| tensor cores | 1 | 160 | 26.4 % | 40 | 4.000 | wait 75.0 %, selected 25.0 % |"), "{report}");
    assert!(report.contains("| barrier | 1 | 310 | 51.2 % | 40 | 7.750 | long_sb 96.8 %, selected 3.2 % |"), "{report}");
    assert!(report.contains("| 0x10 | `SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR10], R35` | 310 | 51.2 % | 40 | long_sb 96.8 %, selected 3.2 % |"), "{report}");
    assert!(report.contains("excess wavefronts (bank conflicts): LDSM 12."), "{report}");

    // A page whose kernel was never sampled is a failed stage.
    std::fs::write(&csv, page(false)).unwrap();
    let out = std::process::Command::new("python3").arg(script).arg(&csv).output().expect("python3 runs");
    assert!(!out.status.success(), "a page with no samples is a failed stage");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no warp samples"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `benches/gpu/profile_table.py` on CubeCL's profile log (kernel names holding `|`, the last
/// table the one read), `bench scenario`'s cuBLASLt table and an unprofiled warm request's JSON:
/// the kernels' and GEMMs' sum against the request's wall time, and a clear line where that
/// request is missing.
#[test]
fn the_profile_table_sets_the_gpus_busy_time_against_a_warm_requests_wall_time() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("cubecl.log");
    let table = |flash_ms: &str| {
        format!("| Name | Duration | Num Computed | Ratio |\n|---|---|---|---|\n| flash_attention_kernel | Cuda | bf16 | {flash_ms} | 28 | 85% |\n| add_rms_norm_kernel | 10.500ms | 57 | 15% |\n| Total | 70.000ms | 85 | 100% |\n")
    };
    std::fs::write(&log, format!("an earlier sync's table\n{}\nthe profiled request's\n{}", table("900.000ms"), table("59.500ms"))).unwrap();
    let stdout = dir.path().join("scenario.stdout");
    std::fs::write(&stdout, "scenario S1\ncuBLASLt GEMMs (on CubeCL's stream, GPU time between events): 30.0 ms in all\n| m | n | k | batch | calls | ms | TFLOP/s |\n").unwrap();
    let warm = dir.path().join("scenario-s1.json");
    std::fs::write(&warm, r#"{"warm_median": {"total_seconds": 0.125}}"#).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../benches/gpu/profile_table.py");
    let run = |warm: &std::path::Path| {
        let out = std::process::Command::new("python3").arg(script).arg(&log).arg("--stdout").arg(&stdout).arg("--warm-json").arg(warm).output().expect("python3 runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let report = run(&warm);
    assert!(report.contains("CubeCL kernels: 70.0 ms over 85 launches, 2 distinct kernels."), "{report}");
    assert!(report.contains("| 1 | `flash_attention_kernel / Cuda / bf16` | 59.50 | 28 | 85.0 % |"), "{report}");
    assert!(report.contains("cuBLASLt GEMMs (on CubeCL's stream"), "{report}");
    // 70 + 30 = 100 ms busy of 125: 25 ms (20 %) idle.
    assert!(report.contains("CubeCL kernels 70.0 ms + cuBLASLt GEMMs 30.0 ms = 100.0 ms of an unprofiled warm request's 125.0 ms (scenario-s1.json): 25.0 ms (20 %)"), "{report}");
    let report = run(&dir.path().join("absent.json"));
    assert!(report.contains("GPU busy against wall time: no warm request to compare with"), "{report}");
}
