//! The flash kernel: the tiled kernel's walk (a cube of `rows / 16` planes — `rows / 32` with
//! 32 rows a warp — takes `rows` rows, key steps of `keys`, both a [`super::TileShape`]) with
//! FlashAttention-2's inner loop — the scores, the masks, the online softmax and the weights
//! never leave the units' registers. Per key step:
//!
//! 1. the cube stages the step's keys and values in shared memory, a 16-byte vector per read
//!    on CUDA. With one stage (`--tile-stages 1`) it reads, stages, syncs, computes and syncs
//!    again before restaging; with two (the default) the next step is read from global memory
//!    into registers while this one is computed, then staged in a second buffer: one
//!    `sync_cube` a step (FlashAttention-2's pipeline, registers in place of cp.async). On CUDA
//!    `--kv-staging cp-async` copies the next step straight into its buffer instead
//!    ([`copy_share`]), one barrier wait a step (`cp-async-split`: two barriers a buffer, so a
//!    unit waits for its step's copies and, after its scores, for the units still reading the
//!    buffer it refills, not for the whole cube at each step's start). With three
//!    (`--tile-stages 3`) a step also multiplies the next step's scores during its softmax,
//!    and the step after lands in a third buffer ([`finish_step_scoring_next`]);
//! 2. each plane multiplies its 16 query rows (32 with `--warp-rows 32`: two blocks of 16 that
//!    share every key and value fragment read, the query staged in shared memory) by the step's
//!    keys into accumulator fragments ([`FragmentMath::scores`]);
//! 3. each unit masks its own elements, takes its rows' maxima across the four units that hold a
//!    row ([`FragmentMath::quad_max`]), moves its running maxima and partial sums and turns its
//!    scores into weights in place, all its rows phase by phase ([`move_maxima`], [`weigh`]);
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
use burn_cubecl::cubecl::prelude::barrier::{copy_async_checked, Barrier};
use burn_cubecl::cubecl::prelude::*;

use super::tiled::{QueryPairs, LANES, NO_ROW, ROWS_PER_PLANE};
use super::walk::{copy_share, in_whole_passes, keys_apart, kv_rows, load_share, read_tile_part, staged_row, store_share, tile_row, unit_origin, visible_keys, walk_step, Step, Tile};
use super::{KvStaging, NO_SCORE};
use crate::grid::cube_index;

/// Elements of one 8-column block a lane holds: two rows (halves of the plane's 16) × two
/// columns.
pub(super) const BLOCK_ELEMENTS: usize = HALVES * COLUMNS;
pub(super) const HALVES: usize = 2;
const COLUMNS: usize = 2;
/// Lanes that hold one row of a block.
pub(super) const QUAD: usize = 4;
/// How far (in scaled scores: natural-log units of weight) a step's maximum may pass a row's
/// running maximum before the running maximum moves and the row's output is rescaled
/// ([`move_maxima`], [`weigh`]). Weights then reach at most e^8 ≈ 2,981.
pub const RESCALE_SLACK: f32 = 8.0;
/// The score a masked step gives the keys a row does not see: scaled by any `1 / √head_dim`
/// it stays far below NO_SCORE, a running maximum's first value (finite: WGSL cannot spell
/// −∞), so such a key is no row's maximum and its weight is 0.
const MASKED_SCORE: f32 = -1.0e38;

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

/// Units of a flash cube of `rows` rows whose planes take `blocks` blocks of 16 rows each.
pub(super) const fn flash_units(rows: usize, blocks: usize) -> usize {
    rows / (ROWS_PER_PLANE * blocks) * LANES
}

/// Units of a flash cube of `shape`: a plane of 32 per `shape.warp_rows` rows.
pub(super) fn units_per_cube(shape: super::TileShape) -> usize {
    flash_units(shape.rows, shape.warp_rows / ROWS_PER_PLANE)
}

/// The first of this unit's plane's rows in the cube (its planes take `blocks` blocks of 16
/// rows each), and the unit's lane in its plane.
#[cube]
pub(super) fn flash_plane_and_lane(#[comptime] blocks: usize) -> (usize, usize) {
    let unit = UNIT_POS_X as usize;
    ((unit / LANES) * comptime![ROWS_PER_PLANE * blocks], unit % LANES)
}

/// Elements of the staged query: `rows` rows of [`staged_row`] where the planes read their
/// query fragments from shared memory (`blocks` > 1), one vector otherwise (unused).
pub(super) const fn staged_query_len(rows: usize, head_dim: usize, blocks: usize) -> usize {
    if blocks > 1 {
        rows * staged_row(head_dim)
    } else {
        8
    }
}

