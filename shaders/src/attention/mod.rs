//! Multi-item attention: every item token attends to its own request's prefix (the query) and,
//! causally, to its own item — never to another item.
//!
//! Tokens are packed (no padding), items given by CSR offsets. The host cuts the tokens into
//! tiles of consecutive items that share a prefix (a long item is split over several tiles);
//! one cube takes one tile and one KV head, so its rows are the tile's tokens × the KV head's
//! query heads (GQA packing: every staged key serves the whole group). The cube walks the key
//! tiles its rows may see — the shared prefix once for all of them, then the tile's own items
//! up to its last token — staging each in shared memory. Keys of items outside the tile, and
//! own keys after it, are never loaded: masked tiles cost nothing.
//!
//! Three kernels walk the tiles that way ([`AttentionKernel`]): `rows`, one row per unit on
//! CUDA cores; `tiled`, which multiplies tiles of query rows and keys ([`TileShape`]) as
//! matrices and runs the softmax through shared memory; and `flash`, the same tiles with
//! FlashAttention-2's softmax in registers. Both tile kernels multiply on tensor cores on CUDA
//! (`mma_tile`) and in plain registers elsewhere (`register_tile`), where their tiling, masks
//! and online softmax are tested.

use std::sync::atomic::{AtomicUsize, Ordering};

use burn_backend::{DType, Shape, TensorMetadata};
use burn_cubecl::cubecl::ir::{features::MmaConfig, StorageType};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use crate::grid::cubes;
use crate::vectors::vector_width;

mod flash;
mod merge;
mod mma_tile;
mod register_tile;
mod rows;
mod tiled;
mod walk;

pub use flash::RESCALE_SLACK;
pub use mma_tile::{fragment_loads, MMA_SHAPE};

/// Below any real score, and finite: WGSL cannot spell −∞.
const NO_SCORE: f32 = -1.0e30;

/// Which kernel runs multi-item attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AttentionKernel {
    /// One query row per unit on CUDA cores, every backend.
    #[default]
    Rows,
    /// Tiles of query rows against steps of keys, multiplied as matrices: `mma.sync` m16n8k16
    /// on CUDA in bf16/f16 (f32 accumulators), a register tile elsewhere. Falls back to
    /// [`Self::Rows`] where a tile cannot hold the shape (a GQA group over the tile's rows, an
    /// odd head size, more shared memory than the device has).
    Tiled(TileShape),
    /// The tiled kernel's tiles with the scores, softmax and weights kept in registers
    /// (FlashAttention-2's loop): no score tile in shared memory, and with two stages the next
    /// key step read while this one is computed, one `sync_cube` a step where the tiled kernel
    /// has four. Tensor cores as for [`Self::Tiled`]; one stage where two don't fit the device's
    /// shared memory; the row kernel where a tile cannot hold the shape (a head size not a
    /// multiple of 8 too).
    Flash(TileShape),
}

pub use tally_core::{FragmentLoads, KvStaging, PrefixSplits, TilePacking, TileShape};
use tally_core::{prefix_parts, PrefixWalk};

/// Whether a cube of `shape` fits the shared memory of `client`'s device at `head_dim` in `dtype`.
pub fn tile_fits<R: CubeRuntime>(shape: TileShape, client: &ComputeClient<R>, head_dim: usize, dtype: DType) -> bool {
    shape.shared_memory_bytes(head_dim, dtype.size()) <= client.properties().hardware.max_shared_memory_size
}

/// Which loop a tile kernel call runs: the tiled kernel's or the flash kernel's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TileLoop {
    SharedSoftmax,
    Flash,
}

/// How one tile kernel call multiplies its tiles, picked per call from the device and dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TileMath {
    Register,
    Mma,
}

impl AttentionKernel {
    /// Rows of one cube: tokens per tile × group.
    fn rows_per_cube(self) -> usize {
        match self {
            AttentionKernel::Rows => rows::ROWS_PER_CUBE,
            AttentionKernel::Tiled(shape) | AttentionKernel::Flash(shape) => shape.rows,
        }
    }

    /// This kernel, or the row kernel where a tile can't hold `group` query heads.
    fn for_group(self, group: usize) -> Self {
        match self {
            AttentionKernel::Tiled(shape) | AttentionKernel::Flash(shape) if group > shape.rows => AttentionKernel::Rows,
            kernel => kernel,
        }
    }
}

