//! What the multi-item kernels share: the tile a cube takes, where each of its rows reads and
//! writes, the key steps it walks (the prefix's keys, then the tile's own), how a step is read
//! and staged in shared memory, and which keys of a step a row may see.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::barrier::copy_async_checked;
use burn_cubecl::cubecl::prelude::*;

use super::tiled::NO_ROW;

/// One cube's tile as the plan wrote it, where its own keys start (the tile's first item
/// start: earlier than its first token for a piece of a long item) and how many of them the
/// cube walks (up to the tile's last token; none in a part of a split prefix walk but the
/// last, [`read_tile_part`]).
#[derive(CubeType)]
pub(super) struct Tile {
    pub start: usize,
    pub end: usize,
    pub prefix_start: usize,
    pub prefix_len: usize,
    pub own_start: usize,
    pub own_keys: usize,
}

/// Tile `index` of `tiles` (`[first token, end token, prefix start, prefix length]` each).
#[cube]
pub(super) fn read_tile(tiles: &Tensor<u32>, item_starts: &Tensor<u32>, index: usize) -> Tile {
    read_tile_part(tiles, item_starts, index, 0usize, 1usize, false, 1usize)
}

/// [`read_tile`], and where `split`, only part `part` of `parts` of its walk
/// ([`tally_core::PrefixSplits`]): an even share of its prefix's key steps (`step_keys` keys
/// each), from a step's start (the last parts fewer steps, or none, where the steps do not
/// divide), and the tile's own keys in the last part only. Every part but the last walks only
/// keys every row sees, so only the prefix's own last step is ever masked.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn read_tile_part(tiles: &Tensor<u32>, item_starts: &Tensor<u32>, index: usize, part: usize, parts: usize, #[comptime] split: bool, #[comptime] step_keys: usize) -> Tile {
    let start = tiles[index * 4] as usize;
    let end = tiles[index * 4 + 1] as usize;
    let own_start = item_starts[start] as usize;
    let mut prefix_start = tiles[index * 4 + 2] as usize;
    let mut prefix_len = tiles[index * 4 + 3] as usize;
    let mut own_keys = end - own_start;
    if comptime![split] {
        let part_keys = prefix_len.div_ceil(step_keys).div_ceil(parts) * step_keys;
        let mut first = part * part_keys;
        if first > prefix_len {
            first = prefix_len;
        }
        prefix_start += first;
        prefix_len -= first;
        if prefix_len > part_keys {
            prefix_len = part_keys;
        }
        if part + 1 != parts {
            own_keys = 0;
        }
    }
    Tile { start, end, prefix_start, prefix_len, own_start, own_keys }
}

/// Where row `row` of a cube (token `row / group` of the tile × query head `row % group` of
/// `kv_head`) reads its query and writes its output, which token it is and where its item
/// starts. A row past the tile's last token gets [`NO_ROW`], and a token and item start that
/// make it see no own key (its item "starts" past every key).
#[cube]
pub(super) fn tile_row(tile: &Tile, item_starts: &Tensor<u32>, row: usize, kv_head: usize, q_heads: usize, #[comptime] group: usize, #[comptime] head_dim: usize) -> TileRow {
    let token = tile.start + row / group;
    let q_head = kv_head * group + row % group;
    let mut offset = u32::new(NO_ROW as i64);
    let mut row_token = tile.own_start as u32;
    let mut item_start = tile.end as u32;
    if token < tile.end {
        offset = ((token * q_heads + q_head) * head_dim) as u32;
        row_token = token as u32;
        item_start = item_starts[token];
    }
    TileRow { offset, token: row_token, item_start }
}

/// One row of a cube, as [`tile_row`] finds it.
#[derive(CubeType)]
pub(super) struct TileRow {
    pub offset: u32,
    pub token: u32,
    pub item_start: u32,
}

/// Elements of padding after each staged key's (or value's) row. Unpadded, the row stride is a
/// multiple of 128 bytes, so the 8 keys of one tensor-core fragment (a lane group each) read
/// the same shared-memory banks (8-way conflicts for K, 4-way for V); 8 more elements shift each
/// row by 4 banks (bf16), which spreads a fragment's 32 lanes over distinct banks.
pub(super) const STAGE_PAD: usize = 8;