/// What a plane does with its rows' fragments: `blocks` blocks of 16 rows (one tensor-core `m`
/// each), every block's elements laid out like the first's, block after block. With one block
/// the query fragments stay in registers ([`Self::load_query`]); with two (FlashAttention-2's
/// 32 rows a warp: each key and value fragment read from shared memory serves both blocks) the
/// registers hold two blocks' outputs, and the query is read from a staged copy in shared
/// memory every step. Every method is called by every unit of the cube, in uniform control flow
/// (implementations may exchange through shared memory).
#[cube]
pub(super) trait FragmentMath: 'static + Send + Sync {
    /// This unit's share of its plane's query rows (`row_offsets`: where each of the cube's
    /// rows starts in `queries`, [`NO_ROW`] for none), as [`Self::scores`] reads it; with more
    /// than one block, nothing (the scores read the staged query).
    fn load_query<F: Float>(queries: &Tensor<F>, row_offsets: &SharedMemory<u32>, #[comptime] head_dim: usize, #[comptime] blocks: usize) -> QueryPairs<F>;

    /// `query · key` of the plane's rows and the `keys` staged keys (`[keys, head_dim]`, rows
    /// [`staged_row`] apart, from element `staged_at`), as `blocks × keys / 8` accumulator
    /// blocks. The query: `query` with one block, `staged_query` (`[rows, head_dim]`, rows
    /// [`staged_row`] apart) with more.
    fn scores<F: Float>(query: &QueryPairs<F>, staged_query: &SharedMemory<F>, staged_keys: &SharedMemory<F>, staged_at: usize, #[comptime] head_dim: usize, #[comptime] keys: usize, #[comptime] blocks: usize) -> Array<f32>;

    /// `output += weights · values` (`weights`: `blocks × keys / 8` blocks, `values`: `[keys,
    /// head_dim]` staged like the keys; `output`: `blocks × head_dim / 8` blocks). `rows`: the
    /// cube's.
    fn accumulate<F: Float>(output: &mut Array<f32>, weights: &Array<f32>, staged_values: &SharedMemory<F>, staged_at: usize, #[comptime] head_dim: usize, #[comptime] keys: usize, #[comptime] rows: usize, #[comptime] blocks: usize);

    /// The largest `value` of this unit's aligned quad of lanes. `units`: the cube's.
    fn quad_max(value: f32, #[comptime] units: usize) -> f32;

    /// The sum of `value` over this unit's aligned quad of lanes. `units`: the cube's.
    fn quad_sum(value: f32, #[comptime] units: usize) -> f32;
}

/// Fast math: `exp` as `ex2.approx` and the final division by a row's sum as a reciprocal on
/// CUDA (`__expf`, `__fdividef`), weights within a few ulp. Its promise of no NaN or infinity
/// holds for finite inputs: masked scores are replaced before they are used, and every
/// exponential's argument is at most [`RESCALE_SLACK`] (a weight at most e^8).
#[cube(launch_unchecked, fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf | FastMath::AllowReciprocal | FastMath::UnsignedZero)]
#[allow(clippy::too_many_arguments)]
pub(super) fn flash_attention_kernel<F: Float, T: FragmentMath, N: Size, W: Size>(
    queries: &Tensor<F>,
    keys: &Tensor<Vector<u32, W>>,
    values: &Tensor<Vector<u32, W>>,
    prefix_keys: &Tensor<Vector<u32, W>>,
    prefix_values: &Tensor<Vector<u32, W>>,
    tiles: &Tensor<u32>,
    item_starts: &Tensor<u32>,
    output: &mut Tensor<Vector<F, Const<2>>>,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] group: usize,
    #[comptime] rows: usize,
    #[comptime] step_keys: usize,
    #[comptime] stages: usize,
    #[comptime] staging: KvStaging,
    #[comptime] blocks: usize,
    #[comptime] split: bool,
    lse: &mut Tensor<f32>,
    parts: u32,
    #[define(F)] _dtype: StorageType,
) {
    // Split (`split`): `parts` cubes a tile, each walking part `part` of its prefix
    // ([`read_tile_part`]) and writing its rows normalised, with their log-sum-exp, to `output`'s
    // part `part` (`[parts · tokens, q_heads, head_dim]`) and `lse` (`[parts · tokens · q_heads]`)
    // for the merge ([`super::merge`]). Whole: `parts` and `lse` unused.
    let mut tile_index = cube_index();
    let mut part = 0usize;
    if comptime![split] {
        part = tile_index % parts as usize;
        tile_index /= parts as usize;
    }
    // Uniform over the cube: the grid's last row may run past the tiles.
    if tile_index * 4 >= tiles.len() {
        terminate!();
    }
    let kv_head = CUBE_POS_Z as usize;
    let tile = read_tile_part(tiles, item_starts, tile_index, part, parts as usize, split, step_keys);
    let q_heads = keys.shape(1) * group;
    let unit = UNIT_POS_X as usize;
    let units = comptime![flash_units(rows, blocks)];
    let prefix_steps = tile.prefix_len.div_ceil(step_keys);
    let steps = prefix_steps + tile.own_keys.div_ceil(step_keys);
    // Where this part's rows start in `output` and `lse`, in elements of a row (0 whole).
    let mut part_at = 0usize;
    if comptime![split] {
        part_at = part * queries.shape(0) * q_heads * head_dim;
    }

    // Where the cube's rows read and write, for the query and output fragments; and which
    // token each row is and where its item starts, read on masked steps only (held in
    // registers across the loop, they took 8 of a unit's 255 at 32 rows a warp).
    let mut row_offsets = SharedMemory::<u32>::new(rows);
    let mut row_tokens = SharedMemory::<u32>::new(rows);
    let mut row_item_starts = SharedMemory::<u32>::new(rows);
    if unit < rows {
        let row = tile_row(&tile, item_starts, unit, kv_head, q_heads, group, head_dim);
        row_offsets[unit] = row.offset;
        row_tokens[unit] = row.token;
        row_item_starts[unit] = row.item_start;
    }
    sync_cube();
    let cube_rows = CubeRows { tokens: row_tokens, item_starts: row_item_starts };
    if comptime![split] {
        // A part with no keys (a prefix of fewer steps than parts) weighs nothing in the merge:
        // its rows' log-sum-exp NO_SCORE, their outputs never read. Uniform over the cube, and
        // before any copy is issued.
        if steps == 0 {
            if unit < rows {
                let offset = row_offsets[unit];
                if offset != NO_ROW {
                    lse[(part_at + offset as usize) / head_dim] = f32::new(NO_SCORE);
                }
            }
            terminate!();
        }
    }

    // With two blocks a plane, the cube's query rows in shared memory (zeros for rows without
    // a token), read by the planes' fragments every step.
    let mut staged_query = SharedMemory::<F>::new_aligned(comptime![staged_query_len(rows, head_dim, blocks)], 16usize);
    let width = N::value();
    if comptime![blocks > 1 && staging.copies_async() && in_whole_passes(rows, head_dim, width, units)] {
        // Copied by `cp.async` and committed with the first step's keys and values: the first
        // step's wait covers them, and no unit waits here.
        copy_query::<F>(queries, &row_offsets, &mut staged_query, rows, head_dim, width, units);
    } else if comptime![blocks > 1] {
        // Unrolled and branch-free, so a unit's reads issue together: as a loop with a branch
        // per element the sm_90a code waited for global memory 16 times a cube (8 reads a
        // round), ~2,500 instructions a warp, about two key steps' worth.
        if comptime![units.is_multiple_of(head_dim)] {
            // Each unit one dimension of every `units / head_dim`-th row.
            let (first_row, dim) = (unit / head_dim, unit % head_dim);
            #[unroll]
            for i in 0..comptime![rows * head_dim / units] {
                stage_query_element::<F>(queries, &row_offsets, &mut staged_query, first_row + i * comptime![units / head_dim], dim, head_dim);
            }
        } else {
            #[unroll]
            for i in 0..comptime![(rows * head_dim).div_ceil(units)] {
                let index = unit + i * units;
                if index < comptime![rows * head_dim] {
                    stage_query_element::<F>(queries, &row_offsets, &mut staged_query, index / head_dim, index % head_dim, head_dim);
                }
            }
        }
        sync_cube();
    }

    // This unit's rows (per block, `half` 0 and 1: the block's rows g and g + 8; state index
    // `block · 2 + half`) and their running state: maxima, and sums of this unit's own columns
    // (the quad adds them up once, at the end).
    let (plane_row, lane) = flash_plane_and_lane(blocks);
    let unit_rows = comptime![blocks * HALVES];
    let mut rows_state = RowsState { maxima: Array::<f32>::new(unit_rows), sums: Array::<f32>::new(unit_rows) };
    #[unroll]
    for r in 0..unit_rows {
        rows_state.maxima[r] = f32::new(NO_SCORE);
        rows_state.sums[r] = f32::new(0.0);
    }

    let query = T::load_query::<F>(queries, &row_offsets, head_dim, blocks);
    let output_elements = comptime![head_dim / 8 * BLOCK_ELEMENTS];
    let mut accumulated = Array::<f32>::new(comptime![blocks * output_elements]);
    #[unroll]
    for i in 0..comptime![blocks * output_elements] {
        accumulated[i] = 0.0;
    }
    // Each stage's keys and values one after the other; 16-byte aligned: `ldmatrix` reads rows
    // of 16 bytes.
    let buffer = comptime![step_keys * staged_row(head_dim)];
    let mut staged_keys = SharedMemory::<F>::new_aligned(comptime![stages * buffer], 16usize);
    let mut staged_values = SharedMemory::<F>::new_aligned(comptime![stages * buffer], 16usize);

    let kv = kv_rows::<W>(&tile, kv_head, keys, values, prefix_keys, head_dim);
    if comptime![stages == 1] {
        // Stage a step, compute on it, and wait for every unit before restaging.
        for s in 0..steps {
            let step = walk_step(&tile, s, prefix_steps, step_keys);
            let share = load_share::<N, W>(&kv, &step, keys, values, prefix_keys, prefix_values, step_keys, head_dim, units);
            store_share::<F, N, W>(&share, &mut staged_keys, &mut staged_values, 0usize, step_keys, head_dim, units);
            sync_cube();
            flash_step::<F, T>(&tile, &step, &query, &staged_query, &cube_rows, &mut rows_state, &mut accumulated, &staged_keys, &staged_values, 0usize, scale, head_dim, step_keys, rows, blocks);
            sync_cube();
        }
    } else if comptime![stages == 3] {
        // Three buffers; step `s` takes its values from buffer `s % 3` and multiplies the next
        // step's keys, in buffer `(s + 1) % 3`, during its softmax
        // ([`finish_step_scoring_next`]), while step `s + 2` lands in the third, the buffer
        // step `s − 1` read. Step `s + 2` is read or copied past the walk's end too: no keys,
        // its vectors zeros. Step 0's scores are multiplied before the loop.
        if comptime![staging.copies_async()] {
            // `cp.async` (CUDA), one barrier: at the end of step `s` a unit waits until every
            // unit's copies of step `s + 2` have landed (the next step multiplies its keys) and
            // every unit is done with step `s` (its values' buffer takes step `s + 3`).
            let barrier = Barrier::shared(comptime![units as u32], UNIT_POS == 0);
            copy_share::<F, N, W>(&kv, &walk_step(&tile, 0usize, prefix_steps, step_keys), keys, values, prefix_keys, prefix_values, &mut staged_keys, &mut staged_values, 0usize, step_keys, head_dim, units);
            copy_share::<F, N, W>(&kv, &walk_step(&tile, 1usize, prefix_steps, step_keys), keys, values, prefix_keys, prefix_values, &mut staged_keys, &mut staged_values, buffer, step_keys, head_dim, units);
            barrier.commit_copy_async();
            barrier.arrive_and_wait();
            let mut scores = T::scores::<F>(&query, &staged_query, &staged_keys, 0usize, head_dim, step_keys, blocks);
            for s in 0..steps {
                copy_share::<F, N, W>(&kv, &walk_step(&tile, s + 2, prefix_steps, step_keys), keys, values, prefix_keys, prefix_values, &mut staged_keys, &mut staged_values, ((s + 2) % 3) * buffer, step_keys, head_dim, units);
                barrier.commit_copy_async();
                finish_step_scoring_next::<F, T>(&mut scores, &tile, &walk_step(&tile, s, prefix_steps, step_keys), &query, &staged_query, &cube_rows, &mut rows_state, &mut accumulated, &staged_keys, &staged_values, (s % 3) * buffer, ((s + 1) % 3) * buffer, scale, head_dim, step_keys, rows, blocks);
                barrier.arrive_and_wait();
            }
        } else {
            // Registers: step `s + 2` read at step `s`'s start, staged at its end (every unit
            // has left that buffer since the last step's sync), one sync a step.
            let first = load_share::<N, W>(&kv, &walk_step(&tile, 0usize, prefix_steps, step_keys), keys, values, prefix_keys, prefix_values, step_keys, head_dim, units);
            store_share::<F, N, W>(&first, &mut staged_keys, &mut staged_values, 0usize, step_keys, head_dim, units);
            let second = load_share::<N, W>(&kv, &walk_step(&tile, 1usize, prefix_steps, step_keys), keys, values, prefix_keys, prefix_values, step_keys, head_dim, units);
            store_share::<F, N, W>(&second, &mut staged_keys, &mut staged_values, buffer, step_keys, head_dim, units);
            sync_cube();
            let mut scores = T::scores::<F>(&query, &staged_query, &staged_keys, 0usize, head_dim, step_keys, blocks);
            for s in 0..steps {
                let ahead = load_share::<N, W>(&kv, &walk_step(&tile, s + 2, prefix_steps, step_keys), keys, values, prefix_keys, prefix_values, step_keys, head_dim, units);
                finish_step_scoring_next::<F, T>(&mut scores, &tile, &walk_step(&tile, s, prefix_steps, step_keys), &query, &staged_query, &cube_rows, &mut rows_state, &mut accumulated, &staged_keys, &staged_values, (s % 3) * buffer, ((s + 1) % 3) * buffer, scale, head_dim, step_keys, rows, blocks);
                store_share::<F, N, W>(&ahead, &mut staged_keys, &mut staged_values, ((s + 2) % 3) * buffer, step_keys, head_dim, units);
                sync_cube();
            }
        }
    } else if comptime![staging == KvStaging::CopyAsyncSplit] {
        // Two buffers, each with a barrier its copies land on (`full`: every unit arrives once
        // it has issued its share, and the phase completes when the copies have landed too)
        // and one its readers leave by (`empty`: every unit arrives after its step's weights ×
        // values). Step `s` waits for its own copies only; the copies of step `s + 1` go after
        // this step's scores, into the buffer step `s − 1` read, once every unit has left it —
        // by then the slowest unit has had the scores' time to finish. Buffer `b` serves steps
        // `b, b + 2, …`: step `s` is its barriers' phase `s / 2`.
        let full_0 = Barrier::shared(comptime![units as u32], UNIT_POS == 0);
        let full_1 = Barrier::shared(comptime![units as u32], UNIT_POS == 0);
        let empty_0 = Barrier::shared(comptime![units as u32], UNIT_POS == 0);
        let empty_1 = Barrier::shared(comptime![units as u32], UNIT_POS == 0);
        let first = walk_step(&tile, 0, prefix_steps, step_keys);
        copy_share::<F, N, W>(&kv, &first, keys, values, prefix_keys, prefix_values, &mut staged_keys, &mut staged_values, 0usize, step_keys, head_dim, units);
        full_0.commit_copy_async();
        full_0.arrive();
        for s in 0..steps {
            let (here, phase) = (s % 2, ((s / 2) % 2) as u32);
            if here == 0 {
                full_0.wait_parity(phase);
            } else {
                full_1.wait_parity(phase);
            }
            let step = walk_step(&tile, s, prefix_steps, step_keys);
            let weights = T::scores::<F>(&query, &staged_query, &staged_keys, here * buffer, head_dim, step_keys, blocks);
            if s + 1 < steps {
                let next = walk_step(&tile, s + 1, prefix_steps, step_keys);
                let there = 1 - here;
                // Step `s − 1` read that buffer (none did before step 1).
                if s >= 1 {
                    let left = (((s - 1) / 2) % 2) as u32;
                    if there == 0 {
                        empty_0.wait_parity(left);
                    } else {
                        empty_1.wait_parity(left);
                    }
                }
                copy_share::<F, N, W>(&kv, &next, keys, values, prefix_keys, prefix_values, &mut staged_keys, &mut staged_values, there * buffer, step_keys, head_dim, units);
                if there == 0 {
                    full_0.commit_copy_async();
                    full_0.arrive();
                } else {
                    full_1.commit_copy_async();
                    full_1.arrive();
                }
            }
            finish_step::<F, T>(weights, &tile, &step, &cube_rows, &mut rows_state, &mut accumulated, &staged_values, here * buffer, scale, head_dim, step_keys, rows, blocks);
            if here == 0 {
                empty_0.arrive();
            } else {
                empty_1.arrive();
            }
        }
    } else if comptime![staging == KvStaging::CopyAsync] {
        // Two buffers, `cp.async` (CUDA): step `s + 1` is copied into one while step `s` is
        // computed on the other. One barrier a step: waiting on it, a unit knows every unit's
        // copies of step `s` have landed and every unit is done with step `s − 1`, whose buffer
        // the next copies overwrite. A tile has at least one own key, and a part of a split
        // walk that has no step has ended above, so at least one step: every copy is waited on
        // before the cube ends.
        let barrier = Barrier::shared(comptime![units as u32], UNIT_POS == 0);
        let first = walk_step(&tile, 0, prefix_steps, step_keys);
        copy_share::<F, N, W>(&kv, &first, keys, values, prefix_keys, prefix_values, &mut staged_keys, &mut staged_values, 0usize, step_keys, head_dim, units);
        barrier.commit_copy_async();
        for s in 0..steps {
            barrier.arrive_and_wait();
            if s + 1 < steps {
                let next = walk_step(&tile, s + 1, prefix_steps, step_keys);
                copy_share::<F, N, W>(&kv, &next, keys, values, prefix_keys, prefix_values, &mut staged_keys, &mut staged_values, ((s + 1) % 2) * buffer, step_keys, head_dim, units);
                barrier.commit_copy_async();
            }
            flash_step::<F, T>(&tile, &walk_step(&tile, s, prefix_steps, step_keys), &query, &staged_query, &cube_rows, &mut rows_state, &mut accumulated, &staged_keys, &staged_values, (s % 2) * buffer, scale, head_dim, step_keys, rows, blocks);
        }
    } else {
        // Two buffers: while step `s` is computed on one, step `s + 1` is read from global
        // memory into registers, then staged in the other; one barrier a step. The read past
        // the walk's end has no keys.
        let first = walk_step(&tile, 0, prefix_steps, step_keys);
        let share = load_share::<N, W>(&kv, &first, keys, values, prefix_keys, prefix_values, step_keys, head_dim, units);
        store_share::<F, N, W>(&share, &mut staged_keys, &mut staged_values, 0usize, step_keys, head_dim, units);
        sync_cube();
        for s in 0..steps {
            let step = walk_step(&tile, s, prefix_steps, step_keys);
            let ahead = load_share::<N, W>(&kv, &walk_step(&tile, s + 1, prefix_steps, step_keys), keys, values, prefix_keys, prefix_values, step_keys, head_dim, units);
            flash_step::<F, T>(&tile, &step, &query, &staged_query, &cube_rows, &mut rows_state, &mut accumulated, &staged_keys, &staged_values, (s % 2) * buffer, scale, head_dim, step_keys, rows, blocks);
            store_share::<F, N, W>(&ahead, &mut staged_keys, &mut staged_values, ((s + 1) % 2) * buffer, step_keys, head_dim, units);
            sync_cube();
        }
    }

    // Each row's sum over its quad, then the normalised output of the rows that have a token:
    // one division a row, and a unit's two neighbouring columns of a block stored as one pair
    // (a 32-bit store in bf16; the output starts a pair in, and a row's columns are an even
    // number in). An element at a time with a division each, it was 128 stores and 717
    // instructions a unit after the loop, now 64 and 590 (sm_90a, 32 rows a warp at head_dim
    // 128). A part of a split walk also writes each row's log-sum-exp (its quad's first lane).
    #[unroll]
    for r in 0..unit_rows {
        let (block, half) = (r / HALVES, r % HALVES);
        let sum = T::quad_sum(rows_state.sums[r], units);
        let inverse = 1.0 / sum;
        let offset = row_offsets[plane_row + block * ROWS_PER_PLANE + fragment_row(lane, 2 * half)];
        if offset != NO_ROW {
            let row_at = part_at + offset as usize;
            if comptime![split] {
                if lane % QUAD == 0 {
                    lse[row_at / head_dim] = rows_state.maxima[r] + f32::ln(sum);
                }
            }
            #[unroll]
            for dims in 0..comptime![head_dim / 8] {
                let dim = dims * 8 + fragment_column(lane, 2 * half);
                let mut columns = Vector::<F, Const<2>>::empty();
                #[unroll]
                for column in 0..COLUMNS {
                    columns[column] = F::cast_from(accumulated[block * output_elements + dims * BLOCK_ELEMENTS + 2 * half + column] * inverse);
                }
                output[(row_at + dim) / COLUMNS] = columns;
            }
        }
    }
}

/// The cube's query rows staged by `cp.async` (CUDA), `width` elements (16 bytes in bf16/f16) a
/// copy, as a K/V step's keys are in whole passes ([`in_whole_passes`]: the rows taken as keys):
/// each unit the same vector ([`unit_origin`]) of every [`keys_apart`]-th row, so neighbouring
/// units read neighbouring bytes. A row without a token copies no bytes, which fills its vectors with zeros. The copies
/// are this unit's until it commits them to a barrier; no register holds the data. With the
/// query read as elements the prologue was ~1,530 instructions a warp (sm_90a, 32 rows a warp at
/// head_dim 128), with these copies 669. The launch holds every query row to the copies' width
/// ([`super::staging_width`]).
#[cube]
fn copy_query<F: Float>(queries: &Tensor<F>, row_offsets: &SharedMemory<u32>, staged_query: &mut SharedMemory<F>, #[comptime] rows: usize, #[comptime] head_dim: usize, #[comptime] width: usize, #[comptime] units: usize) {
    let (first_row, dim) = unit_origin(head_dim, width);
    #[unroll]
    for i in 0..comptime![rows * (head_dim / width) / units] {
        let row = first_row + i * comptime![keys_apart(head_dim, width, units)];
        let offset = row_offsets[row];
        let present = offset != NO_ROW;
        let source = select(present, offset as usize + dim, 0usize);
        let length = select(present, width, 0usize);
        let staged = row * comptime![staged_row(head_dim)] + dim;
        copy_async_checked(&queries.slice(source, source + length), &mut staged_query.slice_mut(staged, staged + width), comptime![width as u32]);
    }
}

/// Stages element `dim` of the cube's query row `row` (`[rows, head_dim]`, rows [`staged_row`]
/// apart; zero for a row without a token). A row without a token reads the first query row
/// instead (there is always one) and stages a zero: selects, not a branch.
#[cube]
fn stage_query_element<F: Float>(queries: &Tensor<F>, row_offsets: &SharedMemory<u32>, staged_query: &mut SharedMemory<F>, row: usize, dim: usize, #[comptime] head_dim: usize) {
    let offset = row_offsets[row];
    let present = offset != NO_ROW;
    let value = queries[select(present, offset as usize, 0usize) + dim];
    staged_query[row * comptime![staged_row(head_dim)] + dim] = select(present, value, F::new(0.0));
}

/// A unit's rows (two a block: `half` 0 and 1): their running maxima, and the partial sums of
/// this unit's own columns.
#[derive(CubeType)]
struct RowsState {
    maxima: Array<f32>,
    sums: Array<f32>,
}

/// Every row of the cube: its token and where its item starts (what it may see of a masked
/// step), in shared memory.
#[derive(CubeType)]
struct CubeRows {
    tokens: SharedMemory<u32>,
    item_starts: SharedMemory<u32>,
}

/// One key step on the keys and values staged from element `staged_at`: steps 2–4 of the loop
/// (scores, masks and online softmax in registers, weights × values). Every unit of the cube
/// calls it.
#[cube]
#[allow(clippy::too_many_arguments)]
fn flash_step<F: Float, T: FragmentMath>(
    tile: &Tile,
    step: &Step,
    query: &QueryPairs<F>,
    staged_query: &SharedMemory<F>,
    cube_rows: &CubeRows,
    rows_state: &mut RowsState,
    accumulated: &mut Array<f32>,
    staged_keys: &SharedMemory<F>,
    staged_values: &SharedMemory<F>,
    staged_at: usize,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] step_keys: usize,
    #[comptime] rows: usize,
    #[comptime] blocks: usize,
) {
    // 2. Scores of the plane's rows against the step's keys (unscaled).
    let weights = T::scores::<F>(query, staged_query, staged_keys, staged_at, head_dim, step_keys, blocks);
    finish_step::<F, T>(weights, tile, step, cube_rows, rows_state, accumulated, staged_values, staged_at, scale, head_dim, step_keys, rows, blocks);
}

/// Steps 3–4 of a key step whose scores are `weights`: masks and online softmax, then weights ×
/// values from element `staged_at`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn finish_step<F: Float, T: FragmentMath>(
    mut weights: Array<f32>,
    tile: &Tile,
    step: &Step,
    cube_rows: &CubeRows,
    rows_state: &mut RowsState,
    accumulated: &mut Array<f32>,
    staged_values: &SharedMemory<F>,
    staged_at: usize,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] step_keys: usize,
    #[comptime] rows: usize,
    #[comptime] blocks: usize,
) {
    // 3. Masks and online softmax, each unit on its own elements, a row's quad together.
    move_maxima::<T>(&mut weights, cube_rows, rows_state, accumulated, tile, step, step_masked(step, step_keys), scale, head_dim, step_keys, rows, blocks);
    weigh(&mut weights, rows_state, scale, step_keys, blocks);

    // 4. Add weights × values.
    T::accumulate::<F>(accumulated, &weights, staged_values, staged_at, head_dim, step_keys, rows, blocks);
}

