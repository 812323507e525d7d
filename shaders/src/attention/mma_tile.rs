//! The tile kernels' multiplies on tensor cores: `mma.sync` m16n8k16 with bf16/f16 operands
//! and f32 accumulators (CubeCL's manual MMA, CUDA sm_80+). A plane's 16 rows are the `m`; the
//! scores take `keys / 8` `n`-blocks of 8 keys and `head_dim / 16` `k`-steps, the output
//! `head_dim / 8` `n`-blocks and `keys / 16` `k`-steps.
//!
//! The query fragments are loaded once, packed in the operand type, and stay in registers with
//! the output accumulators (f32) for the whole key loop. Key and value fragments come from the
//! staged tiles in shared memory as [`FragmentLoad`] reads them: `ldmatrix` (four 8 × 8
//! matrices — two fragments — per instruction, `.trans` for the values) or one read per element
//! where CubeCL says it sits (`position_of_nth`). The flash kernel's [`MmaFragments`] also relies
//! on PTX's layout (an accumulator pair of blocks is an `A` fragment; a row's elements lie in
//! one quad of lanes), which `mma_fragment_layout_is_ptxs` pins; `ldmatrix` gives each lane the
//! elements of PTX's `B` layout by construction. What these fragments read is staged by the
//! kernels (`walk`), on CUDA also by `cp.async` (`--kv-staging cp-async`).

use std::marker::PhantomData;

use burn_backend::{Shape, TensorMetadata};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::cmma::MmaDefinition;
use burn_cubecl::cubecl::ir::MatrixIdent;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use super::flash::{flash_plane_and_lane, FragmentMath, BLOCK_ELEMENTS};
use super::tiled::{plane_and_lane, QueryPairs, TileMath, KEY_BLOCK, NO_ROW, ROWS_PER_PLANE};
use super::walk::{shared_index, staged_row};
use super::FragmentLoads;

/// `(m, n, k)` of one multiply.
pub const MMA_SHAPE: (u32, u32, u32) = (16, 8, 16);

/// Elements a lane holds contiguously in one register: 32 bits of bf16/f16 operands, two f32
/// accumulators (`contiguous_elements_cuda` in cubecl-cpp).
type Pair = Const<2>;
const PAIR: usize = 2;
/// Registers of one `B` fragment (16 × 8): two pairs.
const B_REGISTERS: usize = 2;

/// The tiled kernel's tile math on tensor cores, its key and value fragments read by `L`.
pub(super) struct MmaTile<L: FragmentLoad> {
    _loads: PhantomData<L>,
}

#[cube]
fn definition<F: Float>() -> MmaDefinition<F, F, f32> {
    MmaDefinition::<F, F, f32>::new(16usize, 8usize, 16usize)
}

/// `fragments` accumulator fragments of zeros, one after the other.
#[cube]
fn zeros<F: Float>(def: MmaDefinition<F, F, f32>, #[comptime] fragments: usize) -> Array<Vector<f32, Pair>> {
    let per_fragment = def.vectors_per_lane(MatrixIdent::Accumulator);
    let count = comptime![fragments * per_fragment];
    let mut zeros = Array::<Vector<f32, Pair>>::new(count);
    #[unroll]
    for i in 0..count {
        zeros[i] = Vector::new(0.0);
    }
    zeros
}

/// A fragment of `count` registers from this lane's own f32 values `values[first..]`, in
/// fragment order, as pairs of `E` (an `A` fragment of weights; an accumulator).
#[cube]
fn pairs_of<E: Float>(values: &Array<f32>, first: usize, #[comptime] count: usize) -> Array<Vector<E, Pair>> {
    let mut fragment = Array::<Vector<E, Pair>>::new(count);
    #[unroll]
    for i in 0..count {
        let mut pair = Vector::empty();
        #[unroll]
        for n in 0..PAIR {
            pair[n] = E::cast_from(values[first + i * PAIR + n]);
        }
        fragment[i] = pair;
    }
    fragment
}

