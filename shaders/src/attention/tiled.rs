//! The tiled kernel: a cube of `rows / 16` planes × 32 units takes `rows` rows (one tile's
//! tokens × the KV head's query heads), each plane 16 of them, and walks the key tiles `keys`
//! keys at a time (FlashAttention-2's loop, FlashInfer's multi-item windows); both sizes are a
//! [`super::TileShape`]. Per key tile:
//!
//! 1. the cube stages the tile's keys and values in shared memory (zeros past the last key);
//! 2. each plane multiplies its 16 query rows by the step's keys ([`TileMath::scores`]) into a
//!    shared score tile;
//! 3. one unit per row masks its scores (all of a prefix tile; of an own tile, its own item's
//!    keys up to itself), moves its running max and sum and turns the scores into weights;
//! 4. each plane rescales its output rows and adds weights × values
//!    ([`TileMath::accumulate`]).
//!
//! The output stays in the units' registers until the end; no score matrix reaches memory.
//! [`TileMath`] is the seam between this loop and the hardware: tensor cores on CUDA
//! ([`super::mma_tile`]), plain registers elsewhere ([`super::register_tile`]).

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::walk::{kv_rows, load_share, read_tile, staged_row, store_share, tile_row, visible_keys, walk_step};
use super::NO_SCORE;
use crate::grid::cube_index;

/// Query rows per plane: the `m` of one tensor-core multiply.
pub(super) const ROWS_PER_PLANE: usize = 16;
/// Units per plane: a CUDA warp.
pub(super) const LANES: usize = 32;
/// Keys per step come in multiples of this: one `k` of the weights × values multiply, two `n`
/// of the scores one.
pub(super) const KEY_BLOCK: usize = 16;
/// The row offset of a row without a token (the tile's last tokens × group may not fill 64).
pub(super) const NO_ROW: u32 = u32::MAX;

/// A unit's share of its plane's query rows, loaded once, as the tile math packs them: pairs
/// of elements in the queries' type (tensor cores' operand registers).
pub(super) type QueryPairs<F> = Array<Vector<F, Const<2>>>;

