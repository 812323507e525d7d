//! Every fixture model's whole forward pass on the CubeCL backends — Burn's fusion stream (what
//! `--backend wgpu` runs) and the unfused backend (what the browser runs) — against the CPU
//! backend, with tally's kernels and with the plain path. Kernel tests check each kernel alone;
//! this catches what only a whole model exercises (views of fused projections, RoPE, biases).
//!
//! Like the kernel tests, it runs on wgpu's default adapter (lavapipe in CI), or with feature
//! `cuda` on CUDA.

#[path = "common/gpu.rs"]
mod gpu;

use std::path::{Path, PathBuf};

use burn::backend::NdArray;
use burn_cubecl::CubeBackend;
use tally_model::{AttentionRoute, DecoderModel, ElementwiseRoute, ItemGroup, LabelRoute, LabelTable, ModelFiles, Routes, ScoringBackend, TileShape};

/// Label log-probabilities on `routes` of three items after two queries prefilled together (a
/// short one, and one of two chunks), two items on the first, one on the second, `[items][labels]`.
fn label_logprobs<B: ScoringBackend>(model_dir: &Path, routes: Routes) -> Vec<f32> {
    let opened = ModelFiles::locate(model_dir).and_then(|files| files.open()).expect("fixture model opens");
    let device = B::Device::default();
    let mut model = DecoderModel::<B>::load(opened.config.clone(), opened.weights.as_ref(), &device, &mut |_, _| {}).expect("fixture model loads");
    model.set_routes(routes);
    let vocab = opened.config.vocab_size as u32;
    let token = |i: u32| (i * 37 + 11) % vocab;
    let queries: [Vec<u32>; 2] = [(0..23).map(token).collect(), (500..1030).map(token).collect()];
    let items: Vec<Vec<u32>> = [1, 6, 19].iter().map(|&len| (100..100 + len).map(token).collect()).collect();
    let prefixes = model.prefill_batch(vec![model.empty_query(), model.empty_query()], &[&queries[0], &queries[1]]);
    let groups = [ItemGroup { query: 0, items: vec![&items[0], &items[1]] }, ItemGroup { query: 1, items: vec![&items[2]] }];
    let hidden = model.last_hidden(&model.query_batch(prefixes), &groups);
    let labels = LabelTable::new(&[&[0, 1, vocab - 1], &[2, 3, 4], &[5, vocab / 2, 6]]);
    model.label_logprobs(hidden, &labels).into_data().to_vec().expect("f32 log-probabilities")
}

/// Log-probabilities (not probabilities): relative 1e-3, absolute 1e-3 below 1 in magnitude.
fn assert_logprobs_match_cpu(got: &[f32], expected: &[f32], what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!((g - e).abs() <= 1e-3 * e.abs().max(1.0), "{what}: element {i} is {g}, the CPU says {e}\n got {got:?}\n cpu {expected:?}");
    }
}

fn check<B: ScoringBackend>(backend: &str) {
    // Beside the sources, or where `TALLY_FIXTURES` says (a test binary carried to the GPU machine).
    let fixtures = std::env::var_os("TALLY_FIXTURES").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures"));
    let models = fixtures.join("models");
    let mut dirs: Vec<_> = std::fs::read_dir(&models).unwrap().map(|e| e.unwrap().path()).collect();
    dirs.sort();
    assert!(dirs.len() >= 6, "fixture models are missing");
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let expected = label_logprobs::<NdArray<f32>>(&dir, Routes::PLAIN);
        // The backend's kernels: the row attention kernel with Burn's elementwise ops, the tile
        // kernels with the fused elementwise kernels; then plain Burn ops.
        let tiled = Routes { attention: AttentionRoute::Tiled(TileShape::default()), elementwise: ElementwiseRoute::Kernels, labels: LabelRoute::Kernel };
        let flash = Routes { attention: AttentionRoute::Flash(TileShape::default()), ..tiled };
        for routes in [Routes::default(), tiled, flash, Routes::PLAIN] {
            assert_eq!(B::routes(routes), routes, "a CubeCL backend runs every route asked");
            assert_logprobs_match_cpu(&label_logprobs::<B>(&dir, routes), &expected, &format!("{name} on {backend}, {routes}"));
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod runtime {
    pub type Runtime = burn::backend::wgpu::WgpuRuntime;
    pub type Fused = burn::backend::Wgpu;
    pub const NAME: &str = "wgpu";
}
#[cfg(feature = "cuda")]
mod runtime {
    pub type Runtime = burn_cubecl::cubecl::cuda::CudaRuntime;
    pub type Fused = burn::backend::Cuda;
    pub const NAME: &str = "cuda";
}

fn every_fixture_model_on_the_unfused_cube_backend_matches_the_cpu() {
    check::<CubeBackend<runtime::Runtime, f32, i32, u32>>(&format!("{}, unfused", runtime::NAME));
}

fn every_fixture_model_through_fusion_matches_the_cpu() {
    check::<runtime::Fused>(&format!("{}, fusion", runtime::NAME));
}

fn main() {
    gpu::run(gpu::named![every_fixture_model_on_the_unfused_cube_backend_matches_the_cpu, every_fixture_model_through_fusion_matches_the_cpu])
}
