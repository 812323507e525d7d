//! Helpers shared by the end-to-end tests: fixture paths and running the `tally` binary.

#![allow(dead_code)] // each test binary uses its own subset

pub mod gpu;
pub mod server;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

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
