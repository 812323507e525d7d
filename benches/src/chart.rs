//! `tally bench chart`: one PNG of a results folder, for people who would rather look than read.
//! Top: items/s per scenario, tally's runs beside the PyTorch peers measured in the same run,
//! with the goal marked. Middle: one layer's multi-item attention per route and tile variant
//! (`bench attention`), with the goal marked. Bottom: `bench load`'s P99 latency against the
//! items/s it sustained, with the 500 ms bar.

use std::path::{Path, PathBuf};
use std::sync::Once;

use anyhow::{Context, Result};
use clap::Args;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;

#[derive(Args)]
pub struct ChartArgs {
    /// A folder of `tally bench` and `pytorch_peers.py` JSON results (e.g. the GPU suite's).
    #[arg(long)]
    pub results: PathBuf,
    /// The PNG to write; default `<results>/chart.png`.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// One bar: a run's items/s on one scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    pub scenario: String,
    pub label: String,
    pub items_per_second: f64,
    /// A PyTorch peer rather than tally.
    pub peer: bool,
}

/// One layer's attention on one route (`bench attention`): what ran and how long it took.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionBar {
    pub label: String,
    pub ms: f64,
}

/// One `bench load` run: the rate it sustained and its tail latency.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadPoint {
    pub items_per_second: f64,
    pub p99_ms: f64,
}

/// What a results folder holds, ready to draw.
#[derive(Debug, Default)]
pub struct Results {
    pub bars: Vec<Bar>,
    /// Fastest first; a route run alike in several files (the row kernel, the cascade) once.
    pub attention: Vec<AttentionBar>,
    pub load: Vec<LoadPoint>,
    /// The device line of the first result that names one.
    pub device: Option<String>,
}

/// The goals (H100, Qwen3-0.6B shape, bf16), drawn as lines.
const SCENARIO_GOALS: [(&str, f64); 2] = [("s1", 10_000.0), ("s2", 15_000.0)];
/// One layer's attention at S1's shape (issue: ≤ 0.9 ms, ≥ 200 TFLOP/s useful).
const ATTENTION_GOAL_MS: f64 = 0.9;
const LOAD_P99_BAR_MS: f64 = 500.0;

pub fn run(args: ChartArgs) -> Result<()> {
    let results = Results::read(&args.results)?;
    let out = args.out.unwrap_or_else(|| args.results.join("chart.png"));
    draw(&results, &out)?;
    println!("wrote {} ({} bars, {} attention bars, {} load points)", out.display(), results.bars.len(), results.attention.len(), results.load.len());
    Ok(())
}

