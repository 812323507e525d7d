//! The page's guard against wrong numbers: before a model serves, one small request runs through
//! tally's kernels (its register-block matmul included) and through plain Burn ops (cubek's
//! default matmul) on the same adapter, and the kernels serve only if both agree. An adapter that
//! miscompiles a kernel then costs speed, never correctness.

use burn::tensor::backend::Backend as _;
use serde::Serialize;
use tally_core::{Items, Query, ScoreRequest};
use tally_engine::{EngineError, Scorer};
use tally_model::{set_matmul_route, MatmulRoute, Routes};

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
    pub message: String,
}

/// Scores the check request both ways and leaves `scorer` on the path that may serve.
pub async fn check_kernels(scorer: &mut Scorer<Backend>, vocab_size: usize) -> Result<KernelCheck, EngineError> {
    let request = check_request(vocab_size);
    use_kernels(scorer, false);
    let plain = scorer.score_async(&request).await?.scores;
    use_kernels(scorer, true);
    let kernels = scorer.score_async(&request).await?.scores;
    let error = max_relative_error(&kernels, &plain);
    let passed = error <= TOLERANCE;
    let adapter = Backend::name(&Default::default());
    let message = if passed {
        format!("tally's kernels agree with plain Burn ops on this adapter (max relative difference {error:.1e})")
    } else {
        use_kernels(scorer, false);
        format!("tally's kernels disagree with plain Burn ops on this adapter ({adapter}; max relative difference {error:.1e}): scoring with plain Burn ops instead")
    };
    Ok(KernelCheck { passed, max_relative_error: error, message })
}

/// Every hot path on tally's kernels and the matmuls on its register-block kernel (`true`), or
/// all of them on plain Burn ops and cubek's default matmul.
pub fn use_kernels(scorer: &mut Scorer<Backend>, kernels: bool) {
    scorer.set_routes(if kernels { Routes::default() } else { Routes::PLAIN });
    set_matmul_route(if kernels { MatmulRoute::Block } else { MatmulRoute::Cubecl });
}

/// A query and items of different lengths (one item of a single token), full-vocabulary
/// probabilities: every kernel on the scoring path runs. Short, because the check scores it
/// twice before the model serves (seconds for SmolLM2 on a software adapter).
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