/// Whether `client` multiplies `dtype` tiles on tensor cores (`mma.sync` m16n8k16, f32
/// accumulators): CUDA on sm_80+, in bf16 or f16.
pub fn tensor_core_tiles<R: CubeRuntime>(client: &ComputeClient<R>, dtype: DType) -> bool {
    if !matches!(dtype, DType::BF16 | DType::F16) {
        return false;
    }
    let (m, n, k) = MMA_SHAPE;
    let operand = StorageType::from(dtype);
    let config = MmaConfig { a_type: operand, b_type: operand, cd_type: StorageType::from(DType::F32), m, n, k };
    client.features().matmul.mma.contains(&config)
}

/// Where one pass's items sit, as the kernel reads it: the tiles (runs of consecutive items that
/// share a prefix, cut to one cube's rows) and every token's item start, on the device. Built
/// once per pass and read by every layer.
pub struct AttentionTiles<R: CubeRuntime> {
    tiles: CubeTensor<R>,
    item_starts: CubeTensor<R>,
    tile_count: usize,
    tokens_per_tile: usize,
    tokens: usize,
    /// The end of the furthest prefix an item reads: the prefix K/V must hold this many tokens.
    prefix_tokens: usize,
    /// The longest prefix a tile walks, and the most own keys: a split walk's longest cube.
    longest_prefix: usize,
    most_own_keys: usize,
    /// The flash kernel's log-sum-exp output where its walk is whole (one unused float).
    unused_lse: CubeTensor<R>,
    /// Parts of the last flash launch's walk (0 before one), for [`Self::launched`] to say what
    /// `auto` planned.
    last_parts: AtomicUsize,
    group: usize,
    kernel: AttentionKernel,
}

impl<R: CubeRuntime> AttentionTiles<R> {
    /// - `item_offsets`: item `i` owns tokens `item_offsets[i]..item_offsets[i + 1]`.
    /// - `item_prefixes`: (first token, length) of item `i`'s prefix in the prefix K/V the
    ///   attention calls will read; items that share a prefix are adjacent.
    /// - `group`: query heads per KV head.
    /// - `kernel`: the kernel the tiles are cut for.
    pub fn new(client: &ComputeClient<R>, device: &R::Device, item_offsets: &[usize], item_prefixes: &[(usize, usize)], group: usize, kernel: AttentionKernel) -> Self {
        assert_eq!(item_prefixes.len() + 1, item_offsets.len(), "one prefix per item");
        let kernel = kernel.for_group(group);
        let tokens_per_tile = (kernel.rows_per_cube() / group).max(1);
        let packing = match kernel {
            AttentionKernel::Tiled(shape) | AttentionKernel::Flash(shape) => shape.packing,
            AttentionKernel::Rows => TilePacking::WholeItems,
        };
        let (tiles, item_starts) = tiles(item_offsets, item_prefixes, tokens_per_tile, packing);
        let tile_count = tiles.len() / 4;
        let longest_prefix = tiles.chunks(4).map(|tile| tile[3] as usize).max().unwrap_or(0);
        let most_own_keys = tiles.chunks(4).map(|tile| (tile[1] - item_starts[tile[0] as usize]) as usize).max().unwrap_or(0);
        let upload = |mut values: Vec<u32>| {
            // A buffer can't be empty (a pass without tokens launches nothing, but still plans).
            if values.is_empty() {
                values.push(0);
            }
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            CubeTensor::new_contiguous(client.clone(), device.clone(), Shape::new([values.len()]), client.create_from_slice(&bytes), DType::U32)
        };
        let prefix_tokens = item_prefixes.iter().map(|&(start, len)| start + len).max().unwrap_or(0);
        let tokens = item_offsets.last().copied().unwrap_or(0);
        let unused_lse = empty_device_contiguous_dtype(client.clone(), device.clone(), Shape::new([1]), DType::F32);
        AttentionTiles { tiles: upload(tiles), item_starts: upload(item_starts), tile_count, tokens_per_tile, tokens, prefix_tokens, longest_prefix, most_own_keys, unused_lse, last_parts: AtomicUsize::new(0), group, kernel }
    }

