//! Shared by the kernel tests: seeded random problems, the plain Burn reference on the CPU,
//! and the kernels called directly with poisoned outputs.

#![allow(dead_code)] // each test binary uses its own subset

use burn::backend::wgpu::WgpuRuntime;
use burn::backend::NdArray;
use burn::tensor::{backend::Backend, Tensor, TensorData, TensorPrimitive};
use burn_cubecl::{tensor::CubeTensor, CubeBackend, CubeRuntime, FloatElement};
use tally_model::attention::{multi_item_attention, PrefixKv};
use tally_model::ItemLayout;
use tally_shaders::MultiItemAttention;

pub type Reference = NdArray<f32>;
pub type Wgpu<F = f32> = CubeBackend<WgpuRuntime, F, i32, u32>;
pub type Gpu = Wgpu;

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
    Tensor::from_data(TensorData::new(values.to_vec(), shape), &Default::default())
}

pub fn host<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    tensor.into_data().convert::<f32>().to_vec().unwrap()
}

pub fn cube<R: CubeRuntime, F: FloatElement, const D: usize>(tensor: Tensor<CubeBackend<R, F, i32, u32>, D>) -> CubeTensor<R> {
    tensor.into_primitive().tensor()
}

pub fn poisoned<F: FloatElement, const D: usize>(shape: [usize; D]) -> CubeTensor<WgpuRuntime> {
    let count = shape.iter().product();
    cube(tensor::<Wgpu<F>, D>(&vec![f32::NAN; count], shape))
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
pub struct Case {
    pub groups: Vec<(usize, Vec<usize>)>,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
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
            .map(|(g, (len, _))| (random(seed + 10 + g as u64, kv * len * d, 2.0), random(seed + 20 + g as u64, kv * len * d, 1.0)))
            .collect();
        (random(seed, tokens * q * d, 2.0), random(seed + 1, tokens * kv * d, 2.0), random(seed + 2, tokens * kv * d, 1.0), prefixes)
    }

    /// The plain Burn path on the CPU: the reference.
    pub fn expected(&self, seed: u64) -> Vec<f32> {
        self.plain_on::<Reference>(seed)
    }
    /// The kernel in float type `F`, called directly with a poisoned output.
    pub fn kernel<F: FloatElement>(&self, seed: u64) -> Vec<f32> {
        let (queries, keys, values, prefixes) = self.inputs(seed);
        let layout = self.layout();
        let (t, q, kv, d) = (layout.tokens(), self.q_heads, self.kv_heads, self.head_dim);
        // Prefixes end to end along the token axis ([kv, Σ len, d]); at least one token.
        let total: usize = self.groups.iter().map(|(len, _)| len).sum();
        let mut starts = Vec::new();
        let (mut joined_keys, mut joined_values) = (vec![0.0; kv * total.max(1) * d], vec![0.0; kv * total.max(1) * d]);
        let mut start = 0;
        for ((len, _), (k, v)) in self.groups.iter().zip(&prefixes) {
            for head in 0..kv {
                let to = (head * total.max(1) + start) * d;
                joined_keys[to..to + len * d].copy_from_slice(&k[head * len * d..(head + 1) * len * d]);
                joined_values[to..to + len * d].copy_from_slice(&v[head * len * d..(head + 1) * len * d]);
            }
            starts.push(start);
            start += len;
        }
        let item_prefixes = layout.item_groups().map(|g| (starts[g], self.groups[g].0)).collect();
        let output = poisoned::<F, 3>([t, q, d]);
        MultiItemAttention {
            queries: cube(tensor::<Wgpu<F>, 3>(&queries, [t, q, d])),
            keys: cube(tensor::<Wgpu<F>, 3>(&keys, [t, kv, d])),
            values: cube(tensor::<Wgpu<F>, 3>(&values, [t, kv, d])),
            prefix_keys: cube(tensor::<Wgpu<F>, 3>(&joined_keys, [kv, total.max(1), d])),
            prefix_values: cube(tensor::<Wgpu<F>, 3>(&joined_values, [kv, total.max(1), d])),
            item_offsets: layout.offsets().to_vec(),
            item_prefixes,
        }
        .run_into(&output);
        host(Tensor::<Wgpu<F>, 3>::from_primitive(TensorPrimitive::Float(output)))
    }
}


impl Case {
    /// The plain Burn path (the cascade) on backend `B`.
    pub fn plain_on<B: Backend>(&self, seed: u64) -> Vec<f32> {
        let (queries, keys, values, prefixes) = self.inputs(seed);
        let layout = self.layout();
        let (t, q, kv, d) = (layout.tokens(), self.q_heads, self.kv_heads, self.head_dim);
        let prefixes: Vec<PrefixKv<B>> = self
            .groups
            .iter()
            .zip(&prefixes)
            .map(|((len, _), (k, v))| PrefixKv { keys: tensor(k, [kv, *len, d]), values: tensor(v, [kv, *len, d]) })
            .collect();
        let prefixes: Vec<&PrefixKv<B>> = prefixes.iter().collect();
        host(multi_item_attention(tensor::<B, 3>(&queries, [t, q, d]), tensor(&keys, [t, kv, d]), tensor(&values, [t, kv, d]), &prefixes, &layout))
    }
}