/// Steps 3–4 of key step `step` whose scores are `weights` (the values staged from
/// `values_at`), with step 2 of the next step between them: that step's scores, from the keys
/// staged at `next_keys_at`, are multiplied after this step's branches (its masks, its
/// rescale) and before its exponentials and weights × values, so the tensor cores' work on
/// them and the softmax's arithmetic lie in one stretch of code, for the compiler to
/// interleave (FlashAttention-3's intra-warpgroup overlap, with `mma.sync`). `weights` becomes
/// the next step's scores. On the walk's last step the keys at `next_keys_at` are a stale
/// buffer and their scores unused: one step's scores multiplied in vain a tile, where a branch
/// around them would part them from the exponentials again.
#[cube]
#[allow(clippy::too_many_arguments)]
fn finish_step_scoring_next<F: Float, T: FragmentMath>(
    weights: &mut Array<f32>,
    tile: &Tile,
    step: &Step,
    query: &QueryPairs<F>,
    staged_query: &SharedMemory<F>,
    cube_rows: &CubeRows,
    rows_state: &mut RowsState,
    accumulated: &mut Array<f32>,
    staged_keys: &SharedMemory<F>,
    staged_values: &SharedMemory<F>,
    values_at: usize,
    next_keys_at: usize,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] step_keys: usize,
    #[comptime] rows: usize,
    #[comptime] blocks: usize,
) {
    move_maxima::<T>(weights, cube_rows, rows_state, accumulated, tile, step, step_masked(step, step_keys), scale, head_dim, step_keys, rows, blocks);
    let next = T::scores::<F>(query, staged_query, staged_keys, next_keys_at, head_dim, step_keys, blocks);
    weigh(weights, rows_state, scale, step_keys, blocks);
    T::accumulate::<F>(accumulated, weights, staged_values, values_at, head_dim, step_keys, rows, blocks);
    #[unroll]
    for i in 0..comptime![blocks * step_keys / 8 * BLOCK_ELEMENTS] {
        weights[i] = next[i];
    }
}