/// The row stride of staged keys and values at `head_dim`.
pub(super) const fn staged_row(head_dim: usize) -> usize {
    head_dim + STAGE_PAD
}

/// One step of the walk: in the prefix or the own keys, its first key there, how many keys.
#[derive(CubeType)]
pub(super) struct Step {
    pub in_prefix: bool,
    pub first: usize,
    pub count: usize,
}

/// Step `step` of `tile`'s walk, `keys` keys a step; the first `prefix_steps` are the prefix's.
#[cube]
pub(super) fn walk_step(tile: &Tile, step: usize, prefix_steps: usize, #[comptime] keys: usize) -> Step {
    let in_prefix = step < prefix_steps;
    let mut first = step * keys;
    let mut available = tile.prefix_len;
    if !in_prefix {
        first = (step - prefix_steps) * keys;
        available = tile.own_keys;
    }
    // No keys past the walk's end: the flash kernel reads one step ahead.
    let mut count = 0;
    if available > first {
        count = available - first;
        if count > keys {
            count = keys;
        }
    }
    Step { in_prefix, first, count }
}

/// A unit's share of one key step's keys and values: vectors `unit + i · units` of the step's
/// `[keys, head_dim]` ([`load_share`]), held in registers until [`store_share`] stages them.
/// Between the two the flash kernel computes on the previous step (FlashAttention-2's
/// pipeline, registers in place of cp.async). Held as 32-bit words, `W` a vector: as 16-bit
/// elements (8 separate bf16 values per vector in CubeCL's CUDA code) the zeros for missing keys
/// and the prefix/own choice joined them right where they were read, so each read for the next
/// step stalled the unit at once, every unit of the cube together (sm_90a SASS, NOTES "The flash
/// kernel's instructions"); words go through registers untouched until the store.
#[derive(CubeType)]
pub(super) struct StepShare<W: Size> {
    keys: Array<Vector<u32, W>>,
    values: Array<Vector<u32, W>>,
}

/// Vectors of one step a unit takes.
const fn vectors_per_unit(step_keys: usize, head_dim: usize, width: usize, units: usize) -> usize {
    (step_keys * head_dim / width).div_ceil(units)
}

/// Whether a cube's `units` take a step's `[step_keys, head_dim]` vectors (`width` elements
/// each) in whole passes of the cube, each unit at the same dimensions of every key it takes:
/// its keys are then `units / (head_dim / width)` apart, and no unit runs past the step. Then a
/// unit's share is one [`SharePlan`] a step; otherwise each vector is found from its index.
pub(super) const fn in_whole_passes(step_keys: usize, head_dim: usize, width: usize, units: usize) -> bool {
    let per_key = head_dim / width;
    units.is_multiple_of(per_key) && (step_keys * per_key).is_multiple_of(units)
}

/// Keys from one of a unit's keys of a step to its next, in whole passes.
pub(super) const fn keys_apart(head_dim: usize, width: usize, units: usize) -> usize {
    units / (head_dim / width)
}

/// A unit's share of one step where the cube takes it in whole passes ([`in_whole_passes`]):
/// its first key of the step, where that key's vector is staged, where it is read (as vectors
/// of the prefix K/V, or of the items' keys and values), and how many vectors the sources move
/// from one of its keys to the next. Vector `i` of the share is key `key + i · keys_apart`, read
/// `i` moves further and staged `i · keys_apart` staged rows further: one address a step, not
/// one a vector (in the sm_90a code the vector-by-vector form cost ~40 instructions a pair of
/// cp.async copies — the unit's index read again, a guard and a branch, both sources' addresses
/// worked out whole and predicated —, a quarter of a warp's key step).
#[derive(CubeType)]
struct SharePlan {
    key: usize,
    staged: usize,
    key_source: usize,
    value_source: usize,
    key_move: usize,
    value_move: usize,
}

/// In whole passes, this unit's first key of a step and the dimension it takes of every key:
/// what [`share_plan`] reads and [`store_share`] stages, one mapping for both.
#[cube]
pub(super) fn unit_origin(#[comptime] head_dim: usize, #[comptime] width: usize) -> (usize, usize) {
    let per_key = comptime![head_dim / width];
    let unit = UNIT_POS_X as usize;
    (unit / per_key, (unit % per_key) * width)
}