/// Writes a fragment of `count` f32 registers back into this lane's values from `first`, in
/// fragment order: the inverse of [`pairs_of`].
#[cube]
fn store_pairs(fragment: &Array<Vector<f32, Pair>>, values: &mut Array<f32>, first: usize, #[comptime] count: usize) {
    #[unroll]
    for i in 0..count {
        #[unroll]
        for n in 0..PAIR {
            values[first + i * PAIR + n] = fragment[i][n];
        }
    }
}

/// The `count` registers of `held` from `first`: one fragment of several held together (the
/// query's `k`-steps, two `B` fragments loaded by one `ldmatrix.x4`).
#[cube]
fn fragment_at<F: Float>(held: &Array<Vector<F, Pair>>, first: usize, #[comptime] count: usize) -> Array<Vector<F, Pair>> {
    let mut fragment = Array::<Vector<F, Pair>>::new(count);
    #[unroll]
    for i in 0..count {
        fragment[i] = held[first + i];
    }
    fragment
}

/// Writes the `count` registers of `fragment` into `held` from `first`: the inverse of
/// [`fragment_at`].
#[cube]
fn put_fragment<E: Scalar>(held: &mut Array<Vector<E, Pair>>, first: usize, fragment: &Array<Vector<E, Pair>>, #[comptime] count: usize) {
    #[unroll]
    for i in 0..count {
        held[first + i] = fragment[i];
    }
}

/// An A fragment (16 rows × 16) of `values`: element (row, column) at `first + row · row_stride +
/// column`.
#[cube]
fn a_from_shared<F: Float, E: Float>(def: MmaDefinition<F, F, f32>, lane: u32, values: &SharedMemory<E>, first: usize, #[comptime] row_stride: usize) -> Array<Vector<F, Pair>> {
    let count = def.vectors_per_lane(MatrixIdent::A);
    let mut fragment = Array::<Vector<F, Pair>>::new(count);
    #[unroll]
    for i in 0..count {
        let mut pair = Vector::empty();
        #[unroll]
        for n in 0..PAIR {
            let (row, column) = def.position_of_nth(lane, (i * PAIR + n) as u32, MatrixIdent::A);
            pair[n] = F::cast_from(values[first + row as usize * row_stride + column as usize]);
        }
        fragment[i] = pair;
    }
    fragment
}

/// A B fragment (16 × 8) of `staged`: element (k, n) at `first + k · k_stride + n · n_stride`.
#[cube]
fn b_from_shared<F: Float>(def: MmaDefinition<F, F, f32>, lane: u32, staged: &SharedMemory<F>, first: usize, #[comptime] k_stride: usize, #[comptime] n_stride: usize) -> Array<Vector<F, Pair>> {
    let count = def.vectors_per_lane(MatrixIdent::B);
    let mut fragment = Array::<Vector<F, Pair>>::new(count);
    #[unroll]
    for i in 0..count {
        let mut pair = Vector::empty();
        #[unroll]
        for n in 0..PAIR {
            let (k, column) = def.position_of_nth(lane, (i * PAIR + n) as u32, MatrixIdent::B);
            pair[n] = staged[first + k as usize * k_stride + column as usize * n_stride];
        }
        fragment[i] = pair;
    }
    fragment
}

