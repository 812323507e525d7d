//! The decoder for scoring — Qwen3, Llama and Qwen2 from one source, their differences read
//! from [`ModelConfig`] (q/k norms, attention biases, RoPE scaling, a tied head). A shared-query
//! forward and a multi-item extend that returns only the final hidden state at the last token of
//! each item. No KV cache beyond the query, no sampling, no per-token logits. Reading and
//! fusing the weights is [`load`]'s job; this file is the forward and the routes it takes.

mod load;

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use burn::tensor::{Int, Tensor, TensorData};

use crate::backend::ScoringBackend;
use crate::config::ModelConfig;
use crate::elementwise;
use crate::kv::PrefixKv;
use crate::labels::LabelTable;
use crate::layout::ItemLayout;
use crate::lm_head;
use crate::query_kv::{ItemGroup, QueryBatch, QueryKv, PREFILL_CHUNK};
use crate::rope::Rope;
use crate::route::{ElementwiseRoute, LabelRoute, Routes};
use crate::weight::{Linear, TokenTable, WeightStorage};

pub struct DecoderModel<B: ScoringBackend> {
    config: ModelConfig,
    device: B::Device,
    /// Also the LM head when embeddings are tied.
    embed_tokens: TokenTable<B>,
    layers: Vec<DecoderLayer<B>>,
    final_norm: Tensor<B, 1>,
    /// `None` when tied to `embed_tokens`.
    lm_head: Option<TokenTable<B>>,
    /// What runs each hot path, as the backend answered for the routes asked.
    routes: Routes,
}

struct DecoderLayer<B: ScoringBackend> {
    input_norm: Tensor<B, 1>,
    /// q, k and v projections fused: `hidden` → `(q_heads + 2·kv_heads)·head_dim`.
    qkv_proj: Linear<B>,
    /// Their biases, fused likewise (Qwen2).
    qkv_bias: Option<Tensor<B, 1>>,
    /// Per-head RMSNorm gains of queries and keys (Qwen3).
    qk_norm: Option<(Tensor<B, 1>, Tensor<B, 1>)>,
    o_proj: Linear<B>,
    post_attention_norm: Tensor<B, 1>,
    /// gate and up projections fused: `hidden` → `2·intermediate`.
    gate_up_proj: Linear<B>,
    down_proj: Linear<B>,
}

impl<B: ScoringBackend> DecoderModel<B> {
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Asks for `requested`; the backend says what it runs for them ([`ScoringBackend::routes`]).
    pub fn set_routes(&mut self, requested: Routes) {
        self.routes = B::routes(requested);
    }

    /// What runs each hot path.
    pub fn routes(&self) -> Routes {
        self.routes
    }

    pub fn device(&self) -> B::Device {
        self.device.clone()
    }

    /// The norms, RoPE and SiLU·up on the route picked for them.
    fn elementwise(&self) -> Elementwise<B> {
        Elementwise { route: self.routes.elementwise, eps: self.config.rms_norm_eps, _backend: PhantomData }
    }

    /// How the weight matrices are held: as the file stores them, or as float.
    pub fn weight_storage(&self) -> WeightStorage {
        let mut storage = WeightStorage::default();
        self.embed_tokens.count_into(&mut storage);
        if let Some(head) = &self.lm_head {
            head.count_into(&mut storage);
        }
        for layer in &self.layers {
            for linear in [&layer.qkv_proj, &layer.o_proj, &layer.gate_up_proj, &layer.down_proj] {
                linear.count_into(&mut storage);
            }
        }
        storage
    }

    /// Device bytes one padded item token of a pass needs at a layer's widest point: the
    /// activations alive at once (residual stream and its norm, fused QKV, attention output,
    /// fused gate-up and SiLU·up) plus its row of an LM-head vocabulary chunk (the worst case,
    /// one-token items, makes every token an item end), doubled for kernels' temporaries.
    pub fn pass_bytes_per_token(&self) -> u64 {
        let c = &self.config;
        let (q_width, kv_width) = (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim);
        let elements = 2 * c.hidden_size + (q_width + 2 * kv_width) + q_width + 3 * c.intermediate_size + lm_head::VOCAB_CHUNK;
        2 * (elements * self.final_norm.dtype().size()) as u64
    }

