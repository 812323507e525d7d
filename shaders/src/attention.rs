//! Multi-item attention: every item token attends to its own request's prefix (the query) and,
//! causally, to its own item — never to another item.
//!
//! Tokens are packed (no padding) and items are given as CSR offsets. One cube takes one tile
//! of consecutive tokens of one item and one KV head; each unit owns one (token, query head)
//! row and keeps its running max, sum and output in registers (online softmax). The cube walks
//! the key tiles it may see — the item's prefix, then its own item up to the tile's last
//! token — staging each in shared memory once for all its rows. Keys of other items, and own
//! keys after the tile, are never loaded: masked tiles cost nothing.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use burn_backend::TensorMetadata;

/// Keys staged in shared memory per step. K and V take 2 · 16 · head_dim · 4 B: 16 KiB at
/// head_dim 128, WebGPU's default workgroup-storage limit, so it fits every adapter.
const KEY_TILE: usize = 16;

/// Units per cube: `tokens_per_cube × group` rows.
const ROWS_PER_CUBE: usize = 64;

/// Below any real score, and finite: WGSL cannot spell −∞.
const NO_SCORE: f32 = -1.0e30;

/// The tensors of one multi-item attention call.
///
/// - `queries`: `[tokens, q_heads, head_dim]`; `keys`, `values`: `[tokens, kv_heads, head_dim]`
///   (the items' own K/V, packed like the queries).
/// - `prefix_keys`, `prefix_values`: `[kv_heads, prefix_tokens, head_dim]`, the prefixes of
///   every group of the call one after the other (at least one token; pad an empty one).
/// - `item_offsets`: `[items + 1]` integers, item `i` owns tokens `offsets[i]..offsets[i + 1]`.
/// - `item_prefixes`: `[2 · items]` integers, (first token, length) of item `i`'s prefix.
pub struct MultiItemAttention<R: CubeRuntime> {
    pub queries: CubeTensor<R>,
    pub keys: CubeTensor<R>,
    pub values: CubeTensor<R>,
    pub prefix_keys: CubeTensor<R>,
    pub prefix_values: CubeTensor<R>,
    pub item_offsets: CubeTensor<R>,
    pub item_prefixes: CubeTensor<R>,
    /// Tokens of the longest item: sizes the launch grid.
    pub max_item_len: usize,
}

impl<R: CubeRuntime> MultiItemAttention<R> {
    /// `[tokens, q_heads, head_dim]`, in the queries' dtype.
    pub fn run(self) -> CubeTensor<R> {
        let queries = &self.queries;
        let output = empty_device_dtype(queries.client.clone(), queries.device.clone(), queries.shape(), queries.dtype);
        self.run_into(&output);
        output
    }

    /// Writes every element of `output` (`[tokens, q_heads, head_dim]`, contiguous).
    pub fn run_into(self, output: &CubeTensor<R>) {
        let [tokens, q_heads, head_dim] = self.queries.shape().dims::<3>();
        let kv_heads = self.keys.shape()[1];
        let items = self.item_offsets.shape()[0] - 1;
        assert!(q_heads % kv_heads == 0, "query heads ({q_heads}) must be a multiple of KV heads ({kv_heads})");
        assert!(output.is_contiguous(), "the attention output must be contiguous");
        if tokens == 0 || items == 0 {
            return;
        }
        let group = q_heads / kv_heads;
        let tokens_per_cube = (ROWS_PER_CUBE / group).max(1);
        let tiles_per_item = self.max_item_len.div_ceil(tokens_per_cube);
        let client = self.queries.client.clone();
        let dtypes = [self.queries.dtype.into(), self.item_offsets.dtype.into()];
        multi_item_attention_kernel::launch::<R>(
            &client,
            CubeCount::Static(items as u32, tiles_per_item as u32, kv_heads as u32),
            CubeDim::new_1d((tokens_per_cube * group) as u32),
            into_contiguous(self.queries).into_tensor_arg(),
            into_contiguous(self.keys).into_tensor_arg(),
            into_contiguous(self.values).into_tensor_arg(),
            into_contiguous(self.prefix_keys).into_tensor_arg(),
            into_contiguous(self.prefix_values).into_tensor_arg(),
            into_contiguous(self.item_offsets).into_tensor_arg(),
            into_contiguous(self.item_prefixes).into_tensor_arg(),
            output.clone().into_tensor_arg(),
            (head_dim as f32).powf(-0.5),
            head_dim,
            group,
            tokens_per_cube,
            dtypes,
        );
    }
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn multi_item_attention_kernel<F: Float, I: Numeric>(
    queries: &Tensor<F>,
    keys: &Tensor<F>,
    values: &Tensor<F>,
    prefix_keys: &Tensor<F>,
    prefix_values: &Tensor<F>,
    item_offsets: &Tensor<I>,
    item_prefixes: &Tensor<I>,
    output: &mut Tensor<F>,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] group: usize,
    #[comptime] tokens_per_cube: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let item = CUBE_POS_X as usize;
    let kv_head = CUBE_POS_Z as usize;
    let item_start = u32::cast_from(item_offsets[item]) as usize;
    let item_end = u32::cast_from(item_offsets[item + 1]) as usize;
    let tile_start = item_start + CUBE_POS_Y as usize * tokens_per_cube;
    // Uniform over the cube: a tile past its item's end has nothing to do.
    if tile_start >= item_end {
        terminate!();
    }
    let mut tile_end = tile_start + tokens_per_cube;
    if tile_end > item_end {
        tile_end = item_end;
    }
    let prefix_start = u32::cast_from(item_prefixes[item * 2]) as usize;
    let prefix_len = u32::cast_from(item_prefixes[item * 2 + 1]) as usize;
    let prefix_tokens = prefix_keys.shape(1);
    let kv_heads = keys.shape(1);
    let q_heads = kv_heads * group;

    let unit = UNIT_POS_X as usize;
    let token = tile_start + unit / group;
    let q_head = kv_head * group + unit % group;
    let active = token < tile_end;
    // Own keys this row may see: the item's tokens up to itself.
    let position = token - item_start;

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
    // The cube's last row sees `tile_end - item_start` own keys; later tiles are never loaded.
    let own_len = tile_end - item_start;
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
                let source = ((item_start + key) * kv_heads + kv_head) * head_dim + e;
                tile_keys[index] = f32::cast_from(keys[source]);
                tile_values[index] = f32::cast_from(values[source]);
            }
            index += CUBE_DIM_X as usize;
        }
        sync_cube();

        if active {
            let mut visible = count;
            if !in_prefix {
                visible = 0;
                if position >= first {
                    visible = position - first + 1;
                    if visible > count {
                        visible = count;
                    }
                }
            }
            for j in 0..visible {
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
