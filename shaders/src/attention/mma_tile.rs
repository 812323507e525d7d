//! The tiled kernel's tile multiply on tensor cores: `mma.sync` m16n8k16 with bf16/f16
//! operands and f32 accumulators (CubeCL's manual MMA, CUDA sm_80+). A plane's 16 rows are
//! the `m`; the scores take `keys / 8` `n`-blocks of 8 keys and `head_dim / 16` `k`-steps, the
//! output `head_dim / 8` `n`-blocks and `keys / 16` `k`-steps.
//!
//! Fragments from shared memory are filled element by element from where CubeCL says each
//! lane's elements sit (`position_of_nth`); the query fragments and the output accumulators
//! stay in registers (as f32) for the whole key loop. The flash kernel's [`MmaFragments`] also
//! relies on PTX's layout (an accumulator pair of blocks is an `A` fragment; a row's elements
//! lie in one quad of lanes), which `mma_fragment_layout_is_ptxs` pins. `ldmatrix` loads and
//! cp.async double buffering are the next steps, for the GPU suite to measure.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::cmma::MmaDefinition;
use burn_cubecl::cubecl::ir::MatrixIdent;
use burn_cubecl::cubecl::prelude::*;

use super::flash::{FragmentMath, BLOCK_ELEMENTS};
use super::tiled::{plane_and_lane, TileMath, KEY_BLOCK, NO_ROW};
use super::walk::staged_row;

/// `(m, n, k)` of one multiply.
pub const MMA_SHAPE: (u32, u32, u32) = (16, 8, 16);

/// Elements a lane holds contiguously in one register: 32 bits of bf16/f16 operands, two f32
/// accumulators (`contiguous_elements_cuda` in cubecl-cpp).
type Pair = Const<2>;
const PAIR: usize = 2;

pub(super) struct MmaTile;

#[cube]
fn definition<F: Float>() -> MmaDefinition<F, F, f32> {
    MmaDefinition::<F, F, f32>::new(16usize, 8usize, 16usize)
}

/// An accumulator fragment of zeros.
#[cube]
fn zeros<F: Float>(def: MmaDefinition<F, F, f32>) -> Array<Vector<f32, Pair>> {
    let count = def.vectors_per_lane(MatrixIdent::Accumulator);
    let mut fragment = Array::<Vector<f32, Pair>>::new(count);
    #[unroll]
    for i in 0..count {
        let mut pair = Vector::empty();
        #[unroll]
        for n in 0..PAIR {
            pair[n] = 0.0;
        }
        fragment[i] = pair;
    }
    fragment
}

/// An A fragment (16 rows × 16) from this lane's own f32 registers, `registers[first..]` in
/// fragment order.
#[cube]
fn a_from_registers<F: Float>(def: MmaDefinition<F, F, f32>, registers: &Array<f32>, first: usize) -> Array<Vector<F, Pair>> {
    let count = def.vectors_per_lane(MatrixIdent::A);
    let mut fragment = Array::<Vector<F, Pair>>::new(count);
    #[unroll]
    for i in 0..count {
        let mut pair = Vector::empty();
        #[unroll]
        for n in 0..PAIR {
            pair[n] = F::cast_from(registers[first + i * PAIR + n]);
        }
        fragment[i] = pair;
    }
    fragment
}

