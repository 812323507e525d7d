//! A matmul without shared memory: each unit keeps a block of `ROWS × COLUMNS` outputs in
//! registers and walks the inner dimension reading its operands straight from global memory,
//! every value it loads used `ROWS` or `COLUMNS` times. No workgroup barrier, no staging.
//!
//! Why tally has its own: on software adapters (Chromium's SwiftShader, the WebGPU of a browser
//! with no GPU) workgroup barriers and shared memory are what costs, and cubek's tiled matmuls
//! (all built on them) run 3–7× slower there than its naive one-output-per-unit kernel, which
//! in turn loads every operand once per output. Measured on SmolLM2's shapes with
//! `examples/matmul_candidates.rs`: at 16 and 64 rows its 8 × 8 block is 3–7× faster than the
//! naive kernel and 5–12× faster than the unit kernel WebGPU gets today on SwiftShader, and 1.6–2×
//! faster than autotune's best (cubek's double-buffered unit kernel) on lavapipe. It is a route
//! (`--matmul block`), not a default: hardware adapters keep cubek's tiled kernels where those win.

use burn_backend::{calculate_matmul_output, DType, TensorMetadata};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use crate::grid::{cube_index, cubes};

/// Units per cube.
const UNITS: usize = 64;

/// Outputs one unit holds: `rows × columns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegisterBlock {
    pub rows: usize,
    pub columns: usize,
}

impl RegisterBlock {
    /// What `--matmul block` runs: the fastest of [`Self::CANDIDATES`] on every SmolLM2 shape
    /// measured, on lavapipe (16 and 64 rows) and SwiftShader (16 rows).
    pub const DEFAULT: RegisterBlock = RegisterBlock { rows: 8, columns: 8 };
    /// The blocks a checked timing tries (`MatmulKernel::CANDIDATES`), and so `examples/matmul_candidates.rs`.
    pub const CANDIDATES: [RegisterBlock; 4] = [RegisterBlock { rows: 4, columns: 4 }, RegisterBlock { rows: 8, columns: 4 }, RegisterBlock::DEFAULT, RegisterBlock { rows: 16, columns: 4 }];
}

/// `lhs · rhs` for two 2-D tensors of any strides (a transposed view included), float32
/// accumulation, the output contiguous in the operands' dtype. `None` for other ranks or mixed
/// dtypes (the caller's other matmul takes those).
pub fn block_matmul<R: CubeRuntime>(lhs: &CubeTensor<R>, rhs: &CubeTensor<R>, block: RegisterBlock) -> Option<CubeTensor<R>> {
    if lhs.shape().num_dims() != 2 || rhs.shape().num_dims() != 2 || lhs.dtype != rhs.dtype || !matches!(lhs.dtype, DType::F32 | DType::F16 | DType::BF16) {
        return None;
    }
    let shape = calculate_matmul_output(&lhs.shape(), &rhs.shape()).ok()?;
    let [m, k] = lhs.shape().dims::<2>();
    let n = rhs.shape()[1];
    let out = empty_device_contiguous_dtype(lhs.client.clone(), lhs.device.clone(), shape, lhs.dtype);
    let blocks = m.div_ceil(block.rows) * n.div_ceil(block.columns);
    if blocks == 0 {
        return Some(out);
    }
    let dtype = lhs.dtype;
    let stride = |t: &CubeTensor<R>, dim: usize| t.meta.strides()[dim] as u32;
    // Unchecked: every read is clamped into the operands and every write guarded (see the kernel).
    unsafe { block_matmul_kernel::launch_unchecked::<R>(
        &lhs.client,
        cubes(blocks.div_ceil(UNITS), 1),
        CubeDim::new_1d(UNITS as u32),
        lhs.clone().into_tensor_arg(),
        rhs.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        m as u32,
        n as u32,
        k as u32,
        stride(lhs, 0),
        stride(lhs, 1),
        stride(rhs, 0),
        stride(rhs, 1),
        block.rows,
        block.columns,
        dtype.into(),
    ) };
    Some(out)
}

#[cube(launch_unchecked)]
fn block_matmul_kernel<F: Float>(lhs: &Tensor<F>, rhs: &Tensor<F>, out: &mut Tensor<F>, m: u32, n: u32, k: u32, lhs_row: u32, lhs_col: u32, rhs_row: u32, rhs_col: u32, #[comptime] rows: usize, #[comptime] columns: usize, #[define(F)] _dtype: StorageType) {
    // Sizes and strides in elements (the operands may be transposed views).
    let (m, n, k) = (m as usize, n as usize, k as usize);
    let (lhs_row, lhs_col, rhs_row, rhs_col) = (lhs_row as usize, lhs_col as usize, rhs_row as usize, rhs_col as usize);
    let column_blocks = n.div_ceil(columns);
    let block = cube_index() * UNITS + UNIT_POS_X as usize;
    let first_row = block / column_blocks * rows;
    let first_column = block % column_blocks * columns;
    if first_row < m {
        // Rows and columns past the edge read the last one (in bounds) and are never written.
        let mut lhs_rows = Array::<usize>::new(rows);
        #[unroll]
        for i in 0..rows {
            let row = first_row + i;
            lhs_rows[i] = if row < m { row } else { m - 1 } * lhs_row;
        }
        let mut rhs_columns = Array::<usize>::new(columns);
        #[unroll]
        for j in 0..columns {
            let column = first_column + j;
            rhs_columns[j] = if column < n { column } else { n - 1 } * rhs_col;
        }
        let mut sums = Array::<f32>::new(comptime![rows * columns]);
        #[unroll]
        for i in 0..comptime![rows * columns] {
            sums[i] = 0.0;
        }
        let mut a = Array::<f32>::new(rows);
        for step in 0..k {
            let lhs_step = step * lhs_col;
            let rhs_step = step * rhs_row;
            #[unroll]
            for i in 0..rows {
                a[i] = f32::cast_from(lhs[lhs_rows[i] + lhs_step]);
            }
            #[unroll]
            for j in 0..columns {
                let b = f32::cast_from(rhs[rhs_step + rhs_columns[j]]);
                #[unroll]
                for i in 0..rows {
                    sums[i * columns + j] += a[i] * b;
                }
            }
        }
        #[unroll]
        for i in 0..rows {
            #[unroll]
            for j in 0..columns {
                let (row, column) = (first_row + i, first_column + j);
                if row < m && column < n {
                    out[row * n + column] = F::cast_from(sums[i * columns + j]);
                }
            }
        }
    }
}
