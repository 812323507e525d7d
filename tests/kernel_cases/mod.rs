//! Shared by the kernel tests: seeded random problems, the plain Burn reference on the CPU,
//! and the kernels called directly with poisoned outputs.

#![allow(dead_code)] // each test binary uses its own subset

use burn::backend::NdArray;
use burn::tensor::{backend::Backend, Tensor, TensorData, TensorPrimitive};
use burn_cubecl::cubecl::zspace::metadata::Metadata;
use burn_cubecl::cubecl::Runtime;
use burn_cubecl::{tensor::CubeTensor, CubeBackend, CubeRuntime, FloatElement};
use tally_model::{AttentionRoute, ElementwiseRoute, ItemLayout, LabelRoute, PrefixKv, Routes, ScoringBackend};
use tally_shaders::{AttentionKernel, AttentionTiles, FragmentLoads, KvStaging, MultiItemAttention, TileShape};

pub type Reference = NdArray<f32>;

/// The runtime the kernels are tested on: wgpu's default adapter (lavapipe in CI), or CUDA with
/// feature `cuda` (the GPU suite).
#[cfg(not(feature = "cuda"))]
pub type GpuRuntime = burn::backend::wgpu::WgpuRuntime;
#[cfg(feature = "cuda")]
pub type GpuRuntime = burn_cubecl::cubecl::cuda::CudaRuntime;

/// The plain CubeCL backend (what the browser runs), float type `F`.
pub type Gpu<F = f32> = CubeBackend<GpuRuntime, F, i32, u32>;
/// The same through Burn's fusion layer (what `--backend wgpu` / `cuda` runs).
#[cfg(not(feature = "cuda"))]
pub type Fused<F = f32> = burn::backend::Wgpu<F>;
#[cfg(feature = "cuda")]
pub type Fused<F = f32> = burn::backend::Cuda<F>;

/// Puts the process back on CubeCL's matmuls, nothing forced (and cuBLASLt's wide products in
/// float32), however a test ends.
pub struct CubeclAfter;

impl Drop for CubeclAfter {
    fn drop(&mut self) {
        tally_shaders::force_matmul(None);
        tally_shaders::set_matmul_route(tally_shaders::MatmulRoute::Cubecl);
        tally_shaders::set_wide_products_in_float32(true);
    }
}

/// Both ways the tensor-core tiles read their fragments.
pub const FRAGMENT_LOADS: [FragmentLoads; 2] = [FragmentLoads::Ldmatrix, FragmentLoads::Elements];

/// Every way the flash kernel's two stages bring the next key step in (`cp.async` on tensor
/// cores only, with one barrier a step or two a buffer: elsewhere a call asking for it reads
/// into registers).
pub const KV_STAGINGS: [KvStaging; 3] = [KvStaging::Registers, KvStaging::CopyAsync, KvStaging::CopyAsyncSplit];

/// Every tile shape the kernels are built for: [`TileShape::ROWS`] × [`TileShape::KEYS`] ×
/// [`TileShape::STAGES`], fragments by `ldmatrix`.
pub fn every_tile_shape() -> impl Iterator<Item = TileShape> {
    TileShape::ROWS.into_iter().flat_map(|rows| {
        TileShape::KEYS.into_iter().flat_map(move |keys| TileShape::STAGES.map(|stages| TileShape::new(rows, keys).and_then(|shape| shape.with_stages(stages)).expect("a built shape")))
    })
}

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

pub fn tensor<B: Backend, const D: usize>(values: &[f32], shape: [usize; D]) -> Tensor<B, D> {
    if values.is_empty() {
        // As the model makes an empty prefix: CUDA refuses to upload data of zero elements (their
        // strides are not a pitched row-major layout).
        return Tensor::empty(shape, &Default::default());
    }
    Tensor::from_data(TensorData::new(values.to_vec(), shape), &Default::default())
}

pub fn host<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    tensor.into_data().convert::<f32>().to_vec().unwrap()
}

pub fn cube<R: CubeRuntime, F: FloatElement, const D: usize>(tensor: Tensor<CubeBackend<R, F, i32, u32>, D>) -> CubeTensor<R> {
    tensor.into_primitive().tensor()
}

/// NaN everywhere, contiguous: uploaded flat and reshaped, since CUDA pads the rows of a new
/// tensor to an alignment (a 24-wide float32 row takes 32) and the kernels write contiguous outputs.
pub fn poisoned<F: FloatElement, const D: usize>(shape: [usize; D]) -> CubeTensor<GpuRuntime> {
    let count = shape.iter().product();
    cube(tensor::<Gpu<F>, 1>(&vec![f32::NAN; count], [count]).reshape(shape))
}

/// `max |got − expected| / max |expected|`; NaN anywhere fails.
pub fn assert_close(got: &[f32], expected: &[f32], tolerance: f32, what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: lengths");
    assert!(got.iter().all(|v| v.is_finite()), "{what}: the kernel left elements unwritten or non-finite: {:?} vs {:?}", &got[..got.len().min(12)], &expected[..expected.len().min(12)]);
    let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    let error = got.iter().zip(expected).fold(0f32, |m, (g, e)| m.max((g - e).abs())) / scale;
    assert!(error <= tolerance, "{what}: relative error {error:e} > {tolerance:e}");
}

