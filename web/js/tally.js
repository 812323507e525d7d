// tally in the browser: `await tally.load(source)` then `await tally.score(request)`, where the
// request and the response are those of the server's /v1/score. An ES module; it also sets
// `window.tally` for pages that do not use modules.
import init, { Model, logGpuWork, untunedMatmuls, MatmulTuning, matmulChoices, restoreMatmulChoice, forceMatmul as forceMatmulKernel } from './pkg/tally_web.js';

let wasmReady = null;
let model = null;
// The matmul kernel of each shape class on this adapter (see `matmulReport`): chosen by checked
// timings after the scores that meet a class, kept in localStorage under `choicesKey`.
const matmul = { choicesKey: null, restored: [], tuned: [], tuning: null, listeners: [] };
// The model scores one request at a time; calls made meanwhile wait their turn.
let turn = Promise.resolve();

function serialized(work) {
  const result = turn.then(work, work);
  turn = result.catch(() => {});
  return result;
}

async function webgpuAdapter() {
  if (!('gpu' in navigator)) throw new Error('this browser has no WebGPU (navigator.gpu is missing)');
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) throw new Error('no WebGPU adapter is available (is WebGPU enabled, and is there a GPU it may use?)');
  return adapter;
}

async function fetchBytes(url, onProgress, optional = false) {
  const response = await fetch(url);
  if (optional && response.status === 404) return null;
  if (!response.ok) throw new Error(`cannot fetch ${url}: HTTP ${response.status}`);
  const total = Number(response.headers.get('content-length')) || 0;
  const reader = response.body.getReader();
  const chunks = [];
  let received = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    received += value.length;
    onProgress?.({ url, received, total });
  }
  const bytes = new Uint8Array(received);
  let at = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, at);
    at += chunk.length;
  }
  return bytes;
}

const text = (bytes) => (bytes === null ? null : new TextDecoder().decode(bytes));
const baseName = (path) => path.replace(/\/+$/, '').split('/').pop();

// The shard files a `model.safetensors.index.json` lists, in order.
function shardNames(indexJson) {
  const weightMap = JSON.parse(indexJson).weight_map;
  if (!weightMap || typeof weightMap !== 'object') throw new Error('model.safetensors.index.json has no weight_map');
  return [...new Set(Object.values(weightMap))].sort();
}

// The files of a model: a `.gguf` URL, a model directory's URL (config.json, model.safetensors
// or model.safetensors.index.json and its shards, tokenizer.json), or Files from a picker (one
// .gguf, or those files).
async function modelFiles(source, onProgress) {
  if (typeof source === 'string') {
    if (source.toLowerCase().endsWith('.gguf')) {
      return { name: baseName(source).replace(/\.gguf$/i, ''), gguf: await fetchBytes(source, onProgress) };
    }
    const dir = source.replace(/\/+$/, '');
    const [config, single, tokenizer] = await Promise.all([
      fetchBytes(`${dir}/config.json`, onProgress),
      fetchBytes(`${dir}/model.safetensors`, onProgress, true),
      fetchBytes(`${dir}/tokenizer.json`, onProgress, true),
    ]);
    let weights = [['model.safetensors', single]];
    if (single === null) {
      const index = await fetchBytes(`${dir}/model.safetensors.index.json`, onProgress, true);
      if (index === null) throw new Error(`${dir} has neither model.safetensors nor model.safetensors.index.json`);
      weights = [];
      for (const name of shardNames(text(index))) weights.push([name, await fetchBytes(`${dir}/${name}`, onProgress)]);
    }
    return { name: baseName(dir), config: text(config), weights, tokenizer: text(tokenizer) };
  }
  const files = source instanceof File ? [source] : Array.from(source ?? []);
  const named = (name) => files.find((f) => f.name === name);
  const bytes = async (file) => (file ? new Uint8Array(await file.arrayBuffer()) : null);
  const gguf = files.find((f) => f.name.toLowerCase().endsWith('.gguf'));
  if (gguf) return { name: gguf.name.replace(/\.gguf$/i, ''), gguf: await bytes(gguf) };
  const index = named('model.safetensors.index.json');
  const weightNames = named('model.safetensors') ? ['model.safetensors'] : index ? shardNames(await index.text()) : [];
  const missing = weightNames.filter((name) => !named(name));
  if (!named('config.json') || weightNames.length === 0 || missing.length > 0) {
    throw new Error('pick one .gguf file, or config.json + model.safetensors (or its index and every shard) (+ tokenizer.json)' +
      (missing.length > 0 ? `; missing: ${missing.join(', ')}` : ''));
  }
  return {
    name: 'local-model',
    config: await named('config.json').text(),
    weights: await Promise.all(weightNames.map(async (name) => [name, await bytes(named(name))])),
    tokenizer: named('tokenizer.json') ? await named('tokenizer.json').text() : null,
  };
}

