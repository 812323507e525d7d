//! The row kernel: each unit owns one (token, query head) row and keeps its running max, sum
//! and output in registers (online softmax), on CUDA cores. Every backend runs it; it is the
//! default while the tiled kernel is measured (`--attention kernel`).

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;

use super::walk::{read_tile, visible_keys, walk_step};
use super::NO_SCORE;
use crate::grid::cube_index;

/// Keys staged in shared memory per step. K and V take 2 · 16 · head_dim · 4 B: 16 KiB at
/// head_dim 128, WebGPU's default workgroup-storage limit, so it fits every adapter.
const KEY_TILE: usize = 16;

/// Units per cube: `tokens per tile × group` rows.
pub(super) const ROWS_PER_CUBE: usize = 128;

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn row_attention_kernel<F: Float>(
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
    #[define(F)] _dtype: StorageType,
) {
    let tile_index = cube_index();
    // Uniform over the cube: the grid's last row may run past the tiles.
    if tile_index * 4 >= tiles.len() {
        terminate!();
    }
    let kv_head = CUBE_POS_Z as usize;
    let tile = read_tile(tiles, item_starts, tile_index);
    let prefix_tokens = prefix_keys.shape(1);
    let kv_heads = keys.shape(1);
    let q_heads = kv_heads * group;
    // The items' keys and values may each sit one row a token in a wider buffer (the values
    // where the QKV projection wrote them).
    let (key_stride, value_stride) = (keys.stride(0), values.stride(0));

    let unit = UNIT_POS_X as usize;
    let token = tile.start + unit / group;
    let q_head = kv_head * group + unit % group;
    let active = token < tile.end;
    let mut row_item_start = tile.own_start;
    if active {
        row_item_start = item_starts[token] as usize;
    }

    let mut query = Array::<f32>::new(head_dim);
    let mut acc = Array::<f32>::new(head_dim);
    let row = (token * q_heads + q_head) * head_dim;
    #[unroll]
    for e in 0..head_dim {
        acc[e] = 0.0;
        query[e] = 0.0;
        if active {
            query[e] = f32::cast_from(queries[row + e]) * scale;
        }
    }
    let mut running_max = f32::new(NO_SCORE);
    let mut running_sum = f32::new(0.0);

    let mut tile_keys = SharedMemory::<f32>::new(KEY_TILE * head_dim);
    let mut tile_values = SharedMemory::<f32>::new(KEY_TILE * head_dim);
    let prefix_steps = tile.prefix_len.div_ceil(KEY_TILE);
    let own_steps = tile.own_keys.div_ceil(KEY_TILE);

    for step in 0..prefix_steps + own_steps {
        let step = walk_step(&tile, step, prefix_steps, KEY_TILE);

        // Stage `count` keys and values, all units together.
        let mut index = unit;
        while index < step.count * head_dim {
            let key = step.first + index / head_dim;
            let e = index % head_dim;
            if step.in_prefix {
                let source = (kv_head * prefix_tokens + tile.prefix_start + key) * head_dim + e;
                tile_keys[index] = f32::cast_from(prefix_keys[source]);
                tile_values[index] = f32::cast_from(prefix_values[source]);
            } else {
                let token = tile.own_start + key;
                let head = kv_head * head_dim + e;
                tile_keys[index] = f32::cast_from(keys[token * key_stride + head]);
                tile_values[index] = f32::cast_from(values[token * value_stride + head]);
            }
            index += CUBE_DIM_X as usize;
        }
        sync_cube();

        if active {
            let (from, to) = visible_keys(&tile, &step, row_item_start, token);
            for j in from..to {
                let base = j * head_dim;
                let mut score = f32::new(0.0);
                #[unroll]
                for e in 0..head_dim {
                    score += query[e] * tile_keys[base + e];
                }
                // Online softmax: rescale only when the running max moves.
                if score > running_max {
                    let correction = f32::exp(running_max - score);
                    running_sum *= correction;
                    #[unroll]
                    for e in 0..head_dim {
                        acc[e] *= correction;
                    }
                    running_max = score;
                }
                let weight = f32::exp(score - running_max);
                running_sum += weight;
                #[unroll]
                for e in 0..head_dim {
                    acc[e] += weight * tile_values[base + e];
                }
            }
        }
        sync_cube();
    }

    if active {
        #[unroll]
        for e in 0..head_dim {
            output[row + e] = F::cast_from(acc[e] / running_sum);
        }
    }
}

