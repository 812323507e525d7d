//! [`ScoringBackend`] on the CPU (burn-ndarray), with host kernels of tally's own on the hot
//! paths Burn's ops run slowly there (each op a pass over memory, allocating its result, many on
//! one core):
//! - weight matrices stay in their file's format ([`BlockMatrix`]: quantised blocks, 16-bit
//!   floats), multiplied a panel of rows at a time, each core dequantising and multiplying its
//!   own panels ([`matmul`]) — a model needs its file's size in memory, not four to eight times it;
//! - multi-item attention (`--attention kernel`, [`attention`]): one softmax per row over its
//!   prefix and its own item, blocks of rows spread over the cores;
//! - the elementwise steps (`--elementwise kernels`, [`elementwise`]): one pass per step.
//!
//! `--attention cascade` and `--elementwise burn` run the plain Burn ops, the reference.

mod attention;
mod elementwise;
mod matmul;

use std::ops::Range;

use burn::backend::ndarray::NdArrayTensor;
use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use ndarray::Axis;

use self::attention::{HostAttentionPlan, Operands};
use super::{BlockWeight, PlannedAttention, ScoringBackend};
use crate::attention::PaddedPlan;
use crate::blocks::BlockMatrix;
use crate::kv::PrefixKv;
use crate::layout::ItemLayout;
use crate::matmul::Matmul;
use crate::route::{AttentionRoute, LabelRoute, Routes};

type Cpu = NdArray<f32>;

impl Matmul for NdArray<f32> {}

impl BlockWeight for BlockMatrix {
    fn rows(&self) -> usize {
        BlockMatrix::rows(self)
    }

    fn stored_bytes(&self) -> usize {
        BlockMatrix::stored_bytes(self)
    }
}

impl ScoringBackend for NdArray<f32> {
    type BlockWeight = BlockMatrix;

    fn block_weight(matrix: BlockMatrix, _device: &Self::Device) -> Option<BlockMatrix> {
        Some(matrix)
    }

    fn block_matmul(x: Tensor<Self, 2>, w: &BlockMatrix, rows: Range<usize>) -> Tensor<Self, 2> {
        let device = x.device();
        let [m, k] = x.dims();
        assert_eq!(k, w.cols(), "x · wᵀ needs x's width to be w's");
        let x = host(x);
        let panel = matmul::panel_rows(rows.len(), k, rayon::current_num_threads());
        let out = matmul::matmul_transposed(&x, m, w, rows.clone(), panel);
        Tensor::from_data(TensorData::new(out, [m, rows.len()]), &device)
    }

    fn block_rows(w: &BlockMatrix, ids: &[u32], device: &Self::Device) -> Tensor<Self, 2> {
        let values = w.dequantize_rows(ids.iter().map(|&id| id as usize));
        Tensor::from_data(TensorData::new(values, [ids.len(), w.cols()]), device)
    }

    /// Host kernels for attention (the tiled kernel's tile shapes mean nothing here: its own
    /// blocks) and the elementwise steps, as asked; the label log-sum-exp is Burn's ops.
    fn routes(requested: Routes) -> Routes {
        let attention = match requested.attention {
            AttentionRoute::Cascade => AttentionRoute::Cascade,
            AttentionRoute::Kernel | AttentionRoute::Tiled(_) | AttentionRoute::Flash(_) => AttentionRoute::Kernel,
        };
        Routes { attention, elementwise: requested.elementwise, labels: LabelRoute::Burn }
    }

    fn plan_attention(routes: Routes, layout: &ItemLayout, prefix_spans: &[(usize, usize)], group: usize, device: &Self::Device) -> Box<dyn PlannedAttention<Self>> {
        match routes.attention {
            AttentionRoute::Cascade => Box::new(PaddedPlan::<Self>::new(layout, prefix_spans, group, device)),
            AttentionRoute::Kernel | AttentionRoute::Tiled(_) | AttentionRoute::Flash(_) => Box::new(HostAttentionPlan::new(layout, prefix_spans, group)),
        }
    }

    fn add_rms_norm<const D: usize>(x: Tensor<Self, D>, delta: Option<Tensor<Self, D>>, gain: &Tensor<Self, 1>, eps: f64) -> (Tensor<Self, D>, Tensor<Self, D>) {
        let (shape, device) = (x.dims(), x.device());
        let mut sum = host(x);
        let normed = elementwise::add_rms_norm(&mut sum, delta.map(host).as_deref(), &host(gain.clone()), eps as f32);
        (tensor(sum, shape, &device), tensor(normed, shape, &device))
    }