/**
 * Loads a model (replacing the last one) in three phases, each reported to `onProgress` as
 * `{phase, ...}` before it starts: `download` (with `received`/`total` bytes as they arrive),
 * `upload` (weights to the GPU) and `check` (tally's kernels against plain Burn ops on a one-layer
 * random model of the loaded model's shape; the kernels serve only if they agree). Resolves with
 * the model's info, `kernel_check` and `load_seconds` per phase included. `logGpu: true` on the
 * first load logs every kernel compiled to the console.
 */
export async function load(source, { onProgress, kernels = true, logGpu = false } = {}) {
  const adapter = await webgpuAdapter();
  wasmReady ??= init();
  await wasmReady;
  if (logGpu) logGpuWork();
  const seconds = {};
  let started = performance.now();
  // Each phase is announced, then the page gets a frame to show it before work that holds the thread.
  const phase = async (name, details = {}) => {
    onProgress?.({ phase: name, ...details });
    await new Promise((resolve) => setTimeout(resolve, 0));
  };
  const files = await modelFiles(source, (progress) => onProgress?.({ phase: 'download', ...progress }));
  seconds.download = (performance.now() - started) / 1000;
  return serialized(async () => {
    await phase('upload');
    started = performance.now();
    const loaded = files.gguf
      ? await Model.fromGguf(files.name, files.gguf, adapter.limits.maxStorageBufferBindingSize)
      : await Model.fromHuggingFace(files.name, files.config, files.weights.map(([name]) => name), files.weights.map(([, bytes]) => bytes), files.tokenizer ?? undefined, adapter.limits.maxStorageBufferBindingSize);
    seconds.upload = (performance.now() - started) / 1000;
    await phase('check');
    started = performance.now();
    try {
      await loaded.checkKernels();
    } catch (error) {
      loaded.free();
      throw error;
    }
    model?.free();
    model = loaded;
    // Kernels that failed the load-time check against plain Burn ops never serve.
    const checked = model.info().kernel_check.passed;
    model.setKernels(kernels && checked);
    seconds.check = (performance.now() - started) / 1000;
    matmul.choicesKey = `tally-matmul-choices:${adapterName(adapter)}`;
    return { ...model.info(), adapter: adapterName(adapter), load_seconds: seconds };
  });
}

// The choices kept on this adapter by earlier visits (and this one).
function storedChoices() {
  try {
    return JSON.parse(localStorage.getItem(matmul.choicesKey) ?? '{}') ?? {};
  } catch {
    return {}; // storage disabled or a corrupt entry: tune afresh
  }
}

function storeChoices() {
  try {
    localStorage.setItem(matmul.choicesKey, JSON.stringify({ ...storedChoices(), ...matmulChoices() }));
  } catch {
    // Storage disabled: the choices last as long as the page.
  }
}

