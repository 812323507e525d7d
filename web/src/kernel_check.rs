//! The page's guard against wrong numbers: before a model serves, one small request runs through
//! tally's kernels (its register-block matmul included) and through plain Burn ops (cubek's
//! default matmul) on the same adapter, and the kernels serve only if both agree. An adapter that
//! miscompiles a kernel then costs speed, never correctness.
//!
//! The check runs on a one-layer random model of the real model's attention shape (heads, KV
//! heads, head size, hidden size, its norms and biases), not on the model itself: it checks the
//! kernels, which are compiled per those shapes, and costs a layer instead of two whole scores
//! (SmolLM2's 30 layers on plain Burn ops took 170 s of a 176 s load on a software adapter).
//! Its matrices are stored as a GGUF stores them (Q8_0, Q4_0, Q4_1, BF16, F16: see
//! `random_quantised_model`); the reference reads them as float, so the kernel that expands
//! compact weights on the device is checked too — and as it serves on either path, scores are
//! refused altogether where it disagrees.

use burn::backend::wgpu::WgpuDevice;
use burn::tensor::backend::Backend as _;
use serde::Serialize;
use tally_core::{Items, Query, ScoreRequest};
use tally_engine::{EngineError, Scorer, ScorerOptions};
use tally_model::random::random_quantised_model;
use tally_model::weights::FloatOnly;
use tally_model::{set_matmul_route, MatmulRoute, ModelConfig, Routes};
use tally_shaders::{force_matmul, MatmulKernel};
use wasm_bindgen::JsError;

use crate::Backend;

/// Agreement asked of the two paths: the f32 tolerance of tally's tests.
const TOLERANCE: f64 = 1e-3;

/// What the check found; the page shows it.
#[derive(Serialize, Clone)]
pub struct KernelCheck {
    /// Whether the kernels serve (otherwise the plain path does).
    pub passed: bool,
    /// The largest relative difference between the two paths' probabilities.
    pub max_relative_error: f64,
    /// Whether compact weights, expanded on the device, agree with the same weights read as
    /// float (on plain ops); where not, the model does not score.
    pub weights_agree: bool,
    pub message: String,
}

impl KernelCheck {
    /// Before the check has run: plain Burn ops serve.
    pub fn pending() -> Self {
        KernelCheck { passed: false, max_relative_error: f64::NAN, weights_agree: true, message: "the kernel check has not run yet: plain Burn ops serve".into() }
    }
}

/// Vocabulary of the check model: the label kernel's work, not the model's.
const CHECK_VOCAB: usize = 4_099;

/// Scores the check request both ways on a random model shaped like `scorer`'s and leaves
/// `scorer` (the real model) on the path that may serve.
pub async fn check_kernels(scorer: &mut Scorer<Backend>, device: &WgpuDevice) -> Result<KernelCheck, JsError> {
    let config = check_config(scorer.model_config());
    let compact = random_quantised_model(&config, 29)?;
    let mut float = random_quantised_model(&config, 29)?;
    float.weights = Box::new(FloatOnly(float.weights));
    let load = |opened| Scorer::<Backend>::from_opened(opened, "kernel check".into(), device, ScorerOptions::default(), &mut |_, _| {});
    let result = compare_paths(&mut load(float)?, &mut load(compact)?).await?;
    use_kernels(scorer, result.passed);
    Ok(result)
}

/// One layer of `config`'s attention shape, a small feed-forward and vocabulary.
fn check_config(config: &ModelConfig) -> ModelConfig {
    ModelConfig { num_hidden_layers: 1, intermediate_size: config.intermediate_size.min(2 * config.hidden_size), vocab_size: CHECK_VOCAB, ..config.clone() }
}

/// The check request on float weights through plain ops (the reference), then on compact
/// weights through plain ops and through the kernels; `compact` is left on the kernels.
async fn compare_paths(float: &mut Scorer<Backend>, compact: &mut Scorer<Backend>) -> Result<KernelCheck, EngineError> {
    let request = check_request(CHECK_VOCAB);
    use_kernels(float, false);
    let reference = float.score_async(&request).await?.scores;
    use_kernels(compact, false);
    let weights_error = max_relative_error(&compact.score_async(&request).await?.scores, &reference);
    use_kernels(compact, true);
    // On the register block every shape class starts on (the classes' own choices are each
    // checked as they are made); forced, so the check model's classes are not noted for tuning.
    force_matmul(Some(MatmulKernel::DEFAULT));
    let kernels = compact.score_async(&request).await;
    force_matmul(None);
    let error = max_relative_error(&kernels?.scores, &reference);
    let weights_agree = weights_error <= TOLERANCE;
    let passed = weights_agree && error <= TOLERANCE;
    let adapter = Backend::name(&Default::default());
    let message = if !weights_agree {
        format!("compact weights expanded on this adapter ({adapter}) disagree with the same weights read as float (max relative difference {weights_error:.1e}): this page cannot score on it")
    } else if passed {
        format!("tally's kernels agree with plain Burn ops on this adapter (max relative difference {error:.1e})")
    } else {
        format!("tally's kernels disagree with plain Burn ops on this adapter ({adapter}; max relative difference {error:.1e}): scoring with plain Burn ops instead")
    };
    Ok(KernelCheck { passed, max_relative_error: error.max(weights_error), weights_agree, message })
}

/// Every hot path on tally's kernels and the matmuls on its register-block kernel (`true`), or
/// all of them on plain Burn ops and cubek's default matmul.
pub fn use_kernels(scorer: &mut Scorer<Backend>, kernels: bool) {
    scorer.set_routes(if kernels { Routes::default() } else { Routes::PLAIN });
    set_matmul_route(if kernels { MatmulRoute::Block } else { MatmulRoute::Cubecl });
}

/// A query and items of different lengths (one item of a single token), full-vocabulary
/// probabilities: every kernel on the scoring path runs. Short: it is scored twice before the
/// model serves.
fn check_request(vocab_size: usize) -> ScoreRequest {
    let ids = |start: i64, count: i64| (start..start + count).map(|i| (i * 7919) % vocab_size as i64).collect::<Vec<_>>();
    ScoreRequest {
        query: Query::Ids(ids(1, 9)),
        items: Items::Ids(vec![ids(40, 1), ids(50, 4), ids(60, 11)]),
        label_token_ids: ids(3, 3),
        apply_softmax: false,
        item_first: false,
        model: None,
    }
}

/// `max |a − b| / max(|b|, 1e-6)` over every score; NaN counts as infinitely wrong.
fn max_relative_error(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    let pairs = a.iter().flatten().zip(b.iter().flatten());
    pairs.map(|(x, y)| if x.is_finite() { (x - y).abs() / y.abs().max(1e-6) } else { f64::INFINITY }).fold(0.0, f64::max)
}

