//! Cutting the flash kernel's prefix walk over more cubes (FlashDecoding's split-KV, as
//! FlashInfer's prefill does it when a launch has too few blocks for the GPU).
//!
//! A flash cube takes one tile of a pass's item rows and one KV head, and walks the tile's
//! whole prefix, then its own keys. A pass of few tiles then leaves most of the GPU idle however
//! long its prefix: one request of 10 items of 20 tokens on a 2,020-token query is 4 tiles × 8
//! KV heads, 32 cubes where an H200 runs 264 at once, each walking 32 prefix steps. Cut into
//! `parts`, each cube walks one stretch of the prefix (the last part also the tile's own keys)
//! and writes its rows' output normalised with their log-sum-exp; a second kernel merges the
//! parts. The cost: the parts' outputs written and read once more, and a launch.
//!
//! [`prefix_parts`] picks the parts by counting cube waves: a launch takes as many waves as
//! its cubes fill the GPU's concurrent slots, each as long as its longest cube's key steps.

/// How many parts the flash kernel cuts each tile's prefix walk into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PrefixSplits {
    /// Whole: one cube a tile and KV head walks all of it.
    #[default]
    Whole,
    /// As [`prefix_parts`] counts it for each launch, where the device says how many cubes it
    /// runs at once (CUDA); whole elsewhere.
    Auto,
    /// This many parts (at least 2) for every launch: tests, and measuring the planner.
    Parts(usize),
}

impl PrefixSplits {
    /// Most parts [`PrefixSplits::Auto`] cuts a prefix into: each adds its share of the rows'
    /// outputs to the merge.
    pub const MOST_PARTS: usize = 16;
}

/// `prefix whole`, `prefix split auto` or `prefix in N parts`, as the results spell it (a tile
/// shape's text and what a launch ran add it where the walk is not whole).
impl std::fmt::Display for PrefixSplits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PrefixSplits::Whole => write!(f, "prefix whole"),
            PrefixSplits::Auto => write!(f, "prefix split auto"),
            PrefixSplits::Parts(parts) => write!(f, "prefix in {parts} parts"),
        }
    }
}

/// One flash launch as the planner sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixWalk {
    /// Cubes of the launch whole: tiles × KV heads.
    pub cubes: usize,
    /// Cubes the device runs at once (SMs × cubes an SM); `None` where it does not say.
    pub slots: Option<usize>,
    /// Key steps of the longest prefix a tile walks, and of the most own keys a tile walks.
    pub prefix_steps: usize,
    pub own_steps: usize,
    /// Bytes of the launch's output (tokens × query heads × head size × element size).
    pub output_bytes: usize,
}

/// Bytes the merge moves in the time of one key step of a full wave: on the H200 of
/// 2026-11-27 a step of S1's flash kernel (128 × 64 tile) took ~5.3 µs a wave (ncu: 1.05 ms
/// for 6 waves of 33 steps), in which ~4 TB/s of memory moves ~21 MB.
const STEP_BYTES: usize = 21_000_000;
/// The merge's launch and its slowest row, in key steps of a wave (~10 µs).
const MERGE_STEPS: f64 = 2.0;
/// A split must promise at least this much less time than the whole walk: the model counts
/// waves, not the GPU's own scheduling.
const GAIN: f64 = 0.9;

/// Parts to cut each tile's prefix walk into for `walk` as `splits` asks: 1 for
/// [`PrefixSplits::Whole`], the parts asked for [`PrefixSplits::Parts`], and for
/// [`PrefixSplits::Auto`] the count up to [`PrefixSplits::MOST_PARTS`] (and no more than the
/// prefix's steps) with the fewest estimated key steps, waves × each wave's longest cube plus
/// the merge, where that beats the whole walk by a margin; 1 where the device gives no slots.
pub fn prefix_parts(splits: PrefixSplits, walk: PrefixWalk) -> usize {
    match splits {
        PrefixSplits::Whole => 1,
        PrefixSplits::Parts(parts) => parts.max(1),
        PrefixSplits::Auto => {
            let Some(slots) = walk.slots.filter(|&slots| slots > 0) else { return 1 };
            let whole = split_cost(walk, slots, 1);
            let most = PrefixSplits::MOST_PARTS.min(walk.prefix_steps).max(1);
            let (parts, cost) = (2..=most).map(|parts| (parts, split_cost(walk, slots, parts))).fold((1, whole), |best, next| if next.1 < best.1 { next } else { best });
            if cost <= GAIN * whole { parts } else { 1 }
        }
    }
}

