//! SwiGLU's elementwise half in one kernel: `silu(gate) · up` straight from the fused
//! gate/up projection `[rows, 2 · intermediate]` (gate first, up second), into
//! `[rows, intermediate]`. In Burn ops that is two strided copies (the narrows), a sigmoid, two
//! multiplies and their intermediates; here each input is read once and the output written once,
//! a vector at a time ([`crate::vectors`]), with the row width known when the kernel compiles
//! (a division by it is a multiply) and no bounds checks.

use burn_backend::{Shape, TensorMetadata};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use crate::grid::{cube_index, cubes};
use crate::vectors::vector_width;

const UNITS: usize = 256;

/// `silu(gate_up[:, ..intermediate]) · gate_up[:, intermediate..]` of a `[rows, 2 · intermediate]`
/// tensor, float32 inside, in its dtype.
pub fn silu_mul<R: CubeRuntime>(gate_up: CubeTensor<R>) -> CubeTensor<R> {
    let [rows, width] = gate_up.shape().dims::<2>();
    assert!(width.is_multiple_of(2), "gate and up must be of one width");
    let intermediate = width / 2;
    let gate_up = into_contiguous(gate_up);
    let output = empty_device_contiguous_dtype(gate_up.client.clone(), gate_up.device.clone(), Shape::new([rows, intermediate]), gate_up.dtype);
    let (client, dtype) = (gate_up.client.clone(), gate_up.dtype);
    let vector = vector_width(&client, dtype.size(), &[intermediate], &[&gate_up]);
    let count = rows * intermediate / vector;
    if count > 0 {
        // SAFETY: a unit works only below `count` vectors of the output (`rows · intermediate`
        // elements), reading its row's gate and up vectors of the contiguous input.
        unsafe {
            silu_mul_kernel::launch_unchecked::<R>(
                &client,
                cubes(count.div_ceil(UNITS), 1),
                CubeDim::new_1d(UNITS as u32),
                vector,
                gate_up.into_tensor_arg(),
                output.clone().into_tensor_arg(),
                count as u32,
                intermediate,
                dtype.into(),
            );
        }
    }
    output
}

#[cube(launch_unchecked)]
fn silu_mul_kernel<F: Float, N: Size>(gate_up: &Tensor<Vector<F, N>>, output: &mut Tensor<Vector<F, N>>, count: u32, #[comptime] intermediate: usize, #[define(F)] _dtype: StorageType) {
    let index = cube_index() * UNITS + UNIT_POS_X as usize;
    if index < count as usize {
        let vector = N::value();
        let row_vectors = comptime![intermediate / vector];
        let row = index / row_vectors;
        let gate_at = row * comptime![2 * row_vectors] + index % row_vectors;
        let gate = Vector::<f32, N>::cast_from(gate_up[gate_at]);
        let up = Vector::<f32, N>::cast_from(gate_up[gate_at + row_vectors]);
        // `0 − gate`: CubeCL's CUDA vectors have no unary minus (NVRTC: no operator for `-float_8`).
        let sigmoid = Vector::new(f32::new(1.0)) / (Vector::new(f32::new(1.0)) + Vector::exp(Vector::new(f32::new(0.0)) - gate));
        output[index] = Vector::cast_from(gate * sigmoid * up);
    }
}
