//! What both multi-item kernels share: the tile a cube takes, the key steps it walks (the
//! prefix's keys, then the tile's own), and which keys of a step a row may see.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

/// One cube's tile as the plan wrote it, and where its own keys start: the tile's first item
/// start (earlier than its first token for a piece of a long item).
#[derive(CubeType)]
pub(super) struct Tile {
    pub start: usize,
    pub end: usize,
    pub prefix_start: usize,
    pub prefix_len: usize,
    pub own_start: usize,
}

/// Tile `index` of `tiles` (`[first token, end token, prefix start, prefix length]` each).
#[cube]
pub(super) fn read_tile(tiles: &Tensor<u32>, item_starts: &Tensor<u32>, index: usize) -> Tile {
    let start = tiles[index * 4] as usize;
    Tile {
        start,
        end: tiles[index * 4 + 1] as usize,
        prefix_start: tiles[index * 4 + 2] as usize,
        prefix_len: tiles[index * 4 + 3] as usize,
        own_start: item_starts[start] as usize,
    }
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
        available = tile.end - tile.own_start;
    }
    let mut count = available - first;
    if count > keys {
        count = keys;
    }
    Step { in_prefix, first, count }
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
