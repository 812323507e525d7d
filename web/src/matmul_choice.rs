//! The page's matmul choices (`tally_shaders::matmul_choice`): which kernel multiplies each
//! shape class on this adapter. Scores note the classes they meet; `web/js/tally.js` tunes each
//! after the score (one candidate per turn, checked against a float64 product before it is timed),
//! keeps the choices in `localStorage` per adapter, and on the next visit hands them back here,
//! where each is checked again (untimed) before it serves.

use std::cell::RefCell;
use std::rc::Rc;

use burn::backend::wgpu::WgpuRuntime;
use serde::Serialize;
use tally_shaders::matmul_choice::{force_matmul, matmul_choices, unchosen_matmul_shapes, MatmulKernel, MatmulShape};
use tally_shaders::matmul_tuning::{check_matmul_choice, ClassTuning, Outcome, ShapeTrial};
use wasm_bindgen::prelude::*;

use crate::device;

/// One class's tuning, as the page shows it.
#[derive(Serialize)]
struct TuningReport {
    shape: String,
    /// The kernel now serving the class; `None` if no candidate was right (the page then stops
    /// using tally's kernels).
    chosen: Option<String>,
    candidates: Vec<CandidateReport>,
}

#[derive(Serialize)]
struct CandidateReport {
    kernel: String,
    /// `right`, `wrong`, `declined` or `failed`.
    verdict: &'static str,
    millis: Option<f64>,
    /// Relative to the sum of the products' magnitudes, against the float64 product.
    max_error: Option<f64>,
    message: Option<String>,
}

impl From<ShapeTrial> for TuningReport {
    fn from(trial: ShapeTrial) -> Self {
        let candidates = trial.trials.iter().map(|t| candidate_report(t.name.clone(), &t.outcome)).collect();
        TuningReport { shape: trial.shape.to_string(), chosen: trial.chosen.map(|i| trial.trials[i].name.clone()), candidates }
    }
}

fn candidate_report(kernel: String, outcome: &Outcome) -> CandidateReport {
    let (verdict, millis, max_error, message) = match outcome {
        Outcome::Right { millis, max_error } => ("right", Some(*millis), Some(*max_error), None),
        Outcome::Wrong { max_error } => ("wrong", None, Some(*max_error), None),
        Outcome::Declined => ("declined", None, None, None),
        Outcome::Failed(message) => ("failed", None, None, Some(message.clone())),
    };
    CandidateReport { kernel, verdict, millis, max_error, message }
}

/// The classes scores met that have no choice yet (`f32:16x576x960`, `…/T` for a transposed
/// right-hand side).
#[wasm_bindgen(js_name = untunedMatmuls)]
pub fn untuned_matmuls() -> Vec<String> {
    unchosen_matmul_shapes().iter().map(ToString::to_string).collect()
}

/// The tuning of one class, a candidate per `step` (a score may go between two): each candidate
/// checked against a float64 product, the right ones timed; `finish` uses the fastest right one
/// for the class and returns the report.
#[wasm_bindgen]
pub struct MatmulTuning(Rc<RefCell<Option<ClassTuning>>>);

#[wasm_bindgen]
impl MatmulTuning {
    #[wasm_bindgen(constructor)]
    pub fn new(shape: String) -> Result<MatmulTuning, JsError> {
        Ok(MatmulTuning(Rc::new(RefCell::new(Some(ClassTuning::new(shape.parse()?))))))
    }

    /// Tries the next candidate; resolves with whether there was one.
    pub fn step(&self) -> js_sys::Promise {
        let cell = Rc::clone(&self.0);
        wasm_bindgen_futures::future_to_promise(async move {
            // Out of the cell while it runs, so a second `step` meanwhile is refused, not a panic.
            let mut tuning = cell.borrow_mut().take().ok_or_else(|| JsError::new("this tuning is already stepping or finished"))?;
            let device = device().await;
            let more = match &device {
                Ok(device) => tuning.try_next_kernel::<WgpuRuntime>(device).await,
                Err(_) => false,
            };
            *cell.borrow_mut() = Some(tuning);
            device?;
            Ok(JsValue::from_bool(more))
        })
    }

    /// Uses the fastest right candidate for the class and returns the report.
    pub fn finish(&self) -> Result<JsValue, JsError> {
        let tuning = self.0.borrow_mut().take().ok_or_else(|| JsError::new("this tuning is stepping or already finished"))?;
        Ok(serde_wasm_bindgen::to_value(&TuningReport::from(tuning.choose()))?)
    }
}

/// `{class: kernel}` for every choice in use.
#[wasm_bindgen(js_name = matmulChoices)]
pub fn current_matmul_choices() -> Result<JsValue, JsError> {
    let choices: std::collections::BTreeMap<String, String> = matmul_choices().iter().map(|(shape, kernel)| (shape.to_string(), kernel.to_string())).collect();
    // A plain object (serde-wasm-bindgen makes maps into `Map`s, which JSON.stringify drops).
    Ok(choices.serialize(&serde_wasm_bindgen::Serializer::json_compatible())?)
}

/// A choice kept from an earlier visit: checked (untimed) and used if right. Resolves with
/// `{kernel, verdict, max_error, …}`; a name this build does not know is refused.
#[wasm_bindgen(js_name = restoreMatmulChoice)]
pub async fn restore_matmul_choice(shape: String, kernel: String) -> Result<JsValue, JsError> {
    let (shape, kernel): (MatmulShape, MatmulKernel) = (shape.parse()?, kernel.parse()?);
    let device = device().await?;
    let report = match check_matmul_choice::<WgpuRuntime>(&device, shape, kernel).await {
        Ok(max_error) => CandidateReport { kernel: kernel.to_string(), verdict: "right", millis: None, max_error: Some(max_error), message: None },
        Err(outcome) => candidate_report(kernel.to_string(), &outcome),
    };
    Ok(serde_wasm_bindgen::to_value(&report)?)
}

/// Multiplies every class with one kernel (`undefined`: with the choices again): for tests that
/// check each chosen kernel inside the whole model.
#[wasm_bindgen(js_name = forceMatmul)]
pub fn force_matmul_kernel(kernel: Option<String>) -> Result<(), JsError> {
    force_matmul(kernel.map(|name| name.parse()).transpose()?);
    Ok(())
}
