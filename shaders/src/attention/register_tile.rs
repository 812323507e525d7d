//! The tiled kernel's tile multiply in plain registers, for every backend: lane `l` of a plane
//! takes row `l % 16` and half `l / 16` — of the step's keys for the scores, of the head's
//! dimensions for the output. It is where the tiled kernel's tiling, masks, item windows and
//! online softmax are tested off CUDA (lavapipe).

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::tiled::{plane_and_lane, TileMath, NO_ROW, ROWS_PER_PLANE};

pub(super) struct RegisterTile;

/// This unit's row in the cube and its half (0 or 1).
#[cube]
fn row_and_half() -> (usize, usize) {
    let (plane_row, lane) = plane_and_lane();
    (plane_row + lane % ROWS_PER_PLANE, lane / ROWS_PER_PLANE)
}

#[cube]
impl TileMath for RegisterTile {
    /// The whole query row (both halves of a row hold it).
    fn load_query<F: Float>(queries: &Tensor<F>, row_offsets: &SharedMemory<u32>, #[comptime] head_dim: usize) -> Array<f32> {
        let (row, _) = row_and_half();
        let offset = row_offsets[row];
        let mut query = Array::<f32>::new(head_dim);
        #[unroll]
        for e in 0..head_dim {
            query[e] = 0.0;
            if offset != NO_ROW {
                query[e] = f32::cast_from(queries[offset as usize + e]);
            }
        }
        query
    }

    /// Half the row's dimensions.
    fn new_output<F: Float>(#[comptime] head_dim: usize) -> Array<f32> {
        let mut output = Array::<f32>::new(comptime![head_dim / 2]);
        #[unroll]
        for e in 0..comptime![head_dim / 2] {
            output[e] = 0.0;
        }
        output
    }

    fn scores<F: Float>(query: &Array<f32>, staged_keys: &SharedMemory<F>, scores: &mut SharedMemory<f32>, scale: f32, #[comptime] head_dim: usize, #[comptime] keys: usize) {
        let (row, half) = row_and_half();
        for j in 0..comptime![keys / 2] {
            let key = half * comptime![keys / 2] + j;
            let mut score = f32::new(0.0);
            #[unroll]
            for e in 0..head_dim {
                score += query[e] * f32::cast_from(staged_keys[key * head_dim + e]);
            }
            scores[row * keys + key] = score * scale;
        }
    }

    fn accumulate<F: Float>(output: &mut Array<f32>, weights: &SharedMemory<f32>, corrections: &SharedMemory<f32>, values: &SharedMemory<F>, #[comptime] head_dim: usize, #[comptime] keys: usize) {
        let (row, half) = row_and_half();
        let width = comptime![head_dim / 2];
        let correction = corrections[row];
        #[unroll]
        for e in 0..width {
            output[e] *= correction;
        }
        for key in 0..keys {
            let weight = weights[row * keys + key];
            let base = key * head_dim + half * width;
            #[unroll]
            for e in 0..width {
                output[e] += weight * f32::cast_from(values[base + e]);
            }
        }
    }

    fn store<F: Float>(output: &Array<f32>, sums: &SharedMemory<f32>, row_offsets: &SharedMemory<u32>, out: &mut Tensor<F>, #[comptime] head_dim: usize) {
        let (row, half) = row_and_half();
        let width = comptime![head_dim / 2];
        let offset = row_offsets[row];
        if offset != NO_ROW {
            let sum = sums[row];
            let base = offset as usize + half * width;
            #[unroll]
            for e in 0..width {
                out[base + e] = F::cast_from(output[e] / sum);
            }
        }
    }
}
