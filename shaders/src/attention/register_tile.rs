//! The tile kernels' multiplies in plain registers, for every backend; where their tiling,
//! masks, item windows and online softmax are tested off CUDA (lavapipe).
//!
//! - [`RegisterTile`] (the tiled kernel): lane `l` of a plane takes row `l % 16` and half
//!   `l / 16` — of the step's keys for the scores, of the head's dimensions for the output.
//! - [`RegisterFragments`] (the flash kernel): each lane holds the elements PTX's m16n8k16
//!   accumulators give it, computed as dot products; what tensor cores and warp shuffles
//!   exchange between lanes goes through shared memory instead.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::flash::{flash_plane_and_lane, fragment_column, fragment_row, FragmentMath, BLOCK_ELEMENTS, HALVES, QUAD};
use super::tiled::{plane_and_lane, QueryPairs, TileMath, NO_ROW, ROWS_PER_PLANE};
use super::walk::staged_row;

pub(super) struct RegisterTile;

/// Query row `row` of the cube (zeros for a row without a token), in pairs.
#[cube]
fn query_rows<F: Float>(queries: &Tensor<F>, row_offsets: &SharedMemory<u32>, row: usize, #[comptime] head_dim: usize) -> QueryPairs<F> {
    let offset = row_offsets[row];
    let mut query = Array::<Vector<F, Const<2>>>::new(comptime![head_dim / 2]);
    #[unroll]
    for pair in 0..comptime![head_dim / 2] {
        let mut elements = Vector::empty();
        #[unroll]
        for n in 0..2usize {
            let mut value = F::new(0.0);
            if offset != NO_ROW {
                value = queries[offset as usize + 2 * pair + n];
            }
            elements[n] = value;
        }
        query[pair] = elements;
    }
    query
}

/// This unit's row in the cube and its half (0 or 1).
#[cube]
fn row_and_half() -> (usize, usize) {
    let (plane_row, lane) = plane_and_lane();
    (plane_row + lane % ROWS_PER_PLANE, lane / ROWS_PER_PLANE)
}

