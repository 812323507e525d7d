//! The flash tile a device picked, kept across starts. A tuning
//! ([`tally_engine::Scorer::tune_flash_tile`]) compiles and times every candidate tile, seconds
//! at each start and more on a cold GPU; its pick for a device, dtype, tuning shape and candidate
//! list is kept in `flash-tiles.json` under `$XDG_CACHE_HOME/tally/` (else `~/.cache/tally/`),
//! beside CubeCL's own caches (`$XDG_CACHE_HOME/cubecl`; the Helm chart keeps both on its cache
//! volume), and a later start on the same key takes it without timing (`--tile-tuning retime`
//! times again). The key spells every candidate out and a pick names its candidate by index in
//! that list, so candidates changed by a new build, or by flags, make a new key, never a wrong
//! tile; a kernel changed under the same candidates keeps its old pick until retimed.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tally_engine::{AttentionShape, TileTiming, TileTuning};
use tally_model::TileShape;

const FILE_NAME: &str = "flash-tiles.json";

/// The picks kept in one file, by key ([`TilePicks::key`]).
pub struct TilePicks {
    path: PathBuf,
    kept: BTreeMap<String, KeptTuning>,
}

/// A tuning as kept: candidates by their index in the key's list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct KeptTuning {
    picked: usize,
    timed: Vec<KeptTiming>,
    left_out: Vec<(usize, String)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct KeptTiming {
    candidate: usize,
    launched: String,
    ms: f64,
}

impl TilePicks {
    /// Where picks are kept: `$XDG_CACHE_HOME/tally/`, else `$HOME/.cache/tally/`; `None` where
    /// neither variable is set (nothing is kept then).
    pub fn default_path() -> Option<PathBuf> {
        let cache = std::env::var_os("XDG_CACHE_HOME").filter(|dir| !dir.is_empty()).map(PathBuf::from);
        let cache = cache.or_else(|| std::env::var_os("HOME").filter(|dir| !dir.is_empty()).map(|home| Path::new(&home).join(".cache")))?;
        Some(cache.join("tally").join(FILE_NAME))
    }