// After a score: for each shape class it met without a choice, the choice an earlier visit kept
// for it, checked again (untimed) — or, with none or one that is wrong now, a tuning: every
// candidate checked, the right ones timed. One candidate per turn, so that a score asked for
// meanwhile goes next. A class no candidate multiplies right turns tally's kernels off (plain
// Burn ops serve).
function tuneInBackground() {
  const trusted = () => model?.info().kernel_check.passed;
  if (matmul.tuning || !trusted()) return;
  matmul.tuning = (async () => {
    for (;;) {
      const [shape] = untunedMatmuls();
      if (!shape || !trusted()) return;
      const kept = storedChoices()[shape];
      if (kept !== undefined) {
        const check = await serialized(() => restoreMatmulChoice(shape, String(kept)).catch((error) => ({ kernel: kept, verdict: 'failed', message: error.message })));
        matmul.restored.push({ shape, ...check });
        matmul.listeners.forEach((listener) => listener());
        if (check.verdict === 'right') continue;
      }
      const tuning = new MatmulTuning(shape);
      while (await serialized(() => tuning.step()));
      const report = tuning.finish();
      tuning.free();
      matmul.tuned.push(report);
      storeChoices();
      if (!report.chosen) {
        await serialized(async () => model.setKernels(false));
        console.warn(`tally: no matmul kernel multiplies ${shape} right on this adapter; plain Burn ops serve`);
      }
      matmul.listeners.forEach((listener) => listener());
    }
  })().finally(() => {
    matmul.tuning = null;
  });
}

/**
 * The token ids of labels given as text (["Yes", "No"]): each must be exactly one token of the
 * model's tokenizer, else this rejects saying which label is how many tokens.
 */
export function labelIds(labels) {
  if (!model) return Promise.reject(new Error('load a model first'));
  return serialized(async () => Array.from(model.labelIds(labels)));
}

/**
 * Scores a /v1/score request object; resolves with the server's response object. Shape classes
 * the score met without a matmul choice are tuned afterwards, in the background (`tuned()`).
 */
export async function score(request) {
  if (!model) throw new Error('no model is loaded: call tally.load(source) first');
  const response = await serialized(() => model.score(request));
  tuneInBackground();
  return response;
}

/**
 * The matmul kernels on this adapter: `choices` ({shape class: kernel}), `tuned` (each class
 * tuned on this page: every candidate's verdict — right, wrong, declined, failed — its error
 * against a float64 product and its time), `restored` (choices kept by an earlier visit, checked
 * again when a score met their class) and `untuned` (classes met, not tuned yet).
 */
export function matmulReport() {
  return { choices: matmulChoices(), tuned: matmul.tuned, restored: matmul.restored, untuned: untunedMatmuls() };
}

/** Resolves with `matmulReport()` once the background tuning has nothing left to do. */
export async function tuned() {
  tuneInBackground();
  while (matmul.tuning) await matmul.tuning;
  return matmulReport();
}

/** Calls `listener()` after each shape class is tuned or has its kept choice checked (see `matmulReport`). */
export function onTuned(listener) {
  matmul.listeners.push(listener);
}

/** Multiplies every shape class with one kernel (a name from `matmulReport`), or with the choices again (null). For tests. */
export function forceMatmul(kernel) {
  return serialized(async () => forceMatmulKernel(kernel ?? undefined));
}

/** Runs the hot paths with tally's kernels (true; refused if they failed the load-time check) or plain Burn ops (false). */
export function setKernels(on) {
  if (!model) throw new Error('no model is loaded');
  return serialized(async () => model.setKernels(Boolean(on)));
}

export function info() {
  return model ? model.info() : null;
}

function adapterName(adapter) {
  const i = adapter.info ?? {};
  return [i.vendor, i.architecture, i.device, i.description].filter(Boolean).join(' ') || 'unknown adapter';
}

if (typeof window !== 'undefined') window.tally = { load, score, labelIds, setKernels, info, matmulReport, tuned, onTuned, forceMatmul };