    /// Parts the flash kernel of `shape` cuts each tile's prefix walk into at `kv_heads` KV
    /// heads of `head_dim` in `dtype` ([`tally_core::prefix_parts`]).
    fn prefix_parts(&self, client: &ComputeClient<R>, shape: TileShape, kv_heads: usize, head_dim: usize, dtype: DType) -> usize {
        let walk = PrefixWalk {
            cubes: self.tile_count * kv_heads,
            slots: concurrent_flash_cubes(client, shape, head_dim, dtype),
            prefix_steps: self.longest_prefix.div_ceil(shape.keys),
            own_steps: self.most_own_keys.div_ceil(shape.keys),
            output_bytes: self.tokens * kv_heads * self.group * head_dim * dtype.size(),
        };
        let parts = prefix_parts(shape.splits, walk);
        self.last_parts.store(parts, Ordering::Relaxed);
        parts
    }

    /// The tile kernel a call at `head_dim` in `dtype` runs: where its tile fits, with tensor
    /// cores where they take it, 16-bit only on tensor cores; `None`: the row kernel, which
    /// takes any tile it is given, whatever it was cut for. The tiled kernel stages one key step
    /// at a time; the flash kernel keeps fewer in flight where its stages don't fit (then
    /// takes 16 rows a warp), and copies with `cp.async` only with two or three stages on
    /// tensor cores (CUDA), three always so, with one barrier a step: elsewhere its steps go
    /// through registers.
    fn tile_kernel(&self, client: &ComputeClient<R>, head_dim: usize, dtype: DType) -> Option<(TileLoop, TileMath, TileShape)> {
        let math = if head_dim.is_multiple_of(16) && tensor_core_tiles(client, dtype) { TileMath::Mma } else { TileMath::Register };
        // The tile kernels read K/V as 32-bit words and take them back as floats of `dtype`.
        // CUDA's code reinterprets any equal sizes; on wgpu a `vec2<u32>` taken back as
        // `vec4<f16>` left the f16 kernels' output unwritten (lavapipe), so 16-bit K/V off the
        // tensor cores take the row kernel.
        if dtype.size() != 4 && math == TileMath::Register {
            return None;
        }
        let fits = |shape: TileShape| tile_fits(shape, client, head_dim, dtype);
        let one_stage = |shape: TileShape| TileShape { stages: 1, ..shape };
        match self.kernel {
            AttentionKernel::Tiled(shape) if head_dim.is_multiple_of(2) && fits(one_stage(shape)) => Some((TileLoop::SharedSoftmax, math, one_stage(shape))),
            AttentionKernel::Flash(shape) if head_dim.is_multiple_of(8) => {
                // 32 rows a warp where they fit; the query staged beside them needs room too.
                let sixteen_rows = |shape: TileShape| TileShape { warp_rows: 16, ..shape };
                let fewer_stages = |shape: TileShape| (1..=shape.stages).rev().map(move |stages| TileShape { stages, ..shape });
                fewer_stages(shape).chain(fewer_stages(sixteen_rows(shape))).find(|&shape| fits(shape)).map(|shape| {
                    // Three stages on tensor cores copy by cp.async with one barrier: read
                    // ahead into registers, a step's share would sit beside two steps' scores.
                    let staging = match (shape.stages, math, shape.staging) {
                        (1, ..) | (_, TileMath::Register, _) => KvStaging::Registers,
                        (3, TileMath::Mma, _) => KvStaging::CopyAsync,
                        (_, _, staging) => staging,
                    };
                    (TileLoop::Flash, math, shape.with_staging(staging))
                })
            }
            _ => None,
        }
    }

