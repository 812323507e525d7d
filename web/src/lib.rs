//! tally in the browser: the same model and engine as the server, compiled to wasm, scoring on
//! WebGPU through Burn's wgpu backend. `web/js/tally.js` wraps this in the page's JS API
//! (`tally.load`, `tally.score`); nothing here is specific to the demo page.
//!
//! What the browser changes: the model comes as bytes (no file system), the device is set up
//! and read back asynchronously (a browser cannot block), and the hot paths can run as plain
//! Burn ops instead of tally's kernels, should an adapter get the kernels wrong.
#![cfg(target_arch = "wasm32")]

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use burn::backend::wgpu::{graphics::WebGpu, init_setup_async, MemoryConfiguration, RuntimeOptions, WgpuDevice, WgpuRuntime};
use burn_cubecl::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
use burn_cubecl::CubeBackend;
use serde::Serialize;
use tally_core::ScoreRequest;
use tally_engine::{EngineError, Scorer, ScorerOptions};
use tally_model::{FileData, OpenedModel, RangedBytes};
use wasm_bindgen::prelude::*;

mod kernel_check;
mod matmul_choice;
use kernel_check::{check_kernels, use_kernels, KernelCheck};

/// Burn's CubeCL backend on WebGPU, built without autotune and without fusion (see the
/// workspace's `burn` dependency). Measured in headless Chromium (SwiftShader): matmul autotune
/// picks candidates that leave the output unwritten, with no error anywhere, and fused matmul
/// autotune launches more invocations per workgroup than the adapter allows, which breaks every
/// later kernel. Without them every op runs CubeCL's default kernel, right on every fixture, and
/// the first score does not wait minutes for benchmarks of every candidate.
pub(crate) type Backend = CubeBackend<WgpuRuntime, f32, i32, u32>;

#[wasm_bindgen(start)]
fn start() {
    console_error_panic_hook::set_once();
    // Burn and CubeCL report failed GPU work through `log`: send it to the console.
    let _ = console_log::init_with_level(log::Level::Warn);
}

thread_local! {
    static LOG_GPU_WORK: Cell<bool> = const { Cell::new(false) };
    static DEVICE_READY: Cell<bool> = const { Cell::new(false) };
}

/// Logs every kernel CubeCL compiles to the console, for chasing a
/// GPU problem on one machine. Takes effect if called before the first model loads: CubeCL
/// reads its configuration once.
#[wasm_bindgen(js_name = logGpuWork)]
pub fn log_gpu_work() {
    LOG_GPU_WORK.set(true);
    log::set_max_level(log::LevelFilter::Info);
}

/// Sets up WebGPU once per page. Exclusive memory pages, as heavy Burn-on-web apps use: WebGPU
/// buffers cannot be sliced as freely as native ones.
pub(crate) async fn device() -> Result<WgpuDevice, JsError> {
    let device = WgpuDevice::default();
    if !DEVICE_READY.get() {
        if LOG_GPU_WORK.get() {
            let config = serde_json::json!({ "compilation": { "logger": { "level": "basic", "log": "info" } } });
            CubeClRuntimeConfig::set(serde_json::from_value(config)?);
        }
        let options = RuntimeOptions { memory_config: MemoryConfiguration::ExclusivePages, ..Default::default() };
        init_setup_async::<WebGpu>(&device, options).await;
        DEVICE_READY.set(true);
    }
    Ok(device)
}

/// What the page shows about a loaded model.
#[derive(Serialize)]
struct ModelInfo {
    name: String,
    family: String,
    layers: usize,
    hidden_size: usize,
    vocab_size: usize,
    max_positions: usize,
    has_tokenizer: bool,
    /// Whether tally's kernels serve (or plain Burn ops: until the kernel check passes).
    kernels: bool,
    kernel_check: KernelCheck,
}

/// A loaded model on the page's WebGPU device.
#[wasm_bindgen]
pub struct Model {
    scorer: Rc<RefCell<Scorer<Backend>>>,
    info: Rc<RefCell<ModelInfo>>,
}

#[wasm_bindgen]
impl Model {
    /// A model from one GGUF file's bytes. `max_buffer_bytes`: the adapter's
    /// `maxStorageBufferBindingSize`, which every weight tensor must fit.
    #[wasm_bindgen(js_name = fromGguf)]
    pub async fn from_gguf(name: String, bytes: js_sys::Uint8Array, max_buffer_bytes: f64) -> Result<Model, JsError> {
        let opened = OpenedModel::from_gguf_data(&name, js_file(bytes)).map_err(error)?;
        Self::load(name, opened, max_buffer_bytes).await
    }

    /// A Hugging Face model from `config.json`, its safetensors files (`model.safetensors`, or
    /// the shards its index lists: `weight_files[i]` holds `weight_names[i]`) and, if it has
    /// one, `tokenizer.json`.
    #[wasm_bindgen(js_name = fromHuggingFace)]
    pub async fn from_hugging_face(name: String, config: String, weight_names: Vec<String>, weight_files: Vec<js_sys::Uint8Array>, tokenizer: Option<String>, max_buffer_bytes: f64) -> Result<Model, JsError> {
        let weights = weight_names.into_iter().zip(weight_files.into_iter().map(js_file)).collect();
        let opened = OpenedModel::from_hf_data(&config, weights, tokenizer).map_err(error)?;
        Self::load(name, opened, max_buffer_bytes).await
    }

