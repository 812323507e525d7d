//! The cascade's softmax in one kernel: per row of scores, the weights `exp(s − lse)` and the
//! log-sum-exp `lse = log Σ exp(s)`, one cube per row. In Burn ops that is a max, a subtract
//! and exponential, a sum, a logarithm and add, then a subtract and exponential again: four
//! passes over a score matrix that, for the prefix part of one S1 layer, holds 8 × 20,000 ×
//! 2,020 cells. Here the row is read from memory once (its later sweeps hit the cache) and the
//! weights written once. The scores may be float32 where the matmul before wrote them so
//! (cuBLASLt from 16-bit operands) and the weights in the operands' dtype.

use burn_backend::{DType, Shape, TensorMetadata};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use crate::cube_reduce::row_max_and_exp_sum;
use crate::grid::{cube_index, cubes};

/// Most units a row gets.
const MAX_UNITS: usize = 256;

/// `(exp(scores − lse), lse)` over the last dimension of `scores: [rows, width]` (any float
/// dtype): the weights `[rows, width]` in `weights_dtype` (what the matmul after them reads) and
/// `lse = log Σ exp(scores)` `[rows, 1]` in float32 (a 16-bit log-sum-exp would move the
/// cascade's merge by up to 2⁻⁹ of its magnitude), float32 inside. Scores of −∞ (masked) get a
/// weight of 0; every row needs one finite score.
pub fn softmax_lse<R: CubeRuntime>(scores: CubeTensor<R>, weights_dtype: DType) -> (CubeTensor<R>, CubeTensor<R>) {
    let [rows, width] = scores.shape().dims::<2>();
    let (client, device, scores_dtype) = (scores.client.clone(), scores.device.clone(), scores.dtype);
    let scores = into_contiguous(scores);
    let weights = empty_device_contiguous_dtype(client.clone(), device.clone(), Shape::new([rows, width]), weights_dtype);
    let lse = empty_device_contiguous_dtype(client.clone(), device, Shape::new([rows, 1]), DType::F32);
    if rows > 0 && width > 0 {
        // A power of two (the reduction halves it), no more units than the row has scores.
        let units = width.next_power_of_two().clamp(1, MAX_UNITS);
        softmax_lse_kernel::launch::<R>(
            &client,
            cubes(rows, 1),
            CubeDim::new_1d(units as u32),
            scores.into_tensor_arg(),
            weights.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            rows as u32,
            width as u32,
            units,
            [scores_dtype.into(), weights_dtype.into()],
        );
    }
    (weights, lse)
}

#[cube(launch)]
fn softmax_lse_kernel<S: Float, W: Float>(scores: &Tensor<S>, weights: &mut Tensor<W>, lse: &mut Tensor<f32>, rows: u32, width: u32, #[comptime] units: usize, #[define(S, W)] _dtypes: [StorageType; 2]) {
    let row = cube_index();
    // Uniform over the cube: the grid's last row may run past the rows.
    if row >= rows as usize {
        terminate!();
    }
    let unit = UNIT_POS_X as usize;
    let width = width as usize;
    let base = row * width;
    let mut partials = SharedMemory::<f32>::new(units);
    let (max, sum) = row_max_and_exp_sum(scores, base, width, &mut partials, units);
    let row_lse = max + f32::ln(sum);

    let mut i = unit;
    while i < width {
        weights[base + i] = W::cast_from(f32::exp(f32::cast_from(scores[base + i]) - row_lse));
        i += units;
    }
    if unit == 0 {
        lse[row] = row_lse;
    }
}
