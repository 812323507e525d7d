//! Benchmark results on disk: the `--out` file of every `tally bench` command.

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
