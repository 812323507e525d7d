//! Helpers shared by the end-to-end tests: fixture paths and running the `tally` binary.

#![allow(dead_code)] // each test binary uses its own subset

pub mod gpu;
pub mod server;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

pub fn model(name: &str) -> PathBuf {
    fixtures().join("models").join(name)
}

/// Runs `tally <args>` with `stdin` piped in.
pub fn tally(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tally runs");
    // tally may exit before reading stdin (a broken model directory); that is not a test failure.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    child.wait_with_output().unwrap()
}

/// `tally score --model <model> --request -` with `request` on stdin; returns the response JSON.
pub fn score(model: &str, request: &serde_json::Value, extra: &[&str]) -> serde_json::Value {
    let model = self::model(model);
    let mut args = vec!["score", "--model", model.to_str().unwrap(), "--request", "-"];
    args.extend_from_slice(extra);
    let out = tally(&args, &request.to_string());
    assert!(out.status.success(), "tally failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("stdout is the response JSON")
}

pub fn scores(response: &serde_json::Value) -> Vec<Vec<f64>> {
    serde_json::from_value(response["scores"].clone()).expect("scores is a matrix of numbers")
}

/// Asserts every probability of `got` is within `rel` relative error of `expected`.
pub fn assert_close(got: &[Vec<f64>], expected: &[Vec<f64>], rel: f64, what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: number of items");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert_eq!(g.len(), e.len(), "{what}: item {i} number of labels");
        for (j, (&g, &e)) in g.iter().zip(e).enumerate() {
            assert!((g - e).abs() <= rel * e.abs(), "{what}: scores[{i}][{j}] = {g}, expected {e} (rel {rel})");
        }
    }
}

/// Every float64 fixture case (`tests/fixtures/cases`), in file order.
pub fn cases() -> Vec<Value> {
    let mut paths: Vec<_> = std::fs::read_dir(fixtures().join("cases")).unwrap().map(|e| e.unwrap().path()).collect();
    paths.sort();
    paths.iter().map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()).collect()
}

/// One fixture case by name.
pub fn case(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join(format!("cases/{name}.json"))).unwrap()).unwrap()
}

/// The fixture cases grouped by the model they run on, in file order.
pub fn cases_by_model(cases: &[Value]) -> Vec<(&str, Vec<&Value>)> {
    let mut groups: Vec<(&str, Vec<&Value>)> = Vec::new();
    for case in cases {
        let model = case["model"].as_str().unwrap();
        match groups.iter_mut().find(|(name, _)| *name == model) {
            Some((_, group)) => group.push(case),
            None => groups.push((model, vec![case])),
        }
    }
    groups
}

/// A case's float64 reference scores.
pub fn expected(case: &Value) -> Vec<Vec<f64>> {
    serde_json::from_value(case["expected_scores"].clone()).unwrap()
}
