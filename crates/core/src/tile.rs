//! The tiled attention kernel's tile shape: a plain choice of sizes, made by flags and planners
//! that need no GPU (the kernels in tally-shaders check it against a device's shared memory).

/// The tiled kernel's tile: query rows per cube (16 per plane of 32 units) and keys per step.
/// Larger tiles read each prefix key for more rows and sync less often; smaller ones need less
/// shared memory and registers. [`TileShape::ROWS`] × [`TileShape::KEYS`] are the shapes built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileShape {
    pub rows: usize,
    pub keys: usize,
}

impl Default for TileShape {
    fn default() -> Self {
        TileShape { rows: 64, keys: 16 }
    }
}

/// `ROWSxKEYS`, as the flags and results spell it.
impl std::fmt::Display for TileShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.rows, self.keys)
    }
}

impl TileShape {
    /// Rows per cube a tile may have: 1, 2, 4 or 8 planes of 16.
    pub const ROWS: [usize; 4] = [16, 32, 64, 128];
    /// Keys per step a tile may have.
    pub const KEYS: [usize; 3] = [16, 32, 64];

    /// `None` unless `rows` is in [`Self::ROWS`] and `keys` in [`Self::KEYS`].
    pub fn new(rows: usize, keys: usize) -> Option<Self> {
        (Self::ROWS.contains(&rows) && Self::KEYS.contains(&keys)).then_some(TileShape { rows, keys })
    }

    /// Shared memory a cube of either tile kernel needs at most at `head_dim` with
    /// `element_bytes`-byte K/V: the staged keys and values (rows padded by 8 elements against
    /// bank conflicts), the score tile (the tiled kernel;
    /// the flash kernel's register fragments exchange their weights through one), and ten words
    /// a row (the tiled kernel's row state; the flash kernel's row offsets and quad exchanges).
    pub fn shared_memory_bytes(self, head_dim: usize, element_bytes: usize) -> usize {
        2 * self.keys * (head_dim + 8) * element_bytes + self.rows * self.keys * 4 + self.rows * 10 * 4
    }
}

#[cfg(test)]
mod tests {
    use super::TileShape;

    #[test]
    fn only_built_shapes_exist_and_print_as_flags_spell_them() {
        assert_eq!(TileShape::new(64, 16), Some(TileShape::default()));
        assert_eq!(TileShape::new(48, 16), None);
        assert_eq!(TileShape::new(64, 8), None);
        assert_eq!(TileShape::new(128, 64).unwrap().to_string(), "128x64");
        // 128 × 64 at head_dim 128 in bf16: 34 KiB of padded K/V, 32 KiB of scores, 5 KiB of
        // row state.
        assert_eq!(TileShape::new(128, 64).unwrap().shared_memory_bytes(128, 2), 72_704);
    }
}