    /// A query of length zero: items then attend only to themselves (used for `item_first`).
    pub fn empty_query(&self) -> QueryKv<B> {
        let c = &self.config;
        QueryKv::empty(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, &self.device())
    }

    /// Extends each query's K/V by its tokens, as if `query + tokens` had been prefilled from
    /// scratch (exactly so when `query.len()` is a multiple of [`PREFILL_CHUNK`]). The tokens go
    /// in chunks, each attending to the K/V of the chunks before it (a pass of tails, see
    /// [`QueryBatch`]), so attention memory grows with `chunk × query`, not `query²`. Chunk `c`
    /// of every sequence runs in one pass, each chunk attending to its own query only, so `n`
    /// queries cost one pass per chunk instead of `n`; the caller bounds that pass (`n` chunks
    /// of up to [`PREFILL_CHUNK`] tokens).
    pub fn prefill_batch(&self, queries: Vec<QueryKv<B>>, tokens: &[&[u32]]) -> Vec<QueryKv<B>> {
        assert_eq!(queries.len(), tokens.len(), "one token list per query");
        let mut caches = queries;
        let rounds = tokens.iter().map(|t| t.len().div_ceil(PREFILL_CHUNK)).max().unwrap_or(0);
        for round in 0..rounds {
            let start = round * PREFILL_CHUNK;
            let active: Vec<usize> = (0..tokens.len()).filter(|&s| tokens[s].len() > start).collect();
            let chunks = active.iter().map(|&s| tokens[s][start..tokens[s].len().min(start + PREFILL_CHUNK)].to_vec()).collect();
            let mut batch = QueryBatch::with_tails(active.iter().map(|&s| caches[s].clone()).collect(), chunks);
            self.run_pass(&mut batch, &[], None);
            for (index, &s) in active.iter().enumerate() {
                caches[s] = batch.query(index).clone();
            }
        }
        caches
    }