/// Estimated key steps of a wave `walk` takes in `parts`: the waves its cubes fill, each as
/// long as a last part (its share of the prefix and the own keys), and with more than one part
/// the merge: each part's output written and read, in steps of [`STEP_BYTES`].
fn split_cost(walk: PrefixWalk, slots: usize, parts: usize) -> f64 {
    let waves = (walk.cubes * parts).div_ceil(slots);
    let longest = walk.prefix_steps.div_ceil(parts) + walk.own_steps;
    let merge = if parts > 1 { MERGE_STEPS + (2 * parts * walk.output_bytes) as f64 / STEP_BYTES as f64 } else { 0.0 };
    (waves * longest) as f64 + merge
}

#[cfg(test)]
mod tests {
    use super::{prefix_parts, PrefixSplits, PrefixWalk};

    /// Qwen3-0.6B's heads on an H200 at the default tile (128 rows, 64 keys, 2 cubes an SM):
    /// 8 KV heads, 16 query heads of 128 in bf16.
    fn walk(tiles: usize, prefix_tokens: usize, own_steps: usize, tokens: usize) -> PrefixWalk {
        PrefixWalk { cubes: tiles * 8, slots: Some(264), prefix_steps: prefix_tokens.div_ceil(64), own_steps, output_bytes: tokens * 16 * 128 * 2 }
    }

    #[test]
    fn s1_stays_whole_and_a_lone_small_request_fills_the_gpu() {
        // S1: 500 items of 20 tokens, 167 whole-item tiles a head: 6 waves, and cut in two,
        // 11 waves of half as long plus a merge of 2 × 41 MB.
        assert_eq!(prefix_parts(PrefixSplits::Auto, walk(167, 2020, 1, 10_020)), 1);
        assert_eq!(prefix_parts(PrefixSplits::Auto, walk(158, 2020, 2, 10_020)), 1, "filled tiles");
        // S2: 500 items of 10 tokens on a 1,920-token query, 84 tiles a head, three waves.
        assert_eq!(prefix_parts(PrefixSplits::Auto, walk(84, 1920, 1, 5_010)), 1);
        // 100 items: 34 tiles, 272 cubes, two waves of 33 steps; four parts: five waves of 9.
        assert_eq!(prefix_parts(PrefixSplits::Auto, walk(34, 2020, 1, 2_000)), 4);
        // One request of 10 items on S1's query: 4 tiles, 32 cubes of 33 steps on 264 slots.
        // Eight parts fill the GPU once with cubes of 4 + 1 steps.
        assert_eq!(prefix_parts(PrefixSplits::Auto, walk(4, 2020, 1, 200)), 8);
        // A lone item: 8 cubes, sixteen parts (the most) of 2 + 1 steps.
        assert_eq!(prefix_parts(PrefixSplits::Auto, walk(1, 2020, 1, 20)), 16);
    }

    #[test]
    fn short_prefixes_and_full_launches_stay_whole() {
        // No prefix to cut (a query's own prefill), or a step of one.
        assert_eq!(prefix_parts(PrefixSplits::Auto, walk(5, 0, 5, 300)), 1);
        assert_eq!(prefix_parts(PrefixSplits::Auto, walk(4, 64, 1, 200)), 1);
        // A load batch of 65 requests of 300-token queries: 260 tiles, 8 waves.
        assert_eq!(prefix_parts(PrefixSplits::Auto, walk(260, 300, 1, 32_500)), 1);
        // No slots known (wgpu): whole.
        assert_eq!(prefix_parts(PrefixSplits::Auto, PrefixWalk { slots: None, ..walk(4, 2020, 1, 200) }), 1);
    }

    #[test]
    fn parts_never_pass_the_prefix_steps_and_asked_parts_are_kept() {
        // Three steps of prefix, one tile: at most three parts.
        assert!(prefix_parts(PrefixSplits::Auto, walk(1, 150, 1, 20)) <= 3);
        assert_eq!(prefix_parts(PrefixSplits::Parts(5), walk(1, 10, 1, 20)), 5, "empty parts are the kernel's to handle");
        assert_eq!(prefix_parts(PrefixSplits::Whole, walk(1, 2020, 1, 20)), 1);
        assert_eq!(PrefixSplits::Parts(3).to_string(), "prefix in 3 parts");
    }
}
