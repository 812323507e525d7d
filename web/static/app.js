// The demo page: loads a model with tally.load, scores with tally.score, draws one bar per item
// and label, and optionally scores the same request on a serving tally for comparison.
import * as tally from './tally.js';

const $ = (id) => document.getElementById(id);
const ms = (t) => `${t.toFixed(0)} ms`;

function showError(error) {
  $('error').textContent = error ? `Error: ${error.message ?? error}` : '';
  document.body.dataset.state = error ? 'error' : document.body.dataset.state;
}

// The matmul kernel chosen per shape class on this adapter, and each candidate's time.
function showMatmul() {
  const report = tally.matmulReport();
  // Tuning turns the kernels off where no candidate multiplies a class right.
  $('kernels').checked = tally.info()?.kernels ?? $('kernels').checked;
  const classes = Object.entries(report.choices);
  const kept = report.restored.filter((r) => r.verdict === 'right').length;
  $('matmul').hidden = classes.length === 0 && report.untuned.length === 0;
  $('matmul-summary').textContent = `matmul kernels: ${classes.length} shape classes chosen on this adapter ` +
    `(${kept} kept from an earlier visit and checked again, ${report.tuned.length} tuned now)` +
    (report.untuned.length ? `; tuning ${report.untuned.length} more…` : '');
  const timings = new Map(report.tuned.map((t) => [t.shape, t.candidates]));
  $('matmul-classes').replaceChildren(...classes.map(([shape, kernel]) => {
    const candidates = (timings.get(shape) ?? []).map((c) => `${c.kernel} ${c.verdict === 'right' ? `${c.millis.toFixed(1)} ms` : c.verdict}`);
    return Object.assign(document.createElement('li'), { textContent: `${shape} → ${kernel}${candidates.length ? ` (${candidates.join(', ')})` : ''}` });
  }));
}
tally.onTuned(showMatmul);

// What the page says during each phase of tally.load.
const PHASES = { download: 'downloading the model', upload: 'uploading weights to the GPU', check: "checking tally's kernels (and kept matmul choices) on this adapter" };

async function load(source) {
  showError(null);
  $('score').disabled = true;
  const progress = $('progress');
  progress.hidden = false;
  progress.removeAttribute('value');
  document.body.dataset.state = 'loading';
  const start = performance.now();
  try {
    const info = await tally.load(source, {
      kernels: $('kernels').checked,
      logGpu: new URLSearchParams(location.search).has('log-gpu'),
      onProgress: ({ phase, received, total }) => {
        $('phase').textContent = PHASES[phase];
        if (phase === 'download' && total) {
          progress.max = total;
          progress.value = received;
        } else if (phase !== 'download') {
          progress.removeAttribute('value');
        }
      },
    });
    const seconds = (performance.now() - start) / 1000;
    $('model-info').textContent = `${info.name}: ${info.family}, ${info.layers} layers, hidden ${info.hidden_size}, vocabulary ${info.vocab_size}` +
      `${info.has_tokenizer ? '' : ' (no tokenizer: token ids only)'} — loaded in ${seconds.toFixed(1)} s on ${info.adapter} ` +
      `(${Object.entries(info.load_seconds).map(([phase, s]) => `${phase} ${s.toFixed(1)} s`).join(', ')})`;
    $('kernel-check').textContent = info.kernel_check.message;
    $('kernel-check').className = info.kernel_check.passed ? '' : 'warning';
    $('kernels').checked = info.kernels;
    $('kernels').disabled = !info.kernel_check.passed;
    showMatmul();
    document.body.dataset.state = 'loaded';
    $('score').disabled = false;
    return info;
  } catch (error) {
    showError(error);
    throw error;
  } finally {
    progress.hidden = true;
    $('phase').textContent = '';
  }
}

// The request the form describes. Labels as text resolve to token ids with the model's tokenizer
// (each must be one token); the ids used are shown beside the field.
async function request() {
  const text = $('labels').value;
  let labels;
  if ($('label-kind').value === 'text') {
    const words = text.split('\n').filter((line) => line.length > 0);
    labels = await tally.labelIds(words);
    $('label-ids').textContent = `token ids: ${words.map((w, i) => `${JSON.stringify(w)} → ${labels[i]}`).join(', ')}`;
  } else {
    labels = text.split(/[\s,]+/).filter(Boolean).map(Number);
    if (labels.some((id) => !Number.isInteger(id))) throw new Error('label token ids must be integers, separated by commas');
    $('label-ids').textContent = '';
  }
  return {
    query: $('query').value,
    items: $('items').value.split('\n').filter((line) => line.length > 0),
    label_token_ids: labels,
    apply_softmax: $('softmax').checked,
  };
}

async function onServer(body) {
  const url = `${$('server').value.replace(/\/+$/, '')}/v1/score`;
  const start = performance.now();
  const response = await fetch(url, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  const json = await response.json();
  if (!response.ok) throw new Error(`server: ${json.message ?? response.status}`);
  return { json, ms: performance.now() - start };
}

function draw(body, page, server) {
  const bars = $('bars');
  bars.replaceChildren();
  body.items.forEach((item, i) => {
    const block = document.createElement('div');
    block.className = 'item';
    block.append(Object.assign(document.createElement('strong'), { textContent: JSON.stringify(item) }));
    body.label_token_ids.forEach((label, j) => {
      for (const [who, scores] of [['page', page], ['server', server]]) {
        if (!scores) continue;
        const p = scores.scores[i][j];
        const row = document.createElement('div');
        row.className = 'bar';
        row.innerHTML = `<span>label ${label}${who === 'server' ? ' (server)' : ''}</span><span class="track"><span class="fill ${who}"></span></span><span>${p.toFixed(4)}</span>`;
        row.querySelector('.fill').style.width = `${(100 * p).toFixed(2)}%`;
        block.append(row);
      }
    });
    bars.append(block);
  });
}

async function score() {
  showError(null);
  document.body.dataset.state = 'scoring';
  try {
    const body = await request();
    const start = performance.now();
    const page = await tally.score(body);
    const pageMs = performance.now() - start;
    let server = null;
    let timings = `page: ${ms(pageMs)}`;
    if ($('compare').checked) {
      const answer = await onServer(body);
      server = answer.json;
      timings += `, server: ${ms(answer.ms)}`;
    }
    $('timings').textContent = timings;
    draw(body, page, server);
    window.lastScores = { page, server };
    showMatmul();
    document.body.dataset.state = 'scored';
    return page;
  } catch (error) {
    showError(error);
    throw error;
  }
}

// Served by `tally serve --web`, the page compares with the server it came from.
if (location.protocol.startsWith('http')) $('server').value = location.origin;
$('load-url').addEventListener('click', () => load($('model-url').value).catch(() => {}));
$('model-files').addEventListener('change', (e) => load(e.target.files).catch(() => {}));
$('kernels').addEventListener('change', (e) => tally.setKernels(e.target.checked).catch(showError));
$('score').addEventListener('click', () => score().catch(() => {}));

// The default model: SmolLM2-135M where web/build.sh could include it, else a random fixture
// with a real tokenizer (its scores mean nothing, but everything runs).
async function chooseDefaultModel() {
  const head = await fetch($('model-url').value, { method: 'HEAD' }).catch(() => null);
  if (head?.ok) return;
  $('model-url').value = 'models/wide-vocab';
  $('labels').value = ' Yes\n No';
}

// For tests and the console: the page's own steps, once the default model is chosen.
chooseDefaultModel().then(() => {
  window.page = { load, score };
  if (new URLSearchParams(location.search).has('autoload')) load($('model-url').value).then(score).catch(() => {});
});
