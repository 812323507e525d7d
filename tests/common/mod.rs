//! The end-to-end tests' one harness: fixtures and the probability comparison (`fixtures`), a
//! `tally serve` child (`server`), the GPU adapter gate (`gpu`), and running the `tally` binary.

#![allow(dead_code)] // each test binary uses its own subset

pub mod fixtures;
pub mod gpu;
pub mod server;

pub use fixtures::*;

use std::io::Write;
use std::process::{Command, Output, Stdio};

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