#[cube]
impl TileMath for RegisterTile {
    /// The whole query row (both halves of a row hold it).
    fn load_query<F: Float>(queries: &Tensor<F>, row_offsets: &SharedMemory<u32>, #[comptime] head_dim: usize) -> QueryPairs<F> {
        let (row, _) = row_and_half();
        query_rows::<F>(queries, row_offsets, row, head_dim)
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

    fn scores<F: Float>(query: &QueryPairs<F>, staged_keys: &SharedMemory<F>, scores: &mut SharedMemory<f32>, scale: f32, #[comptime] head_dim: usize, #[comptime] keys: usize) {
        let (row, half) = row_and_half();
        for j in 0..comptime![keys / 2] {
            let key = half * comptime![keys / 2] + j;
            let mut score = f32::new(0.0);
            #[unroll]
            for e in 0..head_dim {
                score += f32::cast_from(query[e / 2][e % 2]) * f32::cast_from(staged_keys[key * comptime![staged_row(head_dim)] + e]);
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
            let base = key * comptime![staged_row(head_dim)] + half * width;
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

pub(super) struct RegisterFragments;

/// `value` of every unit of the cube (`units` of them) through shared memory; this unit's
/// quad's four, in lane order.
#[cube]
fn quad_values(value: f32, #[comptime] units: usize) -> Array<f32> {
    let mut exchange = SharedMemory::<f32>::new(units);
    let unit = UNIT_POS_X as usize;
    exchange[unit] = value;
    sync_cube();
    let mut quad = Array::<f32>::new(QUAD);
    #[unroll]
    for i in 0..QUAD {
        quad[i] = exchange[unit - unit % QUAD + i];
    }
    quad
}

#[cube]
impl FragmentMath for RegisterFragments {
    /// With one block, the unit's two query rows (plane rows `g` and `g + 8`), whole, one after
    /// the other; with more, nothing (the scores read the staged query).
    fn load_query<F: Float>(queries: &Tensor<F>, row_offsets: &SharedMemory<u32>, #[comptime] head_dim: usize, #[comptime] blocks: usize) -> QueryPairs<F> {
        let (plane_row, lane) = flash_plane_and_lane(blocks);
        let held = comptime![if blocks == 1 { HALVES } else { 0 }];
        let mut query = Array::<Vector<F, Const<2>>>::new(comptime![if blocks == 1 { head_dim } else { 1 }]);
        #[unroll]
        for half in 0..held {
            let row = query_rows::<F>(queries, row_offsets, plane_row + fragment_row(lane, 2 * half), head_dim);
            #[unroll]
            for pair in 0..comptime![head_dim / 2] {
                query[half * comptime![head_dim / 2] + pair] = row[pair];
            }
        }
        query
    }

    // The runtime loops are the outer ones, a few per key step: llvmpipe (lavapipe) counts a
    // loop's iterations over the whole invocation and stops it at 65,535, so a runtime loop
    // inside unrolled ones would end early past ~1,000 keys (head_dim 64).
    fn scores<F: Float>(query: &QueryPairs<F>, staged_query: &SharedMemory<F>, staged_keys: &SharedMemory<F>, staged_at: usize, #[comptime] head_dim: usize, #[comptime] keys: usize, #[comptime] blocks: usize) -> Array<f32> {
        let (plane_row, lane) = flash_plane_and_lane(blocks);
        let block_elements = comptime![keys / 8 * BLOCK_ELEMENTS];
        let mut scores = Array::<f32>::new(comptime![blocks * keys / 8 * BLOCK_ELEMENTS]);
        for index in 0..comptime![blocks * keys / 8 * BLOCK_ELEMENTS] {
            let (block, rest) = (index / block_elements, index % block_elements);
            let (keys_block, e) = (rest / BLOCK_ELEMENTS, rest % BLOCK_ELEMENTS);
            let half = e / 2;
            let key = keys_block * 8 + fragment_column(lane, e);
            let row = plane_row + block * ROWS_PER_PLANE + fragment_row(lane, e);
            let mut score = f32::new(0.0);
            #[unroll]
            for d in 0..head_dim {
                let q = if comptime![blocks == 1] { f32::cast_from(query[(half * head_dim + d) / 2][d % 2]) } else { f32::cast_from(staged_query[row * comptime![staged_row(head_dim)] + d]) };
                score += q * f32::cast_from(staged_keys[staged_at + key * comptime![staged_row(head_dim)] + d]);
            }
            scores[index] = score;
        }
        scores
    }

    /// The plane's weights go through shared memory (`[rows, keys]`), where tensor cores would
    /// read them from the quad's registers.
    fn accumulate<F: Float>(output: &mut Array<f32>, weights: &Array<f32>, staged_values: &SharedMemory<F>, staged_at: usize, #[comptime] head_dim: usize, #[comptime] keys: usize, #[comptime] rows: usize, #[comptime] blocks: usize) {
        let (plane_row, lane) = flash_plane_and_lane(blocks);
        let mut shared_weights = SharedMemory::<f32>::new(comptime![rows * keys]);
        #[unroll]
        for block in 0..blocks {
            #[unroll]
            for keys_block in 0..comptime![keys / 8] {
                #[unroll]
                for e in 0..BLOCK_ELEMENTS {
                    let row = plane_row + block * ROWS_PER_PLANE + fragment_row(lane, e);
                    shared_weights[row * keys + keys_block * 8 + fragment_column(lane, e)] = weights[block * comptime![keys / 8 * BLOCK_ELEMENTS] + keys_block * BLOCK_ELEMENTS + e];
                }
            }
        }
        sync_cube();
        let block_elements = comptime![head_dim / 8 * BLOCK_ELEMENTS];
        for index in 0..comptime![blocks * head_dim / 8 * BLOCK_ELEMENTS] {
            let (block, rest) = (index / block_elements, index % block_elements);
            let (dims, e) = (rest / BLOCK_ELEMENTS, rest % BLOCK_ELEMENTS);
            let row = plane_row + block * ROWS_PER_PLANE + fragment_row(lane, e);
            let dim = dims * 8 + fragment_column(lane, e);
            let mut sum = output[index];
            #[unroll]
            for key in 0..keys {
                sum += shared_weights[row * keys + key] * f32::cast_from(staged_values[staged_at + key * comptime![staged_row(head_dim)] + dim]);
            }
            output[index] = sum;
        }
    }

    fn quad_max(value: f32, #[comptime] units: usize) -> f32 {
        let quad = quad_values(value, units);
        let mut largest = quad[0];
        #[unroll]
        for i in 0..QUAD {
            if quad[i] > largest {
                largest = quad[i];
            }
        }
        largest
    }

    fn quad_sum(value: f32, #[comptime] units: usize) -> f32 {
        let quad = quad_values(value, units);
        quad[0] + quad[1] + quad[2] + quad[3]
    }
}