/// One attention problem: groups of (prefix length, item lengths), heads and head size.
#[derive(Default)]
pub struct Case {
    pub groups: Vec<(usize, Vec<usize>)>,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Each prefix's keys scaled up along it (by 1 + 4 · position / length): its later keys'
    /// scores pass the earlier ones' maxima by more than the flash kernel's slack, so a row's
    /// running maximum moves and its output is rescaled after it has summed some of the prefix.
    pub rising_keys: bool,
}

impl Case {
    pub fn name(&self) -> String {
        let prefixes: Vec<usize> = self.groups.iter().map(|(p, _)| *p).collect();
        let items: usize = self.groups.iter().map(|(_, items)| items.len()).sum();
        format!("prefixes {prefixes:?}, {items} items, {}q/{}kv heads, head_dim {}", self.q_heads, self.kv_heads, self.head_dim)
    }

    pub fn layout(&self) -> ItemLayout {
        ItemLayout::new(self.groups.iter().map(|(prefix, items)| (*prefix, items.as_slice())))
    }

    /// (queries, keys, values, per-group prefix keys and values), host-side, seeded.
    #[allow(clippy::type_complexity)]
    pub fn inputs(&self, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<(Vec<f32>, Vec<f32>)>) {
        let tokens = self.layout().tokens();
        let (q, kv, d) = (self.q_heads, self.kv_heads, self.head_dim);
        // Sharp scores: a scale of 2 makes softmax rows far from uniform.
        let prefixes = self
            .groups
            .iter()
            .enumerate()
            .map(|(g, (len, _))| {
                let mut keys = random(seed + 10 + g as u64, kv * len * d, 2.0);
                if self.rising_keys {
                    // `[kv, len, d]`: position `i / d % len`.
                    for (i, key) in keys.iter_mut().enumerate() {
                        *key *= 1.0 + 4.0 * (i / d % len) as f32 / *len as f32;
                    }
                }
                (keys, random(seed + 20 + g as u64, kv * len * d, 1.0))
            })
            .collect();
        (random(seed, tokens * q * d, 2.0), random(seed + 1, tokens * kv * d, 2.0), random(seed + 2, tokens * kv * d, 1.0), prefixes)
    }

    /// The plain Burn path on the CPU: the reference.
    pub fn expected(&self, seed: u64) -> Vec<f32> {
        self.plain_on::<Reference>(seed)
    }
    /// What `kernel` runs for this case in float type `F` (`AttentionTiles::launched`).
    pub fn launched<F: FloatElement>(&self, kernel: AttentionKernel) -> String {
        let layout = self.layout();
        let item_prefixes = vec![(0, 1); layout.offsets().len() - 1];
        let device = Default::default();
        let client = GpuRuntime::client(&device);
        let tiles = AttentionTiles::<GpuRuntime>::new(&client, &device, layout.offsets(), &item_prefixes, self.q_heads / self.kv_heads, kernel);
        tiles.launched(self.head_dim, <F as burn::tensor::Element>::dtype())
    }

    /// `kernel` in float type `F`, called directly with a poisoned output.
    pub fn kernel<F: FloatElement>(&self, seed: u64, kernel: AttentionKernel) -> Vec<f32> {
        let (queries, keys, values, _) = self.inputs(seed);
        let (prefix, spans) = self.joined_prefix_on::<Gpu<F>>(seed);
        let layout = self.layout();
        let (t, q, kv, d) = (layout.tokens(), self.q_heads, self.kv_heads, self.head_dim);
        let item_prefixes: Vec<(usize, usize)> = layout.item_groups().map(|g| spans[g]).collect();
        let device = Default::default();
        let tiles = AttentionTiles::<GpuRuntime>::new(&GpuRuntime::client(&device), &device, layout.offsets(), &item_prefixes, q / kv, kernel);
        let output = poisoned::<F, 3>([t, q, d]);
        MultiItemAttention {
            queries: cube(tensor::<Gpu<F>, 3>(&queries, [t, q, d])),
            keys: cube(tensor::<Gpu<F>, 3>(&keys, [t, kv, d])),
            values: cube(tensor::<Gpu<F>, 3>(&values, [t, kv, d])),
            prefix_keys: cube(prefix.keys),
            prefix_values: cube(prefix.values),
            tiles: &tiles,
        }
        .run_into(&output);
        host(Tensor::<Gpu<F>, 3>::from_primitive(TensorPrimitive::Float(output)))
    }

