//! [`ScoringBackend`] on CubeCL backends (wgpu, CUDA): the kernels of `tally-shaders`, on
//! plain `CubeBackend`s and through Burn's fusion layer (the default `Wgpu`/`Cuda` types).

use std::any::Any;
use std::sync::Mutex;

use burn::tensor::{backend::Backend, DType, Tensor, TensorData, TensorPrimitive};
use burn_cubecl::cubecl::{prelude::ComputeClient, server::CopyDescriptor};
use burn_cubecl::kernel::into_contiguous_aligned;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{client::GlobalFusionClient, stream::OperationStreams, Fusion, FusionBackend, NoOp};
use burn_ir::{InitOperationIr, OperationIr};
use tally_shaders::{add_rms_norm, chosen_matmul, norm_rope, routes_to_block, silu_mul, cublas_matmul, f32_matmul, free_device_memory, matmul_rounds_to_tf32, routes_to_cublas, softmax_lse, wide_product_dtype, AttentionKernel, AttentionTiles, MultiItemAttention, StreamedLabelLogprobs};

use super::stored::{Limits, StoredMatrix};
use super::{DeviceRead, DeviceReadError, PlannedAttention, ScoringBackend};
use crate::blocks::BlockMatrix;
use crate::attention::PaddedPlan;
use crate::kv::PrefixKv;
use crate::labels::LabelTable;
use crate::layout::ItemLayout;
use crate::lm_head::VOCAB_CHUNK;
use crate::matmul::Matmul;
use crate::route::{AttentionRoute, ElementwiseRoute, Routes};

