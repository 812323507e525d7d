//! `tally bench chart`: one PNG of a results folder, for people who would rather look than read.
//! Top: items/s per scenario, tally's runs beside the PyTorch peers measured in the same run,
//! with the goal marked. Middle: one layer's multi-item attention per route and tile variant
//! (`bench attention`), with the goal marked. Bottom: `bench load`'s P99 latency against the
//! items/s it sustained, with the 500 ms bar. The same numbers, with the fixture runs, are then
//! printed as one table ([`crate::summary`]): the last thing the GPU suite prints.

use std::path::{Path, PathBuf};
use std::sync::Once;

use anyhow::{Context, Result};
use clap::Args;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::results::{AttentionBar, Bar, LoadPoint, Results, ATTENTION_GOAL_MS, LOAD_P99_BAR_MS, SCENARIO_GOALS};
use crate::summary;

#[derive(Args)]
pub struct ChartArgs {
    /// A folder of `tally bench` and `pytorch_peers.py` JSON results (e.g. the GPU suite's).
    #[arg(long)]
    pub results: PathBuf,
    /// The PNG to write; default `<results>/chart.png`.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn run(args: ChartArgs) -> Result<()> {
    let results = Results::read(&args.results)?;
    let out = args.out.unwrap_or_else(|| args.results.join("chart.png"));
    draw(&results, &out)?;
    println!("wrote {} ({} bars, {} attention bars, {} load points)\n", out.display(), results.bars.len(), results.attention.len(), results.load.len());
    print!("{}", summary::table(&results));
    Ok(())
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
    // The server's defaults make the curve; a run on other flags is a cross beside it, named.
    let defaults = || load.iter().filter(|p| p.server_label.is_none());
    chart.draw_series(LineSeries::new(defaults().map(|p| (p.items_per_second, p.p99_ms)), TALLY.stroke_width(2)))?;
    chart.draw_series(defaults().map(|p| Circle::new((p.items_per_second, p.p99_ms), 5, TALLY.filled())))?;
    for point in load {
        if let Some(server_label) = &point.server_label {
            let at = (point.items_per_second, point.p99_ms);
            chart.draw_series(std::iter::once(Cross::new(at, 6, TALLY.stroke_width(2))))?;
            let style = ("sans-serif", 14).into_font().color(&TALLY).pos(Pos::new(HPos::Left, VPos::Center));
            chart.draw_series(std::iter::once(Text::new(format!("  {server_label}"), at, style)))?;
        }
    }
    chart.draw_series(std::iter::once(PathElement::new(vec![(0.0, LOAD_P99_BAR_MS), (most_items, LOAD_P99_BAR_MS)], GOAL.stroke_width(2))))?;
    let label = ("sans-serif", 14).into_font().color(&GOAL).pos(Pos::new(HPos::Left, VPos::Bottom));
    chart.draw_series(std::iter::once(Text::new("P99 500 ms", (most_items * 0.01, LOAD_P99_BAR_MS * 1.05), label)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::test_folders::{folder, suite_like};

    #[test]
    fn the_chart_is_a_png_with_a_row_per_bar() {
        let dir = suite_like("png");
        let out = dir.join("chart.png");
        run(ChartArgs { results: dir.clone(), out: None }).unwrap();
        let png = std::fs::read(&out).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        let (width, height) = (u32::from_be_bytes(png[16..20].try_into().unwrap()), u32::from_be_bytes(png[20..24].try_into().unwrap()));
        assert_eq!((width, height), (WIDTH, 50 + 110 + 3 * BAR_ROW_PX + ATTENTION_FRAME_PX + 4 * BAR_ROW_PX + LOAD_PANEL_PX), "S1 has three bars, attention four (one at 10 items), and there are load results");
    }

    #[test]
    fn an_empty_folder_still_draws() {
        let dir = folder("empty", &[]);
        draw(&Results::read(&dir).unwrap(), &dir.join("empty.png")).unwrap();
    }
}
