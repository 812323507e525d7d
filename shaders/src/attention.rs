//! Multi-item attention: every item token attends to its own request's prefix (the query) and,
//! causally, to its own item — never to another item.
//!
//! Tokens are packed (no padding), items given by CSR offsets. The host cuts the tokens into
//! tiles of consecutive items that share a prefix (a long item is split over several tiles);
//! one cube takes one tile and one KV head, and each unit owns one (token, query head) row,
//! keeping its running max, sum and output in registers (online softmax). The cube walks the
//! key tiles its rows may see — the shared prefix once for all of them, then the tile's own
//! items up to its last token — staging each in shared memory. Keys of items outside the tile,
//! and own keys after it, are never loaded: masked tiles cost nothing.

use burn_backend::{DType, Shape, TensorMetadata};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use crate::grid::{cube_index, cubes};

/// Keys staged in shared memory per step. K and V take 2 · 16 · head_dim · 4 B: 16 KiB at
/// head_dim 128, WebGPU's default workgroup-storage limit, so it fits every adapter.
const KEY_TILE: usize = 16;

/// Units per cube: `tokens per tile × group` rows.
const ROWS_PER_CUBE: usize = 128;

/// Below any real score, and finite: WGSL cannot spell −∞.
const NO_SCORE: f32 = -1.0e30;

/// Where one pass's items sit, as the kernel reads it: the tiles (runs of consecutive items that
/// share a prefix, cut to one cube's rows) and every token's item start, on the device. Built
/// once per pass and read by every layer.
pub struct AttentionTiles<R: CubeRuntime> {
    tiles: CubeTensor<R>,
    item_starts: CubeTensor<R>,
    tile_count: usize,
    tokens_per_tile: usize,
    tokens: usize,
    group: usize,
}

impl<R: CubeRuntime> AttentionTiles<R> {
    /// - `item_offsets`: item `i` owns tokens `item_offsets[i]..item_offsets[i + 1]`.
    /// - `item_prefixes`: (first token, length) of item `i`'s prefix in the prefix K/V the
    ///   attention calls will read; items that share a prefix are adjacent.
    /// - `group`: query heads per KV head.
    pub fn new(client: &ComputeClient<R>, device: &R::Device, item_offsets: &[usize], item_prefixes: &[(usize, usize)], group: usize) -> Self {
        assert_eq!(item_prefixes.len() + 1, item_offsets.len(), "one prefix per item");
        let tokens_per_tile = (ROWS_PER_CUBE / group).max(1);
        let (tiles, item_starts) = tiles(item_offsets, item_prefixes, tokens_per_tile);
        let tile_count = tiles.len() / 4;
        let upload = |mut values: Vec<u32>| {
            // A buffer can't be empty (a pass without tokens launches nothing, but still plans).
            if values.is_empty() {
                values.push(0);
            }
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            CubeTensor::new_contiguous(client.clone(), device.clone(), Shape::new([values.len()]), client.create_from_slice(&bytes), DType::U32)
        };
        AttentionTiles { tiles: upload(tiles), item_starts: upload(item_starts), tile_count, tokens_per_tile, tokens: item_offsets.last().copied().unwrap_or(0), group }
    }
}

/// The inputs of one multi-item attention call.
///
/// - `queries`: `[tokens, q_heads, head_dim]`; `keys`, `values`: `[tokens, kv_heads, head_dim]`
///   (the items' own K/V, packed like the queries).
/// - `prefix_keys`, `prefix_values`: `[kv_heads, prefix_tokens, head_dim]`, the prefixes of
///   every request of the call one after the other (at least one token; pad an empty one).
/// - `tiles`: the pass's items and where each finds its prefix in `prefix_keys`/`values`.
pub struct MultiItemAttention<'a, R: CubeRuntime> {
    pub queries: CubeTensor<R>,
    pub keys: CubeTensor<R>,
    pub values: CubeTensor<R>,
    pub prefix_keys: CubeTensor<R>,
    pub prefix_values: CubeTensor<R>,
    pub tiles: &'a AttentionTiles<R>,
}

impl<R: CubeRuntime> MultiItemAttention<'_, R> {
    /// `[tokens, q_heads, head_dim]`, in the queries' dtype.
    pub fn run(self) -> CubeTensor<R> {
        let queries = &self.queries;
        // Contiguous, not the runtime's choice: CUDA pads rows of new tensors to an alignment.
        let output = empty_device_contiguous_dtype(queries.client.clone(), queries.device.clone(), queries.shape(), queries.dtype);
        self.run_into(&output);
        output
    }

    /// Writes every element of `output` (`[tokens, q_heads, head_dim]`, contiguous).
    pub fn run_into(self, output: &CubeTensor<R>) {
        let [tokens, q_heads, head_dim] = self.queries.shape().dims::<3>();
        let kv_heads = self.keys.shape()[1];
        let tiles = self.tiles;
        assert_eq!(q_heads, kv_heads * tiles.group, "query heads must be {} per KV head, as planned", tiles.group);
        assert_eq!(tiles.tokens, tokens, "the tiles must cover the tokens");
        assert!(output.is_contiguous(), "the attention output must be contiguous");
        if tokens == 0 {
            return;
        }
        let client = self.queries.client.clone();
        let dtype = self.queries.dtype;
        multi_item_attention_kernel::launch::<R>(
            &client,
            cubes(tiles.tile_count, kv_heads),
            CubeDim::new_1d((tiles.tokens_per_tile * tiles.group) as u32),
            into_contiguous(self.queries).into_tensor_arg(),
            into_contiguous(self.keys).into_tensor_arg(),
            into_contiguous(self.values).into_tensor_arg(),
            into_contiguous(self.prefix_keys).into_tensor_arg(),
            into_contiguous(self.prefix_values).into_tensor_arg(),
            tiles.tiles.clone().into_tensor_arg(),
            tiles.item_starts.clone().into_tensor_arg(),
            output.clone().into_tensor_arg(),
            (head_dim as f32).powf(-0.5),
            head_dim,
            tiles.group,
            dtype.into(),
        );
    }
}