    /// [`Self::kernel`] with the keys and values read where a fused QKV projection writes them:
    /// views of one `[tokens, row]` buffer, each token's q, k and v side by side, and `padding`
    /// more elements a row after them (so the token stride need not be a multiple of any
    /// vector). Returns the output and the values' token stride as the kernel saw it.
    pub fn kernel_on_fused_rows<F: FloatElement>(&self, seed: u64, kernel: AttentionKernel, padding: usize) -> (Vec<f32>, usize) {
        let (queries, keys, values, _) = self.inputs(seed);
        let (prefix, spans) = self.joined_prefix_on::<Gpu<F>>(seed);
        let layout = self.layout();
        let (t, q, kv, d) = (layout.tokens(), self.q_heads, self.kv_heads, self.head_dim);
        let row = (q + 2 * kv) * d + padding;
        let mut fused = vec![f32::NAN; t * row];
        for token in 0..t {
            let at = token * row;
            fused[at..at + q * d].copy_from_slice(&queries[token * q * d..][..q * d]);
            fused[at + q * d..at + (q + kv) * d].copy_from_slice(&keys[token * kv * d..][..kv * d]);
            fused[at + (q + kv) * d..at + (q + 2 * kv) * d].copy_from_slice(&values[token * kv * d..][..kv * d]);
        }
        // Uploaded flat (a 2-D upload may be pitched on CUDA); the views made here, not by
        // Burn's `narrow`, which copies a slice whose end is not aligned to the device's memory
        // alignment (a padded row's), so the strides the test names are the ones the kernel sees.
        let flat = cube(tensor::<Gpu<F>, 1>(&fused, [t * row]));
        let view = |start: usize, heads: usize| {
            let handle = flat.handle.clone().offset_start((start * flat.dtype.size()) as u64);
            CubeTensor::new(flat.client.clone(), handle, Metadata::new([t, heads, d], [row, d, 1]), flat.device.clone(), flat.dtype)
        };
        let values = view((q + kv) * d, kv);
        let value_stride = values.meta.strides()[0];
        let item_prefixes: Vec<(usize, usize)> = layout.item_groups().map(|g| spans[g]).collect();
        let device = Default::default();
        let tiles = AttentionTiles::<GpuRuntime>::new(&GpuRuntime::client(&device), &device, layout.offsets(), &item_prefixes, q / kv, kernel);
        let output = poisoned::<F, 3>([t, q, d]);
        // The queries contiguous, as the model's are after their norm: Burn's own copy of a view
        // whose token stride is not a multiple of its vectors would read it wrong, and Burn
        // never makes such a view (see above).
        let queries = cube(tensor::<Gpu<F>, 3>(&queries, [t, q, d]));
        MultiItemAttention { queries, keys: view(q * d, kv), values, prefix_keys: cube(prefix.keys), prefix_values: cube(prefix.values), tiles: &tiles }.run_into(&output);
        (host(Tensor::<Gpu<F>, 3>::from_primitive(TensorPrimitive::Float(output))), value_stride)
    }
}


impl Case {
    /// Each group's prefix on backend `B`.
    pub fn prefixes_on<B: Backend>(&self, seed: u64) -> Vec<PrefixKv<B>> {
        let (_, _, _, prefixes) = self.inputs(seed);
        let (kv, d) = (self.kv_heads, self.head_dim);
        self.groups.iter().zip(&prefixes).map(|((len, _), (k, v))| PrefixKv { keys: tensor(k, [kv, *len, d]), values: tensor(v, [kv, *len, d]) }).collect()
    }

    /// Every group's prefix on backend `B`, joined as the model joins a batch's queries, and
    /// each group's span in it.
    pub fn joined_prefix_on<B: Backend>(&self, seed: u64) -> (PrefixKv<B>, Vec<(usize, usize)>) {
        let prefixes = self.prefixes_on::<B>(seed);
        PrefixKv::join(&prefixes.iter().collect::<Vec<_>>())
    }

    /// Attention on `route` through backend `B`'s seam, as the model runs it with its
    /// elementwise kernels (the cascade's softmax among them, where `B` has one).
    pub fn routed_on<B: ScoringBackend>(&self, seed: u64, route: AttentionRoute) -> Vec<f32> {
        self.planned_on::<B>(seed, Routes { attention: route, elementwise: ElementwiseRoute::Kernels, labels: LabelRoute::Kernel })
    }

    /// The plain Burn path (the cascade in Burn's ops) on backend `B`.
    pub fn plain_on<B: ScoringBackend>(&self, seed: u64) -> Vec<f32> {
        self.planned_on::<B>(seed, Routes::PLAIN)
    }

    fn planned_on<B: ScoringBackend>(&self, seed: u64, routes: Routes) -> Vec<f32> {
        let (queries, keys, values, _) = self.inputs(seed);
        let layout = self.layout();
        let (t, q, kv, d) = (layout.tokens(), self.q_heads, self.kv_heads, self.head_dim);
        let (prefix, spans) = self.joined_prefix_on::<B>(seed);
        let plan = B::plan_attention(routes, &layout, &spans, q / kv, &Default::default());
        host(plan.run(tensor::<B, 3>(&queries, [t, q, d]), tensor(&keys, [t, kv, d]), tensor(&values, [t, kv, d]), &prefix))
    }
}
