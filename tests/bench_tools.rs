//! `tally make-model`, `tally bench scenario` and `tally bench soak`: the benchmark harness runs on
//! CPU with small shapes, so GPU sessions only have to run it.

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
