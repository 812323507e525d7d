//! Every fixture model's whole forward pass on the CubeCL backends — Burn's fusion stream (what
//! `--backend wgpu` runs) and the unfused backend (what the browser runs) — against the CPU
//! backend, with tally's kernels and with the plain path. Kernel tests check each kernel alone;
//! this catches what only a whole model exercises (views of fused projections, RoPE, biases).
//!
//! Like the kernel tests, it runs on wgpu's default adapter (lavapipe in CI), or with feature
//! `cuda` on CUDA.

#[path = "common/gpu.rs"]
mod gpu;
#[path = "common/scoring_pass.rs"]
mod scoring_pass;
mod kernel_cases;

use burn::backend::NdArray;
use burn_cubecl::CubeBackend;
use scoring_pass::{fixture_models, label_logprobs, whole_model_routes};
use tally_core::{ModelLimits, PassBudget, ScoreInput};
use tally_engine::{Scorer, ScorerOptions};
use tally_model::{Routes, ScoringBackend};

/// Log-probabilities (not probabilities): relative 1e-3, absolute 1e-3 below 1 in magnitude.
fn assert_logprobs_match_cpu(got: &[f32], expected: &[f32], what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!((g - e).abs() <= 1e-3 * e.abs().max(1.0), "{what}: element {i} is {g}, the CPU says {e}\n got {got:?}\n cpu {expected:?}");
    }
}

/// `checked_routes` on the models of [`EVERY_ROUTE_ON`], and those of them in `on_every_model`
/// on every fixture model.
fn check<B: ScoringBackend>(backend: &str, checked_routes: &[Routes], on_every_model: &[Routes]) {
    let models = fixture_models();
    for every_route in EVERY_ROUTE_ON {
        assert!(models.iter().any(|dir| dir.ends_with(every_route)), "no fixture model {every_route}");
    }
    for dir in models {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let expected = label_logprobs::<NdArray<f32>>(&dir, Routes::PLAIN);
        let every_route = EVERY_ROUTE_ON.contains(&name.as_str());
        for &routes in checked_routes.iter().filter(|routes| every_route || on_every_model.contains(routes)) {
            assert_eq!(B::routes(routes), routes, "a CubeCL backend runs every route asked");
            assert_logprobs_match_cpu(&label_logprobs::<B>(&dir, routes), &expected, &format!("{name} on {backend}, {routes}"));
        }
    }
}

/// The fixture models every route runs on: their attention shapes and what feeds attention —
/// head sizes 16, 12 and 24, two and four query heads a KV head, q/k norms, projection biases,
/// scaled RoPE. The others (GGUF and float16/bfloat16 weights, tied or not, a wide vocabulary)
/// differ before and after attention: they run the default routes, and through fusion the
/// plain path too. Every route on every model was ~10 minutes of CI on lavapipe (the unfused
/// backend's 24 checks 494 s beside the page's build, 2026-12-07); each route's kernels are checked alone in the
/// kernel tests at their sizes' edges, and the browser test runs the page's routes on every
/// fixture case.
const EVERY_ROUTE_ON: [&str; 4] = ["llama-scaled", "qwen2-bias", "tied-gqa", "untied-wide-heads"];

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

/// The routes the unfused backend runs in a product: the browser page's scorer takes the kernels'
/// defaults, or the plain path where its kernel check fails (`web/src/kernel_check.rs`). The
/// other routes are the server's, which runs through fusion; the kernel tests check each route's
/// kernels on the unfused backend at their sizes' edges.
fn browser_routes() -> [Routes; 2] {
    [Routes::default(), Routes::PLAIN]
}

fn every_fixture_model_on_the_unfused_cube_backend_matches_the_cpu() {
    check::<CubeBackend<runtime::Runtime, f32, i32, u32>>(&format!("{}, unfused", runtime::NAME), &browser_routes(), &[Routes::default()]);
}

fn every_fixture_model_through_fusion_matches_the_cpu() {
    check::<runtime::Fused>(&format!("{}, fusion", runtime::NAME), &whole_model_routes(), &[Routes::default(), Routes::PLAIN]);
}

/// The engine's passes on the unfused backend, each issued before the one before it is read: the
/// backend queues a pass's read as it is issued ([`ScoringBackend::start_read`]), behind that
/// pass and ahead of the next, whose work reuses the memory the last one freed. Three requests
/// of five items in passes of at most 16 item tokens, two items a pass (softmax over the labels
/// and full-vocabulary probabilities), against the CPU's scores of the same batch: relative 1e-3.
fn passes_issued_ahead_of_their_reads_score_as_on_the_cpu() {
    let dir = fixture_models().into_iter().find(|dir| dir.ends_with("tied-gqa")).expect("the tied-gqa fixture");
    let limits = ModelLimits { vocab_size: 512, max_positions: 1000 };
    let inputs: Vec<ScoreInput> = (0..3u32)
        .map(|r| {
            let query = (0..9 + 4 * r).map(|t| (t * 37 + r * 11 + 5) % 512).collect();
            let items = (0..5).map(|i| (0..6 + (i % 3)).map(|t| (t * 53 + i * 7 + r * 3 + 1) % 512).collect()).collect();
            ScoreInput::new(query, items, vec![3, 40 + r, 200], r != 1, false, limits).unwrap()
        })
        .collect();
    let batch: Vec<&ScoreInput> = inputs.iter().collect();
    let options = ScorerOptions { pass_budget: PassBudget { max_tokens: 16, ..Default::default() }, ..Default::default() };
    let expected = Scorer::<NdArray<f32>>::load(&dir, &Default::default(), options).unwrap().score_batch(&batch).unwrap();
    let mut scorer = Scorer::<CubeBackend<runtime::Runtime, f32, i32, u32>>::load(&dir, &Default::default(), options).unwrap();
    let got = scorer.score_batch(&batch).unwrap();
    assert!(scorer.stats().pass_items.count() >= 6, "several passes: {}", scorer.stats().pass_items.count());
    for (r, (got, expected)) in got.iter().zip(&expected).enumerate() {
        for (i, (got, expected)) in got.iter().zip(expected).enumerate() {
            for (g, e) in got.iter().zip(expected) {
                assert!((g - e).abs() <= 1e-3 * e.abs(), "request {r} item {i}: {got:?}, the CPU says {expected:?}");
            }
        }
    }
}

/// Every model again with its matmuls on cuBLASLt (`--matmul cublas`), the GEMMs enqueued on
/// CubeCL's own stream between tally's and Burn's kernels: a missing order shows as wrong scores.
#[cfg(feature = "cuda")]
fn every_fixture_model_on_cublas_matches_the_cpu() {
    let _cubecl_after = kernel_cases::CubeclAfter;
    tally_shaders::set_matmul_route(tally_shaders::MatmulRoute::Cublas);
    check::<CubeBackend<runtime::Runtime, f32, i32, u32>>("cuda on cuBLASLt, unfused", &browser_routes(), &browser_routes());
    check::<runtime::Fused>("cuda on cuBLASLt, fusion", &whole_model_routes(), &whole_model_routes());
}

fn main() {
    #[allow(unused_mut)]
    let mut tests = gpu::named![every_fixture_model_on_the_unfused_cube_backend_matches_the_cpu, every_fixture_model_through_fusion_matches_the_cpu, passes_issued_ahead_of_their_reads_score_as_on_the_cpu];
    #[cfg(feature = "cuda")]
    tests.extend(gpu::named![every_fixture_model_on_cublas_matches_the_cpu]);
    gpu::run(tests)
}