/// How the tensor-core tiles read their key and value `B` fragments from the staged tiles
/// (`[keys, head_dim]`, rows [`staged_row`] apart). Each call gives two fragments, registers
/// `0..2` and `2..4`; the first fragment's first key row starts, at its first dimension, at
/// element `base + at`: `base` known only as the kernel runs (the buffer of a step, a plane's
/// rows), the same for many calls, `at` known when it compiles.
#[cube]
pub(super) trait FragmentLoad: 'static + Send + Sync {
    /// Keysᵀ at dimensions `first..first + 16` of their rows (the `k`), for the 8 keys from
    /// `first`'s and for the 8 after them (the `n` of each); `first = base + at`.
    fn keys<F: Float>(def: MmaDefinition<F, F, f32>, lane: u32, staged_keys: &SharedMemory<F>, base: usize, #[comptime] at: usize, #[comptime] head_dim: usize) -> Array<Vector<F, Pair>>;

    /// Values of the 16 keys from `first`'s (the `k`), at 8 dimensions from `first`'s and at the
    /// 8 after them (the `n` of each); `first = base + at`.
    fn values<F: Float>(def: MmaDefinition<F, F, f32>, lane: u32, staged_values: &SharedMemory<F>, base: usize, #[comptime] at: usize, #[comptime] head_dim: usize) -> Array<Vector<F, Pair>>;

    /// The `A` fragment of 16 staged query rows from `first`'s (the `m`), at dimensions
    /// `first..first + 16` of each (the `k`): one fragment, four registers; `first = base + at`.
    fn query<F: Float>(def: MmaDefinition<F, F, f32>, lane: u32, staged_query: &SharedMemory<F>, base: usize, #[comptime] at: usize, #[comptime] head_dim: usize) -> Array<Vector<F, Pair>>;
}

/// One `ldmatrix.x4` per two fragments. Lanes `8i .. 8i + 7` give the row addresses of matrix
/// `i` (its row `lane % 8`), and lane `l` receives row `l / 4`, elements `2(l % 4)` and
/// `2(l % 4) + 1` of each: for a key row that is `B = Kᵀ`'s (k = dimensions, n = key) pair as
/// PTX's m16n8k16 `B` layout puts it; with `.trans` on value rows, the (k = keys, n = dimension)
/// pair. Rows start 16-byte aligned: the tiles are, and their rows ([`staged_row`]), the
/// buffers and the 8-element column blocks are multiples of 16 bytes in bf16/f16.
pub(super) struct Ldmatrix;

#[cube]
impl FragmentLoad for Ldmatrix {
    fn keys<F: Float>(def: MmaDefinition<F, F, f32>, lane: u32, staged_keys: &SharedMemory<F>, base: usize, #[comptime] at: usize, #[comptime] head_dim: usize) -> Array<Vector<F, Pair>> {
        // Matrices: (keys 0..8, dims 0..8), (keys 0..8, dims 8..16), then the next 8 keys.
        let matrix = lane as usize / 8;
        let lane_base = shared_index(base + ((matrix / 2) * 8 + lane as usize % 8) * comptime![staged_row(head_dim)] + (matrix % 2) * 8);
        def.load_matrix::<F, Pair>(&staged_keys.slice(lane_base + at, lane_base + at + 8), MatrixIdent::B, 4usize, false)
    }

    fn values<F: Float>(def: MmaDefinition<F, F, f32>, lane: u32, staged_values: &SharedMemory<F>, base: usize, #[comptime] at: usize, #[comptime] head_dim: usize) -> Array<Vector<F, Pair>> {
        // Matrices: (keys 0..8, dims 0..8), (keys 8..16, dims 0..8), then the next 8 dims.
        rows_then_columns_x4::<F>(def, lane, staged_values, base, at, MatrixIdent::B, true, head_dim)
    }

    fn query<F: Float>(def: MmaDefinition<F, F, f32>, lane: u32, staged_query: &SharedMemory<F>, base: usize, #[comptime] at: usize, #[comptime] head_dim: usize) -> Array<Vector<F, Pair>> {
        // Matrices: (rows 0..8, dims 0..8), (rows 8..16, dims 0..8), then the next 8 dims: PTX's
        // `A` registers a0..a3, row g and pair 2t of each.
        rows_then_columns_x4::<F>(def, lane, staged_query, base, at, MatrixIdent::A, false, head_dim)
    }
}

/// One `ldmatrix.x4` of the 16 staged rows from `first`'s × 16 elements from `first`'s: the
/// matrices (rows 0..8, elements 0..8), (rows 8..16, elements 0..8), (rows 0..8, elements
/// 8..16), (rows 8..16, elements 8..16) — the values' two `B` fragments (`.trans`), the query's
/// `A` fragment.
#[cube]
#[allow(clippy::too_many_arguments)]
fn rows_then_columns_x4<F: Float>(def: MmaDefinition<F, F, f32>, lane: u32, staged: &SharedMemory<F>, base: usize, #[comptime] at: usize, #[comptime] ident: MatrixIdent, #[comptime] transpose: bool, #[comptime] head_dim: usize) -> Array<Vector<F, Pair>> {
    let matrix = lane as usize / 8;
    let lane_base = shared_index(base + ((matrix % 2) * 8 + lane as usize % 8) * comptime![staged_row(head_dim)] + (matrix / 2) * 8);
    def.load_matrix::<F, Pair>(&staged.slice(lane_base + at, lane_base + at + 8), ident, 4usize, transpose)
}

/// One shared-memory read per element, where CubeCL's `position_of_nth` puts it.
pub(super) struct ElementLoads;

#[cube]
impl FragmentLoad for ElementLoads {
    fn keys<F: Float>(def: MmaDefinition<F, F, f32>, lane: u32, staged_keys: &SharedMemory<F>, base: usize, #[comptime] at: usize, #[comptime] head_dim: usize) -> Array<Vector<F, Pair>> {
        // B is keysᵀ: element (dimension, key).
        let (first, row) = (base + at, comptime![staged_row(head_dim)]);
        let low = b_from_shared::<F>(def, lane, staged_keys, first, 1usize, row);
        let high = b_from_shared::<F>(def, lane, staged_keys, first + 8 * row, 1usize, row);
        join::<F>(&low, &high, B_REGISTERS)
    }

    fn values<F: Float>(def: MmaDefinition<F, F, f32>, lane: u32, staged_values: &SharedMemory<F>, base: usize, #[comptime] at: usize, #[comptime] head_dim: usize) -> Array<Vector<F, Pair>> {
        // B is the values: element (key, dimension).
        let (first, row) = (base + at, comptime![staged_row(head_dim)]);
        let low = b_from_shared::<F>(def, lane, staged_values, first, row, 1usize);
        let high = b_from_shared::<F>(def, lane, staged_values, first + 8, row, 1usize);
        join::<F>(&low, &high, B_REGISTERS)
    }

    fn query<F: Float>(def: MmaDefinition<F, F, f32>, lane: u32, staged_query: &SharedMemory<F>, base: usize, #[comptime] at: usize, #[comptime] head_dim: usize) -> Array<Vector<F, Pair>> {
        a_from_shared::<F, F>(def, lane, staged_query, base + at, comptime![staged_row(head_dim)])
    }
}

/// Two fragments of `count` registers each as one array (two `B` fragments as `ldmatrix.x4`
/// gives them; two accumulator blocks).
#[cube]
fn join<E: Scalar>(first: &Array<Vector<E, Pair>>, second: &Array<Vector<E, Pair>>, #[comptime] count: usize) -> Array<Vector<E, Pair>> {
    let mut both = Array::<Vector<E, Pair>>::new(comptime![2 * count]);
    #[unroll]
    for i in 0..count {
        both[i] = first[i];
        both[count + i] = second[i];
    }
    both
}

/// The A fragments of the plane's query rows, one per `k`-step of 16 dimensions, packed in `F`.
#[cube]
fn query_fragments<F: Float>(queries: &Tensor<F>, row_offsets: &SharedMemory<u32>, #[comptime] head_dim: usize) -> QueryPairs<F> {
    let def = definition::<F>();
    let (plane_row, lane) = plane_and_lane();
    let per_step = def.vectors_per_lane(MatrixIdent::A);
    let mut query = Array::<Vector<F, Pair>>::new(comptime![head_dim / 16 * per_step]);
    #[unroll]
    for step in 0..comptime![head_dim / 16] {
        #[unroll]
        for i in 0..per_step {
            let mut pair = Vector::empty();
            #[unroll]
            for n in 0..PAIR {
                let (row, dim) = def.position_of_nth(lane as u32, (i * PAIR + n) as u32, MatrixIdent::A);
                let offset = row_offsets[plane_row + row as usize];
                let mut value = F::new(0.0);
                if offset != NO_ROW {
                    value = queries[offset as usize + step * 16 + dim as usize];
                }
                pair[n] = value;
            }
            query[step * per_step + i] = pair;
        }
    }
    query
}

/// `output += a · values` for every block of 8 dimensions of `output` (accumulator fragments in
/// f32, `head_dim / 8` of them per block of 16 rows, `blocks` blocks one after the other), `a`
/// each row block's `A` fragment of weights (one after the other) for the 16 staged values whose
/// rows start at element `base + at`. Each value fragment read serves every row block.
#[cube]
#[allow(clippy::too_many_arguments)]
fn add_times_values<F: Float, L: FragmentLoad>(def: MmaDefinition<F, F, f32>, lane: u32, output: &mut Array<f32>, a: &Array<Vector<F, Pair>>, values: &SharedMemory<F>, base: usize, #[comptime] at: usize, #[comptime] head_dim: usize, #[comptime] blocks: usize) {
    let per_block = def.elems_per_lane(MatrixIdent::Accumulator);
    let c_vectors = def.vectors_per_lane(MatrixIdent::Accumulator);
    let a_vectors = def.vectors_per_lane(MatrixIdent::A);
    #[unroll]
    for dims in 0..comptime![head_dim / 16] {
        let b = L::values::<F>(def, lane, values, base, comptime![at + dims * 16], head_dim);
        #[unroll]
        for block in 0..blocks {
            let weights = fragment_at::<F>(a, block * a_vectors, a_vectors);
            #[unroll]
            for which in 0..2usize {
                let at = block * comptime![head_dim / 8 * per_block] + (2 * dims + which) * per_block;
                let mut product = pairs_of::<f32>(output, at, c_vectors);
                def.execute_inplace(&weights, &fragment_at::<F>(&b, which * B_REGISTERS, B_REGISTERS), &mut product);
                store_pairs(&product, output, at, c_vectors);
            }
        }
    }
}

/// `products += a · keysᵀ` for one `k`-step of 16 dimensions against every staged key: `a` each
/// row block's query `A` fragment (one after the other), the keys from element `base + at` (this
/// step's dimensions of the first key), `products` the accumulator fragments in the scores'
/// order (row block, then block of 8 keys). Each key fragment read serves every row block.
#[cube]
#[allow(clippy::too_many_arguments)]
fn add_query_times_keys<F: Float, L: FragmentLoad>(def: MmaDefinition<F, F, f32>, lane: u32, products: &mut Array<Vector<f32, Pair>>, a: &Array<Vector<F, Pair>>, staged_keys: &SharedMemory<F>, base: usize, #[comptime] at: usize, #[comptime] head_dim: usize, #[comptime] keys: usize, #[comptime] blocks: usize) {
    let c_vectors = def.vectors_per_lane(MatrixIdent::Accumulator);
    let a_vectors = def.vectors_per_lane(MatrixIdent::A);
    #[unroll]
    for pair in 0..comptime![keys / 16] {
        let b = L::keys::<F>(def, lane, staged_keys, base, comptime![at + pair * 16 * staged_row(head_dim)], head_dim);
        #[unroll]
        for block in 0..blocks {
            #[unroll]
            for which in 0..2usize {
                let at = (block * comptime![keys / 8] + 2 * pair + which) * c_vectors;
                let mut product = fragment_at::<f32>(products, at, c_vectors);
                def.execute_inplace(&fragment_at::<F>(a, block * a_vectors, a_vectors), &fragment_at::<F>(&b, which * B_REGISTERS, B_REGISTERS), &mut product);
                put_fragment::<f32>(products, at, &product, c_vectors);
            }
        }
    }
}

#[cube]
impl<L: FragmentLoad> TileMath for MmaTile<L> {
    fn load_query<F: Float>(queries: &Tensor<F>, row_offsets: &SharedMemory<u32>, #[comptime] head_dim: usize) -> QueryPairs<F> {
        query_fragments::<F>(queries, row_offsets, head_dim)
    }

    /// The accumulator fragments of the plane's output rows, one per `n`-block of 8 dimensions.
    fn new_output<F: Float>(#[comptime] head_dim: usize) -> Array<f32> {
        let def = definition::<F>();
        let per_block = def.elems_per_lane(MatrixIdent::Accumulator);
        let mut output = Array::<f32>::new(comptime![head_dim / 8 * per_block]);
        #[unroll]
        for i in 0..comptime![head_dim / 8 * per_block] {
            output[i] = 0.0;
        }
        output
    }

    fn scores<F: Float>(query: &QueryPairs<F>, staged_keys: &SharedMemory<F>, scores: &mut SharedMemory<f32>, scale: f32, #[comptime] head_dim: usize, #[comptime] keys: usize) {
        let def = definition::<F>();
        let (plane_row, lane) = plane_and_lane();
        let lane = lane as u32;
        let c_vectors = def.vectors_per_lane(MatrixIdent::Accumulator);
        let a_vectors = def.vectors_per_lane(MatrixIdent::A);
        let mut products = zeros::<F>(def, comptime![keys / 8]);
        #[unroll]
        for step in 0..comptime![head_dim / 16] {
            add_query_times_keys::<F, L>(def, lane, &mut products, &fragment_at::<F>(query, step * a_vectors, a_vectors), staged_keys, 0usize, comptime![step * 16], head_dim, keys, 1usize);
        }
        #[unroll]
        for block in 0..comptime![keys / 8] {
            #[unroll]
            for i in 0..c_vectors {
                #[unroll]
                for n in 0..PAIR {
                    let (row, key) = def.position_of_nth(lane, (i * PAIR + n) as u32, MatrixIdent::Accumulator);
                    scores[(plane_row + row as usize) * keys + block * 8 + key as usize] = products[block * c_vectors + i][n] * scale;
                }
            }
        }
    }

    fn accumulate<F: Float>(output: &mut Array<f32>, weights: &SharedMemory<f32>, corrections: &SharedMemory<f32>, values: &SharedMemory<F>, #[comptime] head_dim: usize, #[comptime] keys: usize) {
        let def = definition::<F>();
        let (plane_row, lane) = plane_and_lane();
        let lane = lane as u32;
        let per_block = def.elems_per_lane(MatrixIdent::Accumulator);
        // Rescale: an element's row is the same in every block of dimensions.
        #[unroll]
        for n in 0..per_block {
            let (row, _) = def.position_of_nth(lane, n as u32, MatrixIdent::Accumulator);
            let correction = corrections[plane_row + row as usize];
            #[unroll]
            for block in 0..comptime![head_dim / 8] {
                output[block * per_block + n] *= correction;
            }
        }
        #[unroll]
        for step in 0..comptime![keys / KEY_BLOCK] {
            // A is the weights: element (row, key), loaded once for every block of dimensions.
            let a = a_from_shared::<F, f32>(def, lane, weights, plane_row * keys + step * KEY_BLOCK, keys);
            add_times_values::<F, L>(def, lane, output, &a, values, 0usize, comptime![step * KEY_BLOCK * staged_row(head_dim)], head_dim, 1usize);
        }
    }

    fn store<F: Float>(output: &Array<f32>, sums: &SharedMemory<f32>, row_offsets: &SharedMemory<u32>, out: &mut Tensor<F>, #[comptime] head_dim: usize) {
        let def = definition::<F>();
        let (plane_row, lane) = plane_and_lane();
        let per_block = def.elems_per_lane(MatrixIdent::Accumulator);
        #[unroll]
        for block in 0..comptime![head_dim / 8] {
            #[unroll]
            for n in 0..per_block {
                let (row, dim) = def.position_of_nth(lane as u32, n as u32, MatrixIdent::Accumulator);
                let row = plane_row + row as usize;
                let offset = row_offsets[row];
                if offset != NO_ROW {
                    out[offset as usize + block * 8 + dim as usize] = F::cast_from(output[block * per_block + n] / sums[row]);
                }
            }
        }
    }
}

/// The flash kernel's fragments on tensor cores, its key and value fragments read by `L`: the
/// scores as m16n8k16 accumulators, whose weights are then the weights × values multiply's `A`
/// fragments as they lie (PTX puts `A`'s columns `2t, 2t + 1` and `2t + 8, 2t + 9` of rows `g`,
/// `g + 8` where the accumulators of two 8-key blocks hold them), and a row's quad reduced with
/// two shuffles.
pub(super) struct MmaFragments<L: FragmentLoad> {
    _loads: PhantomData<L>,
}

#[cube]
impl<L: FragmentLoad> FragmentMath for MmaFragments<L> {
    fn load_query<F: Float>(queries: &Tensor<F>, row_offsets: &SharedMemory<u32>, #[comptime] head_dim: usize, #[comptime] blocks: usize) -> QueryPairs<F> {
        if comptime![blocks == 1] {
            query_fragments::<F>(queries, row_offsets, head_dim)
        } else {
            Array::<Vector<F, Pair>>::new(1usize)
        }
    }

    /// Dimensions outside, keys inside: each `k`-step's query fragment (one a row block, from
    /// registers or `ldmatrix`ed from the staged query) serves every key block, each key
    /// fragment every row block.
    fn scores<F: Float>(query: &QueryPairs<F>, staged_query: &SharedMemory<F>, staged_keys: &SharedMemory<F>, staged_at: usize, #[comptime] head_dim: usize, #[comptime] keys: usize, #[comptime] blocks: usize) -> Array<f32> {
        let def = definition::<F>();
        let (plane_row, lane) = flash_plane_and_lane(blocks);
        let lane = lane as u32;
        let c_vectors = def.vectors_per_lane(MatrixIdent::Accumulator);
        let a_vectors = def.vectors_per_lane(MatrixIdent::A);
        let fragments = comptime![blocks * keys / 8];
        let mut products = zeros::<F>(def, fragments);
        #[unroll]
        for step in 0..comptime![head_dim / 16] {
            let mut a = Array::<Vector<F, Pair>>::new(comptime![blocks * a_vectors]);
            #[unroll]
            for block in 0..blocks {
                let fragment = if comptime![blocks == 1] {
                    fragment_at::<F>(query, step * a_vectors, a_vectors)
                } else {
                    L::query::<F>(def, lane, staged_query, plane_row * comptime![staged_row(head_dim)], comptime![(block * ROWS_PER_PLANE) * staged_row(head_dim) + step * 16], head_dim)
                };
                put_fragment::<F>(&mut a, block * a_vectors, &fragment, a_vectors);
            }
            add_query_times_keys::<F, L>(def, lane, &mut products, &a, staged_keys, staged_at, comptime![step * 16], head_dim, keys, blocks);
        }
        let mut scores = Array::<f32>::new(comptime![fragments * BLOCK_ELEMENTS]);
        store_pairs(&products, &mut scores, 0usize, comptime![fragments * c_vectors]);
        scores
    }

    fn accumulate<F: Float>(output: &mut Array<f32>, weights: &Array<f32>, staged_values: &SharedMemory<F>, staged_at: usize, #[comptime] head_dim: usize, #[comptime] keys: usize, #[comptime] _rows: usize, #[comptime] blocks: usize) {
        let def = definition::<F>();
        let (_, lane) = flash_plane_and_lane(blocks);
        let lane = lane as u32;
        let per_step = def.elems_per_lane(MatrixIdent::A);
        let a_vectors = def.vectors_per_lane(MatrixIdent::A);
        #[unroll]
        for step in 0..comptime![keys / KEY_BLOCK] {
            // Each row block's weights of these 16 keys, as the multiply's `A` fragment.
            let mut a = Array::<Vector<F, Pair>>::new(comptime![blocks * a_vectors]);
            #[unroll]
            for block in 0..blocks {
                let fragment = pairs_of::<F>(weights, block * comptime![keys / 8 * BLOCK_ELEMENTS] + step * per_step, a_vectors);
                put_fragment::<F>(&mut a, block * a_vectors, &fragment, a_vectors);
            }
            add_times_values::<F, L>(def, lane, output, &a, staged_values, staged_at, comptime![step * KEY_BLOCK * staged_row(head_dim)], head_dim, blocks);
        }
    }

    fn quad_max(value: f32, #[comptime] _units: usize) -> f32 {
        let pair = f32::max(value, plane_shuffle_xor(value, 1u32));
        f32::max(pair, plane_shuffle_xor(pair, 2u32))
    }

    fn quad_sum(value: f32, #[comptime] _units: usize) -> f32 {
        let pair = value + plane_shuffle_xor(value, 1u32);
        pair + plane_shuffle_xor(pair, 2u32)
    }
}

/// Keys: 16 staged rows. Dimensions: one `k`-step of the scores.
const PROBE_KEYS: usize = 16;
const PROBE_DIM: usize = 16;

/// Values a lane of the probe writes: two key `B` fragments, two value ones, one query `A`.
const PROBE_PER_LANE: usize = 24;

/// One plane stages `tile` (`[16 keys, 16 dimensions]`, row-major) as the tile kernels do and
/// writes what each lane's `L` reads: the keys' two `B` fragments (8 values), the values' two
/// (8 values), then the tile's rows as a query's `A` fragment (8 values), 24 a lane.
#[cube(launch)]
fn fragment_load_probe<F: Float, L: FragmentLoad>(tile: &Tensor<F>, out: &mut Tensor<F>, #[define(F)] _dtype: StorageType) {
    let def = definition::<F>();
    let lane = UNIT_POS_X;
    let mut staged = SharedMemory::<F>::new_aligned(comptime![PROBE_KEYS * staged_row(PROBE_DIM)], 16usize);
    for index in 0..PROBE_DIM / 2 {
        let element = lane as usize * (PROBE_DIM / 2) + index;
        staged[(element / PROBE_DIM) * comptime![staged_row(PROBE_DIM)] + element % PROBE_DIM] = tile[element];
    }
    sync_cube();
    let keys = L::keys::<F>(def, lane, &staged, 0usize, 0usize, PROBE_DIM);
    let values = L::values::<F>(def, lane, &staged, 0usize, 0usize, PROBE_DIM);
    let query = L::query::<F>(def, lane, &staged, 0usize, 0usize, PROBE_DIM);
    let first = lane as usize * PROBE_PER_LANE;
    #[unroll]
    for i in 0..comptime![2 * B_REGISTERS] {
        #[unroll]
        for n in 0..PAIR {
            out[first + i * PAIR + n] = keys[i][n];
            out[first + 8 + i * PAIR + n] = values[i][n];
            out[first + 16 + i * PAIR + n] = query[i][n];
        }
    }
}

/// What each of a plane's 32 lanes reads with `loads` as the key and value `B` fragments of a
/// staged tile (`tile`: `[16 keys, 16 dimensions]`, contiguous, bf16 or f16), and as a query
/// `A` fragment of its rows: per lane the keys' two fragments, the values' two, then the
/// query's, 24 values — for the kernel tests on CUDA to hold against PTX's m16n8k16 layouts
/// (tensor cores only: `mma.sync`'s definition).
pub fn fragment_loads<R: CubeRuntime>(tile: CubeTensor<R>, loads: FragmentLoads) -> CubeTensor<R> {
    assert_eq!(tile.shape().dims::<2>(), [PROBE_KEYS, PROBE_DIM], "a tile of 16 keys x 16 dimensions");
    let tile = into_contiguous(tile);
    let out = empty_device_contiguous_dtype(tile.client.clone(), tile.device.clone(), Shape::new([32 * PROBE_PER_LANE]), tile.dtype);
    let (client, dtype) = (tile.client.clone(), tile.dtype);
    let (count, dim) = (CubeCount::Static(1, 1, 1), CubeDim::new_1d(32));
    match loads {
        FragmentLoads::Ldmatrix => fragment_load_probe::launch::<Ldmatrix, R>(&client, count, dim, tile.into_tensor_arg(), out.clone().into_tensor_arg(), dtype.into()),
        FragmentLoads::Elements => fragment_load_probe::launch::<ElementLoads, R>(&client, count, dim, tile.into_tensor_arg(), out.clone().into_tensor_arg(), dtype.into()),
    }
    out
}
