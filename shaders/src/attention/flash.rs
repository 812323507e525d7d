//! The flash kernel: the tiled kernel's walk (a cube of `rows / 16` planes takes `rows` rows,
//! key steps of `keys`, both a [`super::TileShape`]) with FlashAttention-2's inner loop — the
//! scores, the masks, the online softmax and the weights never leave the units' registers.
//! Per key step:
//!
//! 1. the cube stages the step's keys and values in shared memory (this barrier and the one
//!    before the next step restages are the loop's only `sync_cube`s on tensor cores);
//! 2. each plane multiplies its 16 query rows by the step's keys into accumulator fragments
//!    ([`FragmentMath::scores`]);
//! 3. each unit masks its own elements, takes its rows' maxima across the four units that hold a
//!    row ([`FragmentMath::quad_max`]), moves its running maxima and partial sums and turns its
//!    scores into weights in place;
//! 4. each plane rescales its output rows and adds weights × values, the weights' accumulator
//!    fragments serving as the multiply's left operand as they lie
//!    ([`FragmentMath::accumulate`]).
//!
//! Every fragment has the layout of PTX's `mma.m16n8k16` accumulator, per block of 8 columns:
//! lane `l` (`g = l / 4`, `t = l % 4`) holds rows `g` and `g + 8` at columns `2t` and `2t + 1`,
//! as elements `[(g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)]` (`mma_fragment_layout_is_ptxs`
//! in the kernel tests pins CubeCL's layout to it). So a row's elements sit in one aligned quad
//! of lanes, and the weights of keys `16s .. 16s + 16` (two blocks) are exactly the `A` fragment
//! of an m16n8k16 multiply. [`FragmentMath`] is the seam: tensor cores on CUDA
//! ([`super::mma_tile::MmaFragments`]), plain registers with the same ownership elsewhere
//! ([`super::register_tile::RegisterFragments`]), where the loop is tested.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::tiled::{plane_and_lane, NO_ROW};
use super::walk::{read_tile, stage_step, staged_row, tile_row, visible_keys, walk_step};
use super::NO_SCORE;
use crate::grid::cube_index;

/// Elements of one 8-column block a lane holds: two rows (halves of the plane's 16) × two
/// columns.
pub(super) const BLOCK_ELEMENTS: usize = HALVES * COLUMNS;
pub(super) const HALVES: usize = 2;
const COLUMNS: usize = 2;
/// Lanes that hold one row of a block.
pub(super) const QUAD: usize = 4;

/// The row (0..16, in the plane) of element `e` of a lane's block.
#[cube]
pub(super) fn fragment_row(lane: usize, e: usize) -> usize {
    lane / 4 + 8 * (e / 2)
}

/// The column (0..8, in the block) of element `e` of a lane's block.
#[cube]
pub(super) fn fragment_column(lane: usize, e: usize) -> usize {
    2 * (lane % 4) + e % 2
}

