//! The tile attention kernels' tile shape: a plain choice of sizes, made by flags and planners
//! that need no GPU (the kernels in tally-shaders check it against a device's shared memory),
//! how their tensor-core fragments are read, and how the flash kernel stages its keys and values.

use crate::prefix_split::PrefixSplits;

/// The tile kernels' tile: query rows per cube (16 per plane of 32 units) and keys per step;
/// key steps the flash kernel keeps in flight (`stages`: 2 reads the next step while it
/// computes on this one, in a second buffer; 3 also multiplies the next step's scores while
/// this one's softmax runs, with a third buffer so the step after that can land meanwhile —
/// FlashAttention-3's overlap of softmax and matmul within a warp; the tiled kernel stages one
/// at a time); and how
/// tensor cores read the staged keys and values ([`FragmentLoads`]) and how the flash kernel's
/// two stages bring the next step in ([`KvStaging`]); the register tiles off CUDA ignore both.
/// `warp_rows`: query rows each warp of the flash kernel takes — 16 (one tensor-core `m`, the
/// query in registers) or 32 (FlashAttention-2's layout: two row blocks share every key and
/// value fragment read, the query read from shared memory each step). Larger tiles read each prefix key for more rows and sync less often; smaller ones
/// need less shared memory and registers. [`TileShape::ROWS`] × [`TileShape::KEYS`] ×
/// [`TileShape::STAGES`] are the shapes built. `packing`: how a pass's items fill the tiles
/// ([`TilePacking`]); `splits`: how many cubes the flash kernel cuts each tile's prefix walk
/// over ([`PrefixSplits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileShape {
    pub rows: usize,
    pub keys: usize,
    pub stages: usize,
    pub loads: FragmentLoads,
    pub staging: KvStaging,
    pub warp_rows: usize,
    pub packing: TilePacking,
    pub splits: PrefixSplits,
}

/// How a pass's items (those of one prefix, in order) are cut into tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TilePacking {
    /// A tile takes whole items while they fit; an item longer than a tile is cut into pieces.
    /// S1's 20-token items at 64 tokens a tile: 3 a tile, 60 of its 64 tokens.
    #[default]
    WholeItems,
    /// Every tile but a prefix's last is full: an item that does not fit the open tile whole
    /// begins in it and goes on in the next. Fewer cubes (S1: 1,264 in place of 1,336, five
    /// waves of an H200's 264 two-cube slots rather than six); a tile that begins inside an
    /// item walks that item's earlier keys too (S1: a second own-key step of 64 in most).
    Filled,
}

impl TilePacking {
    /// As the flags and results spell it.
    pub fn name(self) -> &'static str {
        match self {
            TilePacking::WholeItems => "whole-items",
            TilePacking::Filled => "filled",
        }
    }
}

/// How a tile kernel on tensor cores fills its key and value fragments from shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FragmentLoads {
    /// `ldmatrix` (`.trans` for the values): four 8 × 8 matrices, two fragments, per instruction.
    #[default]
    Ldmatrix,
    /// One shared-memory read per element, where CubeCL's `position_of_nth` puts it.
    Elements,
}

impl FragmentLoads {
    /// As the flags and results spell it.
    pub fn name(self) -> &'static str {
        match self {
            FragmentLoads::Ldmatrix => "ldmatrix",
            FragmentLoads::Elements => "elements",
        }
    }
}

/// How the flash kernel's two stages bring the next key step's keys and values from global
/// into shared memory while it computes on this one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum KvStaging {
    /// Each unit reads its share of the next step into registers, and stores it in shared
    /// memory after this step's work: every backend. Three stages on tensor cores take
    /// [`Self::CopyAsync`] whatever is asked (a share in registers beside two steps' scores).
    #[default]
    Registers,
    /// `cp.async` (CUDA, sm_80+): the copies go global → shared without the units' registers
    /// or stores, waited on by a shared-memory barrier. Tensor cores only; the register tiles
    /// take [`Self::Registers`].
    CopyAsync,
    /// `cp.async` with two barriers a buffer, one its copies land on and one its readers
    /// leave by: a step waits for its own copies only, and the next step's copies are issued
    /// after this step's scores, once every unit is done with the buffer they refill. With one
    /// barrier a step, as [`Self::CopyAsync`], every unit waits at each step's start for the
    /// cube's slowest to finish the step before. Two stages only.
    CopyAsyncSplit,
}

