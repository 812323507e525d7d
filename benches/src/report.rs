//! Benchmark results on disk (the `--out` file of every `tally bench` command) and the machine
//! they ran on.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

/// Writes `result` as pretty JSON to `out`, when one was asked for.
pub fn write_json(out: Option<&Path>, result: &Value) -> Result<()> {
    if let Some(out) = out {
        std::fs::write(out, serde_json::to_string_pretty(result)? + "\n").with_context(|| format!("cannot write {}", out.display()))?;
    }
    Ok(())
}

/// The CPU's model name and the threads this process may use, e.g. "AMD EPYC (2 threads)".
pub fn cpu_name() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|info| {
        info.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).map(|name| name.trim().to_owned())
    });
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{} ({threads} threads)", cpu.unwrap_or_else(|| "unknown CPU".into()))
}