/// Whether vector `i` of a unit's planned share is a key of `step`, and where its key and its
/// value are read.
#[cube]
fn planned_vector(plan: &SharePlan, step: &Step, i: usize, #[comptime] head_dim: usize, #[comptime] width: usize, #[comptime] units: usize) -> (bool, usize, usize) {
    let present = plan.key + i * comptime![keys_apart(head_dim, width, units)] < step.count;
    (present, plan.key_source + i * plan.key_move, plan.value_source + i * plan.value_move)
}

/// The [`SharePlan`] of this unit for `step`, staged from element `staged_at`.
#[cube]
fn share_plan(kv: &KvRows, step: &Step, staged_at: usize, #[comptime] head_dim: usize, #[comptime] width: usize, #[comptime] units: usize) -> SharePlan {
    let apart = comptime![keys_apart(head_dim, width, units)];
    let (key, e) = unit_origin(head_dim, width);
    // Both places worked out, once a step: selects, where branches would each need their own
    // copies of the variables.
    let prefix = prefix_element(kv, step, key, e, head_dim) / width;
    let (own_key, own_value) = own_elements(kv, step, key, e);
    let in_prefix = step.in_prefix;
    // Token strides hold whole vectors (`staging_width`).
    let key_source = select(in_prefix, prefix, own_key / width);
    let value_source = select(in_prefix, prefix, own_value / width);
    let key_move = select(in_prefix, comptime![apart * head_dim / width], apart * kv.key_stride / width);
    let value_move = select(in_prefix, comptime![apart * head_dim / width], apart * kv.value_stride / width);
    SharePlan { key, staged: staged_at + key * comptime![staged_row(head_dim)] + e, key_source, value_source, key_move, value_move }
}

/// Reads this unit's share of `step`'s keys and values of `kv_head`, a vector of `N` elements
/// (`W` words: the same bytes) at a time (`N` divides `head_dim`; 16 bytes on CUDA), zeros
/// for keys past its count (the tile multiplies read them: a weight of 0 times a stale NaN
/// would still be NaN). The K/V tensors are the float tensors read as words: only their token
/// and head dimensions are used.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn load_share<N: Size, W: Size>(
    kv: &KvRows,
    step: &Step,
    keys: &Tensor<Vector<u32, W>>,
    values: &Tensor<Vector<u32, W>>,
    prefix_keys: &Tensor<Vector<u32, W>>,
    prefix_values: &Tensor<Vector<u32, W>>,
    #[comptime] step_keys: usize,
    #[comptime] head_dim: usize,
    #[comptime] units: usize,
) -> StepShare<W> {
    let width = N::value();
    let count = comptime![vectors_per_unit(step_keys, head_dim, width, units)];
    let mut share_keys = Array::<Vector<u32, W>>::new(count);
    let mut share_values = Array::<Vector<u32, W>>::new(count);
    if comptime![in_whole_passes(step_keys, head_dim, width, units)] {
        let plan = share_plan(kv, step, 0usize, head_dim, width, units);
        // One branch a step, around all of its reads.
        if step.in_prefix {
            read_planned::<W>(&plan, step, prefix_keys, prefix_values, &mut share_keys, &mut share_values, step_keys, head_dim, width, units);
        } else {
            read_planned::<W>(&plan, step, keys, values, &mut share_keys, &mut share_values, step_keys, head_dim, width, units);
        }
    } else {
        #[unroll]
        for i in 0..count {
            let index = UNIT_POS_X as usize + i * units;
            let key = index / comptime![head_dim / width];
            let e = (index % comptime![head_dim / width]) * width;
            let mut k = Vector::<u32, W>::new(0u32);
            let mut v = Vector::<u32, W>::new(0u32);
            // `key < step.count` also keeps `index` inside the step.
            if key < step.count {
                if step.in_prefix {
                    let source = prefix_element(kv, step, key, e, head_dim) / width;
                    k = prefix_keys[source];
                    v = prefix_values[source];
                } else {
                    let (key_source, value_source) = own_elements(kv, step, key, e);
                    k = keys[key_source / width];
                    v = values[value_source / width];
                }
            }
            share_keys[i] = k;
            share_values[i] = v;
        }
    }
    StepShare::<W> { keys: share_keys, values: share_values }
}

