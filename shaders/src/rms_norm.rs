//! Residual add + RMSNorm in one kernel: `sum = x + delta` and `sum / rms(sum) · gain`, one cube
//! per row. In Burn ops that is an add, a square, a mean, an add, a square root, a divide and a
//! multiply, each reading and writing the row again; here the row is read once (twice for the
//! second sweep, from cache) and each output written once. Without `delta` it is RMSNorm alone
//! (the first layer's input norm, Qwen3's per-head q/k norms).

use burn_backend::TensorMetadata;
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use crate::cube_reduce::cube_reduce;
use crate::grid::{cube_index, cubes};

/// Most units a row gets: enough for a 4,096-wide row in 16 sweeps.
const MAX_UNITS: usize = 256;

/// `(x + delta, rms_norm(x + delta) · gain)` over the last dimension of `x` (any rank, made
/// contiguous: the kernel reads rows by linear index; `delta` of the same shape, `gain` of the
/// last dimension's length), or `(x, rms_norm(x) · gain)` without `delta`. Float32 inside,
/// outputs in `x`'s dtype.
pub fn add_rms_norm<R: CubeRuntime>(x: CubeTensor<R>, delta: Option<CubeTensor<R>>, gain: CubeTensor<R>, eps: f64) -> (CubeTensor<R>, CubeTensor<R>) {
    let shape = x.shape();
    let width = shape[shape.num_dims() - 1];
    let rows = shape.num_elements() / width.max(1);
    assert_eq!(gain.shape().num_elements(), width, "one gain per element of a row");
    let (client, device, dtype) = (x.client.clone(), x.device.clone(), x.dtype);
    let x = into_contiguous(x);
    let normed = empty_device_contiguous_dtype(client.clone(), device.clone(), shape.clone(), dtype);
    let Some(delta) = delta else {
        if rows > 0 {
            launch(&client, &x, &x, &gain, &normed, &normed, rows, width, eps, false);
        }
        return (x, normed);
    };
    assert_eq!(delta.shape(), shape, "x and delta must have one shape");
    let delta = into_contiguous(delta);
    let sum = empty_device_contiguous_dtype(client.clone(), device, shape, dtype);
    if rows > 0 {
        launch(&client, &x, &delta, &gain, &sum, &normed, rows, width, eps, true);
    }
    (sum, normed)
}

#[allow(clippy::too_many_arguments)]
fn launch<R: CubeRuntime>(client: &ComputeClient<R>, x: &CubeTensor<R>, delta: &CubeTensor<R>, gain: &CubeTensor<R>, sum: &CubeTensor<R>, normed: &CubeTensor<R>, rows: usize, width: usize, eps: f64, add: bool) {
    // A power of two (the reduction halves it), no more units than the row has elements.
    let units = width.next_power_of_two().clamp(1, MAX_UNITS);
    add_rms_norm_kernel::launch::<R>(
        client,
        cubes(rows, 1),
        CubeDim::new_1d(units as u32),
        x.clone().into_tensor_arg(),
        delta.clone().into_tensor_arg(),
        into_contiguous(gain.clone()).into_tensor_arg(),
        sum.clone().into_tensor_arg(),
        normed.clone().into_tensor_arg(),
        eps as f32,
        rows as u32,
        width,
        units,
        add,
        x.dtype.into(),
    );
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn add_rms_norm_kernel<F: Float>(
    x: &Tensor<F>,
    delta: &Tensor<F>,
    gain: &Tensor<F>,
    sum: &mut Tensor<F>,
    normed: &mut Tensor<F>,
    eps: f32,
    rows: u32,
    #[comptime] width: usize,
    #[comptime] units: usize,
    #[comptime] add: bool,
    #[define(F)] _dtype: StorageType,
) {
    let row = cube_index();
    // Uniform over the cube: the grid's last row may run past the rows.
    if row >= rows as usize {
        terminate!();
    }
    let unit = UNIT_POS_X as usize;
    let base = row * width;

    let mut squares = f32::new(0.0);
    let mut i = unit;
    while i < width {
        let mut value = f32::cast_from(x[base + i]);
        if comptime![add] {
            value += f32::cast_from(delta[base + i]);
            sum[base + i] = F::cast_from(value);
        }
        squares += value * value;
        i += units;
    }

    let mut partials = SharedMemory::<f32>::new(units);
    let inverse_rms = inverse_rms(&mut partials, squares, eps, width);

    let mut i = unit;
    while i < width {
        let mut value = f32::cast_from(x[base + i]);
        if comptime![add] {
            value += f32::cast_from(delta[base + i]);
        }
        normed[base + i] = F::cast_from(value * inverse_rms * f32::cast_from(gain[i]));
        i += units;
    }
}

/// `1 / sqrt(Σ squares / width + eps)` over the cube: each unit brings its partial sum of
/// squares ([`cube_reduce`]; the cube a power of two, `partials` a slot a unit), and every unit
/// gets the result. `partials` is read by every unit on return: sync before reusing it.
#[cube]
pub(crate) fn inverse_rms(partials: &mut SharedMemory<f32>, squares: f32, eps: f32, #[comptime] width: usize) -> f32 {
    let sum = cube_reduce(partials, squares, false);
    f32::new(1.0) / f32::sqrt(sum / f32::new(comptime![width as f32]) + eps)
}