/// What a plane does with its 16 rows, in the units' registers. Every method is called by
/// every unit of the cube (the unit's plane and lane come from `UNIT_POS_X`).
#[cube]
pub(super) trait TileMath: 'static + Send + Sync {
    /// This unit's share of its plane's query rows (`row_offsets`: where each of the cube's
    /// rows starts in `queries`, [`NO_ROW`] for none): what [`Self::scores`] reads.
    fn load_query<F: Float>(queries: &Tensor<F>, row_offsets: &SharedMemory<u32>, #[comptime] head_dim: usize) -> QueryPairs<F>;

    /// This unit's share of its plane's output rows, zero.
    fn new_output<F: Float>(#[comptime] head_dim: usize) -> Array<f32>;

    /// Writes `scale · query · key` for the plane's rows and the `keys` staged keys
    /// (`[keys, head_dim]`, rows [`staged_row`] apart) into `scores` (`[rows, keys]`).
    fn scores<F: Float>(query: &QueryPairs<F>, staged_keys: &SharedMemory<F>, scores: &mut SharedMemory<f32>, scale: f32, #[comptime] head_dim: usize, #[comptime] keys: usize);

    /// `output = output · correction[row] + weights · values` for the plane's rows
    /// (`weights`: `[rows, keys]`, `values`: `[keys, head_dim]` staged like the keys).
    fn accumulate<F: Float>(output: &mut Array<f32>, weights: &SharedMemory<f32>, corrections: &SharedMemory<f32>, values: &SharedMemory<F>, #[comptime] head_dim: usize, #[comptime] keys: usize);

    /// Writes `output / sums[row]` of the plane's rows that have a token.
    fn store<F: Float>(output: &Array<f32>, sums: &SharedMemory<f32>, row_offsets: &SharedMemory<u32>, out: &mut Tensor<F>, #[comptime] head_dim: usize);
}

/// Units of a cube of `shape`: a plane of 32 per 16 rows.
pub(super) fn units_per_cube(shape: super::TileShape) -> usize {
    units_per_cube_of(shape.rows)
}

/// Units of a cube of `rows` rows.
pub(super) const fn units_per_cube_of(rows: usize) -> usize {
    rows / ROWS_PER_PLANE * LANES
}

/// The first of this unit's plane's rows in the cube, and the unit's lane in its plane.
#[cube]
pub(super) fn plane_and_lane() -> (usize, usize) {
    let unit = UNIT_POS_X as usize;
    ((unit / LANES) * ROWS_PER_PLANE, unit % LANES)
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn tiled_attention_kernel<F: Float, T: TileMath, N: Size, W: Size>(
    queries: &Tensor<F>,
    keys: &Tensor<Vector<u32, W>>,
    values: &Tensor<Vector<u32, W>>,
    prefix_keys: &Tensor<Vector<u32, W>>,
    prefix_values: &Tensor<Vector<u32, W>>,
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

    // One unit per row: where the row reads and writes, what it may see, its running state.
    let mut row_offsets = SharedMemory::<u32>::new(rows);
    let mut row_tokens = SharedMemory::<u32>::new(rows);
    let mut row_item_starts = SharedMemory::<u32>::new(rows);
    let mut maxima = SharedMemory::<f32>::new(rows);
    let mut sums = SharedMemory::<f32>::new(rows);
    let mut corrections = SharedMemory::<f32>::new(rows);
    if unit < rows {
        let row = tile_row(&tile, item_starts, unit, kv_head, q_heads, group, head_dim);
        row_offsets[unit] = row.offset;
        row_tokens[unit] = row.token;
        row_item_starts[unit] = row.item_start;
        maxima[unit] = f32::new(NO_SCORE);
        sums[unit] = f32::new(0.0);
    }
    sync_cube();

    let query = T::load_query::<F>(queries, &row_offsets, head_dim);
    let mut accumulated = T::new_output::<F>(head_dim);
    // 16-byte aligned: `ldmatrix` reads rows of 16 bytes.
    let mut tile_keys = SharedMemory::<F>::new_aligned(comptime![step_keys * staged_row(head_dim)], 16usize);
    let mut tile_values = SharedMemory::<F>::new_aligned(comptime![step_keys * staged_row(head_dim)], 16usize);
    let mut scores = SharedMemory::<f32>::new(comptime![rows * step_keys]);

    let kv = kv_rows::<W>(&tile, kv_head, keys, values, prefix_keys, head_dim);
    let prefix_steps = tile.prefix_len.div_ceil(step_keys);
    let own_steps = tile.own_keys.div_ceil(step_keys);
    for step in 0..prefix_steps + own_steps {
        let step = walk_step(&tile, step, prefix_steps, step_keys);

        // 1. Stage the step's keys and values.
        let share = load_share::<N, W>(&kv, &step, keys, values, prefix_keys, prefix_values, step_keys, head_dim, comptime![units_per_cube_of(rows)]);
        store_share::<F, N, W>(&share, &mut tile_keys, &mut tile_values, 0usize, step_keys, head_dim, comptime![units_per_cube_of(rows)]);
        sync_cube();

        // 2. Scores of every row against the step's keys.
        T::scores::<F>(&query, &tile_keys, &mut scores, scale, head_dim, step_keys);
        sync_cube();

        // 3. Masks and online softmax, one unit per row: visible keys are `from..to`, all
        //    staged keys of a prefix step, and of an own step those in `item start..=token`.
        if unit < rows {
            let (from, to) = visible_keys(&tile, &step, row_item_starts[unit] as usize, row_tokens[unit] as usize);
            let base = unit * step_keys;
            let mut step_max = f32::new(NO_SCORE);
            #[unroll]
            for j in 0..step_keys {
                if j >= from && j < to && scores[base + j] > step_max {
                    step_max = scores[base + j];
                }
            }
            let previous = maxima[unit];
            let mut running_max = previous;
            if step_max > previous {
                running_max = step_max;
            }
            // exp(0) = 1 while the row has seen nothing; 0-weighted history once it does.
            let correction = f32::exp(previous - running_max);
            let mut sum = sums[unit] * correction;
            #[unroll]
            for j in 0..step_keys {
                let mut weight = f32::new(0.0);
                if j >= from && j < to {
                    weight = f32::exp(scores[base + j] - running_max);
                }
                scores[base + j] = weight;
                sum += weight;
            }
            maxima[unit] = running_max;
            sums[unit] = sum;
            corrections[unit] = correction;
        }
        sync_cube();

        // 4. Rescale and add weights × values.
        T::accumulate::<F>(&mut accumulated, &scores, &corrections, &tile_values, head_dim, step_keys);
        sync_cube();
    }

    T::store::<F>(&accumulated, &sums, &row_offsets, output, head_dim);
}
