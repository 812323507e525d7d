//! Qwen3's per-head q/k RMSNorm and the rotary position embedding in one kernel (RoPE alone
//! for models without the norm): one cube per (token, head) row, one unit per element. In Burn
//! ops that is the norm's six launches, then two narrows, a negation, a concatenation, two
//! multiplies and an add, each a pass over q or k; here the row is read once, where it lies in
//! the fused q/k/v projection (any strides), and written once.

use burn_backend::{Shape, TensorMetadata};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use crate::grid::{cube_index, cubes};
use crate::rms_norm::inverse_rms;

/// `rope(rms_norm(x) · gain)` for `x: [tokens, heads, head_dim]` (strided as it comes), or
/// `rope(x)` without `gain`. `cos`, `sin`: `[tokens, 1, head_dim]` (transformers' rotate-half
/// layout: `x·cos + rotate_half(x)·sin`). Float32 inside; a contiguous output in `x`'s dtype.
pub fn norm_rope<R: CubeRuntime>(x: CubeTensor<R>, gain: Option<CubeTensor<R>>, cos: CubeTensor<R>, sin: CubeTensor<R>, eps: f64) -> CubeTensor<R> {
    let [tokens, heads, head_dim] = x.shape().dims::<3>();
    assert!(head_dim.is_multiple_of(2) && head_dim <= 1024, "rotate-half needs an even head size a cube can hold");
    assert_eq!(cos.shape().num_elements(), tokens * head_dim, "one cos row per token");
    let (client, dtype) = (x.client.clone(), x.dtype);
    let output = empty_device_contiguous_dtype(client.clone(), x.device.clone(), Shape::new([tokens, heads, head_dim]), dtype);
    let rows = tokens * heads;
    if rows == 0 {
        return output;
    }
    let norm = gain.is_some();
    // Without a norm the gain is never read; any tensor fills its place.
    let gain = into_contiguous(gain.unwrap_or_else(|| cos.clone()));
    norm_rope_kernel::launch::<R>(
        &client,
        cubes(rows, 1),
        CubeDim::new_1d(head_dim.next_power_of_two() as u32),
        x.into_tensor_arg(),
        gain.into_tensor_arg(),
        into_contiguous(cos).into_tensor_arg(),
        into_contiguous(sin).into_tensor_arg(),
        output.clone().into_tensor_arg(),
        eps as f32,
        rows as u32,
        heads,
        head_dim,
        norm,
        dtype.into(),
    );
    output
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn norm_rope_kernel<F: Float>(
    x: &Tensor<F>,
    gain: &Tensor<F>,
    cos: &Tensor<F>,
    sin: &Tensor<F>,
    output: &mut Tensor<F>,
    eps: f32,
    rows: u32,
    #[comptime] heads: usize,
    #[comptime] head_dim: usize,
    #[comptime] norm: bool,
    #[define(F)] _dtype: StorageType,
) {
    let row = cube_index();
    // Uniform over the cube: the grid's last row may run past the rows.
    if row >= rows as usize {
        terminate!();
    }
    let unit = UNIT_POS_X as usize;
    let token = row / heads;
    let head = row % heads;
    let active = unit < head_dim;
    let mut value = f32::new(0.0);
    if active {
        value = f32::cast_from(x[token * x.stride(0) + head * x.stride(1) + unit * x.stride(2)]);
    }

    // The units past `head_dim` (a power-of-two cube) add zeros.
    let mut shared = SharedMemory::<f32>::new(comptime![head_dim.next_power_of_two()]);
    if comptime![norm] {
        let inverse_rms = inverse_rms(&mut shared, value * value, eps, head_dim);
        if active {
            value = value * inverse_rms * f32::cast_from(gain[unit]);
        }
        // Every unit has read the sum before it is overwritten.
        sync_cube();
    }
    shared[unit] = value;
    sync_cube();

    if active {
        let half = comptime![head_dim / 2];
        // rotate_half: (−x₂, x₁); an element's partner sits half a head away.
        let mut rotated = shared[(unit + half) % head_dim];
        if unit < half {
            rotated = -rotated;
        }
        let table = token * head_dim + unit;
        output[row * head_dim + unit] = F::cast_from(value * f32::cast_from(cos[table]) + rotated * f32::cast_from(sin[table]));
    }
}