/// [`load_share`]'s reads from `keys` and `values` as `plan` places them, zeros past the count.
#[cube]
#[allow(clippy::too_many_arguments)]
fn read_planned<W: Size>(
    plan: &SharePlan,
    step: &Step,
    keys: &Tensor<Vector<u32, W>>,
    values: &Tensor<Vector<u32, W>>,
    share_keys: &mut Array<Vector<u32, W>>,
    share_values: &mut Array<Vector<u32, W>>,
    #[comptime] step_keys: usize,
    #[comptime] head_dim: usize,
    #[comptime] width: usize,
    #[comptime] units: usize,
) {
    #[unroll]
    for i in 0..comptime![vectors_per_unit(step_keys, head_dim, width, units)] {
        let mut k = Vector::<u32, W>::new(0u32);
        let mut v = Vector::<u32, W>::new(0u32);
        let (present, key_source, value_source) = planned_vector(plan, step, i, head_dim, width, units);
        if present {
            k = keys[key_source];
            v = values[value_source];
        }
        share_keys[i] = k;
        share_values[i] = v;
    }
}

/// Where a cube's keys and values start, worked out once before its walk (in the step loop,
/// each tensor shape it took was a read of CubeCL's metadata from global memory, every step,
/// ahead of the next step's copies): the element of its KV head's first prefix key in the
/// prefix K/V (`[kv_heads, prefix_tokens, head_dim]`, contiguous), of its first own key and
/// value in the items' keys and values (`[tokens, kv_heads, head_dim]`, heads and dimensions
/// contiguous), and the elements from one own key, or value, to the next: each tensor's token
/// stride, so the values can be read where the QKV projection wrote them, one fused row a token,
/// without a copy.
#[derive(CubeType)]
pub(super) struct KvRows {
    prefix: usize,
    own_key: usize,
    own_value: usize,
    key_stride: usize,
    value_stride: usize,
}

/// [`KvRows`] of `tile` at `kv_head`.
#[cube]
pub(super) fn kv_rows<W: Size>(tile: &Tile, kv_head: usize, keys: &Tensor<Vector<u32, W>>, values: &Tensor<Vector<u32, W>>, prefix_keys: &Tensor<Vector<u32, W>>, #[comptime] head_dim: usize) -> KvRows {
    let prefix_tokens = prefix_keys.shape(1);
    let (key_stride, value_stride) = (keys.stride(0), values.stride(0));
    KvRows {
        prefix: (kv_head * prefix_tokens + tile.prefix_start) * head_dim,
        own_key: tile.own_start * key_stride + kv_head * head_dim,
        own_value: tile.own_start * value_stride + kv_head * head_dim,
        key_stride,
        value_stride,
    }
}

/// The element where key `key` of a prefix `step` starts its dimension `e` in the prefix K/V.
#[cube]
fn prefix_element(kv: &KvRows, step: &Step, key: usize, e: usize, #[comptime] head_dim: usize) -> usize {
    kv.prefix + (step.first + key) * head_dim + e
}

/// The elements where key `key` of an own `step` starts its dimension `e` in the items' keys,
/// and in their values.
#[cube]
fn own_elements(kv: &KvRows, step: &Step, key: usize, e: usize) -> (usize, usize) {
    let token = step.first + key;
    (kv.own_key + token * kv.key_stride + e, kv.own_value + token * kv.value_stride + e)
}