    /// The picks kept at `path`: none where the file does not exist; an unreadable one is
    /// reported and treated as empty (the next pick replaces it).
    pub fn open(path: PathBuf) -> Self {
        let kept = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|error| {
                tracing::warn!("ignoring the kept flash tiles in {}: {error}", path.display());
                BTreeMap::new()
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(error) => {
                tracing::warn!("cannot read the kept flash tiles in {}: {error}", path.display());
                BTreeMap::new()
            }
        };
        TilePicks { path, kept }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What a pick is kept under: the device (`device`: its name), the dtype, the shape the
    /// candidates are timed at, and every candidate in order.
    pub fn key(device: &str, dtype: &str, shape: &AttentionShape, candidates: &[TileShape]) -> String {
        let s = shape;
        let candidates: Vec<String> = candidates.iter().map(ToString::to_string).collect();
        format!(
            "{device} | {dtype} | {} query tokens, {} items of {}, {} query heads, {} KV heads of {} | {}",
            s.query_tokens,
            s.items,
            s.item_tokens,
            s.q_heads,
            s.kv_heads,
            s.head_dim,
            candidates.join(" / ")
        )
    }

    /// The tuning kept under `key`, its candidates read from `candidates` (the key's list),
    /// marked as picked at an earlier start.
    pub fn get(&self, key: &str, shape: AttentionShape, candidates: &[TileShape]) -> Option<TileTuning> {
        let kept = self.kept.get(key)?;
        let candidate = |index: usize| candidates.get(index).copied();
        let timed = kept.timed.iter().map(|t| Some(TileTiming { tile: candidate(t.candidate)?, launched: t.launched.clone(), ms: t.ms })).collect::<Option<Vec<_>>>()?;
        let left_out = kept.left_out.iter().map(|(index, why)| Some((candidate(*index)?, why.clone()))).collect::<Option<Vec<_>>>()?;
        Some(TileTuning { shape, timed, left_out, picked: candidate(kept.picked)?, from_earlier_start: true })
    }

    /// Keeps `tuning` (timed on `candidates`) under `key` and writes the file (a new file
    /// renamed over the old, so a reader never sees half of one; two starts writing at once
    /// keep one of their picks).
    pub fn keep(&mut self, key: String, tuning: &TileTuning, candidates: &[TileShape]) -> Result<()> {
        let index = |tile: &TileShape| candidates.iter().position(|candidate| candidate == tile).context("a tuning's tile is one of its candidates");
        let timed = tuning.timed.iter().map(|t| Ok(KeptTiming { candidate: index(&t.tile)?, launched: t.launched.clone(), ms: t.ms })).collect::<Result<_>>()?;
        let left_out = tuning.left_out.iter().map(|(tile, why)| Ok((index(tile)?, why.clone()))).collect::<Result<_>>()?;
        self.kept.insert(key, KeptTuning { picked: index(&tuning.picked)?, timed, left_out });
        let dir = self.path.parent().context("the picks' file is in a folder")?;
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        // A file of its own first (replicas may share the cache volume), then renamed over.
        let mut written = tempfile::NamedTempFile::new_in(dir).with_context(|| format!("cannot write in {}", dir.display()))?;
        written.write_all(&serde_json::to_vec_pretty(&self.kept)?)?;
        written.persist(&self.path).with_context(|| format!("cannot replace {}", self.path.display()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidates() -> Vec<TileShape> {
        vec![TileShape::new(128, 64).unwrap(), TileShape::new(64, 32).unwrap(), TileShape::new(32, 32).unwrap()]
    }

    fn shape() -> AttentionShape {
        AttentionShape { query_tokens: 2020, items: 500, item_tokens: 20, q_heads: 16, kv_heads: 8, head_dim: 128 }
    }

    fn tuning(candidates: &[TileShape]) -> TileTuning {
        let timing = |index: usize, ms| TileTiming { tile: candidates[index], launched: format!("kernel {index}"), ms };
        TileTuning { shape: shape(), timed: vec![timing(0, 1.5), timing(2, 1.2)], left_out: vec![(candidates[1], "runs as 128x64".into())], picked: candidates[2], from_earlier_start: false }
    }

    #[test]
    fn a_kept_pick_comes_back_under_its_key_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tally").join(FILE_NAME);
        let candidates = candidates();
        let key = TilePicks::key("NVIDIA H200", "bfloat16", &shape(), &candidates);
        let mut picks = TilePicks::open(path.clone());
        assert_eq!(picks.get(&key, shape(), &candidates), None, "nothing kept yet");
        picks.keep(key.clone(), &tuning(&candidates), &candidates).unwrap();

        let reopened = TilePicks::open(path);
        assert_eq!(reopened.get(&key, shape(), &candidates), Some(TileTuning { from_earlier_start: true, ..tuning(&candidates) }));
        // Another device, dtype, shape or candidate list is another key.
        let other_shape = AttentionShape { head_dim: 64, ..shape() };
        for other in [
            TilePicks::key("NVIDIA A100-SXM4-80GB", "bfloat16", &shape(), &candidates),
            TilePicks::key("NVIDIA H200", "float32", &shape(), &candidates),
            TilePicks::key("NVIDIA H200", "bfloat16", &other_shape, &candidates),
            TilePicks::key("NVIDIA H200", "bfloat16", &shape(), &candidates[..2]),
        ] {
            assert_ne!(other, key);
            assert_eq!(reopened.get(&other, shape(), &candidates), None);
        }
    }

    #[test]
    fn an_unreadable_file_keeps_nothing_and_the_next_pick_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        std::fs::write(&path, "{ not json").unwrap();
        let candidates = candidates();
        let key = TilePicks::key("gpu", "bfloat16", &shape(), &candidates);
        let mut picks = TilePicks::open(path.clone());
        assert_eq!(picks.get(&key, shape(), &candidates), None);
        picks.keep(key.clone(), &tuning(&candidates), &candidates).unwrap();
        assert!(TilePicks::open(path).get(&key, shape(), &candidates).is_some());
    }

    #[test]
    fn a_pick_past_its_candidate_list_is_not_taken() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let candidates = candidates();
        let key = TilePicks::key("gpu", "bfloat16", &shape(), &candidates);
        let mut picks = TilePicks::open(path);
        picks.keep(key.clone(), &tuning(&candidates), &candidates).unwrap();
        assert_eq!(picks.get(&key, shape(), &candidates[..2]), None, "the pick is candidate 2");
    }
}