/// What a plane does with its 16 rows' fragments. Every method is called by every unit of the
/// cube, in uniform control flow (implementations may exchange through shared memory).
#[cube]
pub(super) trait FragmentMath: 'static + Send + Sync {
    /// This unit's share of its plane's query rows (`row_offsets`: where each of the cube's
    /// rows starts in `queries`, [`NO_ROW`] for none), as [`Self::scores`] reads it.
    fn load_query<F: Float>(queries: &Tensor<F>, row_offsets: &SharedMemory<u32>, #[comptime] head_dim: usize) -> Array<f32>;

    /// `query · key` of the plane's rows and the `keys` staged keys (`[keys, head_dim]`, rows
    /// [`staged_row`] apart), as `keys / 8` accumulator blocks.
    fn scores<F: Float>(query: &Array<f32>, staged_keys: &SharedMemory<F>, #[comptime] head_dim: usize, #[comptime] keys: usize) -> Array<f32>;

    /// `output += weights · values` (`weights`: `keys / 8` blocks, `values`: `[keys, head_dim]`
    /// staged like the keys; `output`: `head_dim / 8` blocks). `rows`: the cube's.
    fn accumulate<F: Float>(output: &mut Array<f32>, weights: &Array<f32>, staged_values: &SharedMemory<F>, #[comptime] head_dim: usize, #[comptime] keys: usize, #[comptime] rows: usize);

    /// The largest `value` of this unit's aligned quad of lanes. `rows`: the cube's.
    fn quad_max(value: f32, #[comptime] rows: usize) -> f32;

    /// The sum of `value` over this unit's aligned quad of lanes. `rows`: the cube's.
    fn quad_sum(value: f32, #[comptime] rows: usize) -> f32;
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(super) fn flash_attention_kernel<F: Float, T: FragmentMath>(
    queries: &Tensor<F>,
    keys: &Tensor<F>,
    values: &Tensor<F>,
    prefix_keys: &Tensor<F>,
    prefix_values: &Tensor<F>,
    tiles: &Tensor<u32>,
    item_starts: &Tensor<u32>,
    output: &mut Tensor<F>,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] group: usize,
    #[comptime] rows: usize,
    #[comptime] step_keys: usize,
    #[define(F)] _dtype: StorageType,
) {
    let tile_index = cube_index();
    // Uniform over the cube: the grid's last row may run past the tiles.
    if tile_index * 4 >= tiles.len() {
        terminate!();
    }
    let kv_head = CUBE_POS_Z as usize;
    let tile = read_tile(tiles, item_starts, tile_index);
    let q_heads = keys.shape(1) * group;
    let unit = UNIT_POS_X as usize;

    // Where the cube's rows read and write, for the query and output fragments.
    let mut row_offsets = SharedMemory::<u32>::new(rows);
    if unit < rows {
        row_offsets[unit] = tile_row(&tile, item_starts, unit, kv_head, q_heads, group, head_dim).offset;
    }
    sync_cube();

    // This unit's two rows (`half` 0 and 1: plane rows g and g + 8) and their running state:
    // maxima, and sums of this unit's own columns (the quad adds them up once, at the end).
    let (plane_row, lane) = plane_and_lane();
    let mut tokens = Array::<u32>::new(HALVES);
    let mut item_begins = Array::<u32>::new(HALVES);
    let mut maxima = Array::<f32>::new(HALVES);
    let mut sums = Array::<f32>::new(HALVES);
    #[unroll]
    for half in 0..HALVES {
        let row = tile_row(&tile, item_starts, plane_row + fragment_row(lane, 2 * half), kv_head, q_heads, group, head_dim);
        tokens[half] = row.token;
        item_begins[half] = row.item_start;
        maxima[half] = f32::new(NO_SCORE);
        sums[half] = f32::new(0.0);
    }

    let query = T::load_query::<F>(queries, &row_offsets, head_dim);
    let mut accumulated = Array::<f32>::new(comptime![head_dim / 8 * BLOCK_ELEMENTS]);
    #[unroll]
    for i in 0..comptime![head_dim / 8 * BLOCK_ELEMENTS] {
        accumulated[i] = 0.0;
    }
    let mut tile_keys = SharedMemory::<F>::new(comptime![step_keys * staged_row(head_dim)]);
    let mut tile_values = SharedMemory::<F>::new(comptime![step_keys * staged_row(head_dim)]);

    let prefix_steps = tile.prefix_len.div_ceil(step_keys);
    let own_steps = (tile.end - tile.own_start).div_ceil(step_keys);
    for step in 0..prefix_steps + own_steps {
        let step = walk_step(&tile, step, prefix_steps, step_keys);

        // 1. Stage the step's keys and values.
        stage_step::<F>(&tile, &step, kv_head, keys, values, prefix_keys, prefix_values, &mut tile_keys, &mut tile_values, step_keys, head_dim);
        sync_cube();

        // 2. Scores of the plane's rows against the step's keys.
        let mut weights = T::scores::<F>(&query, &tile_keys, head_dim, step_keys);

        // 3. Masks and online softmax, each unit on its own elements, a row's quad together.
        #[unroll]
        for half in 0..HALVES {
            let (from, to) = visible_keys(&tile, &step, item_begins[half] as usize, tokens[half] as usize);
            let mut step_max = f32::new(NO_SCORE);
            #[unroll]
            for block in 0..comptime![step_keys / 8] {
                #[unroll]
                for column in 0..COLUMNS {
                    let e = 2 * half + column;
                    let key = block * 8 + fragment_column(lane, e);
                    let index = block * BLOCK_ELEMENTS + e;
                    let score = weights[index] * scale;
                    weights[index] = score;
                    if key >= from && key < to && score > step_max {
                        step_max = score;
                    }
                }
            }
            let step_max = T::quad_max(step_max, rows);
            let previous = maxima[half];
            let mut running_max = previous;
            if step_max > previous {
                running_max = step_max;
            }
            // exp(0) = 1 while the row has seen nothing; 0-weighted history once it does.
            let correction = f32::exp(previous - running_max);
            let mut sum = sums[half] * correction;
            #[unroll]
            for block in 0..comptime![step_keys / 8] {
                #[unroll]
                for column in 0..COLUMNS {
                    let e = 2 * half + column;
                    let key = block * 8 + fragment_column(lane, e);
                    let index = block * BLOCK_ELEMENTS + e;
                    let mut weight = f32::new(0.0);
                    if key >= from && key < to {
                        weight = f32::exp(weights[index] - running_max);
                    }
                    weights[index] = weight;
                    sum += weight;
                }
            }
            maxima[half] = running_max;
            sums[half] = sum;
            #[unroll]
            for block in 0..comptime![head_dim / 8] {
                #[unroll]
                for column in 0..COLUMNS {
                    accumulated[block * BLOCK_ELEMENTS + 2 * half + column] *= correction;
                }
            }
        }

        // 4. Add weights × values.
        T::accumulate::<F>(&mut accumulated, &weights, &tile_values, head_dim, step_keys, rows);
        // Every unit is done with the staged keys and values before the next step restages them.
        sync_cube();
    }

    // Each row's sum over its quad, then the normalised output of the rows that have a token.
    #[unroll]
    for half in 0..HALVES {
        let sum = T::quad_sum(sums[half], rows);
        let offset = row_offsets[plane_row + fragment_row(lane, 2 * half)];
        if offset != NO_ROW {
            #[unroll]
            for block in 0..comptime![head_dim / 8] {
                #[unroll]
                for column in 0..COLUMNS {
                    let dim = block * 8 + fragment_column(lane, 2 * half + column);
                    output[offset as usize + dim] = F::cast_from(accumulated[block * BLOCK_ELEMENTS + 2 * half + column] / sum);
                }
            }
        }
    }
}