/// Writes this unit's `share` of a step into the staged tiles (`[keys, head_dim]`, rows
/// [`staged_row`] apart, from element `staged_at`), its words taken back as `N` elements.
#[cube]
pub(super) fn store_share<F: Float, N: Size, W: Size>(
    share: &StepShare<W>,
    staged_keys: &mut SharedMemory<F>,
    staged_values: &mut SharedMemory<F>,
    staged_at: usize,
    #[comptime] step_keys: usize,
    #[comptime] head_dim: usize,
    #[comptime] units: usize,
) {
    let width = N::value();
    let count = comptime![vectors_per_unit(step_keys, head_dim, width, units)];
    if comptime![in_whole_passes(step_keys, head_dim, width, units)] {
        let (key, e) = unit_origin(head_dim, width);
        let first = staged_at + key * comptime![staged_row(head_dim)] + e;
        #[unroll]
        for i in 0..count {
            store_vector::<F, N, W>(share, i, staged_keys, staged_values, first + i * comptime![keys_apart(head_dim, width, units) * staged_row(head_dim)]);
        }
    } else {
        #[unroll]
        for i in 0..count {
            let index = UNIT_POS_X as usize + i * units;
            if index < comptime![step_keys * head_dim / width] {
                let staged = staged_at + (index / comptime![head_dim / width]) * comptime![staged_row(head_dim)] + (index % comptime![head_dim / width]) * width;
                store_vector::<F, N, W>(share, i, staged_keys, staged_values, staged);
            }
        }
    }
}

/// Stages vector `i` of `share` at element `staged` of the keys and of the values.
#[cube]
fn store_vector<F: Float, N: Size, W: Size>(share: &StepShare<W>, i: usize, staged_keys: &mut SharedMemory<F>, staged_values: &mut SharedMemory<F>, staged: usize) {
    let k = Vector::<F, N>::reinterpret(share.keys[i]);
    let v = Vector::<F, N>::reinterpret(share.values[i]);
    #[unroll]
    for n in 0..N::value() {
        staged_keys[staged + n] = k[n];
        staged_values[staged + n] = v[n];
    }
}

/// [`load_share`] and [`store_share`] in one, for CUDA (sm_80+) only: this unit's share of
/// `step`'s keys and values of `kv_head` copied global → shared by `cp.async`, `N` elements
/// (`W` words) a copy, into the staged tiles from element `staged_at`. No register holds the
/// data and no unit stores it. A key past the step's count is a copy of no bytes, which fills
/// its vector with zeros. The copies are the unit's until it commits them to a barrier
/// (`commit_copy_async`) and the cube waits on it. Addressed as [`load_share`] reads.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn copy_share<F: Float, N: Size, W: Size>(
    kv: &KvRows,
    step: &Step,
    keys: &Tensor<Vector<u32, W>>,
    values: &Tensor<Vector<u32, W>>,
    prefix_keys: &Tensor<Vector<u32, W>>,
    prefix_values: &Tensor<Vector<u32, W>>,
    staged_keys: &mut SharedMemory<F>,
    staged_values: &mut SharedMemory<F>,
    staged_at: usize,
    #[comptime] step_keys: usize,
    #[comptime] head_dim: usize,
    #[comptime] units: usize,
) {
    let width = N::value();
    if comptime![in_whole_passes(step_keys, head_dim, width, units)] {
        let plan = share_plan(kv, step, staged_at, head_dim, width, units);
        // One branch a step, around all of its copies: inside, the sm_90a code issued both
        // sides' copies predicated, reloading the four tensors' addresses for each.
        if step.in_prefix {
            copy_planned::<F, W>(&plan, step, prefix_keys, prefix_values, staged_keys, staged_values, step_keys, head_dim, width, units);
        } else {
            copy_planned::<F, W>(&plan, step, keys, values, staged_keys, staged_values, step_keys, head_dim, width, units);
        }
    } else {
        #[unroll]
        for i in 0..comptime![vectors_per_unit(step_keys, head_dim, width, units)] {
            let index = UNIT_POS_X as usize + i * units;
            if index < comptime![step_keys * head_dim / width] {
                let key = index / comptime![head_dim / width];
                let e = (index % comptime![head_dim / width]) * width;
                let staged = staged_at + key * comptime![staged_row(head_dim)] + e;
                // Vectors copied from the source: one, or none past the count.
                let present = key < step.count;
                let length = select(present, 1usize, 0usize);
                if step.in_prefix {
                    let source = select(present, prefix_element(kv, step, key, e, head_dim) / width, 0usize);
                    unsafe {
                        copy_async_checked(&prefix_keys.slice(source, source + length).downcast_unchecked::<F>(), &mut staged_keys.slice_mut(staged, staged + width), comptime![width as u32]);
                        copy_async_checked(&prefix_values.slice(source, source + length).downcast_unchecked::<F>(), &mut staged_values.slice_mut(staged, staged + width), comptime![width as u32]);
                    }
                } else {
                    let (key_source, value_source) = own_elements(kv, step, key, e);
                    let key_source = select(present, key_source / width, 0usize);
                    let value_source = select(present, value_source / width, 0usize);
                    unsafe {
                        copy_async_checked(&keys.slice(key_source, key_source + length).downcast_unchecked::<F>(), &mut staged_keys.slice_mut(staged, staged + width), comptime![width as u32]);
                        copy_async_checked(&values.slice(value_source, value_source + length).downcast_unchecked::<F>(), &mut staged_values.slice_mut(staged, staged + width), comptime![width as u32]);
                    }
                }
            }
        }
    }
}