    fn norm_rope(x: Tensor<Self, 3>, gain: Option<&Tensor<Self, 1>>, cos: &Tensor<Self, 3>, sin: &Tensor<Self, 3>, eps: f64) -> Tensor<Self, 3> {
        let (shape, device) = (x.dims(), x.device());
        let mut values = host(x);
        let gain = gain.map(|gain| host(gain.clone()));
        elementwise::norm_rope(&mut values, shape[2], gain.as_deref(), &host(cos.clone()), &host(sin.clone()), eps as f32);
        tensor(values, shape, &device)
    }

    fn silu_mul(gate_up: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let ([rows, width], device) = (gate_up.dims(), gate_up.device());
        tensor(elementwise::silu_mul(&host(gate_up), width / 2), [rows, width / 2], &device)
    }
}

impl PlannedAttention<Cpu> for HostAttentionPlan {
    fn run(&self, queries: Tensor<Cpu, 3>, keys: Tensor<Cpu, 3>, values: Tensor<Cpu, 3>, prefix: &PrefixKv<Cpu>) -> Tensor<Cpu, 3> {
        let (shape, device) = (queries.dims(), queries.device());
        let [_, kv_heads, head_dim] = keys.dims();
        let (queries, keys, values) = (host(queries), host(keys), host(values));
        let (prefix_keys, prefix_values) = (host(prefix.keys.clone()), host(prefix.values.clone()));
        let operands = Operands { queries: &queries, keys: &keys, values: &values, prefix_keys: &prefix_keys, prefix_values: &prefix_values, prefix_tokens: prefix.len(), kv_heads, head_dim };
        tensor(HostAttentionPlan::run(self, &operands), shape, &device)
    }

    fn launched(&self, _head_dim: usize) -> String {
        "host blocks of rows".into()
    }
}

/// An output buffer's first element, shared by the threads of a host kernel, each of which
/// writes its own disjoint part of it (a matmul's panel columns, attention's (rows, head) blocks).
struct SharedOutput(*mut f32);

// SAFETY: the kernels hand each part of the output to one task only, so sharing the pointer
// between threads never lets two of them write one element.
unsafe impl Send for SharedOutput {}
unsafe impl Sync for SharedOutput {}

impl SharedOutput {
    fn at(&self, offset: usize) -> *mut f32 {
        // SAFETY: callers pass an offset inside the output.
        unsafe { self.0.add(offset) }
    }
}

/// A tensor's values, row-major: its own buffer where the tensor is the only owner of a
/// contiguous one, else copied — a lane at a time where it is a strided view (the decoder's q/k/v
/// are column ranges of the fused projection). Burn's `into_data` copies both of the latter an
/// element at a time through a dynamic-rank iterator: 8% of a Qwen3-0.6B score.
fn host<const D: usize>(x: Tensor<Cpu, D>) -> Vec<f32> {
    let primitive = x.into_primitive().tensor();
    let NdArrayTensor::F32(storage) = &primitive else {
        panic!("float32 tensors on the CPU backend");
    };
    let view = storage.view();
    if let Some(values) = view.as_slice() {
        if !storage.is_unique() {
            return values.to_vec();
        }
        // The buffer itself, no copy.
        let tensor = Tensor::<Cpu, D>::from_primitive(TensorPrimitive::Float(primitive));
        return tensor.into_data().into_vec::<f32>().expect("float32 tensors on the CPU backend");
    }
    let mut values = Vec::with_capacity(view.len());
    for lane in view.lanes(Axis(view.ndim() - 1)) {
        match lane.as_slice() {
            Some(lane) => values.extend_from_slice(lane),
            None => values.extend(lane.iter().copied()),
        }
    }
    values
}

fn tensor<const D: usize>(values: Vec<f32>, shape: [usize; D], device: &burn::backend::ndarray::NdArrayDevice) -> Tensor<Cpu, D> {
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// Seeded inputs for the host kernels' tests, which check them against Burn's ops.
#[cfg(test)]
mod test_support {
    use burn::tensor::{Tensor, TensorData};

    pub type Cpu = super::Cpu;

    /// Seeded uniform values in `[-scale, scale)`.
    pub fn random(seed: u64, count: usize, scale: f32) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..count)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    pub fn tensor<const D: usize>(values: &[f32], shape: [usize; D]) -> Tensor<Cpu, D> {
        Tensor::from_data(TensorData::new(values.to_vec(), shape), &Default::default())
    }
}
