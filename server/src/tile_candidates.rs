//! The flash tiles `--tile-tuning` times at start-up, by name: which tiles a backend tries,
//! `--tile-candidates` to narrow them, and each spelled as the flags that run it alone
//! (`tally bench tile-candidates`, from which the GPU suite takes its flash variants, so the
//! tuning and the suite cannot drift apart).

use anyhow::{ensure, Result};
use tally_model::{KvStaging, PrefixSplits, TilePacking, TileShape};

/// A tile a tuning may time, by the name `--tile-candidates` and the GPU suite's results give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileCandidate {
    pub name: &'static str,
    pub tile: TileShape,
}

/// Every candidate's name on any backend, in the order a tuning times them.
const NAMES: [&str; 7] = ["default", "filled", "split-barriers", "ahead", "warps12", "ahead12", "square"];

/// `--tile-candidates`: a set of [`NAMES`] (a bit each, so the flags stay `Copy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CandidateNames(u16);

impl CandidateNames {
    fn contains(self, name: &str) -> bool {
        NAMES.iter().position(|known| *known == name).is_some_and(|bit| self.0 & (1 << bit) != 0)
    }
}

/// Parses `--tile-candidates`: names from [`NAMES`], joined by commas.
pub fn candidate_names(text: &str) -> Result<CandidateNames, String> {
    let mut set = 0u16;
    for name in text.split(',').map(str::trim) {
        let bit = NAMES.iter().position(|known| *known == name).ok_or_else(|| format!("`{name}` is not a tile candidate (they are: {})", NAMES.join(", ")))?;
        set |= 1 << bit;
    }
    Ok(CandidateNames(set))
}

/// The tiles a tuning times from the backend's default tile `default`, that tile first (the one
/// kept unless another is faster by a margin). On CUDA the flash variants the GPU suite measured
/// as worth a try: filled tiles (fewer cubes, so fewer waves), two barriers a buffer, three
/// stages on filled tiles with 16 rows a warp, and the 64 x 32 tile that keeps 12 warps an SM,
/// with two stages and three. Elsewhere filled tiles and a 32 x 32 tile.
pub fn candidates(default: TileShape, cuda: bool) -> Vec<TileCandidate> {
    let filled = default.with_packing(TilePacking::Filled);
    let candidate = |name, tile| TileCandidate { name, tile };
    if !cuda {
        let square = TileShape::new(32, 32).expect("a built shape").with_loads(default.loads).with_splits(default.splits);
        return vec![candidate("default", default), candidate("filled", filled), candidate("square", square)];
    }
    let sixteen_rows = |shape: TileShape| shape.with_warp_rows(16).expect("every tile holds warps of 16 rows");
    let three_stages = |shape: TileShape| shape.with_stages(3).expect("a built shape");
    let twelve_warps = TileShape::new(64, 32).expect("a built shape").with_loads(default.loads).with_staging(default.staging).with_splits(default.splits);
    let twelve_warps = sixteen_rows(twelve_warps.with_packing(TilePacking::Filled));
    vec![
        candidate("default", default),
        candidate("filled", filled),
        candidate("split-barriers", default.with_staging(KvStaging::CopyAsyncSplit)),
        candidate("ahead", three_stages(sixteen_rows(filled))),
        candidate("warps12", twelve_warps),
        candidate("ahead12", three_stages(twelve_warps)),
    ]
}

/// The `candidates` whose names `asked` lists (all where nothing is asked), in their order; an
/// error names one asked that this backend does not try.
pub fn select(candidates: Vec<TileCandidate>, asked: Option<CandidateNames>, backend: &str) -> Result<Vec<TileCandidate>> {
    let Some(asked) = asked else { return Ok(candidates) };
    let tried: Vec<&str> = candidates.iter().map(|candidate| candidate.name).collect();
    for name in NAMES.into_iter().filter(|name| asked.contains(name)) {
        ensure!(tried.contains(&name), "--tile-candidates: `{name}` is not one of {backend}'s tile candidates ({})", tried.join(", "));
    }
    Ok(candidates.into_iter().filter(|candidate| asked.contains(candidate.name)).collect())
}