/// Cuts the items into tiles of at most `tokens_per_tile` tokens: whole consecutive items with
/// the same prefix, or one piece of an item longer than a tile. Returns the tiles as
/// `[first token, end token, prefix start, prefix length]` each, and every token's item start.
fn tiles(item_offsets: &[usize], item_prefixes: &[(usize, usize)], tokens_per_tile: usize) -> (Vec<u32>, Vec<u32>) {
    let mut tiles: Vec<[usize; 4]> = Vec::new();
    let mut item_starts = Vec::with_capacity(item_offsets.last().copied().unwrap_or(0));
    for (item, &(prefix_start, prefix_len)) in item_prefixes.iter().enumerate() {
        let (start, end) = (item_offsets[item], item_offsets[item + 1]);
        item_starts.extend(std::iter::repeat_n(start as u32, end - start));
        match tiles.last_mut() {
            // Joins the open tile: same prefix and room for the whole item.
            Some(tile) if tile[2..] == [prefix_start, prefix_len] && tile[1] == start && end - tile[0] <= tokens_per_tile => tile[1] = end,
            _ => tiles.extend((start..end).step_by(tokens_per_tile).map(|first| [first, (first + tokens_per_tile).min(end), prefix_start, prefix_len])),
        }
    }
    (tiles.into_iter().flatten().map(|v| v as u32).collect(), item_starts)
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn multi_item_attention_kernel<F: Float>(
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
    let tile = cube_index();
    // Uniform over the cube: the grid's last row may run past the tiles.
    if tile * 4 >= tiles.len() {
        terminate!();
    }
    let kv_head = CUBE_POS_Z as usize;
    let tile_start = tiles[tile * 4] as usize;
    let tile_end = tiles[tile * 4 + 1] as usize;
    let prefix_start = tiles[tile * 4 + 2] as usize;
    let prefix_len = tiles[tile * 4 + 3] as usize;
    let prefix_tokens = prefix_keys.shape(1);
    let kv_heads = keys.shape(1);
    let q_heads = kv_heads * group;

    let unit = UNIT_POS_X as usize;
    let token = tile_start + unit / group;
    let q_head = kv_head * group + unit % group;
    let active = token < tile_end;
    // Own keys run from the tile's first item start (earlier for a piece of a long item) to
    // the tile's end; a row sees those from its own item's start up to itself.
    let own_start = item_starts[tile_start] as usize;
    let mut row_item_start = own_start;
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
    let prefix_tiles = prefix_len.div_ceil(KEY_TILE);
    let own_len = tile_end - own_start;
    let own_tiles = own_len.div_ceil(KEY_TILE);

    for step in 0..prefix_tiles + own_tiles {
        let in_prefix = step < prefix_tiles;
        let mut first = step * KEY_TILE;
        let mut available = prefix_len;
        if !in_prefix {
            first = (step - prefix_tiles) * KEY_TILE;
            available = own_len;
        }
        let mut count = available - first;
        if count > KEY_TILE {
            count = KEY_TILE;
        }

        // Stage `count` keys and values, all units together.
        let mut index = unit;
        while index < count * head_dim {
            let key = first + index / head_dim;
            let e = index % head_dim;
            if in_prefix {
                let source = (kv_head * prefix_tokens + prefix_start + key) * head_dim + e;
                tile_keys[index] = f32::cast_from(prefix_keys[source]);
                tile_values[index] = f32::cast_from(prefix_values[source]);
            } else {
                let source = ((own_start + key) * kv_heads + kv_head) * head_dim + e;
                tile_keys[index] = f32::cast_from(keys[source]);
                tile_values[index] = f32::cast_from(values[source]);
            }
            index += CUBE_DIM_X as usize;
        }
        sync_cube();

        if active {
            // Visible keys of this step: `from..to`, all of a prefix step, and of an own step
            // those in `row_item_start..=token`.
            let mut from = 0;
            let mut to = count;
            if !in_prefix {
                let step_start = own_start + first;
                if row_item_start > step_start {
                    from = row_item_start - step_start;
                }
                to = 0;
                if token >= step_start {
                    to = token - step_start + 1;
                    if to > count {
                        to = count;
                    }
                }
            }
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

#[cfg(test)]
mod tests {
    use super::tiles;

    #[test]
    fn tiles_join_small_items_of_one_prefix_and_split_long_ones() {
        // Items of 3, 2 and 7 tokens on prefix (0, 10), then 1 token on prefix (10, 4); 5 tokens per tile.
        let (tiles, starts) = tiles(&[0, 3, 5, 12, 13], &[(0, 10), (0, 10), (0, 10), (10, 4)], 5);
        let tiles: Vec<&[u32]> = tiles.chunks(4).collect();
        assert_eq!(tiles, [&[0, 5, 0, 10][..], &[5, 10, 0, 10], &[10, 12, 0, 10], &[12, 13, 10, 4]]);
        assert_eq!(starts, [0, 0, 0, 3, 3, 5, 5, 5, 5, 5, 5, 5, 12]);
    }

    #[test]
    fn tiles_never_mix_prefixes() {
        let (tiles, _) = tiles(&[0, 1, 2], &[(0, 3), (3, 3)], 8);
        assert_eq!(tiles, [0, 1, 0, 3, 1, 2, 3, 3]);
    }
}