    async fn load(name: String, opened: OpenedModel, max_buffer_bytes: f64) -> Result<Model, JsError> {
        let config = opened.config.clone();
        let largest = largest_tensor_bytes(&config);
        if largest as f64 > max_buffer_bytes {
            let mib = |bytes: f64| bytes / f64::from(1 << 20);
            return Err(JsError::new(&format!(
                "{name} is too large for this WebGPU adapter: its largest weight takes {:.0} MiB as f32, and the adapter's buffers hold at most {:.0} MiB",
                mib(largest as f64),
                mib(max_buffer_bytes)
            )));
        }
        let device = device().await?;
        let mut scorer = Scorer::<Backend>::from_opened(opened, name.clone(), &device, ScorerOptions::default(), &mut |_, _| {}).map_err(error)?;
        // Plain Burn ops until `checkKernels` says the kernels agree with them.
        use_kernels(&mut scorer, false);
        let kernel_check = KernelCheck::pending();
        let info = ModelInfo {
            name,
            family: format!("{:?}", config.family),
            layers: config.num_hidden_layers,
            hidden_size: config.hidden_size,
            vocab_size: config.vocab_size,
            max_positions: config.max_position_embeddings,
            has_tokenizer: scorer.preparer().tokenizer().is_ok(),
            kernels: kernel_check.passed,
            kernel_check,
        };
        Ok(Model { scorer: Rc::new(RefCell::new(scorer)), info: Rc::new(RefCell::new(info)) })
    }

    /// The load-time kernel check (see `kernel_check.rs`): resolves with its result and leaves the
    /// model on tally's kernels if they agree with plain Burn ops, on plain ops otherwise. A
    /// separate step from loading, so the page can show it as one.
    #[wasm_bindgen(js_name = checkKernels)]
    pub fn check_kernels(&self) -> js_sys::Promise {
        let (scorer, info) = (Rc::clone(&self.scorer), Rc::clone(&self.info));
        wasm_bindgen_futures::future_to_promise(async move {
            let device = device().await?;
            let mut scorer = scorer.try_borrow_mut().map_err(|_| JsError::new("the model is busy scoring"))?;
            let check = check_kernels(&mut scorer, &device).await?;
            let mut info = info.borrow_mut();
            info.kernels = check.passed;
            info.kernel_check = check.clone();
            Ok(serde_wasm_bindgen::to_value(&check)?)
        })
    }

    /// `{name, family, layers, hidden_size, vocab_size, max_positions, has_tokenizer, kernels}`.
    pub fn info(&self) -> Result<JsValue, JsError> {
        Ok(serde_wasm_bindgen::to_value(&*self.info.borrow())?)
    }

    /// Run the hot paths and matmuls with tally's kernels (`true`, the default where they passed
    /// the load-time check) or plain Burn ops.
    #[wasm_bindgen(js_name = setKernels)]
    pub fn set_kernels(&self, kernels: bool) -> Result<(), JsError> {
        if kernels && !self.info.borrow().kernel_check.passed {
            return Err(JsError::new(&self.info.borrow().kernel_check.message));
        }
        let mut scorer = self.scorer.try_borrow_mut().map_err(|_| JsError::new("the model is busy scoring"))?;
        use_kernels(&mut scorer, kernels);
        self.info.borrow_mut().kernels = kernels;
        Ok(())
    }

    /// The token ids of labels given as text, each of which must be exactly one token of the
    /// model's tokenizer (as `tally score --label` requires).
    #[wasm_bindgen(js_name = labelIds)]
    pub fn label_ids(&self, labels: Vec<String>) -> Result<Vec<u32>, JsError> {
        let scorer = self.scorer.try_borrow().map_err(|_| JsError::new("the model is busy scoring"))?;
        let tokenizer = scorer.preparer().tokenizer().map_err(error)?;
        labels.iter().map(|label| tokenizer.label_id(label)).collect::<Result<_, _>>().map_err(error)
    }

    /// Scores a `/v1/score` request object; resolves with the response object the server returns.
    pub fn score(&self, request: JsValue) -> js_sys::Promise {
        let (scorer, info) = (Rc::clone(&self.scorer), Rc::clone(&self.info));
        wasm_bindgen_futures::future_to_promise(async move {
            let request: ScoreRequest = serde_wasm_bindgen::from_value(request).map_err(|e| JsError::new(&format!("invalid request: {e}")))?;
            if !info.borrow().kernel_check.weights_agree {
                return Err(JsError::new(&info.borrow().kernel_check.message).into());
            }
            let mut scorer = scorer.try_borrow_mut().map_err(|_| JsError::new("the model is busy scoring: wait for the previous score"))?;
            let response = scorer.score_async(&request).await.map_err(error)?;
            Ok(serde_wasm_bindgen::to_value(&response)?)
        })
    }
}

/// A fetched or picked model file, left where JS has it: the wasm heap receives its header, then
/// one tensor at a time on its way to the GPU, never the whole file.
struct JsFile(js_sys::Uint8Array);

impl RangedBytes for JsFile {
    fn len(&self) -> usize {
        self.0.length() as usize
    }

    fn copy(&self, range: std::ops::Range<usize>) -> Vec<u8> {
        self.0.subarray(range.start as u32, range.end as u32).to_vec()
    }
}

fn js_file(bytes: js_sys::Uint8Array) -> FileData {
    FileData::Ranged(Box::new(JsFile(bytes)))
}

/// The largest weight tensor on the device, in f32 bytes: the embedding (also the tied head), or
/// a layer's fused projections.
fn largest_tensor_bytes(c: &tally_model::ModelConfig) -> usize {
    let qkv = c.hidden_size * (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim;
    [c.vocab_size * c.hidden_size, c.hidden_size * 2 * c.intermediate_size, qkv].into_iter().max().unwrap_or(0) * 4
}

fn error(error: impl Into<EngineError>) -> JsError {
    JsError::new(&error.into().to_string())
}