    /// What a call at `head_dim` in `dtype` runs, for benchmarks and tests to report: `rows`,
    /// or `tiled`/`flash` with `registers`/`tensor cores`, on tensor cores how their fragments
    /// load (`ldmatrix`/`elements`), and the flash kernel's stages (`, cp-async` where it
    /// copies so; `, 32 rows a warp` where its warps take two row blocks), `, filled tiles`
    /// where items are cut at tile edges, and the flash kernel's prefix walk where it is cut
    /// (`, prefix in N parts`; for `auto`, the parts of the last launch, or `, prefix split
    /// auto` before one). It assumes K/V that
    /// start whole 32-bit words into their buffers, as every 16-bit K/V does that the tile
    /// kernels take (tensor cores need `head_dim` a multiple of 16); a call whose K/V do not
    /// runs the row kernel ([`staging_width`]).
    pub fn launched(&self, head_dim: usize, dtype: DType) -> String {
        let Some((tile_loop, math, shape)) = self.tile_kernel(&self.tiles.client, head_dim, dtype) else {
            return "rows".into();
        };
        let mut launched = String::from(match tile_loop {
            TileLoop::SharedSoftmax => "tiled",
            TileLoop::Flash => "flash",
        });
        match math {
            TileMath::Register => launched.push_str(", registers"),
            TileMath::Mma => launched.push_str(&format!(", tensor cores, {}", shape.loads.name())),
        }
        if tile_loop == TileLoop::Flash {
            launched.push_str(&format!(", {}", shape.stages_text()));
            if shape.staging.copies_async() {
                launched.push_str(&format!(", {}", shape.staging.name()));
            }
            if shape.warp_rows != 16 {
                launched.push_str(&format!(", {} rows a warp", shape.warp_rows));
            }
        }
        if shape.packing != TilePacking::WholeItems {
            launched.push_str(&format!(", {} tiles", shape.packing.name()));
        }
        if tile_loop == TileLoop::Flash && shape.splits != PrefixSplits::Whole {
            match (shape.splits, self.last_parts.load(Ordering::Relaxed)) {
                (PrefixSplits::Auto, parts) if parts > 0 => launched.push_str(&format!(", prefix in {parts} part{} (auto, last launch)", if parts == 1 { "" } else { "s" })),
                (splits, _) => launched.push_str(&format!(", {splits}")),
            }
        }
        launched
    }
}

