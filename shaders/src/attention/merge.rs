//! The merge of a split prefix walk's parts (FlashDecoding's reduction; FlashInfer's
//! `merge_states`): each part wrote its rows normalised over the keys it walked, and each row's
//! log-sum-exp over them, `lse_j`. A row's output is `Σ_j exp(lse_j − L) · output_j`, where
//! `L = ln Σ_j exp(lse_j)`: the weights of the keys of all parts, normalised together.

use burn_backend::{DType, TensorMetadata};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use super::NO_SCORE;
use crate::grid::{cube_index, cubes};
use crate::vectors::vector_width;

const UNITS: usize = 256;

/// Writes `output` (`[tokens, q_heads, head_dim]`, contiguous) from `parts` parts
/// (`part_outputs`: `[parts · tokens, q_heads, head_dim]`, `lse`: `[parts · tokens · q_heads]`
/// float32, both contiguous; a part whose row walked no key has the log-sum-exp
/// [`NO_SCORE`] there, and its output row is never read).
pub(super) fn merge_parts<R: CubeRuntime>(part_outputs: &CubeTensor<R>, lse: &CubeTensor<R>, parts: usize, output: &CubeTensor<R>) {
    let [tokens, q_heads, head_dim] = output.shape().dims::<3>();
    assert_eq!(part_outputs.shape().dims::<3>(), [parts * tokens, q_heads, head_dim], "one output a part");
    assert_eq!((lse.shape().num_elements(), lse.dtype), (parts * tokens * q_heads, DType::F32), "one float32 log-sum-exp a part's row");
    let (client, dtype) = (output.client.clone(), output.dtype);
    let vector = vector_width(&client, dtype.size(), &[head_dim], &[part_outputs, output]);
    let rows = tokens * q_heads;
    let count = rows * head_dim / vector;
    if count == 0 {
        return;
    }
    // SAFETY: a unit works only below `count` vectors of the output; it reads its row's
    // log-sum-exp and output vector of each of the `parts` parts, inside both tensors by the
    // asserts above.
    unsafe {
        merge_parts_kernel::launch_unchecked::<R>(
            &client,
            cubes(count.div_ceil(UNITS), 1),
            CubeDim::new_1d(UNITS as u32),
            vector,
            part_outputs.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            output.clone().into_tensor_arg(),
            count as u32,
            rows as u32,
            parts as u32,
            head_dim,
            dtype.into(),
        );
    }
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn merge_parts_kernel<F: Float, N: Size>(
    part_outputs: &Tensor<Vector<F, N>>,
    lse: &Tensor<f32>,
    output: &mut Tensor<Vector<F, N>>,
    count: u32,
    rows: u32,
    parts: u32,
    #[comptime] head_dim: usize,
    #[define(F)] _dtype: StorageType,
) {
    let index = cube_index() * UNITS + UNIT_POS_X as usize;
    if index < count as usize {
        let width = N::value();
        let row_vectors = comptime![head_dim / width];
        let (rows, parts) = (rows as usize, parts as usize);
        let row = index / row_vectors;
        let mut largest = f32::new(NO_SCORE);
        for part in 0..parts {
            largest = f32::max(largest, lse[part * rows + row]);
        }
        let mut total = f32::new(0.0);
        let mut sum = Vector::<f32, N>::new(f32::new(0.0));
        for part in 0..parts {
            let part_lse = lse[part * rows + row];
            // A part without keys for this row adds nothing (its output was never written).
            if part_lse > f32::new(NO_SCORE) {
                let weight = f32::exp(part_lse - largest);
                total += weight;
                sum += Vector::<f32, N>::cast_from(part_outputs[part * rows * row_vectors + index]) * Vector::new(weight);
            }
        }
        output[index] = Vector::cast_from(sum / Vector::new(total));
    }
}
