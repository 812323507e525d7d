//! Label log-probabilities over the full vocabulary, streamed: the LM head's logits arrive one
//! vocabulary chunk at a time (`[rows, chunk]`, from a matmul), and one fused kernel per chunk
//! folds them into a running log-sum-exp per row and picks out the label logits. `[rows, vocab]`
//! never exists; what stays between chunks is two floats per row plus the label logits.

use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use burn_backend::{DType, Shape, TensorMetadata};

use crate::cube_reduce::{row_max_and_exp_sum, NO_VALUE};
use crate::grid::{cube_index, cubes};

/// Units per row: a power of two for the tree reductions.
const UNITS_PER_ROW: usize = 256;

/// Units per cube of the finishing kernel, one element each.
const FINISH_UNITS: usize = 256;

/// Running state of the streamed log-softmax for `rows` rows and a `[rows, width]` label table.
pub struct StreamedLabelLogprobs<R: CubeRuntime> {
    /// `[rows, width]` label token ids (any integer dtype).
    labels: CubeTensor<R>,
    /// `[rows]` f32: the largest logit so far.
    running_max: CubeTensor<R>,
    /// `[rows]` f32: `Σ exp(logit − running_max)` so far.
    running_sum: CubeTensor<R>,
    /// `[rows, width]` f32: the label logits, filled in by the chunk that holds each label.
    label_logits: CubeTensor<R>,
    /// Vocabulary rows folded in so far.
    vocab_seen: usize,
}

impl<R: CubeRuntime> StreamedLabelLogprobs<R> {
    pub fn new(labels: CubeTensor<R>) -> Self {
        let labels = into_contiguous(labels);
        let [rows, width] = labels.shape().dims::<2>();
        let (client, device) = (labels.client.clone(), labels.device.clone());
        // Contiguous, as the kernels index them: CUDA pads rows of new tensors to an alignment.
        let fill = |shape: Shape, value: f32| {
            // At least one element: a buffer cannot be empty.
            let bytes: Vec<u8> = std::iter::repeat_n(value.to_le_bytes(), shape.num_elements().max(1)).flatten().collect();
            CubeTensor::new_contiguous(client.clone(), device.clone(), shape, client.create_from_slice(&bytes), DType::F32)
        };
        let running_max = fill(Shape::new([rows]), NO_VALUE);
        let running_sum = fill(Shape::new([rows]), 0.0);
        let label_logits = fill(Shape::new([rows, width]), NO_VALUE);
        Self { labels, running_max, running_sum, label_logits, vocab_seen: 0 }
    }

    /// Folds in the logits of the next vocabulary chunk, `[rows, chunk]`.
    pub fn add_chunk(&mut self, logits: CubeTensor<R>) {
        let logits = into_contiguous(logits);
        let [rows, chunk] = logits.shape().dims::<2>();
        assert_eq!(rows, self.labels.shape()[0], "one label row per logit row");
        let client = logits.client.clone();
        let dtypes = [logits.dtype.into(), self.labels.dtype.into()];
        if rows > 0 {
            vocab_chunk_kernel::launch::<R>(
                &client,
                cubes(rows, 1),
                CubeDim::new_1d(UNITS_PER_ROW as u32),
                logits.into_tensor_arg(),
                self.labels.clone().into_tensor_arg(),
                self.running_max.clone().into_tensor_arg(),
                self.running_sum.clone().into_tensor_arg(),
                self.label_logits.clone().into_tensor_arg(),
                self.vocab_seen as u32,
                UNITS_PER_ROW,
                dtypes,
            );
        }
        self.vocab_seen += chunk;
    }

    /// `[rows, width]` log-probabilities in `dtype`: label logit minus the row's log-sum-exp.
    pub fn finish(self, dtype: DType) -> CubeTensor<R> {
        let shape = self.label_logits.shape().clone();
        let output = empty_device_contiguous_dtype(self.labels.client.clone(), self.labels.device.clone(), shape, dtype);
        self.finish_into(&output);
        output
    }

    /// Like [`Self::finish`], writing every element of `output` (`[rows, width]`, contiguous).
    pub fn finish_into(self, output: &CubeTensor<R>) {
        assert!(output.is_contiguous(), "the log-probabilities must be contiguous");
        let elements = self.label_logits.shape().num_elements();
        if elements == 0 {
            return;
        }
        let width = self.label_logits.shape()[1];
        let client = output.client.clone();
        finish_kernel::launch::<R>(
            &client,
            cubes(elements.div_ceil(FINISH_UNITS), 1),
            CubeDim::new_1d(FINISH_UNITS as u32),
            self.running_max.into_tensor_arg(),
            self.running_sum.into_tensor_arg(),
            self.label_logits.into_tensor_arg(),
            output.clone().into_tensor_arg(),
            width as u32,
            output.dtype.into(),
        );
    }
}

/// One cube per row: max and sum of `exp` over the chunk by tree reduction, merged into the
/// running pair; the row's labels that fall inside the chunk are copied out, `units` at a time
/// (a row may have more labels than the cube has units).
#[cube(launch)]
fn vocab_chunk_kernel<F: Float, I: Numeric>(
    logits: &Tensor<F>,
    labels: &Tensor<I>,
    running_max: &mut Tensor<f32>,
    running_sum: &mut Tensor<f32>,
    label_logits: &mut Tensor<f32>,
    chunk_start: u32,
    #[comptime] units: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let row = cube_index();
    // Uniform over the cube: the grid's last row may run past the rows.
    if row >= labels.shape(0) {
        terminate!();
    }
    let unit = UNIT_POS_X as usize;
    let chunk = logits.shape(1);
    let first = row * chunk;
    let mut reduced = SharedMemory::<f32>::new(units);
    let (chunk_max, chunk_sum) = row_max_and_exp_sum(logits, first, chunk, &mut reduced, units);
    if unit == 0 {
        // The running sum and the chunk's, each moved to the larger maximum.
        let previous_max = running_max[row];
        let new_max = f32::max(previous_max, chunk_max);
        running_sum[row] = running_sum[row] * f32::exp(previous_max - new_max) + chunk_sum * f32::exp(chunk_max - new_max);
        running_max[row] = new_max;
    }
    let width = labels.shape(1);
    let start = chunk_start as usize;
    let mut slot = unit;
    while slot < width {
        let label = u32::cast_from(labels[row * width + slot]) as usize;
        if label >= start && label < start + chunk {
            label_logits[row * width + slot] = f32::cast_from(logits[first + label - start]);
        }
        slot += units;
    }
}

#[cube(launch)]
fn finish_kernel<F: Float>(running_max: &Tensor<f32>, running_sum: &Tensor<f32>, label_logits: &Tensor<f32>, output: &mut Tensor<F>, width: u32, #[define(F)] _dtype: StorageType) {
    let index = cube_index() * CUBE_DIM_X as usize + UNIT_POS_X as usize;
    if index < output.len() {
        let row = index / width as usize;
        let log_normalizer = running_max[row] + f32::ln(running_sum[row]);
        output[index] = F::cast_from(label_logits[index] - log_normalizer);
    }
}
