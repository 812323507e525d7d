//! Every matmul tally could run, timed on the wgpu adapter on SmolLM2-135M's shapes (M rows,
//! default 16; `M=64 cargo run --release -p tally-shaders --example matmul_candidates`), each
//! checked against Burn's matmul: tally's register blocks and cubek's strategies (those WebGPU
//! lacks say why they declined). Chromium's software adapter natively:
//! `VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json LD_LIBRARY_PATH=/usr/lib/chromium`.
//! Three runs each; the first includes compiling the kernel.
use std::time::Instant;
use burn::backend::wgpu::{WgpuDevice, WgpuRuntime};
use burn::prelude::*;
use burn::tensor::{Distribution, TensorPrimitive};
use burn_cubecl::CubeBackend;
use burn_backend::DType;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::matmul::launch::{launch_ref, Strategy};
use cubek::matmul::routines::{BlueprintStrategy, TileSizeSelection, simple_unit::SimpleUnitSelectionArgs, double_unit::DoubleUnitSelectionArgs};
use cubek::std::InputBinding;

type B = CubeBackend<WgpuRuntime, f32, i32, u32>;

fn main() {
    let device = WgpuDevice::default();
    let m: usize = std::env::var("M").ok().and_then(|v| v.parse().ok()).unwrap_or(16);
    let strategies: Vec<(&str, Strategy)> = vec![
        ("naive", Strategy::Naive),
        ("simple_unit_max", Strategy::SimpleUnit(BlueprintStrategy::Inferred(SimpleUnitSelectionArgs { tile_size: TileSizeSelection::MaxTileSize }))),
        ("simple_unit_min", Strategy::SimpleUnit(BlueprintStrategy::Inferred(SimpleUnitSelectionArgs { tile_size: TileSizeSelection::MinTileSize }))),
        ("double_unit_min", Strategy::DoubleUnit(BlueprintStrategy::Inferred(DoubleUnitSelectionArgs { tile_size: TileSizeSelection::MinTileSize }))),
        ("simple_vecmat", Strategy::SimpleVecMat(BlueprintStrategy::Inferred(().into()))),
        ("double_vecmat", Strategy::DoubleVecMat(BlueprintStrategy::Inferred(().into()))),
        ("gemv_plane_parallel", Strategy::GemvPlaneParallel(BlueprintStrategy::Inferred(Default::default()))),
        ("gemv_unit_perp", Strategy::GemvUnitPerpendicular(BlueprintStrategy::Inferred(Default::default()))),
    ];
    for (what, k, n, transposed) in [("qkv", 576, 960, false), ("o", 576, 576, false), ("gate_up", 576, 3072, false), ("down", 1536, 576, false), ("head", 576, 8192, true)] {
        let lhs = Tensor::<B, 2>::random([m, k], Distribution::Normal(0.0, 1.0), &device);
        let rhs = if transposed { Tensor::<B, 2>::random([n, k], Distribution::Normal(0.0, 1.0), &device).transpose() } else { Tensor::<B, 2>::random([k, n], Distribution::Normal(0.0, 1.0), &device) };
        let reference: Vec<f32> = lhs.clone().matmul(rhs.clone()).into_data().to_vec().unwrap();
        let (l, r) = (lhs.into_primitive().tensor(), rhs.into_primitive().tensor());
        for block in tally_shaders::RegisterBlock::CANDIDATES {
            let mut times = vec![];
            let mut err = 0.0;
            for _ in 0..3 {
                B::sync(&device).unwrap();
                let start = Instant::now();
                let out = tally_shaders::block_matmul(&l, &r, block).unwrap();
                B::sync(&device).unwrap();
                times.push(start.elapsed().as_secs_f64() * 1e3);
                let got: Vec<f32> = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(out)).into_data().to_vec().unwrap();
                err = got.iter().zip(&reference).map(|(g, e)| (g - e).abs() / e.abs().max(1.0)).fold(0.0, f32::max);
            }
            println!("{what} m={m} k={k} n={n} block {}x{}: {:?} ms, max err {err:.1e}", block.rows, block.columns, times.iter().map(|t| (t * 10.0).round() / 10.0).collect::<Vec<_>>());
        }
        for (name, strategy) in &strategies {
            let mut times = vec![];
            let mut err = f32::NAN;
            for _ in 0..3 {
                let out = empty_device_contiguous_dtype(l.client.clone(), l.device.clone(), [m, n].into(), DType::F32);
                let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems { lhs: DType::F32.into(), rhs: DType::F32.into(), out: DType::F32.into() });
                B::sync(&device).unwrap();
                let start = Instant::now();
                let launched = launch_ref(strategy, &l.client, InputBinding::new(l.clone().binding(), DType::F32.into()), InputBinding::new(r.clone().binding(), DType::F32.into()), out.clone().binding(), &mut dtypes);
                if let Err(e) = launched { println!("{what} m={m} {name}: declined {:?}", format!("{e:?}").chars().take(80).collect::<String>()); break; }
                B::sync(&device).unwrap();
                times.push(start.elapsed().as_secs_f64() * 1e3);
                let got: Vec<f32> = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(out)).into_data().to_vec().unwrap();
                err = got.iter().zip(&reference).map(|(g, e)| (g - e).abs() / e.abs().max(1.0)).fold(0.0, f32::max);
            }
            if !times.is_empty() { println!("{what} m={m} k={k} n={n} {name}: {:?} ms, max err {err:.1e}", times.iter().map(|t| (t * 10.0).round() / 10.0).collect::<Vec<_>>()); }
        }
    }
}