/// An A fragment (16 rows × 16) of f32 `values`: element (row, column) at `first + row ·
/// row_stride + column`.
#[cube]
fn a_from_shared<F: Float>(def: MmaDefinition<F, F, f32>, lane: u32, values: &SharedMemory<f32>, first: usize, #[comptime] row_stride: usize) -> Array<Vector<F, Pair>> {
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

/// The A fragments of the plane's query rows, one per `k`-step of 16 dimensions, as f32.
#[cube]
fn query_fragments<F: Float>(queries: &Tensor<F>, row_offsets: &SharedMemory<u32>, #[comptime] head_dim: usize) -> Array<f32> {
    let def = definition::<F>();
    let (plane_row, lane) = plane_and_lane();
    let per_step = def.elems_per_lane(MatrixIdent::A);
    let mut query = Array::<f32>::new(comptime![head_dim / 16 * per_step]);
    #[unroll]
    for step in 0..comptime![head_dim / 16] {
        #[unroll]
        for n in 0..per_step {
            let (row, dim) = def.position_of_nth(lane as u32, n as u32, MatrixIdent::A);
            let offset = row_offsets[plane_row + row as usize];
            let mut value = f32::new(0.0);
            if offset != NO_ROW {
                value = f32::cast_from(queries[offset as usize + step * 16 + dim as usize]);
            }
            query[step * per_step + n] = value;
        }
    }
    query
}

/// `output += a · values` for every block of 8 dimensions of `output` (accumulator fragments in
/// f32, `head_dim / 8` of them), `values` staged as `[keys, head_dim]` (rows `staged_row` apart) from key `first_key`.
#[cube]
fn add_times_values<F: Float>(def: MmaDefinition<F, F, f32>, lane: u32, output: &mut Array<f32>, a: &Array<Vector<F, Pair>>, values: &SharedMemory<F>, first_key: usize, #[comptime] head_dim: usize) {
    let per_block = def.elems_per_lane(MatrixIdent::Accumulator);
    let c_vectors = def.vectors_per_lane(MatrixIdent::Accumulator);
    #[unroll]
    for block in 0..comptime![head_dim / 8] {
        let mut product = Array::<Vector<f32, Pair>>::new(c_vectors);
        #[unroll]
        for i in 0..c_vectors {
            let mut pair = Vector::empty();
            #[unroll]
            for n in 0..PAIR {
                pair[n] = output[block * per_block + i * PAIR + n];
            }
            product[i] = pair;
        }
        // B is the values: element (key, dimension).
        let b = b_from_shared::<F>(def, lane, values, first_key * comptime![staged_row(head_dim)] + block * 8, comptime![staged_row(head_dim)], 1usize);
        def.execute_inplace(a, &b, &mut product);
        #[unroll]
        for i in 0..c_vectors {
            #[unroll]
            for n in 0..PAIR {
                output[block * per_block + i * PAIR + n] = product[i][n];
            }
        }
    }
}

/// `query · keys` (unscaled) of the plane's rows and the 8 staged keys from `first_key`.
#[cube]
fn score_block<F: Float>(def: MmaDefinition<F, F, f32>, lane: u32, query: &Array<f32>, staged_keys: &SharedMemory<F>, first_key: usize, #[comptime] head_dim: usize) -> Array<Vector<f32, Pair>> {
    let per_step = def.elems_per_lane(MatrixIdent::A);
    let mut product = zeros::<F>(def);
    #[unroll]
    for step in 0..comptime![head_dim / 16] {
        let a = a_from_registers::<F>(def, query, step * per_step);
        // B is keysᵀ: element (dimension, key).
        let b = b_from_shared::<F>(def, lane, staged_keys, first_key * comptime![staged_row(head_dim)] + step * 16, 1usize, comptime![staged_row(head_dim)]);
        def.execute_inplace(&a, &b, &mut product);
    }
    product
}

#[cube]
impl TileMath for MmaTile {
    fn load_query<F: Float>(queries: &Tensor<F>, row_offsets: &SharedMemory<u32>, #[comptime] head_dim: usize) -> Array<f32> {
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

    fn scores<F: Float>(query: &Array<f32>, staged_keys: &SharedMemory<F>, scores: &mut SharedMemory<f32>, scale: f32, #[comptime] head_dim: usize, #[comptime] keys: usize) {
        let def = definition::<F>();
        let (plane_row, lane) = plane_and_lane();
        let lane = lane as u32;
        let c_vectors = def.vectors_per_lane(MatrixIdent::Accumulator);
        #[unroll]
        for block in 0..comptime![keys / 8] {
            let product = score_block::<F>(def, lane, query, staged_keys, block * 8, head_dim);
            #[unroll]
            for i in 0..c_vectors {
                #[unroll]
                for n in 0..PAIR {
                    let (row, key) = def.position_of_nth(lane, (i * PAIR + n) as u32, MatrixIdent::Accumulator);
                    scores[(plane_row + row as usize) * keys + block * 8 + key as usize] = product[i][n] * scale;
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
            let a = a_from_shared::<F>(def, lane, weights, plane_row * keys + step * KEY_BLOCK, keys);
            add_times_values::<F>(def, lane, output, &a, values, step * KEY_BLOCK, head_dim);
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

/// The flash kernel's fragments on tensor cores: the scores as m16n8k16 accumulators, whose
/// weights are then the weights × values multiply's `A` fragments as they lie (PTX puts `A`'s
/// columns `2t, 2t + 1` and `2t + 8, 2t + 9` of rows `g`, `g + 8` where the accumulators of two
/// 8-key blocks hold them), and a row's quad reduced with two shuffles.
pub(super) struct MmaFragments;

#[cube]
impl FragmentMath for MmaFragments {
    fn load_query<F: Float>(queries: &Tensor<F>, row_offsets: &SharedMemory<u32>, #[comptime] head_dim: usize) -> Array<f32> {
        query_fragments::<F>(queries, row_offsets, head_dim)
    }

    fn scores<F: Float>(query: &Array<f32>, staged_keys: &SharedMemory<F>, #[comptime] head_dim: usize, #[comptime] keys: usize) -> Array<f32> {
        let def = definition::<F>();
        let (_, lane) = plane_and_lane();
        let lane = lane as u32;
        let c_vectors = def.vectors_per_lane(MatrixIdent::Accumulator);
        let mut scores = Array::<f32>::new(comptime![keys / 8 * BLOCK_ELEMENTS]);
        #[unroll]
        for block in 0..comptime![keys / 8] {
            let product = score_block::<F>(def, lane, query, staged_keys, block * 8, head_dim);
            #[unroll]
            for i in 0..c_vectors {
                #[unroll]
                for n in 0..PAIR {
                    scores[block * BLOCK_ELEMENTS + i * PAIR + n] = product[i][n];
                }
            }
        }
        scores
    }

    fn accumulate<F: Float>(output: &mut Array<f32>, weights: &Array<f32>, staged_values: &SharedMemory<F>, #[comptime] head_dim: usize, #[comptime] keys: usize, #[comptime] _rows: usize) {
        let def = definition::<F>();
        let (_, lane) = plane_and_lane();
        let lane = lane as u32;
        let per_step = def.elems_per_lane(MatrixIdent::A);
        #[unroll]
        for step in 0..comptime![keys / KEY_BLOCK] {
            let a = a_from_registers::<F>(def, weights, step * per_step);
            add_times_values::<F>(def, lane, output, &a, staged_values, step * KEY_BLOCK, head_dim);
        }
    }

    fn quad_max(value: f32, #[comptime] _rows: usize) -> f32 {
        let mut largest = value;
        let neighbour = plane_shuffle_xor(largest, 1u32);
        if neighbour > largest {
            largest = neighbour;
        }
        let across = plane_shuffle_xor(largest, 2u32);
        if across > largest {
            largest = across;
        }
        largest
    }

    fn quad_sum(value: f32, #[comptime] _rows: usize) -> f32 {
        let pair = value + plane_shuffle_xor(value, 1u32);
        pair + plane_shuffle_xor(pair, 2u32)
    }
}