/// Flash cubes of `shape` the device runs at once, where it says how many SMs it has (CUDA):
/// SMs × cubes an SM, as many as the SM's shared memory holds (the device's most a cube, plus
/// the 1 KiB CUDA keeps a cube), its 64 Ki registers (a unit's count is ptxas's, unknown before
/// the kernel compiles: 256 at 32 rows a warp or three stages, 176 otherwise, by the sm_90a
/// report's 255 and 164–232) and its 2,048 units. On the H200 at CUDA's default tile: 132 × 2.
fn concurrent_flash_cubes<R: CubeRuntime>(client: &ComputeClient<R>, shape: TileShape, head_dim: usize, dtype: DType) -> Option<usize> {
    const RESERVED_SHARED: usize = 1024;
    let hardware = &client.properties().hardware;
    let sms = hardware.num_streaming_multiprocessors? as usize;
    let units = flash::units_per_cube(shape);
    let by_shared = (hardware.max_shared_memory_size + RESERVED_SHARED) / (shape.shared_memory_bytes(head_dim, dtype.size()) + RESERVED_SHARED);
    let unit_registers = if shape.warp_rows > 16 || shape.stages == 3 { 256 } else { 176 };
    let by_registers = 65_536 / (unit_registers * units);
    Some(sms * by_shared.min(by_registers).min(2_048 / units).max(1))
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

    /// Writes every element of `output` (`[tokens, q_heads, head_dim]`, contiguous, starting a
    /// pair of elements into its buffer: the flash kernel stores column pairs).
    pub fn run_into(self, output: &CubeTensor<R>) {
        let [tokens, q_heads, head_dim] = self.queries.shape().dims::<3>();
        let kv_heads = self.keys.shape()[1];
        let tiles = self.tiles;
        assert_eq!(q_heads, kv_heads * tiles.group, "query heads must be {} per KV head, as planned", tiles.group);
        assert_eq!(tiles.tokens, tokens, "the tiles must cover the tokens");
        // The kernels read what the tiles say without bounds checks: hold the tensors to them.
        assert_eq!(self.keys.shape().dims::<3>(), [tokens, kv_heads, head_dim], "one key per token");
        assert_eq!(self.values.shape(), self.keys.shape(), "one value per key");
        let prefix_shape = self.prefix_keys.shape().dims::<3>();
        assert!(prefix_shape[0] == kv_heads && prefix_shape[2] == head_dim && prefix_shape[1] >= tiles.prefix_tokens, "the prefix K/V must hold every item's prefix");
        assert_eq!(self.prefix_values.shape(), self.prefix_keys.shape(), "one prefix value per key");
        assert!(output.is_contiguous(), "the attention output must be contiguous");
        assert!(output.handle.offset_start.unwrap_or(0).is_multiple_of(2 * output.dtype.size() as u64), "the attention output must start a pair of elements in");
        if tokens == 0 {
            return;
        }
        let client = self.queries.client.clone();
        let dtype = self.queries.dtype;
        let queries = into_contiguous(self.queries);
        // The items' keys and values are read a token row at a time, at each tensor's token
        // stride: the values as the QKV projection left them (a view of its fused output), not
        // copied out first (1.8 ms of an S1 request on the H200, 2026-11-27).
        let (keys, values) = (token_rows(self.keys), token_rows(self.values));
        let (prefix_keys, prefix_values) = (into_contiguous(self.prefix_keys), into_contiguous(self.prefix_values));
        // The tile kernels stage K/V a vector at a time, read as 32-bit words; the flash kernel
        // with cp.async copies the query rows in vectors of the same width.
        let strides = [keys.meta.strides()[0], values.meta.strides()[0]];
        let staging = staging_width(&client, head_dim, dtype, &strides, [&queries, &keys, &values, &prefix_keys, &prefix_values]);
        let tiled = staging.and_then(|_| tiles.tile_kernel(&client, head_dim, dtype));
        let (width, words) = staging.map_or((1, 1), |width| (width, width * dtype.size() / 4));
        // A flash walk cut into parts writes each part's rows and their log-sum-exps, merged
        // into `output` after it; whole, it writes `output`.
        let parts = match tiled {
            Some((TileLoop::Flash, _, shape)) => tiles.prefix_parts(&client, shape, kv_heads, head_dim, dtype),
            _ => 1,
        };
        let split = parts > 1;
        let (target, lse) = if split {
            let part_outputs = empty_device_contiguous_dtype(client.clone(), queries.device.clone(), Shape::new([parts * tokens, q_heads, head_dim]), dtype);
            (part_outputs, empty_device_contiguous_dtype(client.clone(), queries.device.clone(), Shape::new([parts * tokens * q_heads]), DType::F32))
        } else {
            (output.clone(), tiles.unused_lse.clone())
        };
        let grid = cubes(tiles.tile_count * parts, kv_heads);
        let scale = (head_dim as f32).powf(-0.5);
        // Every kernel takes the same tensors; the tile kernels also the K/V vectors' width in
        // elements and in words, and their tile's comptime sizes. Launched without CubeCL's
        // bounds checks, which clamp and select every global and shared access: in the flash
        // kernel's loop they made each K/V vector read for the next step wait for its data where
        // it was issued, so the read-ahead hid nothing (sm_90a SASS, NOTES "The flash kernel's
        // instructions").
        macro_rules! launch {
            ($launch:expr, $units:expr, [$($vector_size:expr),*] $(, $tile_size:expr)*) => {
                // SAFETY: every global and shared access of the attention kernels is inside its
                // buffer by the kernel's own guards: a cube past the last tile stops, rows
                // without a token (`NO_ROW`, `active`) neither read a query nor write, K/V reads
                // stop at the step's key count (`walk_step`: within the prefix length or the
                // tile's own tokens, both held to the tensors by the asserts above), query rows
                // are copied whole at a width `staging_width` holds them aligned to,
                // staged indices stay below the shared tiles' comptime sizes, and a part of a
                // split walk writes its rows `part` parts into `target` and `lse`, both made
                // for `parts` (`read_tile_part` keeps a part's keys inside its tile's prefix). The kernel
                // tests check every route at the edges of each tile size with NaN-poisoned
                // outputs.
                unsafe { $launch(
                    &client,
                    grid,
                    CubeDim::new_1d($units as u32),
                    $($vector_size,)*
                    queries.into_tensor_arg(),
                    keys.into_tensor_arg(),
                    values.into_tensor_arg(),
                    prefix_keys.into_tensor_arg(),
                    prefix_values.into_tensor_arg(),
                    tiles.tiles.clone().into_tensor_arg(),
                    tiles.item_starts.clone().into_tensor_arg(),
                    target.clone().into_tensor_arg(),
                    scale,
                    head_dim,
                    tiles.group,
                    $($tile_size,)*
                    dtype.into(),
                ) }
            };
        }
        match tiled {
            Some((TileLoop::SharedSoftmax, TileMath::Mma, shape)) => match shape.loads {
                FragmentLoads::Ldmatrix => launch!(tiled::tiled_attention_kernel::launch_unchecked::<mma_tile::MmaTile<mma_tile::Ldmatrix>, R>, tiled::units_per_cube(shape), [width, words], shape.rows, shape.keys),
                FragmentLoads::Elements => launch!(tiled::tiled_attention_kernel::launch_unchecked::<mma_tile::MmaTile<mma_tile::ElementLoads>, R>, tiled::units_per_cube(shape), [width, words], shape.rows, shape.keys),
            },
            Some((TileLoop::SharedSoftmax, TileMath::Register, shape)) => launch!(tiled::tiled_attention_kernel::launch_unchecked::<register_tile::RegisterTile, R>, tiled::units_per_cube(shape), [width, words], shape.rows, shape.keys),
            Some((TileLoop::Flash, TileMath::Mma, shape)) => match shape.loads {
                FragmentLoads::Ldmatrix => launch!(flash::flash_attention_kernel::launch_unchecked::<mma_tile::MmaFragments<mma_tile::Ldmatrix>, R>, flash::units_per_cube(shape), [width, words], shape.rows, shape.keys, shape.stages, shape.staging, shape.warp_rows / 16, split, lse.clone().into_tensor_arg(), parts as u32),
                FragmentLoads::Elements => launch!(flash::flash_attention_kernel::launch_unchecked::<mma_tile::MmaFragments<mma_tile::ElementLoads>, R>, flash::units_per_cube(shape), [width, words], shape.rows, shape.keys, shape.stages, shape.staging, shape.warp_rows / 16, split, lse.clone().into_tensor_arg(), parts as u32),
            },
            Some((TileLoop::Flash, TileMath::Register, shape)) => launch!(flash::flash_attention_kernel::launch_unchecked::<register_tile::RegisterFragments, R>, flash::units_per_cube(shape), [width, words], shape.rows, shape.keys, shape.stages, KvStaging::Registers, shape.warp_rows / 16, split, lse.clone().into_tensor_arg(), parts as u32),
            None => launch!(rows::row_attention_kernel::launch_unchecked::<R>, tiles.tokens_per_tile * tiles.group, []),
        }
        if split {
            merge::merge_parts(&target, &lse, parts, output);
        }
    }
}