impl<R, F, I, BT> ScoringBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    /// GGUF blocks and (when computing in float32) 16-bit weights stay compact on the device.
    type BlockWeight = StoredMatrix<R>;

    fn block_weight(matrix: BlockMatrix, device: &R::Device) -> Option<StoredMatrix<R>> {
        StoredMatrix::pack(&matrix, F::dtype(), Limits::DEFAULT, &R::client(device), device)
    }

    fn block_matmul(x: Tensor<Self, 2>, w: &StoredMatrix<R>, rows: std::ops::Range<usize>) -> Tensor<Self, 2> {
        w.matmul(x, rows, Self::matmul)
    }

    fn block_rows(w: &StoredMatrix<R>, ids: &[u32], _device: &R::Device) -> Tensor<Self, 2> {
        w.rows(ids, F::dtype())
    }

    /// Every route has its kernel here.
    fn routes(requested: Routes) -> Routes {
        requested
    }

    fn plan_attention(routes: Routes, layout: &ItemLayout, prefix_spans: &[(usize, usize)], group: usize, device: &R::Device) -> Box<dyn PlannedAttention<Self>> {
        let kernel = match routes.attention {
            AttentionRoute::Cascade => return Box::new(cascade::<Self>(routes, layout, prefix_spans, group, device)),
            AttentionRoute::Kernel => AttentionKernel::Rows,
            AttentionRoute::Tiled(shape) => AttentionKernel::Tiled(shape),
            AttentionRoute::Flash(shape) => AttentionKernel::Flash(shape),
        };
        let item_prefixes: Vec<(usize, usize)> = layout.item_groups().map(|g| prefix_spans[g]).collect();
        Box::new(AttentionTiles::new(&R::client(device), device, layout.offsets(), &item_prefixes, group, kernel))
    }

    /// Kernels compile and matmuls tune per shape class: see [`tally_shaders::autotune`].
    fn warmup_rows(largest: usize) -> Vec<usize> {
        tally_shaders::autotune::warmup_rows(largest)
    }

    fn free_memory(device: &R::Device) -> Option<u64> {
        free_device_memory::<R>(device)
    }

    fn overlaps_issue_with_work() -> bool {
        true
    }

    /// CubeCL queues the copy (and, on CUDA, an event after it) when the read is asked for;
    /// the future only waits for it.
    fn start_read<const D: usize>(tensor: Tensor<Self, D>) -> DeviceRead {
        let tensor = into_contiguous_aligned(tensor.into_primitive().tensor());
        let (shape, strides, dtype, elem_size) = (tensor.meta.shape().clone(), tensor.meta.strides().clone(), tensor.dtype, tensor.elem_size());
        let client = lasting_client::<R>(&tensor.device);
        let descriptor = CopyDescriptor::new(tensor.handle.binding(), shape.clone(), strides, elem_size);
        let bytes = client.read_one_tensor_async(descriptor);
        Box::pin(async move {
            let bytes = bytes.await.map_err(|error| DeviceReadError(error.to_string()))?;
            Ok(TensorData::from_bytes(bytes, shape, dtype))
        })
    }

    fn max_buffer_bytes(device: &R::Device) -> Option<u64> {
        Some(R::client(device).properties().memory.max_page_size)
    }

    fn add_rms_norm<const D: usize>(x: Tensor<Self, D>, delta: Option<Tensor<Self, D>>, gain: &Tensor<Self, 1>, eps: f64) -> (Tensor<Self, D>, Tensor<Self, D>) {
        let delta = delta.map(|delta| delta.into_primitive().tensor());
        let (sum, normed) = add_rms_norm(x.into_primitive().tensor(), delta, gain.clone().into_primitive().tensor(), eps);
        (Tensor::from_primitive(TensorPrimitive::Float(sum)), Tensor::from_primitive(TensorPrimitive::Float(normed)))
    }

    fn norm_rope(x: Tensor<Self, 3>, gain: Option<&Tensor<Self, 1>>, cos: &Tensor<Self, 3>, sin: &Tensor<Self, 3>, eps: f64) -> Tensor<Self, 3> {
        let primitive = |t: &Tensor<Self, 3>| t.clone().into_primitive().tensor();
        let gain = gain.map(|gain| gain.clone().into_primitive().tensor());
        Tensor::from_primitive(TensorPrimitive::Float(norm_rope(x.into_primitive().tensor(), gain, primitive(cos), primitive(sin), eps)))
    }

    fn silu_mul(gate_up: Tensor<Self, 2>) -> Tensor<Self, 2> {
        Tensor::from_primitive(TensorPrimitive::Float(silu_mul(gate_up.into_primitive().tensor())))
    }

    fn softmax_lse(scores: Tensor<Self, 2>, weights_dtype: DType) -> (Tensor<Self, 2>, Tensor<Self, 2>) {
        let (weights, lse) = softmax_lse(scores.into_primitive().tensor(), weights_dtype);
        (Tensor::from_primitive(TensorPrimitive::Float(weights)), Tensor::from_primitive(TensorPrimitive::Float(lse)))
    }

    fn label_logprobs(hidden: Tensor<Self, 2>, head: Tensor<Self, 2>, labels: &LabelTable) -> Tensor<Self, 2> {
        let dtype = hidden.dtype();
        let vocab = head.dims()[0];
        let mut stream = StreamedLabelLogprobs::new(labels.to_tensor::<Self>(&hidden.device()).into_primitive());
        for start in (0..vocab).step_by(VOCAB_CHUNK) {
            let chunk = VOCAB_CHUNK.min(vocab - start);
            let logits = Self::matmul(hidden.clone(), head.clone().narrow(0, start, chunk).transpose());
            stream.add_chunk(logits.into_primitive().tensor());
        }
        Tensor::from_primitive(TensorPrimitive::Float(stream.finish(dtype)))
    }
}

/// The cascade on a CubeCL backend: its softmaxes in tally's kernel on the elementwise kernels'
/// route, in Burn's ops (fused where the backend fuses) otherwise.
fn cascade<B: ScoringBackend>(routes: Routes, layout: &ItemLayout, prefix_spans: &[(usize, usize)], group: usize, device: &B::Device) -> PaddedPlan<B> {
    let plan = PaddedPlan::new(layout, prefix_spans, group, device);
    match routes.elementwise {
        ElementwiseRoute::Kernels => plan.with_softmax(B::softmax_lse),
        ElementwiseRoute::Burn => plan,
    }
}