/// Whether some row of the tile may not see some key of `step`: every row sees every key of a
/// full prefix step (all but the prefix's last), and those skip the masks. Uniform over the cube.
#[cube]
fn step_masked(step: &Step, #[comptime] step_keys: usize) -> bool {
    !(step.in_prefix && step.count == step_keys)
}

/// Step 3's first part for all of a unit's rows (row `r`: `half` `r % 2` of block `r / 2`),
/// phase by phase: on a masked step the scores of keys a row does not see replaced (once, for
/// both phases that read them), every row's largest score, then the quads' maxima and each
/// row's correction (of its partial sum at once), then the output rescaled; [`weigh`] then
/// turns the scores into weights and sums. Each row's scores (`weights`' elements of that row,
/// unscaled) end as the weights of the keys it sees — [`visible_keys`] of the step where
/// `masked`, all of them otherwise —, its running maximum and partial sum move on, and its
/// output fragments are rescaled.
///
/// Phases, not a pass per row: the rows' dependent chains (a maximum, two shuffles, the
/// exponentials, a sum) interleave in one stretch of code, where a pass per row put each
/// behind its own mask and rescale branches (15 on a full step's path in the sm_90a code, 6
/// now). Maxima are of unscaled scores (`scale` > 0 keeps their order), each weight is one
/// `exp(score · scale − max)`, and masks are selects, not branches (a branch per element cost a
/// reconvergence point each), made once a step (the maxima and the weights each masked on
/// their own cost a masked step twice the selects and reads of the rows' tokens: 1,626 sm_90a
/// instructions against 1,321 at the default tile). The maximum and the sum run as one chain
/// per column of the unit's pairs, halving their dependent lengths. `masked` is uniform over
/// the cube; the quad's exchanges stay outside its branches (on the register fragments each
/// call site of one allocates its own shared memory).
#[cube]
#[allow(clippy::too_many_arguments)]
fn move_maxima<T: FragmentMath>(
    weights: &mut Array<f32>,
    cube_rows: &CubeRows,
    rows_state: &mut RowsState,
    accumulated: &mut Array<f32>,
    tile: &Tile,
    step: &Step,
    masked: bool,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] step_keys: usize,
    #[comptime] rows: usize,
    #[comptime] blocks: usize,
) {
    let (plane_row, lane) = flash_plane_and_lane(blocks);
    let units = comptime![flash_units(rows, blocks)];
    let unit_rows = comptime![blocks * HALVES];

    // A masked step first sets the scores of the keys a row does not see to MASKED_SCORE, so
    // that from here on both kinds of step run the same code: such a key can be no row's
    // maximum, and its weight below is exp(MASKED_SCORE · scale − running maximum) = 0.
    if masked {
        #[unroll]
        for r in 0..unit_rows {
            let (from, to) = row_visible_keys(cube_rows, tile, step, plane_row, lane, r);
            #[unroll]
            for block in 0..comptime![step_keys / 8] {
                #[unroll]
                for column in 0..COLUMNS {
                    let index = score_index(r, block, column, step_keys);
                    let key = block * 8 + fragment_column(lane, 2 * (r % HALVES) + column);
                    weights[index] = select(key >= from && key < to, weights[index], f32::new(MASKED_SCORE));
                }
            }
        }
    }

    // Each row's largest score of the step.
    let mut step_max = Array::<f32>::new(unit_rows);
    #[unroll]
    for r in 0..unit_rows {
        let mut column_max = Array::<f32>::new(COLUMNS);
        #[unroll]
        for column in 0..COLUMNS {
            column_max[column] = weights[score_index(r, 0, column, step_keys)];
            #[unroll]
            for block in 1..comptime![step_keys / 8] {
                column_max[column] = f32::max(column_max[column], weights[score_index(r, block, column, step_keys)]);
            }
        }
        step_max[r] = f32::max(column_max[0], column_max[1]);
    }

    // The quads' maxima, each row's running maximum and the correction of what it has summed.
    // The running maximum moves only when a step's maximum passes it by more than RESCALE_SLACK
    // (FlashAttention-4's conditional rescaling): below that the weights are measured from a
    // maximum up to the slack too low, at most e^slack, which float32 sums and bf16/f16 weights
    // hold as well as any (the output divides by the sum of the same weights). A row that sees
    // no key yet keeps its first maximum, NO_SCORE, far below any real score, since a step of
    // masked keys only reaches MASKED_SCORE · scale, further below: its weights and sum stay 0,
    // its correction exp(0) = 1 while it has seen nothing, 0-weighted history once it does.
    let mut corrections = Array::<f32>::new(unit_rows);
    let mut any_correction = false;
    #[unroll]
    for r in 0..unit_rows {
        let row_max = T::quad_max(step_max[r], units) * scale;
        let previous = rows_state.maxima[r];
        let running_max = select(row_max > previous + f32::new(RESCALE_SLACK), row_max, previous);
        corrections[r] = f32::exp(previous - running_max);
        any_correction = any_correction || corrections[r] != 1.0;
        rows_state.maxima[r] = running_max;
        rows_state.sums[r] *= corrections[r];
    }

    // The output rescaled, before the weights: the corrections are dead by then, and the
    // weights' exponentials and the weights × values multiply that reads them lie in one
    // stretch of code with no branch between. Where no row's maximum moved every correction is
    // exactly 1 (`exp(0)`) and the output stays as it is, `head_dim / 4` multiplies a row
    // saved. A warp takes the branch if any of its rows moved: with the plain running maximum
    // and scores alike in distribution, a row's maximum moves at step `s` with odds `1 / s`,
    // one of a warp's 32 rows at step 31 still about two times in three (26 of S1's 31 steps
    // after the first); with the slack, a step moves a row only by passing its maximum so far
    // by e^8 in weight.
    if any_correction {
        #[unroll]
        for r in 0..unit_rows {
            let output_at = (r / HALVES) * comptime![head_dim / 8 * BLOCK_ELEMENTS] + 2 * (r % HALVES);
            #[unroll]
            for block in 0..comptime![head_dim / 8] {
                #[unroll]
                for column in 0..COLUMNS {
                    accumulated[output_at + block * BLOCK_ELEMENTS + column] *= corrections[r];
                }
            }
        }
    }

}

