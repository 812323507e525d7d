//! Which tile the flash kernel runs on this device: each candidate timed on one layer's
//! attention at S1's shape (a 2,020-token query, 20-token items, the model's heads), the fastest
//! kept. The best tile moves with the GPU: its shared memory and registers an SM set how many
//! cubes of each tile run at once, and its SM count how many waves a pass's cubes take (on the
//! H200, 2026-11-27: S1's default 1,336 cubes took six waves of 264 where 1,264 filled ones
//! would take five). FlashAttention and FlashInfer pick their tiles by rules per architecture;
//! a handful of candidates, timed once at start-up, costs a few seconds the first time (each
//! compiles a kernel; CubeCL caches them) and a fraction of a second after.

use burn::tensor::{Distribution, ElementConversion, Tensor};
use tally_model::{AttentionRoute, DeviceReadError, ItemLayout, PrefixKv, Routes, ScoringBackend, TileShape};

use crate::scorer::EngineError;
use crate::timing::median_seconds_back_to_back;

/// S1, the GPU suite's headline request, whose pass the tiles are timed at: a 2,000-token static
/// prefix and a 20-token suffix, then 500 items of 20 tokens. `bench scenario` and `bench
/// attention` take their S1 from here.
pub mod s1 {
    pub const STATIC_PREFIX_TOKENS: usize = 2000;
    pub const SUFFIX_TOKENS: usize = 20;
    pub const QUERY_TOKENS: usize = STATIC_PREFIX_TOKENS + SUFFIX_TOKENS;
    pub const ITEMS: usize = 500;
    pub const ITEM_TOKENS: usize = 20;
}

/// Runs issued back to back and waited for once, a group; groups a candidate (their median).
const RUNS: usize = 5;
const GROUPS: usize = 3;
/// A candidate replaces the first (the backend's default tile) only where it is faster by more
/// than this share: timing noise must not change the tile from one start to the next.
const MARGIN: f64 = 0.02;
/// Largest difference from the first candidate's output a candidate may show: the inputs are
/// uniform in [−1, 1), the outputs of order 1, and a 16-bit output rounds at ~4e-3.
const AGREEMENT: f32 = 2e-2;

/// One layer's attention to time the candidates at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    pub query_tokens: usize,
    pub items: usize,
    pub item_tokens: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl AttentionShape {
    /// S1's pass on a model's heads, within its positions and a pass of `max_pass_tokens` item
    /// tokens.
    pub fn s1(q_heads: usize, kv_heads: usize, head_dim: usize, max_positions: usize, max_pass_tokens: usize) -> Self {
        let item_tokens = s1::ITEM_TOKENS.min(max_positions / 2).max(1);
        let query_tokens = s1::QUERY_TOKENS.min(max_positions.saturating_sub(item_tokens)).max(1);
        let items = s1::ITEMS.min(max_pass_tokens / item_tokens).max(1);
        AttentionShape { query_tokens, items, item_tokens, q_heads, kv_heads, head_dim }
    }
}

/// A candidate's time.
#[derive(Debug, Clone, PartialEq)]
pub struct TileTiming {
    pub tile: TileShape,
    /// What the kernel launched for it ([`tally_model::PlannedAttention::launched`]): a tile
    /// the device cannot hold runs with fewer stages or rows a warp.
    pub launched: String,
    /// One layer's attention, run among others (back to back).
    pub ms: f64,
}

/// What a tuning timed, left out and kept.
#[derive(Debug, Clone, PartialEq)]
pub struct TileTuning {
    pub shape: AttentionShape,
    pub timed: Vec<TileTiming>,
    /// Candidates not timed, and why: the same kernel as an earlier candidate, or an output
    /// off the first candidate's.
    pub left_out: Vec<(TileShape, String)>,
    pub picked: TileShape,
    /// Timed at an earlier start and kept (the server's kept picks), not now.
    pub from_earlier_start: bool,
}

impl std::fmt::Display for TileTuning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.shape;
        write!(f, "flash tile {} (one layer, {}-token query, {} items of {} tokens:", self.picked, s.query_tokens, s.items, s.item_tokens)?;
        for timing in &self.timed {
            write!(f, " {} {:.3} ms;", timing.tile, timing.ms)?;
        }
        for (tile, why) in &self.left_out {
            write!(f, " {tile} left out, {why};")?;
        }
        f.write_str(if self.from_earlier_start { " timed at an earlier start)" } else { ")" })
    }
}