impl<R, F, I, BT> Matmul for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    /// cuBLASLt, or tally's register-block kernel (or the kernel chosen for the shape class), where
    /// that route is picked; else Burn's autotuned matmul, except for float32 where that would round to
    /// tf32 (tally's float32 unit matmul then).
    fn matmul<const D: usize>(lhs: Tensor<Self, D>, rhs: Tensor<Self, D>) -> Tensor<Self, D> {
        let (dtype, device) = (lhs.dtype(), lhs.device());
        if !Self::replaces_matmul(dtype, &device) {
            return autotuned_matmul(lhs, rhs);
        }
        let (lhs, rhs) = (lhs.into_primitive().tensor(), rhs.into_primitive().tensor());
        let routed = if routes_to_cublas::<R>(dtype) {
            cublas_matmul(&lhs, &rhs, dtype)
        } else if routes_to_block(dtype) {
            chosen_matmul(&lhs, &rhs)
        } else {
            None
        };
        let product = match routed {
            Some(product) => product,
            None if matmul_rounds_to_tf32(&R::client(&device), dtype) => f32_matmul(lhs, rhs),
            None => return autotuned_matmul(Tensor::from_primitive(TensorPrimitive::Float(lhs)), Tensor::from_primitive(TensorPrimitive::Float(rhs))),
        };
        Tensor::from_primitive(TensorPrimitive::Float(product))
    }

    /// cuBLASLt writes float32 from 16-bit operands on its route.
    fn matmul_wide<const D: usize>(lhs: Tensor<Self, D>, rhs: Tensor<Self, D>) -> Tensor<Self, D> {
        let (dtype, wide) = (lhs.dtype(), Self::wide_dtype(lhs.dtype()));
        if wide != dtype {
            let product = cublas_matmul(&lhs.clone().into_primitive().tensor(), &rhs.clone().into_primitive().tensor(), wide);
            if let Some(product) = product {
                return Tensor::from_primitive(TensorPrimitive::Float(product));
            }
        }
        Self::matmul(lhs, rhs)
    }

    fn wide_dtype(dtype: DType) -> DType {
        wide_product_dtype::<R>(dtype)
    }

    fn replaces_matmul(dtype: DType, device: &R::Device) -> bool {
        routes_to_cublas::<R>(dtype) || routes_to_block(dtype) || matmul_rounds_to_tf32(&R::client(device), dtype)
    }
}

/// The row and tiled kernels, reading the joined prefix at the spans their tiles were planned with.
impl<R, F, I, BT> PlannedAttention<CubeBackend<R, F, I, BT>> for AttentionTiles<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn run(&self, queries: Tensor<CubeBackend<R, F, I, BT>, 3>, keys: Tensor<CubeBackend<R, F, I, BT>, 3>, values: Tensor<CubeBackend<R, F, I, BT>, 3>, prefix: &PrefixKv<CubeBackend<R, F, I, BT>>) -> Tensor<CubeBackend<R, F, I, BT>, 3> {
        let attention = MultiItemAttention {
            queries: queries.into_primitive().tensor(),
            keys: keys.into_primitive().tensor(),
            values: values.into_primitive().tensor(),
            prefix_keys: prefix.keys.clone().into_primitive().tensor(),
            prefix_values: prefix.values.clone().into_primitive().tensor(),
            tiles: self,
        };
        Tensor::from_primitive(TensorPrimitive::Float(attention.run()))
    }

    fn launched(&self, head_dim: usize) -> String {
        AttentionTiles::launched(self, head_dim, F::dtype())
    }
}

/// Through fusion: settle the inputs, run the inner backend's kernels, hand the result back to
/// the fusion stream as a fresh tensor.
impl<B: ScoringBackend + FusionBackend> ScoringBackend for Fusion<B> {
    type BlockWeight = B::BlockWeight;

    fn block_weight(matrix: BlockMatrix, device: &B::Device) -> Option<B::BlockWeight> {
        B::block_weight(matrix, device)
    }

    fn block_matmul(x: Tensor<Self, 2>, w: &B::BlockWeight, rows: std::ops::Range<usize>) -> Tensor<Self, 2> {
        let client = fusion_client(&x);
        into_fusion(B::block_matmul(settle(x), w, rows), &client)
    }

    fn block_rows(w: &B::BlockWeight, ids: &[u32], device: &B::Device) -> Tensor<Self, 2> {
        into_fusion(B::block_rows(w, ids, device), &burn_fusion::get_client::<B>(device))
    }

    fn routes(requested: Routes) -> Routes {
        B::routes(requested)
    }

    /// The cascade on the fusion stream itself (its ops fuse); the inner backend's kernels
    /// between settled inputs and a fresh output.
    fn plan_attention(routes: Routes, layout: &ItemLayout, prefix_spans: &[(usize, usize)], group: usize, device: &B::Device) -> Box<dyn PlannedAttention<Self>> {
        match routes.attention {
            AttentionRoute::Cascade => Box::new(cascade::<Self>(routes, layout, prefix_spans, group, device)),
            _ => Box::new(SettledAttention(B::plan_attention(routes, layout, prefix_spans, group, device))),
        }
    }

