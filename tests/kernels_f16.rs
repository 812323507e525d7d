//! The attention kernel with f16 inputs and output (f32 inside), in a process of its own: see
//! `kernels.rs`.

#[path = "common/gpu.rs"]
mod gpu;
mod kernel_cases;

use burn::tensor::DType;
use kernel_cases::{assert_close, tensor, Case, Gpu, FRAGMENT_LOADS, KV_STAGINGS};
use tally_shaders::{tensor_core_tiles, AttentionKernel, KvStaging, TileShape};

fn attention_in_f16_accumulates_in_f32() {
    // f16 inputs and output, f32 inside: only the roundings of f16 remain.
    assert_eq!(tensor::<Gpu<half::f16>, 1>(&[1.0], [1]).dtype(), DType::F16, "the kernel must see f16 tensors");
    let device = Default::default();
    let tensor_cores = tensor_core_tiles(&<kernel_cases::GpuRuntime as burn_cubecl::cubecl::Runtime>::client(&device), DType::F16);
    // On CUDA the tile kernels multiply f16 tiles on tensor cores (the path bfloat16 models
    // take); elsewhere in registers. The shapes straddle their 16-key steps and 16-row planes.
    println!("tile kernels in f16 on tensor cores: {tensor_cores}");
    let cases = [
        Case { groups: vec![(700, vec![20, 65, 1]), (3, vec![17])], q_heads: 8, kv_heads: 4, head_dim: 64 },
        Case { groups: vec![(2020, vec![20, 20, 3]), (0, vec![5, 1]), (37, vec![64, 16, 17])], q_heads: 16, kv_heads: 8, head_dim: 128 },
        Case { groups: vec![(15, vec![15, 16, 17]), (1, vec![1]), (17, vec![33])], q_heads: 6, kv_heads: 2, head_dim: 16 },
        // Prefixes at the 64-key step (its last step full: unmasked) and just under it; items of
        // 16/17 tokens (32/34 rows: a 32-row warp's edge) — cp.async and 32 rows a warp on
        // tensor cores, which the float32 cases never reach.
        Case { groups: vec![(64, vec![16, 17]), (128, vec![15, 33]), (63, vec![1])], q_heads: 8, kv_heads: 4, head_dim: 64 },
    ];
    for (seed, case) in cases.iter().enumerate() {
        let expected = case.expected(seed as u64);
        // Both ways of reading fragments, at the default tile and at the largest (8 planes,
        // 64-key steps: four `ldmatrix.x4` of keys per 16 dimensions); the flash kernel's next
        // step staged both ways (cp.async on tensor cores), its warps taking 16 rows or 32.
        let tiles = [TileShape::default(), TileShape::new(128, 64).expect("a built shape")]
            .into_iter()
            .flat_map(|shape| FRAGMENT_LOADS.map(|loads| shape.with_loads(loads)));
        let kernels = std::iter::once(AttentionKernel::Rows).chain(tiles.flat_map(|tile| {
            let flash = KV_STAGINGS.into_iter().flat_map(move |staging| {
                let tile = tile.with_staging(staging);
                [Some(tile), tile.with_warp_rows(32)].into_iter().flatten().map(AttentionKernel::Flash)
            });
            std::iter::once(AttentionKernel::Tiled(tile)).chain(flash)
        }));
        for kernel in kernels {
            let launched = case.launched::<half::f16>(kernel);
            if kernel != AttentionKernel::Rows && tensor_cores {
                assert!(launched.contains("tensor cores"), "{kernel:?} ran as {launched}, {}", case.name());
            }
            let asks_copy_async = matches!(kernel, AttentionKernel::Flash(tile) if tile.staging == KvStaging::CopyAsync);
            assert_eq!(launched.contains("cp-async"), asks_copy_async && tensor_cores, "{kernel:?} ran as {launched}, {}", case.name());
            assert_close(&case.kernel::<half::f16>(seed as u64, kernel), &expected, 1e-2, &format!("f16, {kernel:?} ({launched}), {}", case.name()));
        }
    }
}

/// Both ways the tensor-core tiles read key and value `B` fragments (`ldmatrix`, and one read
/// per element where CubeCL's `position_of_nth` says) give every lane the elements PTX's
/// m16n8k16 layout puts there: keysᵀ (k = dimension, n = key) and values (k = key, n =
/// dimension), lane `l` (`g = l / 4`, `t = l % 4`) holding k = 2t, 2t + 1, 2t + 8, 2t + 9 at
/// n = g in one fragment and at n = g + 8 in the next; and the staged rows as a query `A`
/// fragment (m = row, k = dimension: rows g, g + 8 at k = 2t, 2t + 1, then at 2t + 8, 2t + 9). If only `ldmatrix` fails, its lane
/// addressing is wrong; if both do, CubeCL's layout moved (see `mma_fragment_layout_is_ptxs`).
#[cfg(feature = "cuda")]
fn tensor_core_fragment_loads_are_ptxs() {
    use burn::tensor::TensorPrimitive;
    // Element (key, dimension) of the tile is 64 · key + dimension: exact in f16.
    let value = |key: u32, dim: u32| (64 * key + dim) as f32;
    let tile: Vec<f32> = (0..16 * 16).map(|i| value(i / 16, i % 16)).collect();
    let mut expected = Vec::new();
    for lane in 0..32u32 {
        let (g, t) = (lane / 4, lane % 4);
        let ks = [2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9];
        expected.extend([g, g + 8].iter().flat_map(|&key| ks.map(|dim| value(key, dim))));
        expected.extend([g, g + 8].iter().flat_map(|&dim| ks.map(|key| value(key, dim))));
        expected.extend([2 * t, 2 * t + 8].iter().flat_map(|&k| [(g, k), (g, k + 1), (g + 8, k), (g + 8, k + 1)].map(|(row, dim)| value(row, dim))));
    }
    for loads in FRAGMENT_LOADS {
        let staged = tensor::<Gpu<half::f16>, 2>(&tile, [16, 16]).into_primitive().tensor();
        let read = burn::tensor::Tensor::<Gpu<half::f16>, 1>::from_primitive(TensorPrimitive::Float(tally_shaders::fragment_loads(staged, loads)));
        assert_eq!(kernel_cases::host(read), expected, "{loads:?}: per lane, the keys' two fragments, the values' two, then the query's");
    }
}

fn main() {
    #[allow(unused_mut)] // more tests on CUDA
    let mut tests = gpu::named![attention_in_f16_accumulates_in_f32];
    #[cfg(feature = "cuda")]
    tests.extend(gpu::named![tensor_core_fragment_loads_are_ptxs]);
    gpu::run(tests)
}