impl Results {
    /// Reads every `*.json` in `dir`; files of other kinds are skipped.
    pub fn read(dir: &Path) -> Result<Results> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read the results folder {}", dir.display()))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
            .collect();
        paths.sort();
        let mut results = Results::default();
        for path in paths {
            let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
            let value: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
            results.add(&value);
        }
        results.load.sort_by(|a, b| a.items_per_second.total_cmp(&b.items_per_second));
        results.attention.sort_by(|a, b| a.ms.total_cmp(&b.ms));
        Ok(results)
    }

    fn add(&mut self, result: &Value) {
        let text = |key: &str| result[key].as_str().unwrap_or("").to_owned();
        if self.device.is_none() {
            self.device = result["device"].as_str().map(str::to_owned);
        }
        match result["benchmark"].as_str() {
            Some("scenario") => {
                let timing = if result["warm_median"].is_object() { &result["warm_median"] } else { &result["cold"] };
                if let Some(rate) = timing["items_per_second"].as_f64() {
                    let cublas = if text("matmul") == "cublas" { " cublas" } else { "" };
                    let elementwise = if text("elementwise") == "kernels" { " ew-kernels" } else { "" };
                    let label = format!("tally {} {} {}{cublas}{elementwise}", text("backend"), short_dtype(&text("dtype")), text("attention"));
                    self.bars.push(Bar { scenario: text("scenario"), label: label.trim_end().to_owned(), items_per_second: rate, peer: false });
                }
            }
            Some("multi-item attention, one layer") => {
                // The tile routes carry their tile's size; what launched says the rest (loads,
                // stages). A route the same in several files (the row kernel and the cascade in
                // every file of a dtype) is drawn once.
                let size = text("tile").split(',').next().unwrap_or_default().to_owned();
                for (route, key) in [("kernel", "multi_item_ms"), ("tiled", "tiled_ms"), ("flash", "flash_ms"), ("cascade", "cascade_ms")] {
                    let Some(ms) = result[key].as_f64() else { continue };
                    let launched = result["launched"][route].as_str().unwrap_or(route);
                    let tile = if matches!(route, "tiled" | "flash") { format!(" {size}") } else { String::new() };
                    let label = format!("{route} {}{tile}: {launched}", short_dtype(&text("dtype")));
                    if !self.attention.iter().any(|bar| bar.label == label) {
                        self.attention.push(AttentionBar { label, ms });
                    }
                }
            }
            Some("load") => {
                if let (Some(rate), Some(p99)) = (result["items_per_second"].as_f64(), result["latency_ms"]["p99"].as_f64()) {
                    self.load.push(LoadPoint { items_per_second: rate, p99_ms: p99 });
                }
            }
            Some(name) if name.starts_with("PyTorch peers") => {
                let Some(peers) = result["peers"].as_object() else { return };
                for (peer, timing) in peers {
                    if let Some(rate) = timing["items_per_second"].as_f64() {
                        let label = format!("PyTorch {} {}", peer.replace('_', " "), short_dtype(&text("dtype")));
                        self.bars.push(Bar { scenario: text("scenario"), label, items_per_second: rate, peer: true });
                    }
                }
            }
            _ => {}
        }
    }

    /// The bars of each scenario present, scenarios in order (s1 before s2).
    fn by_scenario(&self) -> Vec<(&str, Vec<&Bar>)> {
        let mut names: Vec<&str> = self.bars.iter().map(|bar| bar.scenario.as_str()).collect();
        names.sort();
        names.dedup();
        names.into_iter().map(|name| (name, self.bars.iter().filter(|bar| bar.scenario == name).collect())).collect()
    }
}

fn short_dtype(dtype: &str) -> &str {
    match dtype {
        "bfloat16" => "bf16",
        "float16" => "f16",
        "float32" => "f32",
        other => other,
    }
}

/// plotters' bitmap text needs a font it can load without the system's: ours is built in.
fn register_font() {
    static FONT: Once = Once::new();
    FONT.call_once(|| {
        // A subset of DejaVu Sans (ASCII and a few symbols, 27 KB); licence beside it.
        let font: &'static [u8] = include_bytes!("../assets/DejaVuSans-ascii.ttf");
        plotters::style::register_font("sans-serif", FontStyle::Normal, font).unwrap_or_else(|_| panic!("the built-in font is a valid TrueType file"));
    });
}

const WIDTH: u32 = 1400;
const BAR_ROW_PX: u32 = 34;
const LOAD_PANEL_PX: u32 = 420;
/// Room for the attention panel's title and axis, and for its message when it has no bars.
const ATTENTION_FRAME_PX: u32 = 110;
const NO_PANEL_PX: u32 = 60;
const TALLY: RGBColor = RGBColor(52, 101, 164);
const PEER: RGBColor = RGBColor(160, 160, 160);
const GOAL: RGBColor = RGBColor(204, 0, 0);

/// Rows of every scenario panel: as many as the fullest one has, so bars are the same height in all.
fn scenario_rows(results: &Results) -> usize {
    results.by_scenario().iter().map(|(_, bars)| bars.len()).max().unwrap_or(0).max(1)
}

/// Heights of the scenario panels, the attention panel and the load panel.
fn panel_heights(results: &Results) -> (u32, u32, u32) {
    let rows = scenario_rows(results);
    let attention_px = if results.attention.is_empty() { NO_PANEL_PX } else { ATTENTION_FRAME_PX + BAR_ROW_PX * results.attention.len() as u32 };
    let load_px = if results.load.is_empty() { NO_PANEL_PX } else { LOAD_PANEL_PX };
    (110 + BAR_ROW_PX * rows as u32, attention_px, load_px)
}

