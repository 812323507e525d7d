//! A cube-wide reduction of one float per unit, as a tree in shared memory: the row kernels'
//! (RMSNorm's sum of squares, the softmax's maximum and sum) one building block.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

/// The maximum (`max`) or sum of `value` over the cube, returned to every unit. `partials` has a
/// slot a unit and the cube is a power of two (the tree halves it). Every unit reads the result
/// from `partials`: sync before reusing it.
#[cube]
pub(crate) fn cube_reduce(partials: &mut SharedMemory<f32>, value: f32, #[comptime] max: bool) -> f32 {
    let unit = UNIT_POS_X as usize;
    partials[unit] = value;
    sync_cube();
    let mut stride = CUBE_DIM_X as usize / 2;
    while stride > 0 {
        if unit < stride {
            if comptime![max] {
                partials[unit] = f32::max(partials[unit], partials[unit + stride]);
            } else {
                partials[unit] += partials[unit + stride];
            }
        }
        sync_cube();
        stride /= 2;
    }
    partials[0]
}
