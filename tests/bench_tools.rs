//! `tally make-model` and `tally bench scenario`: the benchmark harness runs on CPU with a small
//! preset, so GPU sessions only have to run it.

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
