//! Grids of more cubes than one dimension holds. WebGPU, Vulkan and CUDA's y/z accept at most
//! 65,535 workgroups along a dimension; a launch of one cube per row, tile or 256 elements
//! passes that at sizes the server accepts (16.7 M label cells is 65,536 cubes of 256). Kernels
//! launched on [`cubes`] find their cube's index with [`cube_index`] and stop past `count`.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

/// Most cubes along one grid dimension every runtime accepts.
pub const MAX_CUBES_PER_DIM: usize = 65_535;

/// `count` cubes (at least one) as an x × y grid, `depth` deep along z. The last row of the
/// grid may run past `count`, by less than a cube a row: the rows are as even as they come (a
/// full first row would leave up to 65,534 cubes of the last with nothing to do — 39 % of a
/// launch of 80,000 rows).
pub fn cubes(count: usize, depth: usize) -> CubeCount {
    let count = count.max(1);
    let rows = count.div_ceil(MAX_CUBES_PER_DIM);
    let columns = count.div_ceil(rows);
    CubeCount::Static(columns as u32, rows as u32, depth as u32)
}

/// This cube's index in a grid made by [`cubes`] (z not counted).
#[cube]
pub fn cube_index() -> usize {
    (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_hold_every_cube_and_no_more_than_a_row_past() {
        for count in [0, 1, 65_534, 65_535, 65_536, 131_071, 16_777_216 / 256 + 1, 5_000_000] {
            let CubeCount::Static(x, y, z) = cubes(count, 3) else { unreachable!() };
            assert!(x as usize <= MAX_CUBES_PER_DIM && y as usize <= MAX_CUBES_PER_DIM && z == 3, "{count}: {x} x {y}");
            let total = x as usize * y as usize;
            assert!(total >= count.max(1) && total - count.max(1) < x as usize, "{count}: {x} x {y}");
            assert!(total - count.max(1) < y as usize, "{count}: {x} x {y} idles a cube or more a row");
        }
    }
}