    fn warmup_rows(largest: usize) -> Vec<usize> {
        B::warmup_rows(largest)
    }

    fn free_memory(device: &B::Device) -> Option<u64> {
        B::free_memory(device)
    }

    fn max_buffer_bytes(device: &B::Device) -> Option<u64> {
        B::max_buffer_bytes(device)
    }

    /// The tensor's queued operations flushed, then the inner backend's read, queued at once.
    fn start_read<const D: usize>(tensor: Tensor<Self, D>) -> DeviceRead {
        B::start_read(settle(tensor))
    }

    fn overlaps_issue_with_work() -> bool {
        B::overlaps_issue_with_work()
    }

    fn add_rms_norm<const D: usize>(x: Tensor<Self, D>, delta: Option<Tensor<Self, D>>, gain: &Tensor<Self, 1>, eps: f64) -> (Tensor<Self, D>, Tensor<Self, D>) {
        let client = fusion_client(&x);
        let (sum, normed) = B::add_rms_norm(settle(x), delta.map(settle), &settle(gain.clone()), eps);
        (into_fusion(sum, &client), into_fusion(normed, &client))
    }

    fn norm_rope(x: Tensor<Self, 3>, gain: Option<&Tensor<Self, 1>>, cos: &Tensor<Self, 3>, sin: &Tensor<Self, 3>, eps: f64) -> Tensor<Self, 3> {
        let client = fusion_client(&x);
        let gain = gain.map(|gain| settle(gain.clone()));
        into_fusion(B::norm_rope(settle(x), gain.as_ref(), &settle(cos.clone()), &settle(sin.clone()), eps), &client)
    }

    fn silu_mul(gate_up: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let client = fusion_client(&gate_up);
        into_fusion(B::silu_mul(settle(gate_up)), &client)
    }

    fn softmax_lse(scores: Tensor<Self, 2>, weights_dtype: DType) -> (Tensor<Self, 2>, Tensor<Self, 2>) {
        let client = fusion_client(&scores);
        let (weights, lse) = B::softmax_lse(settle(scores), weights_dtype);
        (into_fusion(weights, &client), into_fusion(lse, &client))
    }

    fn label_logprobs(hidden: Tensor<Self, 2>, head: Tensor<Self, 2>, labels: &LabelTable) -> Tensor<Self, 2> {
        let client = fusion_client(&hidden);
        into_fusion(B::label_logprobs(settle(hidden), settle(head), labels), &client)
    }
}

impl<B: Matmul + FusionBackend> Matmul for Fusion<B> {
    /// Through fusion only where the inner backend replaces the matmul: a settled matmul is
    /// one the fusion stream cannot fuse its neighbours into.
    fn matmul<const D: usize>(lhs: Tensor<Self, D>, rhs: Tensor<Self, D>) -> Tensor<Self, D> {
        if !B::replaces_matmul(lhs.dtype(), &lhs.device()) {
            return autotuned_matmul(lhs, rhs);
        }
        let client = fusion_client(&lhs);
        into_fusion(B::matmul(settle(lhs), settle(rhs)), &client)
    }

    fn matmul_wide<const D: usize>(lhs: Tensor<Self, D>, rhs: Tensor<Self, D>) -> Tensor<Self, D> {
        if !B::replaces_matmul(lhs.dtype(), &lhs.device()) {
            return Self::matmul(lhs, rhs);
        }
        let client = fusion_client(&lhs);
        into_fusion(B::matmul_wide(settle(lhs), settle(rhs)), &client)
    }

    fn wide_dtype(dtype: DType) -> DType {
        B::wide_dtype(dtype)
    }

    fn replaces_matmul(dtype: DType, device: &B::Device) -> bool {
        B::replaces_matmul(dtype, device)
    }
}

/// The inner backend's attention kernel, run through fusion.
struct SettledAttention<B: Backend>(Box<dyn PlannedAttention<B>>);

