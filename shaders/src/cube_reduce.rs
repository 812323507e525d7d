//! A cube-wide reduction of one float per unit, as a tree in shared memory, and a row's maximum
//! and sum of exponentials made of it: the row kernels' (RMSNorm's sum of squares, the
//! softmax's and the label log-sum-exp's maximum and sum) building blocks.

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

/// Below any real value, and finite: WGSL cannot spell −∞ (a value may be −∞ itself: a masked
/// score). Also where a running maximum starts before its first row (the label log-sum-exp's).
pub(crate) const NO_VALUE: f32 = -1.0e30;

/// The row `values[base .. base + width]`, read by the cube's units in turn: its maximum and
/// `Σ exp(v − max)`, returned to every unit (`partials` as for [`cube_reduce`]; it holds the sum
/// on return). The row's log-sum-exp is `max + ln(sum)`.
#[cube]
pub(crate) fn row_max_and_exp_sum<F: Float>(values: &Tensor<F>, base: usize, width: usize, partials: &mut SharedMemory<f32>, #[comptime] units: usize) -> (f32, f32) {
    let unit = UNIT_POS_X as usize;
    let mut local_max = f32::new(NO_VALUE);
    let mut i = unit;
    while i < width {
        local_max = f32::max(local_max, f32::cast_from(values[base + i]));
        i += units;
    }
    let max = cube_reduce(partials, local_max, true);
    // Every unit has read the maximum before the sum overwrites it.
    sync_cube();
    let mut local_sum = f32::new(0.0);
    let mut i = unit;
    while i < width {
        local_sum += f32::exp(f32::cast_from(values[base + i]) - max);
        i += units;
    }
    (max, cube_reduce(partials, local_sum, false))
}