impl KvStaging {
    /// As the flags and results spell it.
    pub fn name(self) -> &'static str {
        match self {
            KvStaging::Registers => "registers",
            KvStaging::CopyAsync => "cp-async",
            KvStaging::CopyAsyncSplit => "cp-async-split",
        }
    }

    /// Whether the copies are `cp.async` (either barrier scheme).
    pub fn copies_async(self) -> bool {
        self != KvStaging::Registers
    }
}

impl Default for TileShape {
    fn default() -> Self {
        TileShape { rows: 64, keys: 16, stages: 2, loads: FragmentLoads::default(), staging: KvStaging::default(), warp_rows: 16, packing: TilePacking::default(), splits: PrefixSplits::default() }
    }
}

/// `ROWSxKEYS, STAGES stages, LOADS`, then `, cp-async` and `, 32 rows a warp` where the flash
/// kernel runs so, `, filled tiles` where the tiles are and the prefix walk's split
/// ([`PrefixSplits`]'s text) where the walk is not whole, as the results spell it (runs before
/// those choices read the same).
impl std::fmt::Display for TileShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}, {}, {}", self.rows, self.keys, self.stages_text(), self.loads.name())?;
        if self.staging != KvStaging::Registers {
            write!(f, ", {}", self.staging.name())?;
        }
        if self.warp_rows != 16 {
            write!(f, ", {} rows a warp", self.warp_rows)?;
        }
        if self.packing != TilePacking::WholeItems {
            write!(f, ", {} tiles", self.packing.name())?;
        }
        if self.splits != PrefixSplits::Whole {
            write!(f, ", {}", self.splits)?;
        }
        Ok(())
    }
}

impl TileShape {
    /// Rows per cube a tile may have: 1, 2, 4 or 8 planes of 16.
    pub const ROWS: [usize; 4] = [16, 32, 64, 128];
    /// Keys per step a tile may have.
    pub const KEYS: [usize; 3] = [16, 32, 64];
    /// Key steps in flight the flash kernel may have.
    pub const STAGES: [usize; 3] = [1, 2, 3];
    /// Query rows a warp of the flash kernel may take.
    pub const WARP_ROWS: [usize; 2] = [16, 32];

    /// `None` unless `rows` is in [`Self::ROWS`] and `keys` in [`Self::KEYS`]; two stages,
    /// fragments by `ldmatrix`.
    pub fn new(rows: usize, keys: usize) -> Option<Self> {
        (Self::ROWS.contains(&rows) && Self::KEYS.contains(&keys)).then_some(TileShape { rows, keys, ..TileShape::default() })
    }

    /// This shape with `stages` key steps in flight; `None` unless `stages` is in
    /// [`Self::STAGES`].
    pub fn with_stages(self, stages: usize) -> Option<Self> {
        Self::STAGES.contains(&stages).then_some(TileShape { stages, ..self })
    }

    /// `1 stage`, `2 stages`, as the results spell it.
    pub fn stages_text(self) -> String {
        format!("{} stage{}", self.stages, if self.stages == 1 { "" } else { "s" })
    }

    /// This shape with its fragments read by `loads`.
    pub fn with_loads(self, loads: FragmentLoads) -> Self {
        TileShape { loads, ..self }
    }

    /// This shape with the flash kernel's next key step staged by `staging`.
    pub fn with_staging(self, staging: KvStaging) -> Self {
        TileShape { staging, ..self }
    }

    /// This shape with its tiles packed by `packing`.
    pub fn with_packing(self, packing: TilePacking) -> Self {
        TileShape { packing, ..self }
    }

    /// This shape with its prefix walks cut as `splits` asks.
    pub fn with_splits(self, splits: PrefixSplits) -> Self {
        TileShape { splits, ..self }
    }