/// Times `candidates` (the first is the backend's default) on the flash route at `shape` and
/// returns the fastest, the first unless another beats it by more than [`MARGIN`]; `None`
/// without candidates. `routes`: the routes the backend runs, the flash kernel's among them
/// ([`crate::Scorer::tune_flash_tile`] asks only then).
pub(crate) fn tune<B: ScoringBackend>(candidates: &[TileShape], routes: Routes, shape: AttentionShape, device: &B::Device) -> Result<Option<TileTuning>, EngineError> {
    let flash = |tile| Routes { attention: AttentionRoute::Flash(tile), ..routes };
    if candidates.is_empty() {
        return Ok(None);
    }
    let s = shape;
    let tokens = s.items * s.item_tokens;
    let random = |dims: [usize; 3]| Tensor::<B, 3>::random(dims, Distribution::Uniform(-1.0, 1.0), device);
    let (queries, keys, values) = (random([tokens, s.q_heads, s.head_dim]), random([tokens, s.kv_heads, s.head_dim]), random([tokens, s.kv_heads, s.head_dim]));
    let prefix = PrefixKv { keys: random([s.kv_heads, s.query_tokens, s.head_dim]), values: random([s.kv_heads, s.query_tokens, s.head_dim]) };
    let item_lens = vec![s.item_tokens; s.items];
    let layout = ItemLayout::new([(s.query_tokens, item_lens.as_slice())]);
    let group = s.q_heads / s.kv_heads;
    let wait = || B::sync(device).map_err(|e| EngineError::from(DeviceReadError(format!("{e:?}"))));

    let mut timed: Vec<TileTiming> = Vec::new();
    let mut left_out = Vec::new();
    let mut reference: Option<Tensor<B, 3>> = None;
    for &tile in candidates {
        let planned = B::plan_attention(flash(tile), &layout, &[(0, s.query_tokens)], group, device);
        let launched = planned.launched(s.head_dim);
        // Tiles that launch the same kernel on the same tiles time the same.
        if let Some(same) = timed.iter().find(|t| t.launched == launched && (t.tile.rows, t.tile.keys, t.tile.packing) == (tile.rows, tile.keys, tile.packing)) {
            left_out.push((tile, format!("runs as {}", same.tile)));
            continue;
        }
        let run = || planned.run(queries.clone(), keys.clone(), values.clone(), &prefix);
        let output = run();
        match &reference {
            None => reference = Some(output),
            Some(reference) => {
                let off = (output - reference.clone()).abs().max().into_scalar().elem::<f32>();
                if off.is_nan() || off > AGREEMENT {
                    left_out.push((tile, format!("its output is {off} off the first candidate's")));
                    continue;
                }
            }
        }
        let seconds = median_seconds_back_to_back(GROUPS, RUNS, run, wait)?;
        timed.push(TileTiming { tile, launched, ms: seconds * 1e3 });
    }
    let picked = fastest(&timed).tile;
    Ok(Some(TileTuning { shape, timed, left_out, picked, from_earlier_start: false }))
}

/// The fastest of `timed`, or the first where none beats it by more than [`MARGIN`].
fn fastest(timed: &[TileTiming]) -> &TileTiming {
    let first = &timed[0];
    let best = timed.iter().min_by(|a, b| a.ms.total_cmp(&b.ms)).expect("the first candidate is always timed");
    if best.ms < first.ms * (1.0 - MARGIN) {
        best
    } else {
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(rows: usize, ms: f64) -> TileTiming {
        TileTiming { tile: TileShape::new(rows, 16).unwrap(), launched: String::new(), ms }
    }

    #[test]
    fn the_default_stays_unless_another_beats_it_by_the_margin() {
        assert_eq!(fastest(&[timing(64, 1.0), timing(32, 0.99), timing(16, 1.5)]).tile.rows, 64, "1 % faster is noise");
        assert_eq!(fastest(&[timing(64, 1.0), timing(32, 0.97), timing(16, 0.9)]).tile.rows, 16, "the fastest of those past the margin");
        assert_eq!(fastest(&[timing(64, 1.0)]).tile.rows, 64);
    }

    #[test]
    fn s1_fits_the_models_positions_and_the_pass() {
        let qwen3 = AttentionShape::s1(16, 8, 128, 40_960, 32_768);
        assert_eq!((qwen3.query_tokens, qwen3.items, qwen3.item_tokens), (2020, 500, 20));
        let small = AttentionShape::s1(4, 2, 16, 64, 100);
        assert_eq!((small.query_tokens, small.items, small.item_tokens), (44, 5, 20), "a 64-position model, a 100-token pass");
        let tiny = AttentionShape::s1(4, 2, 16, 2, 1);
        assert_eq!((tiny.query_tokens, tiny.items, tiny.item_tokens), (1, 1, 1));
    }
}