impl<B: FusionBackend> PlannedAttention<Fusion<B>> for SettledAttention<B> {
    fn run(&self, queries: Tensor<Fusion<B>, 3>, keys: Tensor<Fusion<B>, 3>, values: Tensor<Fusion<B>, 3>, prefix: &PrefixKv<Fusion<B>>) -> Tensor<Fusion<B>, 3> {
        let client = fusion_client(&queries);
        let prefix = PrefixKv { keys: settle(prefix.keys.clone()), values: settle(prefix.values.clone()) };
        into_fusion(self.0.run(settle(queries), settle(keys), settle(values), &prefix), &client)
    }

    fn launched(&self, head_dim: usize) -> String {
        self.0.launched(head_dim)
    }
}

/// `lhs · rhs` through Burn's autotuned matmul, past one of its candidates' defect: cubek 0.2's
/// `DoubleUnit` matmul (on every CubeCL runtime) multiplies wrong (off by 0.1 – 1 relative) when
/// the inner dimension is an odd multiple of 8 and the operands are batched or the right-hand
/// side is transposed — the cascade's shapes (head_dim 24; 600 prefix keys). Autotune picks it
/// when it is fastest, right or not. Zero columns and rows that take the inner dimension to a
/// multiple of 16 leave the product exact and dodge it; the model's linears (inner dimension a
/// multiple of 16) never pay for them.
fn autotuned_matmul<B: Backend, const D: usize>(lhs: Tensor<B, D>, rhs: Tensor<B, D>) -> Tensor<B, D> {
    let inner = lhs.dims()[D - 1];
    if inner % 16 != 8 {
        return lhs.matmul(rhs);
    }
    let lhs_zeros = lhs.clone().narrow(D - 1, 0, 8).zeros_like();
    let rhs_zeros = rhs.clone().narrow(D - 2, 0, 8).zeros_like();
    Tensor::cat(vec![lhs, lhs_zeros], D - 1).matmul(Tensor::cat(vec![rhs, rhs_zeros], D - 2))
}

/// A client of `device` kept for the life of the process, one a device and runtime. CubeCL's
/// read futures borrow the client that started them (an edition-2024 `impl Future` captures
/// `&self`) though they hold nothing of it, and a read started for a pass must outlive the call
/// that started it ([`ScoringBackend::start_read`]). CubeCL keeps its own clients for the
/// process too; this is one more handle to the same device a runtime already keeps.
fn lasting_client<R: CubeRuntime>(device: &R::Device) -> &'static ComputeClient<R> {
    static CLIENTS: Mutex<Vec<Box<dyn Any + Send + Sync>>> = Mutex::new(Vec::new());
    let mut clients = CLIENTS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let kept = clients.iter().filter_map(|entry| entry.downcast_ref::<(R::Device, &'static ComputeClient<R>)>()).find(|(kept, _)| kept == device);
    if let Some(&(_, client)) = kept {
        return client;
    }
    let client: &'static ComputeClient<R> = Box::leak(Box::new(R::client(device)));
    clients.push(Box::new((device.clone(), client)));
    client
}

fn fusion_client<B: FusionBackend, const D: usize>(tensor: &Tensor<Fusion<B>, D>) -> GlobalFusionClient<B::FusionRuntime> {
    tensor.clone().into_primitive().tensor().client.clone()
}

/// The inner backend's tensor, after every queued operation that produces it has run.
fn settle<B: FusionBackend, const D: usize>(tensor: Tensor<Fusion<B>, D>) -> Tensor<B, D> {
    let primitive = tensor.into_primitive().tensor();
    Tensor::from_primitive(TensorPrimitive::Float(primitive.client.clone().resolve_tensor_float::<B>(primitive)))
}

fn into_fusion<B: FusionBackend, const D: usize>(tensor: Tensor<B, D>, client: &GlobalFusionClient<B::FusionRuntime>) -> Tensor<Fusion<B>, D> {
    let primitive = tensor.into_primitive().tensor();
    let (shape, dtype) = (burn::tensor::TensorMetadata::shape(&primitive), burn::tensor::TensorMetadata::dtype(&primitive));
    let handle = B::float_tensor_handle(primitive);
    let init = InitOperationIr::create(shape, dtype, || client.register_tensor_handle(handle));
    let mut outputs = client.register(OperationStreams::default(), OperationIr::Init(init), NoOp::<B>::new());
    Tensor::from_primitive(TensorPrimitive::Float(outputs.remove(0)))
}
