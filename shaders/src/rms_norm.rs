//! Residual add + RMSNorm in one kernel: `sum = x + delta` and `sum / rms(sum) · gain`, one cube
//! per row. In Burn ops that is an add, a square, a mean, an add, a square root, a divide and a
//! multiply, each reading and writing the row again; here the row is read once (twice for the
//! second sweep, from cache) and each output written once. Without `delta` it is RMSNorm alone
//! (the first layer's input norm). Rows are read and written a vector at a time
//! ([`crate::vectors`]), without bounds checks.

use burn_backend::TensorMetadata;
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use crate::cube_reduce::cube_reduce;
use crate::grid::{cube_index, cubes};
use crate::vectors::vector_width;

/// Most units a row gets.
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
    let gain = into_contiguous(gain);
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
    let vector = vector_width(client, x.dtype.size(), &[width], &[x, delta, gain]);
    // Two vectors a unit where the row has them (two loads in flight each), a power of two
    // (the reduction halves it), at most `MAX_UNITS`.
    let units = (width / vector).div_ceil(2).next_power_of_two().clamp(1, MAX_UNITS);
    // SAFETY: a cube past the last row stops; the others read and write their row's `width /
    // vector` vectors of the contiguous tensors, each `rows · width` long, and `gain`'s.
    unsafe {
        add_rms_norm_kernel::launch_unchecked::<R>(
            client,
            cubes(rows, 1),
            CubeDim::new_1d(units as u32),
            vector,
            x.clone().into_tensor_arg(),
            delta.clone().into_tensor_arg(),
            gain.clone().into_tensor_arg(),
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
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn add_rms_norm_kernel<F: Float, N: Size>(
    x: &Tensor<Vector<F, N>>,
    delta: &Tensor<Vector<F, N>>,
    gain: &Tensor<Vector<F, N>>,
    sum: &mut Tensor<Vector<F, N>>,
    normed: &mut Tensor<Vector<F, N>>,
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
    let vector = N::value();
    let vectors = comptime![width / vector];
    let base = row * vectors;

    let mut squares = Vector::<f32, N>::new(0.0);
    let mut i = unit;
    while i < vectors {
        let mut value = Vector::<f32, N>::cast_from(x[base + i]);
        if comptime![add] {
            value += Vector::cast_from(delta[base + i]);
            sum[base + i] = Vector::cast_from(value);
        }
        squares += value * value;
        i += units;
    }
    let mut own = f32::new(0.0);
    #[unroll]
    for n in 0..vector {
        own += squares[n];
    }

    let mut partials = SharedMemory::<f32>::new(units);
    let inverse_rms = Vector::<f32, N>::new(inverse_rms(&mut partials, own, eps, width));

    // The row again, from cache: held in registers it would cap the widths a cube takes.
    let mut i = unit;
    while i < vectors {
        let mut value = Vector::<f32, N>::cast_from(x[base + i]);
        if comptime![add] {
            value += Vector::cast_from(delta[base + i]);
        }
        normed[base + i] = Vector::cast_from(value * inverse_rms * Vector::cast_from(gain[i]));
        i += units;
    }
}

/// `1 / sqrt(Σ squares / width + eps)` over the cube: each unit brings its partial sum of
/// squares ([`cube_reduce`]; the cube a power of two, `partials` a slot a unit), and every unit
/// gets the result. `partials` is read by every unit on return: sync before reusing it.
#[cube]
fn inverse_rms(partials: &mut SharedMemory<f32>, squares: f32, eps: f32, #[comptime] width: usize) -> f32 {
    let sum = cube_reduce(partials, squares, false);
    f32::new(1.0) / f32::sqrt(sum / f32::new(comptime![width as f32]) + eps)
}