/// [`copy_share`]'s copies from `keys` and `values` as `plan` places them. The copies are typed
/// as the staged floats (CubeCL asks both sides to be one type); each side's offset stays in
/// its own units (words vectors in global memory, elements in shared memory), and a copy moves
/// `width` elements: `W` words. A key past the count copies nothing, from vector 0.
#[cube]
#[allow(clippy::too_many_arguments)]
fn copy_planned<F: Float, W: Size>(
    plan: &SharePlan,
    step: &Step,
    keys: &Tensor<Vector<u32, W>>,
    values: &Tensor<Vector<u32, W>>,
    staged_keys: &mut SharedMemory<F>,
    staged_values: &mut SharedMemory<F>,
    #[comptime] step_keys: usize,
    #[comptime] head_dim: usize,
    #[comptime] width: usize,
    #[comptime] units: usize,
) {
    let first = shared_index(plan.staged);
    #[unroll]
    for i in 0..comptime![vectors_per_unit(step_keys, head_dim, width, units)] {
        let (present, key_source, value_source) = planned_vector(plan, step, i, head_dim, width, units);
        let length = select(present, 1usize, 0usize);
        let key_source = select(present, key_source, 0usize);
        let value_source = select(present, value_source, 0usize);
        let staged = first + i * comptime![keys_apart(head_dim, width, units) * staged_row(head_dim)];
        unsafe {
            copy_async_checked(&keys.slice(key_source, key_source + length).downcast_unchecked::<F>(), &mut staged_keys.slice_mut(staged, staged + width), comptime![width as u32]);
            copy_async_checked(&values.slice(value_source, value_source + length).downcast_unchecked::<F>(), &mut staged_values.slice_mut(staged, staged + width), comptime![width as u32]);
        }
    }
}

/// Every element index into a kernel's shared memory is below this (2¹⁷ elements: 256 KiB of
/// 16-bit ones, past any GPU's shared memory a cube).
const SHARED_INDICES: usize = 1 << 17;

/// `index`, which is below [`SHARED_INDICES`], said so: with this bound NVRTC (LLVM) knows that
/// adding a compile-time offset to it cannot wrap 32 bits, so it moves the offset out of the
/// 64-bit address (`shared + zext(index + at)` becomes `shared + zext(index) + at`). A step's
/// `ldmatrix` addresses then share one register and differ by immediates, which ptxas folds
/// into the instruction; without it each of the 80 a step took an `IADD3` of its own (sm_90a
/// SASS of the default flash kernel). The same for a step's `cp.async` destinations.
#[cube]
pub(super) fn shared_index(index: usize) -> usize {
    index & comptime![SHARED_INDICES - 1]
}

/// The keys of `step` a row sees, `from..to`: all of a prefix step; of an own step, those in
/// `item_start..=token` (the row's own item up to itself).
#[cube]
pub(super) fn visible_keys(tile: &Tile, step: &Step, item_start: usize, token: usize) -> (usize, usize) {
    let mut from = 0;
    let mut to = step.count;
    if !step.in_prefix {
        let step_start = tile.own_start + step.first;
        if item_start > step_start {
            from = item_start - step_start;
        }
        to = 0;
        if token >= step_start {
            to = token - step_start + 1;
            if to > step.count {
                to = step.count;
            }
        }
    }
    (from, to)
}