    /// This shape with `warp_rows` query rows a warp of the flash kernel; `None` unless
    /// `warp_rows` is in [`Self::WARP_ROWS`] and divides the tile's rows.
    pub fn with_warp_rows(self, warp_rows: usize) -> Option<Self> {
        (Self::WARP_ROWS.contains(&warp_rows) && self.rows.is_multiple_of(warp_rows)).then_some(TileShape { warp_rows, ..self })
    }

    /// Shared memory a cube of either tile kernel needs at most at `head_dim` with
    /// `element_bytes`-byte K/V: the staged keys and values of each stage (rows padded by 8
    /// elements against bank conflicts), the score tile (the tiled kernel; the flash kernel's
    /// register fragments exchange their weights through one), and ten words a row (the tiled
    /// kernel's row state; the flash kernel's row offsets, tokens, item starts and quad
    /// exchanges); with 32 rows a warp, the flash kernel's staged query too.
    pub fn shared_memory_bytes(self, head_dim: usize, element_bytes: usize) -> usize {
        let staged_query = if self.warp_rows > 16 { self.rows * (head_dim + 8) * element_bytes } else { 0 };
        2 * self.stages * self.keys * (head_dim + 8) * element_bytes + self.rows * self.keys * 4 + self.rows * 10 * 4 + staged_query
    }
}

#[cfg(test)]
mod tests {
    use super::{FragmentLoads, KvStaging, PrefixSplits, TileShape};

    #[test]
    fn only_built_shapes_exist_and_print_as_flags_spell_them() {
        assert_eq!(TileShape::new(64, 16), Some(TileShape::default()));
        assert_eq!(TileShape::new(48, 16), None);
        assert_eq!(TileShape::new(64, 8), None);
        assert_eq!(TileShape::new(128, 64).unwrap().to_string(), "128x64, 2 stages, ldmatrix");
        let one_stage = TileShape::default().with_stages(1).unwrap();
        assert_eq!(one_stage.with_loads(FragmentLoads::Elements).to_string(), "64x16, 1 stage, elements");
        assert_eq!(TileShape::default().with_stages(3).unwrap().to_string(), "64x16, 3 stages, ldmatrix");
        assert_eq!(TileShape::default().with_stages(4), None);
        assert_eq!(TileShape::new(128, 64).unwrap().with_staging(KvStaging::CopyAsync).to_string(), "128x64, 2 stages, ldmatrix, cp-async");
        assert_eq!(TileShape::new(128, 64).unwrap().with_staging(KvStaging::CopyAsyncSplit).to_string(), "128x64, 2 stages, ldmatrix, cp-async-split");
        assert!(KvStaging::CopyAsyncSplit.copies_async() && KvStaging::CopyAsync.copies_async() && !KvStaging::Registers.copies_async());
        let two_blocks = TileShape::new(128, 64).unwrap().with_warp_rows(32).unwrap();
        assert_eq!(two_blocks.to_string(), "128x64, 2 stages, ldmatrix, 32 rows a warp");
        assert_eq!(two_blocks.with_splits(PrefixSplits::Auto).to_string(), "128x64, 2 stages, ldmatrix, 32 rows a warp, prefix split auto");
        assert_eq!(TileShape::default().with_splits(PrefixSplits::Parts(3)).to_string(), "64x16, 2 stages, ldmatrix, prefix in 3 parts");
        assert_eq!(TileShape::new(16, 16).unwrap().with_warp_rows(32), None, "a 16-row tile has no warp of 32 rows");
        assert_eq!(TileShape::default().with_warp_rows(24), None);
        // 128 × 64 at head_dim 128 in bf16: 34 KiB of padded K/V a stage, 32 KiB of scores,
        // 5 KiB of row state.
        let largest = TileShape::new(128, 64).unwrap();
        assert_eq!(largest.with_stages(1).unwrap().shared_memory_bytes(128, 2), 72_704);
        assert_eq!(largest.shared_memory_bytes(128, 2), 72_704 + 34_816);
        assert_eq!(largest.with_stages(3).unwrap().shared_memory_bytes(128, 2), 72_704 + 2 * 34_816);
        // 32 rows a warp add the staged query: 128 rows of 136 bf16.
        assert_eq!(largest.with_warp_rows(32).unwrap().shared_memory_bytes(128, 2), 72_704 + 34_816 + 34_816);
    }
}