/// `[tokens, kv_heads, head_dim]` with each token's heads and dimensions contiguous, the tokens
/// any stride apart (how the kernels read the items' keys and values): the tensor itself where
/// it is so, else a contiguous copy.
fn token_rows<R: CubeRuntime>(tensor: CubeTensor<R>) -> CubeTensor<R> {
    let (shape, strides) = (tensor.meta.shape().dims::<3>(), tensor.meta.strides());
    let rows_within = strides[2] == 1 && strides[1] == shape[2] && strides[0] >= shape[1] * shape[2];
    if rows_within { tensor } else { into_contiguous(tensor) }
}

/// Elements per vector the tile kernels stage K/V with (and the flash kernel's `cp.async` the
/// query rows): the widest the device loads fastest (16 bytes on CUDA, 4 elements in WGSL)
/// that divides `head_dim` and the items' K/V token `strides` and every tensor's offset in its
/// buffer (the queries' and the K/V's; a query row starts a whole number of heads in), in whole
/// 32-bit words (the kernels read K/V as words). `None` where no width is whole words (16-bit
/// K/V at an odd offset or stride): the row kernel takes those.
fn staging_width<R: CubeRuntime>(client: &ComputeClient<R>, head_dim: usize, dtype: DType, strides: &[usize], tensors: [&CubeTensor<R>; 5]) -> Option<usize> {
    // The widest vector dividing a head, the strides, and aligned; a narrower one would be
    // fewer bytes still.
    let runs: Vec<usize> = std::iter::once(head_dim).chain(strides.iter().copied()).collect();
    let width = vector_width(client, dtype.size(), &runs, &tensors);
    (width * dtype.size()).is_multiple_of(4).then_some(width)
}