    /// Final-normed hidden state at the last token of each item, `[items, hidden]`, items in
    /// group order. Item token `k` sits at position `query.len() + k` and sees its group's
    /// query (in `queries`) and its own item only. Groups of different requests share the
    /// pass's matmuls; the batch's query tails, if any are left, run in this pass too.
    pub fn last_hidden(&self, queries: &mut QueryBatch<B>, groups: &[ItemGroup<'_>]) -> Tensor<B, 2> {
        let items: usize = groups.iter().map(|g| g.items.len()).sum();
        let hidden = self.run_pass(queries, groups, Some(items)).expect("a pass keeping rows returns them");
        // On the elementwise route the model's layers take: on CUDA, Burn's norm is a mean
        // reduction autotuned per item count, ~30 kernels compiled in a cold start.
        let (_, normed) = self.elementwise().add_rms_norm(hidden, None, &self.final_norm);
        normed
    }
    /// Logits of each row's labels, `[rows, labels.width()]`.
    pub fn label_logits(&self, hidden: Tensor<B, 2>, labels: &LabelTable) -> Tensor<B, 2> {
        lm_head::label_logits(hidden, self.head(), labels)
    }

    /// Full-vocabulary log-probabilities of each row's labels, `[rows, labels.width()]`.
    pub fn label_logprobs(&self, hidden: Tensor<B, 2>, labels: &LabelTable) -> Tensor<B, 2> {
        match (self.routes.labels, self.head().as_float()) {
            (LabelRoute::Kernel, Some(head)) => B::label_logprobs(hidden, head.clone(), labels),
            _ => lm_head::label_logprobs(hidden, self.head(), labels),
        }
    }

    fn head(&self) -> &TokenTable<B> {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }

    /// One forward pass: the batch's tails still to run (a group each, first), then `groups`'
    /// items. Returns the hidden state after the last layer (before the final norm) of the
    /// last row of each of the `kept_items` last items (`None`: a pass of tails alone, which
    /// keeps only K/V, in `queries`).
    fn run_pass(&self, queries: &mut QueryBatch<B>, groups: &[ItemGroup<'_>], kept_items: Option<usize>) -> Option<Tensor<B, 2>> {
        // (query, its length so far, its tail) of each query with a tail left.
        let tails: Vec<(usize, usize, Vec<u32>)> = queries.parts().enumerate().filter(|(_, (_, tail))| !tail.is_empty()).map(|(q, (so_far, tail))| (q, so_far.len(), tail.to_vec())).collect();
        let lens: Vec<Vec<usize>> = tails.iter().map(|(_, _, tail)| vec![tail.len()]).chain(groups.iter().map(|g| g.items.iter().map(|item| item.len()).collect())).collect();
        // A tail sits after its query's K/V so far and sees it whole; items see their query whole.
        let prefix_spans: Vec<(usize, usize)> =
            tails.iter().map(|&(q, so_far, _)| (queries.span(q).0, so_far)).chain(groups.iter().map(|g| queries.span(g.query))).collect();
        let layout = ItemLayout::new(prefix_spans.iter().zip(&lens).map(|(&(_, prefix_len), lens)| (prefix_len, lens.as_slice())));
        let tokens: Vec<u32> = tails.iter().flat_map(|(_, _, tail)| tail.iter().copied()).chain(groups.iter().flat_map(|g| g.items.iter().flat_map(|item| item.iter().copied()))).collect();
        let keep = kept_items.map(|items| {
            let rows = layout.last_rows();
            let kept: Vec<i64> = rows[rows.len() - items..].iter().map(|&row| row as i64).collect();
            Tensor::<B, 1, Int>::from_data(TensorData::new(kept, [items]), &self.device())
        });
        let mut tail_rows = vec![0..0; queries.parts().count()];
        let mut offset = 0;
        for (q, _, tail) in &tails {
            tail_rows[*q] = offset..offset + tail.len();
            offset += tail.len();
        }
        let mut run = (!tails.is_empty()).then(|| TailRun::new(tail_rows));
        let hidden = self.forward(&tokens, &layout, &prefix_spans, &mut |layer, keys, values| match &mut run {
            Some(run) => run.layer_prefix(queries, layer, keys, values),
            None => queries.joined(layer).clone(),
        }, keep);
        if let Some(run) = run {
            run.finish(queries);
        }
        hidden
    }

    /// Runs the packed tokens of `layout` through all layers. Group `g` attends to the prefix
    /// K/V at `prefix_spans[g]` of what `prefix(layer, keys, values)` gives each layer (which
    /// sees the layer's keys and values of every row, RoPE applied, `[rows, kv_heads,
    /// head_dim]`). Returns the hidden state after the last layer (before the final norm) of
    /// the rows `keep` names, in their order; past the last layer's attention rows no longer
    /// mix, so only those rows go through its output projection and MLP, and a pass that keeps
    /// none stops once the last layer's prefix is made.
    fn forward(
        &self,
        tokens: &[u32],
        layout: &ItemLayout,
        prefix_spans: &[(usize, usize)],
        prefix: &mut LayerPrefix<'_, B>,
        keep: Option<Tensor<B, 1, Int>>,
    ) -> Option<Tensor<B, 2>> {
        let c = &self.config;
        let device = self.device();
        let count = tokens.len();
        let mut x = self.embed_tokens.rows(tokens, &device);
        // Planned once for the pass, read by every layer (FlashInfer's plan/run split): RoPE
        // tables for the rows' positions, and the attention's tiles or gathers.
        let rope = Rope::new(&layout.positions(), &c.rope.inverse_frequencies(c.head_dim), &device);
        let group = c.num_attention_heads / c.num_key_value_heads;
        let attention = B::plan_attention(self.routes, layout, prefix_spans, group, &device);
        let (q_width, kv_width) = (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim);

        let steps = self.elementwise();
        // Each block's output waits to be added until the next norm, which adds it in the same launch.
        let mut pending: Option<Tensor<B, 2>> = None;
        for (index, layer) in self.layers.iter().enumerate() {
            let last = index + 1 == self.layers.len();
            let (residual, h) = steps.add_rms_norm(x, pending.take(), &layer.input_norm);
            x = residual;
            let mut qkv = layer.qkv_proj.forward(h);
            if let Some(bias) = &layer.qkv_bias {
                qkv = qkv + bias.clone().unsqueeze::<2>();
            }
            let heads = |t: Tensor<B, 2>, n: usize| t.reshape([count, n, c.head_dim]);
            let q = heads(qkv.clone().narrow(1, 0, q_width), c.num_attention_heads);
            let k = heads(qkv.clone().narrow(1, q_width, kv_width), c.num_key_value_heads);
            let v = heads(qkv.narrow(1, q_width + kv_width, kv_width), c.num_key_value_heads);
            let (q_norm, k_norm) = layer.qk_norm.as_ref().map(|(q, k)| (q, k)).unzip();
            let k = steps.norm_rope(k, k_norm, &rope);
            // The last layer's K/V is all a pass that keeps no rows needs. The prefix comes after
            // the queries' norm: a pass whose prefixes are all empty (`item_first`) makes its
            // unread prefix buffer here, and Burn's fusion compiles other kernels for the
            // queries' norm if that op comes before it (ones the warm-up never met).
            let q = (!last || keep.is_some()).then(|| steps.norm_rope(q, q_norm, &rope));
            let layer_prefix = prefix(index, &k, &v);
            let q = q?;
            let mut attended = attention.run(q, k, v, &layer_prefix).reshape([count, q_width]);
            if let (Some(rows), true) = (&keep, last) {
                // Past the last attention, rows no longer mix: only the kept ones go on.
                (attended, x) = (attended.select(0, rows.clone()), x.select(0, rows.clone()));
            }
            let attention_out = layer.o_proj.forward(attended);

            let (residual, h) = steps.add_rms_norm(x, Some(attention_out), &layer.post_attention_norm);
            x = residual;
            let gate_up = layer.gate_up_proj.forward(h);
            pending = Some(layer.down_proj.forward(steps.silu_mul(gate_up)));
        }
        let hidden = match pending {
            Some(mlp_out) => x + mlp_out,
            None => x,
        };
        // With no layers, no last layer selected the rows.
        keep.map(|rows| if self.layers.is_empty() { hidden.select(0, rows) } else { hidden })
    }
}

/// What a pass's layer `layer` attends to as prefixes, given the layer's keys and values of every
/// row of the pass (see [`DecoderModel::forward`]).
type LayerPrefix<'a, B> = dyn FnMut(usize, &Tensor<B, 3>, &Tensor<B, 3>) -> PrefixKv<B> + 'a;

/// The tails of a [`QueryBatch`] as one pass runs them: each layer's prefix is every query,
/// whole, end to end — its K/V so far, then its tail's K/V from the pass's rows — copied into one
/// buffer, and each query with a tail is then a window of that buffer. A layer's prefix is one
/// copy per part, not per query: tails of queries with nothing run so far sit next to each other
/// in the pass, so a batch of new queries (the load of many short prompts) joins each layer's
/// prefix with a single copy of its K and one of its V.
struct TailRun<B: ScoringBackend> {
    /// Per query of the batch: its tail's rows in the pass (empty: no tail).
    rows: Vec<Range<usize>>,
    /// The prefix of each layer so far: every query, whole, end to end.
    joined: Vec<PrefixKv<B>>,
}

impl<B: ScoringBackend> TailRun<B> {
    fn new(rows: Vec<Range<usize>>) -> Self {
        TailRun { rows, joined: Vec::new() }
    }

    /// Layer `layer`'s prefix. `keys`, `values`: the layer's, every row of the pass.
    fn layer_prefix(&mut self, queries: &QueryBatch<B>, layer: usize, keys: &Tensor<B, 3>, values: &Tensor<B, 3>) -> PrefixKv<B> {
        let so_far: Vec<&QueryKv<B>> = queries.parts().map(|(query, _)| query).collect();
        // `[rows, kv_heads, head_dim]` rows → `[kv_heads, rows, head_dim]`, a view.
        let rows_of = |tensor: &Tensor<B, 3>, rows: &Range<usize>| tensor.clone().narrow(0, rows.start, rows.len()).swap_dims(0, 1);
        let (key_parts, value_parts) = prefix_parts(so_far.iter().map(|query| query.len()), &self.rows)
            .into_iter()
            .map(|part| match part {
                PrefixPart::SoFar(query) => {
                    let kv = so_far[query].layer(layer);
                    (kv.keys, kv.values)
                }
                PrefixPart::PassRows(rows) => (rows_of(keys, &rows), rows_of(values, &rows)),
            })
            .unzip();
        // A copy even of one part: the attention reads its prefix contiguous, and the pass's
        // rows are a strided view.
        let joined = PrefixKv { keys: Tensor::cat(key_parts, 1), values: Tensor::cat(value_parts, 1) };
        self.joined.push(joined.clone());
        joined
    }

    /// Hands the queries, tails included, to the batch: each a window of the joined prefixes.
    fn finish(self, queries: &mut QueryBatch<B>) {
        let joined: Arc<[PrefixKv<B>]> = self.joined.into();
        let extended = (self.rows.iter().enumerate())
            .map(|(query, rows)| {
                let (start, len) = queries.span(query);
                (!rows.is_empty()).then(|| QueryKv::window_of(&joined, start, len))
            })
            .collect();
        queries.tails_ran(extended, joined);
    }
}

/// Where a stretch of a layer's joined prefix comes from.
#[derive(Debug, PartialEq)]
enum PrefixPart {
    /// Query `q`'s K/V so far.
    SoFar(usize),
    /// The pass's rows: one or more tails, of queries next to each other in the batch.
    PassRows(Range<usize>),
}

/// The parts of a layer's joined prefix, in order, for queries with `so_far_lens` tokens run and
/// tails at `tail_rows` of the pass (in query order, as the pass lays them out): each query's K/V
/// so far, then its tail; a tail directly after the previous query's tail (nothing run between
/// them) extends that part.
fn prefix_parts(so_far_lens: impl Iterator<Item = usize>, tail_rows: &[Range<usize>]) -> Vec<PrefixPart> {
    let mut parts = Vec::new();
    for (query, (so_far, rows)) in so_far_lens.zip(tail_rows).enumerate() {
        if so_far > 0 {
            parts.push(PrefixPart::SoFar(query));
        }
        if rows.is_empty() {
            continue;
        }
        match parts.last_mut() {
            Some(PrefixPart::PassRows(previous)) if previous.end == rows.start => previous.end = rows.end,
            _ => parts.push(PrefixPart::PassRows(rows.clone())),
        }
    }
    parts
}

/// The layers' elementwise steps on their route: the backend's fused kernels or Burn's ops.
struct Elementwise<B> {
    route: ElementwiseRoute,
    eps: f64,
    _backend: PhantomData<B>,
}

impl<B: ScoringBackend> Elementwise<B> {
    fn add_rms_norm<const D: usize>(&self, x: Tensor<B, D>, delta: Option<Tensor<B, D>>, gain: &Tensor<B, 1>) -> (Tensor<B, D>, Tensor<B, D>) {
        match self.route {
            ElementwiseRoute::Kernels => B::add_rms_norm(x, delta, gain, self.eps),
            ElementwiseRoute::Burn => elementwise::add_rms_norm(x, delta, gain, self.eps),
        }
    }

    fn norm_rope(&self, x: Tensor<B, 3>, gain: Option<&Tensor<B, 1>>, rope: &Rope<B>) -> Tensor<B, 3> {
        let (cos, sin) = rope.tables();
        match self.route {
            ElementwiseRoute::Kernels => B::norm_rope(x, gain, cos, sin, self.eps),
            ElementwiseRoute::Burn => elementwise::norm_rope(x, gain, cos, sin, self.eps),
        }
    }

    fn silu_mul(&self, gate_up: Tensor<B, 2>) -> Tensor<B, 2> {
        match self.route {
            ElementwiseRoute::Kernels => B::silu_mul(gate_up),
            ElementwiseRoute::Burn => elementwise::silu_mul(gate_up),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{prefix_parts, PrefixPart};

    #[test]
    fn new_queries_tails_join_as_one_stretch_of_the_pass() {
        // Three queries with nothing run yet, and an empty one (no query) among them.
        let parts = prefix_parts([0, 0, 0, 0].into_iter(), &[0..300, 300..420, 0..0, 420..421]);
        assert_eq!(parts, [PrefixPart::PassRows(0..421)]);
    }

    #[test]
    fn a_query_run_so_far_splits_the_tails_around_it() {
        // Query 1 resumes from the cache; query 2 is cached whole (no tail).
        let parts = prefix_parts([0, 512, 40, 0].into_iter(), &[0..10, 10..30, 0..0, 30..35]);
        assert_eq!(parts, [PrefixPart::PassRows(0..10), PrefixPart::SoFar(1), PrefixPart::PassRows(10..30), PrefixPart::SoFar(2), PrefixPart::PassRows(30..35)]);
        assert_eq!(prefix_parts([7].into_iter(), &[0..0]), [PrefixPart::SoFar(0)], "no tail: the query as it is");
    }
}