/// Step 3's second part: each row's scores (unscaled) made weights against its running maximum,
/// added to its partial sum.
#[cube]
fn weigh(weights: &mut Array<f32>, rows_state: &mut RowsState, scale: f32, #[comptime] step_keys: usize, #[comptime] blocks: usize) {
    #[unroll]
    for r in 0..comptime![blocks * HALVES] {
        let running_max = rows_state.maxima[r];
        let mut column_sum = Array::<f32>::new(COLUMNS);
        column_sum[0] = rows_state.sums[r];
        column_sum[1] = f32::new(0.0);
        #[unroll]
        for block in 0..comptime![step_keys / 8] {
            #[unroll]
            for column in 0..COLUMNS {
                let index = score_index(r, block, column, step_keys);
                let weight = f32::exp(weights[index] * scale - running_max);
                weights[index] = weight;
                column_sum[column] += weight;
            }
        }
        rows_state.sums[r] = column_sum[0] + column_sum[1];
    }
}

/// Where a unit's row `r`'s score of key block `block`, column `column` lies in `weights`.
#[cube]
fn score_index(r: usize, block: usize, column: usize, #[comptime] step_keys: usize) -> usize {
    (r / HALVES) * comptime![step_keys / 8 * BLOCK_ELEMENTS] + block * BLOCK_ELEMENTS + 2 * (r % HALVES) + column
}

/// The keys of `step` a unit's row `r` sees ([`visible_keys`]), its token and item start read
/// from the cube's rows.
#[cube]
fn row_visible_keys(cube_rows: &CubeRows, tile: &Tile, step: &Step, plane_row: usize, lane: usize, r: usize) -> (usize, usize) {
    let row = plane_row + (r / HALVES) * ROWS_PER_PLANE + fragment_row(lane, 2 * (r % HALVES));
    visible_keys(tile, step, cube_rows.item_starts[row] as usize, cube_rows.tokens[row] as usize)
}