/// Draws the scenario panels side by side on top, the attention panel and the load panel under them.
pub fn draw(results: &Results, out: &Path) -> Result<()> {
    register_font();
    let scenarios = results.by_scenario();
    let rows = scenario_rows(results);
    let (bars_px, attention_px, load_px) = panel_heights(results);
    let root = BitMapBackend::new(out, (WIDTH, 50 + bars_px + attention_px + load_px)).into_drawing_area();
    root.fill(&WHITE)?;
    let device = results.device.as_deref().unwrap_or("device not recorded");
    let root = root.titled(&format!("tally — {device}"), ("sans-serif", 26))?;
    let (top, rest) = root.split_vertically(bars_px);
    let (middle, bottom) = rest.split_vertically(attention_px);
    if scenarios.is_empty() {
        top.draw_text("no scenario or peer results", &("sans-serif", 18).into_text_style(&top), (40, 40))?;
    } else {
        for (area, (scenario, bars)) in top.split_evenly((1, scenarios.len())).iter().zip(&scenarios) {
            let goal = SCENARIO_GOALS.iter().find(|(name, _)| name == scenario).map(|(_, goal)| *goal);
            draw_scenario(area, scenario, bars, rows, goal)?;
        }
    }
    draw_attention(&middle, &results.attention)?;
    draw_load(&bottom, &results.load)?;
    root.present().with_context(|| format!("cannot write {}", out.display()))?;
    Ok(())
}

/// 100 → "100", 20000 → "20k".
fn count_label(value: &f64) -> String {
    if *value >= 10_000.0 {
        format!("{:.0}k", value / 1000.0)
    } else {
        format!("{value:.0}")
    }
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

/// Horizontal bars on a log axis, best first; each bar carries its label and value.
fn draw_scenario(area: &Area, scenario: &str, bars: &[&Bar], rows: usize, goal: Option<f64>) -> Result<()> {
    let mut bars = bars.to_vec();
    bars.sort_by(|a, b| b.items_per_second.total_cmp(&a.items_per_second));
    let lowest = bars.iter().map(|b| b.items_per_second).fold(f64::INFINITY, f64::min);
    let highest = bars.iter().map(|b| b.items_per_second).chain(goal).fold(0.0, f64::max);
    let (left, right) = (10f64.powf((lowest / 4.0).log10().floor()), 10f64.powf((highest * 3.0).log10().ceil()));
    let rows = rows as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{} — items/s, warm (log scale)", scenario.to_uppercase()), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(30)
        .build_cartesian_2d((left..right).log_scale(), 0.0..rows)?;
    chart.configure_mesh().disable_y_mesh().disable_y_axis().x_label_formatter(&count_label).draw()?;
    // The first bar on top.
    let row_of = |i: usize| rows - 1.0 - i as f64;
    chart.draw_series(bars.iter().enumerate().map(|(i, bar)| {
        let color = if bar.peer { PEER } else { TALLY };
        Rectangle::new([(left, row_of(i) + 0.12), (bar.items_per_second, row_of(i) + 0.88)], color.mix(0.55).filled())
    }))?;
    let text = ("sans-serif", 15).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
    chart.draw_series(bars.iter().enumerate().map(|(i, bar)| {
        Text::new(format!("{}  {:.0}", bar.label, bar.items_per_second), (left * 1.15, row_of(i) + 0.5), text.clone())
    }))?;
    if let Some(goal) = goal {
        chart.draw_series(std::iter::once(PathElement::new(vec![(goal, 0.0), (goal, rows)], GOAL.stroke_width(2))))?;
        let label = ("sans-serif", 14).into_font().color(&GOAL).pos(Pos::new(HPos::Left, VPos::Top));
        chart.draw_series(std::iter::once(Text::new(format!("goal {} (H100)", count_label(&goal)), (goal * 1.08, rows), label)))?;
    }
    Ok(())
}

/// 0.5 → "0.5", 14.9 → "15", 120 → "120".
fn ms_label(value: &f64) -> String {
    if *value < 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.0}")
    }
}