/// Cuts the items into tiles of at most `tokens_per_tile` tokens, never two prefixes in one:
/// whole consecutive items while they fit and pieces of an item longer than a tile
/// ([`TilePacking::WholeItems`]), or every tile full, items cut at its edges
/// ([`TilePacking::Filled`]). Returns the tiles as
/// `[first token, end token, prefix start, prefix length]` each, and every token's item start.
fn tiles(item_offsets: &[usize], item_prefixes: &[(usize, usize)], tokens_per_tile: usize, packing: TilePacking) -> (Vec<u32>, Vec<u32>) {
    let mut tiles: Vec<[usize; 4]> = Vec::new();
    let mut item_starts = Vec::with_capacity(item_offsets.last().copied().unwrap_or(0));
    for (item, &(prefix_start, prefix_len)) in item_prefixes.iter().enumerate() {
        let (start, end) = (item_offsets[item], item_offsets[item + 1]);
        item_starts.extend(std::iter::repeat_n(start as u32, end - start));
        // Where the item's own tiles begin: at its start, or past the part the open tile took.
        let mut first = start;
        if let Some(tile) = tiles.last_mut().filter(|tile| tile[2..] == [prefix_start, prefix_len] && tile[1] == start) {
            if end - tile[0] <= tokens_per_tile {
                // Joins the open tile whole: same prefix, and room for all of it.
                tile[1] = end;
                continue;
            }
            if packing == TilePacking::Filled {
                // Fills the open tile and goes on in the next.
                first = tile[0] + tokens_per_tile;
                tile[1] = first;
            }
        }
        tiles.extend((first..end).step_by(tokens_per_tile).map(|first| [first, (first + tokens_per_tile).min(end), prefix_start, prefix_len]));
    }
    (tiles.into_iter().flatten().map(|v| v as u32).collect(), item_starts)
}

#[cfg(test)]
mod tests {
    use super::{tiles, PrefixSplits, TilePacking, TileShape};

    #[test]
    fn tiles_join_small_items_of_one_prefix_and_split_long_ones() {
        // Items of 3, 2 and 7 tokens on prefix (0, 10), then 1 token on prefix (10, 4); 5 tokens per tile.
        let (tiles, starts) = tiles(&[0, 3, 5, 12, 13], &[(0, 10), (0, 10), (0, 10), (10, 4)], 5, TilePacking::WholeItems);
        let tiles: Vec<&[u32]> = tiles.chunks(4).collect();
        assert_eq!(tiles, [&[0, 5, 0, 10][..], &[5, 10, 0, 10], &[10, 12, 0, 10], &[12, 13, 10, 4]]);
        assert_eq!(starts, [0, 0, 0, 3, 3, 5, 5, 5, 5, 5, 5, 5, 12]);
    }

    #[test]
    fn tile_shapes_are_those_built() {
        assert_eq!(TileShape::new(64, 16), Some(TileShape::default()));
        assert_eq!(TileShape::new(128, 64), Some(TileShape { rows: 128, keys: 64, stages: 2, loads: super::FragmentLoads::Ldmatrix, staging: super::KvStaging::Registers, warp_rows: 16, packing: TilePacking::WholeItems, splits: PrefixSplits::Whole }));
        for (rows, keys) in [(48, 16), (64, 8), (256, 16), (0, 0)] {
            assert_eq!(TileShape::new(rows, keys), None, "{rows}x{keys}");
        }
    }

    #[test]
    fn tiles_never_mix_prefixes() {
        for packing in [TilePacking::WholeItems, TilePacking::Filled] {
            let (tiles, _) = tiles(&[0, 1, 2], &[(0, 3), (3, 3)], 8, packing);
            assert_eq!(tiles, [0, 1, 0, 3, 1, 2, 3, 3], "{packing:?}");
        }
    }

    #[test]
    fn filled_tiles_cut_items_at_tile_edges() {
        // Items of 3, 4, 2 and 9 tokens on one prefix, then 2 on another; 5 tokens a tile.
        let offsets = [0, 3, 7, 9, 18, 20];
        let prefixes = [(0, 6), (0, 6), (0, 6), (0, 6), (6, 1)];
        let cut = |packing| tiles(&offsets, &prefixes, 5, packing).0.chunks(4).map(|t| [t[0], t[1]]).collect::<Vec<_>>();
        // Whole items: the 3 alone (the 4 does not fit beside it), the 4 alone (nor the 2), the
        // 2 alone (nor the 9), then the 9 in pieces of 5 and 4.
        assert_eq!(cut(TilePacking::WholeItems), [[0, 3], [3, 7], [7, 9], [9, 14], [14, 18], [18, 20]]);
        // Filled: every tile of the first prefix full but its last; the other prefix apart.
        assert_eq!(cut(TilePacking::Filled), [[0, 5], [5, 10], [10, 15], [15, 18], [18, 20]]);
        // An item that exactly fills the open tile joins it whole either way.
        assert_eq!(tiles(&[0, 2, 5], &[(0, 1), (0, 1)], 5, TilePacking::Filled).0, [0, 5, 0, 1]);
    }
}
