//! SwiGLU's elementwise half in one kernel: `silu(gate) · up` straight from the fused
//! gate/up projection `[rows, 2 · intermediate]` (gate first, up second), into
//! `[rows, intermediate]`. In Burn ops that is two strided copies (the narrows), a sigmoid, two
//! multiplies and their intermediates; here each input is read once and the output written once.

use burn_backend::{Shape, TensorMetadata};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use crate::grid::{cube_index, cubes};

const UNITS: usize = 256;

/// `silu(gate_up[:, ..intermediate]) · gate_up[:, intermediate..]` of a `[rows, 2 · intermediate]`
/// tensor, float32 inside, in its dtype.
pub fn silu_mul<R: CubeRuntime>(gate_up: CubeTensor<R>) -> CubeTensor<R> {
    let [rows, width] = gate_up.shape().dims::<2>();
    assert!(width.is_multiple_of(2), "gate and up must be of one width");
    let intermediate = width / 2;
    let gate_up = into_contiguous(gate_up);
    let output = empty_device_contiguous_dtype(gate_up.client.clone(), gate_up.device.clone(), Shape::new([rows, intermediate]), gate_up.dtype);
    let count = rows * intermediate;
    if count > 0 {
        let dtype = gate_up.dtype;
        silu_mul_kernel::launch::<R>(
            &gate_up.client.clone(),
            cubes(count.div_ceil(UNITS), 1),
            CubeDim::new_1d(UNITS as u32),
            gate_up.into_tensor_arg(),
            output.clone().into_tensor_arg(),
            intermediate as u32,
            dtype.into(),
        );
    }
    output
}

#[cube(launch)]
fn silu_mul_kernel<F: Float>(gate_up: &Tensor<F>, output: &mut Tensor<F>, intermediate: u32, #[define(F)] _dtype: StorageType) {
    let index = cube_index() * UNITS + UNIT_POS_X as usize;
    if index < output.len() {
        let intermediate = intermediate as usize;
        let row = index / intermediate;
        let column = index % intermediate;
        let gate = f32::cast_from(gate_up[row * 2 * intermediate + column]);
        let up = f32::cast_from(gate_up[row * 2 * intermediate + intermediate + column]);
        output[index] = F::cast_from(gate / (f32::new(1.0) + f32::exp(-gate)) * up);
    }
}
