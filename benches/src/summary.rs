//! A results folder as one markdown table: the issues' goals met or not ([`crate::goals`]),
//! then each scenario's runs best first, tally's against the best PyTorch peer measured in the
//! same run; one layer's attention per route; each fixture run; `bench load`'s points; how long
//! each `tally serve` timed took to be ready. `tally bench chart` prints it after the PNG, so it
//! is the last thing the GPU suite prints — what a short GPU lease shows first.

use std::fmt::Write;

use crate::results::{Results, ATTENTION_GOAL_MS, LOAD_P99_BAR_MS, SCENARIO_GOALS};

/// The table, one section per kind of result present.
pub fn table(results: &Results) -> String {
    let mut out = String::new();
    let device = results.device.as_deref().unwrap_or("device not recorded");
    let _ = writeln!(out, "## Summary — {device}\n");
    out.push_str(&crate::goals::table(results));
    for (scenario, bars) in results.by_scenario() {
        let goal = SCENARIO_GOALS.iter().find(|(name, _)| *name == scenario).map(|(_, goal)| *goal);
        let best_peer = bars.iter().filter(|bar| bar.peer).map(|bar| bar.items_per_second).max_by(f64::total_cmp);
        let goal_header = goal.map_or(String::new(), |goal| format!(" (goal {})", thousands(goal)));
        let _ = writeln!(out, "| {} run | items/s{goal_header} | × best PyTorch peer | a warm request: tokens prefilled, prefill passes, item passes |\n|---|---:|---:|---:|", scenario.to_uppercase());
        let mut bars = bars;
        bars.sort_by(|a, b| b.items_per_second.total_cmp(&a.items_per_second));
        for bar in bars {
            let ratio = best_peer.map_or("—".to_owned(), |peer| format!("{:.2}×", bar.items_per_second / peer));
            let warm = bar.warm_request.map_or("—".to_owned(), |warm| {
                let prefill_passes = warm.prefill_passes.map_or("—".to_owned(), |passes| format!("{passes:.1}"));
                format!("{:.0}, {prefill_passes}, {:.1}", warm.prefill_tokens, warm.item_passes)
            });
            let _ = writeln!(out, "| {} | {} | {ratio} | {warm} |", bar.label, thousands(bar.items_per_second));
        }
        out.push('\n');
    }
    if !results.attention.is_empty() {
        let _ = writeln!(out, "| one layer's attention: route, dtype, tile: what launched | ms (goal {ATTENTION_GOAL_MS}) | useful TFLOP/s |\n|---|---:|---:|");
        for bar in &results.attention {
            let tflops = bar.tflops.map_or("—".to_owned(), |rate| format!("{rate:.1}"));
            let _ = writeln!(out, "| {} | {:.3} | {tflops} |", bar.label, bar.ms);
        }
        out.push('\n');
    }
    if !results.fixtures.is_empty() {
        let _ = writeln!(out, "| fixtures: backend, dtype, routes | within tolerance | worst error | tolerance |\n|---|---:|---:|---:|");
        for run in &results.fixtures {
            let mark = if run.passed == run.cases { "" } else { " ✗" };
            let _ = writeln!(out, "| {} | {}/{}{mark} | {:.1e} | {:.0e} |", run.label, run.passed, run.cases, run.worst_error, run.tolerance);
        }
        out.push('\n');
    }
    if !results.load.is_empty() {
        let _ = writeln!(out, "| bench load: items/s sustained | P99 ms (bar {LOAD_P99_BAR_MS}) | server |\n|---:|---:|---|");
        for point in &results.load {
            let _ = writeln!(out, "| {} | {:.0} | {} |", thousands(point.items_per_second), point.p99_ms, point.server_label.as_deref().unwrap_or("defaults"));
        }
        out.push('\n');
    }
    if !results.starts.is_empty() {
        let _ = writeln!(out, "| tally serve: backend, dtype, routes, caches | ready in s | of which warm-up | goal s |\n|---|---:|---:|---:|");
        for start in &results.starts {
            let mark = if start.seconds <= start.goal_seconds() { "" } else { " ✗" };
            let warm_up = start.warm_up_seconds.map_or("—".to_owned(), |seconds| format!("{seconds:.1}"));
            let _ = writeln!(out, "| {} | {:.1}{mark} | {warm_up} | {:.0} |", start.label, start.seconds, start.goal_seconds());
        }
        out.push('\n');
    }
    if results.bars.is_empty() && results.attention.is_empty() && results.fixtures.is_empty() && results.load.is_empty() && results.starts.is_empty() {
        out.push_str("no results\n");
    }
    out
}

/// 12345.6 → "12,346".
pub(crate) fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut grouped = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::test_folders::{folder, suite_like};

    #[test]
    fn every_kind_of_result_is_a_section_with_tally_against_the_best_peer() {
        let table = table(&Results::read(&suite_like("summary")).unwrap());
        assert!(table.starts_with("## Summary — H100\n\n| goal (issue) | this run | |\n|---|---|---|\n| S1 ≥ 10,000 items/s (#26) | 849 (tally cuda bf16 kernel) | 0.08 of it |\n"), "{table}");
        // S1: best first; tally's 849 against the best peer's 2,410, the peer itself at 1.
        let s1 = [
            "| S1 run | items/s (goal 10,000) | × best PyTorch peer | a warm request: tokens prefilled, prefill passes, item passes |",
            "|---|---:|---:|---:|",
            "| PyTorch packed mask bf16 | 2,410 | 1.00× | — |",
            "| tally cuda bf16 kernel | 849 | 0.35× | 20, 0.0, 1.0 |",
            "| PyTorch padded bf16 | 82 | 0.03× | — |",
        ];
        assert!(table.contains(&s1.join("\n")), "{table}");
        // S2 has no peer to compare with, and its one request no warm one.
        assert!(table.contains("| tally cpu f32 cascade | 30 | — | — |"), "{table}");
        assert!(table.contains("| flash bf16 128x32: flash, tensor cores, ldmatrix, 2 stages | 0.600 | 277.3 |"), "{table}");
        assert!(table.contains("| kernel bf16: kernel | 14.900 | — |"), "{table}");
        assert!(table.contains("| cuda bf16 flash cublas burn | 1/3 ✗ | 5.0e-2 | 3e-2 |"), "{table}");
        assert!(table.contains("| 1,000 | 120 | defaults |\n| 2,500 | 700 | --no-overlap |\n| 3,000 | 400 | defaults |"), "{table}");
        assert!(table.contains("| cuda bf16, defaults, empty caches | 15.0 | 8.2 | 60 |\n| cuda bf16, defaults, kept caches | 10.6 ✗ | — | 10 |"), "{table}");
    }

    #[test]
    fn an_empty_folder_says_so() {
        assert_eq!(table(&Results::read(&folder("summary-empty", &[])).unwrap()), "## Summary — device not recorded\n\nno results\n");
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!([thousands(0.4), thousands(999.0), thousands(1000.0), thousands(12_345.6), thousands(1_234_567.0)], ["0", "999", "1,000", "12,346", "1,234,567"]);
    }
}