/// One layer's attention per route, fastest on top, on a log axis of ms; the goal as a line.
fn draw_attention(area: &Area, bars: &[AttentionBar]) -> Result<()> {
    if bars.is_empty() {
        area.draw_text("no attention results", &("sans-serif", 18).into_text_style(area), (40, 20))?;
        return Ok(());
    }
    let lowest = bars.iter().map(|b| b.ms).chain([ATTENTION_GOAL_MS]).fold(f64::INFINITY, f64::min);
    let highest = bars.iter().map(|b| b.ms).fold(0.0, f64::max);
    let (left, right) = (10f64.powf((lowest / 4.0).log10().floor()), 10f64.powf((highest * 3.0).log10().ceil()));
    let rows = bars.len() as f64;
    let mut chart = ChartBuilder::on(area)
        .caption("one layer's multi-item attention, ms (log scale): route, dtype, tile: what launched", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(30)
        .build_cartesian_2d((left..right).log_scale(), 0.0..rows)?;
    chart.configure_mesh().disable_y_mesh().disable_y_axis().x_label_formatter(&ms_label).draw()?;
    let row_of = |i: usize| rows - 1.0 - i as f64;
    chart.draw_series(bars.iter().enumerate().map(|(i, bar)| Rectangle::new([(left, row_of(i) + 0.12), (bar.ms, row_of(i) + 0.88)], TALLY.mix(0.55).filled())))?;
    let text = ("sans-serif", 15).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
    chart.draw_series(bars.iter().enumerate().map(|(i, bar)| Text::new(format!("{}  {} ms", bar.label, ms_label(&bar.ms)), (left * 1.15, row_of(i) + 0.5), text.clone())))?;
    chart.draw_series(std::iter::once(PathElement::new(vec![(ATTENTION_GOAL_MS, 0.0), (ATTENTION_GOAL_MS, rows)], GOAL.stroke_width(2))))?;
    let label = ("sans-serif", 14).into_font().color(&GOAL).pos(Pos::new(HPos::Left, VPos::Top));
    chart.draw_series(std::iter::once(Text::new(format!("goal {ATTENTION_GOAL_MS} ms (H100, bf16, S1's shape)"), (ATTENTION_GOAL_MS * 1.08, rows), label)))?;
    Ok(())
}

/// P99 latency against sustained items/s, one point per offered rate, the 500 ms bar across.
fn draw_load(area: &Area, load: &[LoadPoint]) -> Result<()> {
    if load.is_empty() {
        area.draw_text("no load results", &("sans-serif", 18).into_text_style(area), (40, 40))?;
        return Ok(());
    }
    let most_items = load.iter().map(|p| p.items_per_second).fold(0.0, f64::max) * 1.15;
    let (lowest, highest) = load.iter().map(|p| p.p99_ms).fold((LOAD_P99_BAR_MS, LOAD_P99_BAR_MS), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let mut chart = ChartBuilder::on(area)
        .caption("bench load (300-token queries, 10 × 20-token items, Poisson): P99 latency against items/s", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..most_items, (lowest / 2.0..highest * 2.0).log_scale())?;
    chart.configure_mesh().y_labels(6).x_desc("items/s sustained").y_desc("P99 latency, ms (log)").x_label_formatter(&count_label).y_label_formatter(&count_label).draw()?;
    chart.draw_series(LineSeries::new(load.iter().map(|p| (p.items_per_second, p.p99_ms)), TALLY.stroke_width(2)))?;
    chart.draw_series(load.iter().map(|p| Circle::new((p.items_per_second, p.p99_ms), 5, TALLY.filled())))?;
    chart.draw_series(std::iter::once(PathElement::new(vec![(0.0, LOAD_P99_BAR_MS), (most_items, LOAD_P99_BAR_MS)], GOAL.stroke_width(2))))?;
    let label = ("sans-serif", 14).into_font().color(&GOAL).pos(Pos::new(HPos::Left, VPos::Bottom));
    chart.draw_series(std::iter::once(Text::new("P99 500 ms", (most_items * 0.01, LOAD_P99_BAR_MS * 1.05), label)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A fresh folder per test (they run in parallel).
    fn folder(test: &str, results: &[(&str, Value)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tally-chart-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, value) in results {
            std::fs::write(dir.join(name), value.to_string()).unwrap();
        }
        std::fs::write(dir.join("suite.log"), "not a result").unwrap();
        dir
    }

    fn suite_like(test: &str) -> PathBuf {
        folder(test, &[
            ("scenario-s1.json", json!({"benchmark": "scenario", "scenario": "s1", "backend": "cuda", "dtype": "bfloat16", "attention": "kernel", "device": "H100", "cold": {"items_per_second": 2.0}, "warm_median": {"items_per_second": 849.0}})),
            ("scenario-s2-cold.json", json!({"benchmark": "scenario", "scenario": "s2", "backend": "cpu", "dtype": "float32", "attention": "cascade", "cold": {"items_per_second": 30.0}, "warm_median": null})),
            ("peers-s1.json", json!({"benchmark": "PyTorch peers (HF transformers, SDPA)", "scenario": "s1", "dtype": "bfloat16", "peers": {"packed_mask": {"items_per_second": 2410.0}, "padded": {"items_per_second": 82.0}}})),
            ("load-qps300.json", json!({"benchmark": "load", "items_per_second": 3000.0, "latency_ms": {"p50": 90.0, "p99": 400.0}})),
            ("load-qps100.json", json!({"benchmark": "load", "items_per_second": 1000.0, "latency_ms": {"p50": 50.0, "p99": 120.0}})),
            ("attention.json", json!({"benchmark": "multi-item attention, one layer", "dtype": "bfloat16", "tile": "64x16, 2 stages, ldmatrix", "multi_item_ms": 14.9, "flash_ms": 0.8, "launched": {"flash": "flash, tensor cores, ldmatrix, 2 stages"}})),
            ("attention-tile.json", json!({"benchmark": "multi-item attention, one layer", "dtype": "bfloat16", "tile": "128x32, 2 stages, ldmatrix", "multi_item_ms": 14.9, "flash_ms": 0.6, "launched": {"flash": "flash, tensor cores, ldmatrix, 2 stages"}})),
        ])
    }

    #[test]
    fn a_results_folder_becomes_bars_and_load_points() {
        let results = Results::read(&suite_like("read")).unwrap();
        assert_eq!(results.device.as_deref(), Some("H100"));
        let bar = |label: &str| results.bars.iter().find(|b| b.label == label).unwrap_or_else(|| panic!("no bar {label}: {:?}", results.bars)).clone();
        assert_eq!(bar("tally cuda bf16 kernel"), Bar { scenario: "s1".into(), label: "tally cuda bf16 kernel".into(), items_per_second: 849.0, peer: false });
        // No warm request: the cold one stands in.
        assert_eq!(bar("tally cpu f32 cascade").items_per_second, 30.0);
        assert!(bar("PyTorch packed mask bf16").peer);
        assert_eq!(bar("PyTorch padded bf16").items_per_second, 82.0);
        assert_eq!(results.bars.len(), 4, "attention results are not scenario bars");
        // The row kernel's time, the same in both files, once; each flash tile its own; fastest first.
        let attention: Vec<(&str, f64)> = results.attention.iter().map(|bar| (bar.label.as_str(), bar.ms)).collect();
        assert_eq!(attention, [
            ("flash bf16 128x32: flash, tensor cores, ldmatrix, 2 stages", 0.6),
            ("flash bf16 64x16: flash, tensor cores, ldmatrix, 2 stages", 0.8),
            ("kernel bf16: kernel", 14.9),
        ]);
        assert_eq!(results.load, vec![LoadPoint { items_per_second: 1000.0, p99_ms: 120.0 }, LoadPoint { items_per_second: 3000.0, p99_ms: 400.0 }]);
        let scenarios: Vec<(&str, usize)> = results.by_scenario().into_iter().map(|(name, bars)| (name, bars.len())).collect();
        assert_eq!(scenarios, [("s1", 3), ("s2", 1)]);
    }

    #[test]
    fn the_chart_is_a_png_with_a_row_per_bar() {
        let dir = suite_like("png");
        let out = dir.join("chart.png");
        run(ChartArgs { results: dir.clone(), out: None }).unwrap();
        let png = std::fs::read(&out).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        let (width, height) = (u32::from_be_bytes(png[16..20].try_into().unwrap()), u32::from_be_bytes(png[20..24].try_into().unwrap()));
        assert_eq!((width, height), (WIDTH, 50 + 110 + 3 * BAR_ROW_PX + ATTENTION_FRAME_PX + 3 * BAR_ROW_PX + LOAD_PANEL_PX), "S1 has three bars, attention three, and there are load results");
    }

    #[test]
    fn an_empty_folder_still_draws_and_a_missing_one_is_an_error() {
        let dir = folder("empty", &[]);
        draw(&Results::read(&dir).unwrap(), &dir.join("empty.png")).unwrap();
        assert!(Results::read(&dir.join("missing")).unwrap_err().to_string().contains("cannot read the results folder"));
    }
}