/// The flags that run `tile` alone, untimed, on a backend whose default tile is `default`:
/// those it differs by (which, naming a tile, turn the tuning off), or `--tile-tuning off` for
/// the default itself. As `tally bench tile-candidates` prints them, so that flags given beside
/// them (the suite's `TALLY_SUITE_TILE_FLAGS`) clash only where they name the same thing.
pub fn flags(tile: TileShape, default: TileShape) -> Vec<String> {
    let splits = |splits: PrefixSplits| match splits {
        PrefixSplits::Whole => "whole".to_owned(),
        PrefixSplits::Auto => "auto".to_owned(),
        PrefixSplits::Parts(parts) => parts.to_string(),
    };
    let spelled = [
        ("--tile-rows", tile.rows != default.rows, tile.rows.to_string()),
        ("--tile-keys", tile.keys != default.keys, tile.keys.to_string()),
        ("--tile-stages", tile.stages != default.stages, tile.stages.to_string()),
        ("--fragment-loads", tile.loads != default.loads, tile.loads.name().to_owned()),
        ("--kv-staging", tile.staging != default.staging, tile.staging.name().to_owned()),
        ("--warp-rows", tile.warp_rows != default.warp_rows, tile.warp_rows.to_string()),
        ("--tile-packing", tile.packing != default.packing, tile.packing.name().to_owned()),
        ("--prefix-splits", tile.splits != default.splits, splits(tile.splits)),
    ];
    let differing: Vec<String> = spelled.into_iter().filter(|(_, differs, _)| *differs).flat_map(|(flag, _, value)| [flag.to_owned(), value]).collect();
    if differing.is_empty() {
        vec!["--tile-tuning".to_owned(), "off".to_owned()]
    } else {
        differing
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{BackendKind, DeviceArgs};
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        device: DeviceArgs,
    }

    fn device(words: &[&str]) -> DeviceArgs {
        Flags::try_parse_from(std::iter::once("tally").chain(words.iter().copied())).unwrap().device
    }

    /// What the GPU suite relies on: a candidate's printed flags, given back to tally, run that
    /// very tile, untuned, on every backend's list; and they are the suite's variants as it
    /// spelled them before it read them from here.
    #[test]
    fn a_candidates_flags_run_its_tile_untuned() {
        for backend in ["cuda", "wgpu"] {
            let asked = device(&["--backend", backend]);
            for candidate in asked.tuning_candidates().unwrap() {
                let words = flags(candidate.tile, asked.tile());
                let mut run = vec!["--backend", backend];
                run.extend(words.iter().map(String::as_str));
                let run = device(&run);
                assert_eq!(run.tile(), candidate.tile, "{backend} {}: {words:?}", candidate.name);
                assert!(!run.tunes_tile(), "{backend} {}: {words:?} time nothing", candidate.name);
            }
        }
        let cuda = device(&["--backend", "cuda"]);
        let spelled: Vec<String> = cuda.tuning_candidates().unwrap().iter().map(|candidate| format!("{} {}", candidate.name, flags(candidate.tile, cuda.tile()).join(" "))).collect();
        assert_eq!(
            spelled,
            [
                "default --tile-tuning off",
                "filled --tile-packing filled",
                "split-barriers --kv-staging cp-async-split",
                "ahead --tile-stages 3 --warp-rows 16 --tile-packing filled",
                "warps12 --tile-rows 64 --tile-keys 32 --warp-rows 16 --tile-packing filled",
                "ahead12 --tile-rows 64 --tile-keys 32 --tile-stages 3 --warp-rows 16 --tile-packing filled",
            ]
        );
        let split = TileShape::default().with_splits(PrefixSplits::Parts(4));
        assert_eq!(flags(split, TileShape::default()), ["--prefix-splits", "4"]);
        assert_eq!(device(&["--backend", "wgpu", "--prefix-splits", "4"]).tile(), split);
    }

    #[test]
    fn candidates_are_narrowed_by_name_in_their_own_order() {
        let cuda = |asked: &str| device(&["--backend", "cuda", "--tile-candidates", asked]).tuning_candidates();
        let names = |asked: &str| cuda(asked).unwrap().iter().map(|candidate| candidate.name).collect::<Vec<_>>();
        assert_eq!(names("ahead12,default, filled"), ["default", "filled", "ahead12"]);
        assert_eq!(names("warps12"), ["warps12"], "the default may be left out; the first left is the reference");
        let all = device(&["--backend", "cuda"]).tuning_candidates().unwrap();
        assert_eq!(all.len(), 6);
        assert_eq!(names("default,filled,split-barriers,ahead,warps12,ahead12").len(), all.len());

        let error = cuda("square").unwrap_err().to_string();
        assert!(error.contains("`square` is not one of cuda's tile candidates (default, filled, split-barriers, ahead, warps12, ahead12)"), "{error}");
        let error = Flags::try_parse_from(["tally", "--tile-candidates", "filled,wide"]).err().unwrap().to_string();
        assert!(error.contains("`wide` is not a tile candidate (they are: default, filled, split-barriers, ahead, warps12, ahead12, square)"), "{error}");
        assert!(Flags::try_parse_from(["tally", "--tile-candidates", ""]).is_err(), "no name at all");

        let wgpu = device(&["--backend", "wgpu", "--tile-candidates", "square,default"]);
        assert_eq!(wgpu.backend, BackendKind::Wgpu);
        assert_eq!(wgpu.tuning_candidates().unwrap().iter().map(|candidate| candidate.name).collect::<Vec<_>>(), ["default", "square"]);
    }
}
