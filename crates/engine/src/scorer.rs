//! The scoring pipeline over one loaded model: one request, or a batch of requests whose items
//! share forward passes.

use std::borrow::Borrow;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use tally_core::{padded_tokens, plan_passes, ModelLimits, PassBudget, ScoreInput, ScoreRequest, ScoreResponse};
use tally_model::weights::FloatOnly;
use tally_model::{DecoderModel, DeviceReadError, ItemGroup, LabelTable, LoadError, ModelConfig, OpenedModel, QueryBatch, Routes, ScoringBackend, WeightForm, WeightStorage, PREFILL_CHUNK};
#[cfg(not(target_arch = "wasm32"))]
use tally_model::{AttentionRoute, TileShape};
// `std::time::Instant` panics on wasm32, where the browser page runs this engine.
use web_time::Instant;

use crate::batch::{BatchItems, BatchRun, PassRead};
use crate::prefill::{prefill_queries, PrefixCacheUse};
use crate::prefix_cache::PrefixLru;
use crate::prepare::{RequestError, RequestPreparer};
use crate::stats::EngineStats;
#[cfg(not(target_arch = "wasm32"))]
use crate::tile_tuning::{AttentionShape, TileTuning};
use crate::tokenizer::{TextTokenizer, TokenizerError};
use crate::warmup::{warmup_steps, WarmupStep};

/// Why scoring failed: the request (the caller's fault), or loading and running the model.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Read(#[from] DeviceReadError),
}

#[derive(Debug, Clone, Copy, Default)]
pub struct ScorerOptions {
    pub pass_budget: PassBudget,
    /// Device bytes for prefilled queries kept across requests; 0 disables the cache.
    pub prefix_cache_bytes: usize,
    /// Weight matrices as the file stores them, or as float.
    pub weights: WeightForm,
}

/// One request's answer from a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// `scores[i][j]`: label `j` after item `i`.
    pub scores: Vec<Vec<f64>>,
    /// How its query was found in the prefix cache.
    pub prefix_cache: PrefixCacheUse,
}

/// A model, its tokenizer and the scoring pipeline.
pub struct Scorer<B: ScoringBackend> {
    model: DecoderModel<B>,
    preparer: RequestPreparer,
    options: ScorerOptions,
    prefix_cache: PrefixLru<B>,
    stats: Arc<EngineStats>,
    /// How the flash kernel's tile was picked, where it was timed ([`Self::tune_flash_tile`]).
    #[cfg(not(target_arch = "wasm32"))]
    tile_tuning: Option<TileTuning>,
}

impl<B: ScoringBackend> Scorer<B> {
    /// Loads a model (a Hugging Face directory or a GGUF file) and its tokenizer, if it has
    /// one (without, requests must send token ids).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(path: &std::path::Path, device: &B::Device, options: ScorerOptions) -> Result<Self, EngineError> {
        Self::load_with_progress(path, device, options, &mut |_, _| {})
    }

    /// [`Self::load`], calling `progress(done, total)` as the model's layers are read.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load_with_progress(path: &std::path::Path, device: &B::Device, options: ScorerOptions, progress: &mut dyn FnMut(usize, usize)) -> Result<Self, EngineError> {
        let files = tally_model::ModelFiles::locate(path)?;
        Self::from_opened(files.open()?, files.name(), device, options, progress)
    }

    /// A model whose files are already open (or in memory), named `model_name` in responses.
    pub fn from_opened(opened: OpenedModel, model_name: String, device: &B::Device, options: ScorerOptions, progress: &mut dyn FnMut(usize, usize)) -> Result<Self, EngineError> {
        let tokenizer = TextTokenizer::from_source(opened.tokenizer)?;
        let weights = match options.weights {
            WeightForm::Compact => opened.weights,
            WeightForm::Float => Box::new(FloatOnly(opened.weights)),
        };
        let model = DecoderModel::load(opened.config, weights.as_ref(), device, progress).map_err(LoadError::from)?;
        let config = model.config();
        let limits = ModelLimits { vocab_size: config.vocab_size, max_positions: config.max_position_embeddings };
        let stats = Arc::new(EngineStats::default());
        stats.prefix_cache_capacity_bytes.store(options.prefix_cache_bytes as u64, Relaxed);
        Ok(Scorer {
            preparer: RequestPreparer::new(tokenizer, limits, model_name),
            model,
            options,
            prefix_cache: PrefixLru::new(options.prefix_cache_bytes),
            stats,
            #[cfg(not(target_arch = "wasm32"))]
            tile_tuning: None,
        })
    }

    /// Names the model in responses (default: the directory's name).
    pub fn with_model_name(mut self, name: String) -> Self {
        self.preparer = self.preparer.renamed(name);
        self
    }

    /// Asks for the hot paths' routes; the backend answers what it runs (see [`Routes`]).
    pub fn set_routes(&mut self, requested: Routes) {
        self.model.set_routes(requested);
    }

    /// Times `candidates` (the first the backend's default) for the flash route at S1's shape on
    /// this model's heads ([`Self::flash_tuning_shape`]) and runs the fastest from now on
    /// ([`crate::tile_tuning`]); `None` where the routes the backend runs are not the flash
    /// kernel's (the CPU runs its own kernel for every route).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn tune_flash_tile(&mut self, candidates: &[TileShape]) -> Result<Option<TileTuning>, EngineError> {
        let Some(routes) = self.flash_routes() else { return Ok(None) };
        let tuning = crate::tile_tuning::tune::<B>(candidates, routes, self.flash_tuning_shape(), &self.model.device())?;
        if let Some(tuning) = tuning.clone() {
            self.adopt_flash_tile(tuning);
        }
        Ok(tuning)
    }

    /// Runs the tile `tuning` picked (one timed at an earlier start on this device and shape) and
    /// reports it as [`Self::tile_tuning`]; false, and nothing changed, where the routes the
    /// backend runs are not the flash kernel's.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn adopt_flash_tile(&mut self, tuning: TileTuning) -> bool {
        let Some(routes) = self.flash_routes() else { return false };
        self.model.set_routes(Routes { attention: AttentionRoute::Flash(tuning.picked), ..routes });
        self.tile_tuning = Some(tuning);
        true
    }

    /// The routes the backend runs, where attention is on the flash kernel's (the CPU runs its
    /// own kernel for every route).
    #[cfg(not(target_arch = "wasm32"))]
    fn flash_routes(&self) -> Option<Routes> {
        let routes = self.model.routes();
        matches!(routes.attention, AttentionRoute::Flash(_)).then_some(routes)
    }

    /// The one layer's attention [`Self::tune_flash_tile`] times: S1's pass on this model's
    /// heads, within its positions and this scorer's pass budget.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn flash_tuning_shape(&self) -> AttentionShape {
        let config = self.model.config();
        AttentionShape::s1(config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.max_position_embeddings, self.options.pass_budget.max_tokens)
    }

    /// The last [`Self::tune_flash_tile`]'s timings and pick, if one ran.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn tile_tuning(&self) -> Option<&TileTuning> {
        self.tile_tuning.as_ref()
    }

    /// The model's shape.
    pub fn model_config(&self) -> &ModelConfig {
        self.model.config()
    }

    /// What runs each hot path.
    pub fn routes(&self) -> Routes {
        self.model.routes()
    }

    /// How the model holds its weight matrices.
    pub fn weight_storage(&self) -> WeightStorage {
        self.model.weight_storage()
    }

    /// Most padded item tokens per pass that the device's free memory allows
    /// ([`PassBudget::tokens_for_memory`] of the model's activation bytes per token), or `None`
    /// where the backend cannot tell (the CPU, wgpu).
    pub fn device_pass_tokens(&self) -> Option<usize> {
        let free = B::free_memory(&self.model.device())?;
        Some(PassBudget::tokens_for_memory(free, self.model.pass_bytes_per_token()))
    }

    /// Most attention score cells per head a pass on a scores-in-memory route may take that the
    /// device's free memory allows ([`PassBudget::attention_cells_for_memory`]), or `None`
    /// where the backend cannot tell (the CPU, wgpu).
    pub fn device_attention_cells(&self) -> Option<usize> {
        let free = B::free_memory(&self.model.device())?;
        Some(PassBudget::attention_cells_for_memory(free, self.model.config().num_attention_heads))
    }

    /// Most attention score cells per head a pass may take from now on, where the route holds
    /// a pass's scores in memory (the cascade).
    pub fn set_max_attention_cells(&mut self, cells: usize) {
        self.options.pass_budget.max_attention_cells = cells;
    }

    /// Most padded item tokens per pass from now on (and the largest warm-up pass).
    pub fn set_max_pass_tokens(&mut self, tokens: usize) {
        self.options.pass_budget.max_tokens = tokens;
    }

    pub fn max_pass_tokens(&self) -> usize {
        self.options.pass_budget.max_tokens
    }

    /// The budget item passes are planned in. Its attention-cell bound is the memory of the
    /// cascade's score matrices, one row of scores per query head, so the cells a head may take
    /// are also bounded by the device's largest buffer (in float32, what the softmax runs in).
    /// The attention kernels hold a tile of scores at a time, so on their routes the bound does
    /// not apply: S1's 500 items of 20 tokens after a 2,020-token query, 20.4 M cells, would
    /// otherwise split into two passes however many tokens a pass may hold.
    fn pass_budget(&self) -> PassBudget {
        let budget = self.options.pass_budget;
        if !self.model.routes().attention.scores_in_memory() {
            return PassBudget { max_attention_cells: usize::MAX, ..budget };
        }
        let score_row_bytes = (self.model.config().num_attention_heads * std::mem::size_of::<f32>()) as u64;
        let buffer_cells = B::max_buffer_bytes(&self.model.device()).map_or(usize::MAX, |bytes| usize::try_from(bytes / score_row_bytes).unwrap_or(usize::MAX));
        PassBudget { max_attention_cells: budget.max_attention_cells.min(buffer_cells), ..budget }
    }

    /// Tokenization and validation for this model, shareable with other threads.
    pub fn preparer(&self) -> &RequestPreparer {
        &self.preparer
    }

    pub fn stats(&self) -> Arc<EngineStats> {
        Arc::clone(&self.stats)
    }

    /// The warm-up this scorer's backend needs before traffic: a step per shape class it
    /// compiles or tunes for ([`ScoringBackend::warmup_rows`]), up to this scorer's pass budget
    /// and queries of two prefill chunks (one resumed from the cache). None on the CPU.
    pub fn warmup_steps(&self) -> Vec<WarmupStep> {
        let max_pass_tokens = self.options.pass_budget.max_tokens;
        let rows = B::warmup_rows(max_pass_tokens.max(2 * PREFILL_CHUNK));
        // A query's length is a shape class only where it is a matmul dimension (the cascade's
        // scores); elsewhere two prefill chunks meet every class, and the attention of long
        // queries would only lengthen the warm-up.
        let max_query_tokens = if self.model.routes().attention.scores_in_memory() { usize::MAX } else { 2 * PREFILL_CHUNK };
        warmup_steps(&rows, max_pass_tokens, max_query_tokens, self.preparer.limits())
    }

    /// Runs `steps` (see [`Self::warmup_steps`]), so kernels are compiled and matmuls tuned
    /// before the first request; `progress(done, total, step)` after each step. It leaves no
    /// trace: the prefix cache starts empty afterwards and the statistics never see it.
    pub fn warm_up(&mut self, steps: &[WarmupStep], progress: &mut dyn FnMut(usize, usize, &WarmupStep)) -> Result<(), EngineError> {
        let stats = std::mem::take(&mut self.stats);
        let outcome = steps.iter().enumerate().try_for_each(|(done, step)| {
            for batch in &step.batches {
                self.score_batch(&batch.iter().collect::<Vec<_>>())?;
            }
            progress(done + 1, steps.len(), step);
            Ok(())
        });
        self.stats = stats;
        self.prefix_cache = PrefixLru::new(self.options.prefix_cache_bytes);
        outcome
    }

    /// Validates, tokenizes and scores one request.
    pub fn score(&mut self, request: &ScoreRequest) -> Result<ScoreResponse, EngineError> {
        block_on(self.score_async(request))
    }

    /// `scores[r][i][j]` for a batch of validated requests (see [`Self::begin_batch`]).
    pub fn score_batch(&mut self, inputs: &[&ScoreInput]) -> Result<Vec<Vec<Vec<f64>>>, EngineError> {
        let scored = self.score_batch_while(inputs, &|_| true)?;
        Ok(scored.into_iter().map(|s| s.expect("every request is wanted").scores).collect())
    }

    /// [`Self::score_batch`], asking `wanted(r)` before each query and each pass: a request
    /// nobody waits for any more (client gone, deadline passed) stops costing work and comes
    /// back `None`.
    pub fn score_batch_while(&mut self, inputs: &[&ScoreInput], wanted: &dyn Fn(usize) -> bool) -> Result<Vec<Option<Scored>>, EngineError> {
        block_on(self.score_batch_while_async(inputs, wanted))
    }

    /// Validates, tokenizes and scores one request, reading results back asynchronously: the
    /// browser's path, where blocking on the device is impossible.
    pub async fn score_async(&mut self, request: &ScoreRequest) -> Result<ScoreResponse, EngineError> {
        let input = self.preparer.prepare(request)?;
        let mut scores = self.score_batch_while_async(&[&input], &|_| true).await?;
        let scores = scores.remove(0).expect("the request is wanted").scores;
        let model = request.model.clone().unwrap_or_else(|| self.preparer.model_name().to_owned());
        Ok(ScoreResponse::new(scores, model, input.prompt_tokens()))
    }

    /// [`Self::score_batch_while`] with asynchronous readback; the one implementation of both:
    /// each pass issued before the one before it is read.
    async fn score_batch_while_async(&mut self, inputs: &[&ScoreInput], wanted: &dyn Fn(usize) -> bool) -> Result<Vec<Option<Scored>>, EngineError> {
        let mut run = self.begin_batch(inputs.to_vec(), wanted);
        self.issue_passes(&mut run, wanted, 1).await?;
        self.read_unread(&mut run).await?;
        Ok(self.finish_batch(run))
    }

    /// Starts a batch of validated requests: each query taken from the prefix cache or
    /// prefilled (the misses together), the items of every request planned into shared passes,
    /// in which each item attends to its own request's query. With `item_first` nothing can be
    /// shared, so each `item + query` is a sequence of its own with an empty prefix. No pass is
    /// issued yet: [`Self::issue_pass`] issues them one at a time, [`Self::read_pass`] reads
    /// them back in order, [`Self::finish_batch`] gives the answers. `wanted(r)` is asked
    /// before the queries run, as before each pass.
    pub fn begin_batch<I: Borrow<ScoreInput>>(&mut self, inputs: Vec<I>, wanted: &dyn Fn(usize) -> bool) -> BatchRun<B, I> {
        let dropped: Vec<bool> = (0..inputs.len()).map(|r| !wanted(r)).collect();
        let wanted_queries: Vec<Option<&[u32]>> = inputs.iter().map(Borrow::borrow).zip(&dropped).map(|(input, &dropped): (&ScoreInput, _)| (!input.item_first && !dropped).then_some(&*input.query)).collect();
        let items = BatchItems::new(&inputs);
        let shapes = items.shapes(&inputs, &wanted_queries);
        let budget = self.pass_budget();
        let passes = plan_passes(&shapes, budget);
        // The queries' last chunks run in the first item pass where it has room for them: every
        // pass then leaves room for them, so they go in only where the items still take as many
        // passes and every pass, tails included, stays within the token budget (an item longer
        // than the room left gets a pass of its own, past it). A batch of new queries whose tails
        // and items fit one pass is then one pass, however much of it the tails take. Only on
        // the routes that keep no score matrix, whose cells the planner would have to count.
        let with_tails = |tail_tokens: usize| PassBudget { max_tokens: budget.max_tokens.saturating_sub(tail_tokens).max(1), ..budget };
        let tails_fit = |tail_tokens: usize| {
            if self.model.routes().attention.scores_in_memory() {
                return false;
            }
            let passes_with_tails = plan_passes(&shapes, with_tails(tail_tokens));
            passes_with_tails.len() == passes.len() && passes_with_tails.iter().all(|pass| padded_tokens(&shapes, pass) + tail_tokens <= budget.max_tokens)
        };
        let queries = prefill_queries(&self.model, &mut self.prefix_cache, &self.stats, &wanted_queries, self.options.pass_budget.max_tokens, &tails_fit);
        let tail_tokens = queries.queries.tail_tokens();
        let passes = if tail_tokens == 0 { passes } else { plan_passes(&shapes, with_tails(tail_tokens)) };
        let (query_of, cache_uses) = queries.of_request.iter().copied().unzip();
        let scores = inputs.iter().map(|input| vec![Vec::new(); input.borrow().items.len()]).collect();
        BatchRun { inputs, items, queries: Some(queries), query_of, cache_uses, passes: passes.into_iter(), unread: VecDeque::new(), scores, dropped }
    }

    /// Issues `run`'s next pass (the batch's query tails first, if any are left), asking
    /// `wanted(r)` first: a pass left with no wanted item is skipped. The pass's label values
    /// start on their way to the host ([`ScoringBackend::start_read`]), so the next pass can be
    /// issued before they are read. False when every pass has been issued.
    pub fn issue_pass<I: Borrow<ScoreInput>>(&mut self, run: &mut BatchRun<B, I>, wanted: &dyn Fn(usize) -> bool) -> bool {
        for (r, dropped) in run.dropped.iter_mut().enumerate() {
            *dropped = *dropped || !wanted(r);
        }
        let issued = loop {
            let Some(mut pass) = run.passes.next() else { break false };
            pass.retain(|&e| !run.dropped[run.items.entries[e].0]);
            if pass.is_empty() {
                continue;
            }
            self.stats.pass_items.observe(pass.len() as f64);
            let queries = run.queries.as_mut().expect("the queries are kept until the last pass is issued");
            let read = self.issue(&mut queries.queries, &run.query_of, &run.inputs, &run.items, pass);
            queries.cache_run_tails(&mut self.prefix_cache, &self.stats);
            run.unread.push_back(read);
            break true;
        };
        if run.passes.len() == 0 {
            // The prefix K/V of every pass is on the device's queue; what the cache keeps of it stays.
            run.queries = None;
        }
        issued
    }

    /// Waits for the oldest pass of `run` issued and not read, and keeps its items' scores.
    /// False when no pass is left unread.
    pub async fn read_pass<I: Borrow<ScoreInput>>(&self, run: &mut BatchRun<B, I>) -> Result<bool, EngineError> {
        let Some(pass) = run.unread.pop_front() else { return Ok(false) };
        let waiting = Instant::now();
        let data = pass.values.await?.convert::<f32>();
        self.stats.pass_wait_seconds.observe(waiting.elapsed().as_secs_f64());
        let values = data.as_slice::<f32>().map_err(|error| DeviceReadError(format!("{error:?}")))?;
        run.keep_scores(&pass.rows, values, pass.width);
        Ok(true)
    }

    /// Issues the rest of `run`'s passes ([`Self::issue_pass`]), each once at most `ahead`
    /// passes issued before it are unread (the oldest read meanwhile): 1 keeps the next pass on
    /// the device while the host reads the last; 0 reads each pass before issuing the next.
    pub async fn issue_passes<I: Borrow<ScoreInput>>(&mut self, run: &mut BatchRun<B, I>, wanted: &dyn Fn(usize) -> bool, ahead: usize) -> Result<(), EngineError> {
        loop {
            while run.passes_unread() > ahead {
                self.read_pass(run).await?;
            }
            if !self.issue_pass(run, wanted) {
                return Ok(());
            }
        }
    }

    /// Reads every pass of `run` issued and not yet read ([`Self::read_pass`]).
    pub async fn read_unread<I: Borrow<ScoreInput>>(&self, run: &mut BatchRun<B, I>) -> Result<(), EngineError> {
        while self.read_pass(run).await? {}
        Ok(())
    }

    /// The answers of a batch whose passes have all been issued and read (`None`: a request
    /// dropped on the way), and the batch in the engine's counters.
    pub fn finish_batch<I: Borrow<ScoreInput>>(&self, run: BatchRun<B, I>) -> Vec<Option<Scored>> {
        assert!(run.passes.len() == 0 && run.unread.is_empty(), "a batch finishes once its passes are issued and read");
        self.count_batch(&run.inputs, &run.dropped);
        run.scores.into_iter().zip(run.cache_uses).zip(run.dropped).map(|((scores, prefix_cache), dropped)| (!dropped).then_some(Scored { scores, prefix_cache })).collect()
    }

    /// Issues one forward pass over `pass` (entries of `items`), the batch's query tails first
    /// if any are left, and starts reading its label values. Request `r` reads query
    /// `query_of[r]` of `queries`.
    fn issue<I: Borrow<ScoreInput>>(&self, queries: &mut QueryBatch<B>, query_of: &[usize], inputs: &[I], items: &BatchItems, mut pass: Vec<usize>) -> PassRead {
        // Items of one request must be adjacent: they form one prefix group.
        pass.sort_by_key(|&e| items.entries[e].0);
        let runs: Vec<&[usize]> = pass.chunk_by(|&a, &b| items.entries[a].0 == items.entries[b].0).collect();
        let request_of = |run: &[usize]| items.entries[run[0]].0;
        let input_of = |run: &[usize]| inputs[request_of(run)].borrow();
        let groups: Vec<ItemGroup> = runs
            .iter()
            .map(|run| ItemGroup { query: query_of[request_of(run)], items: run.iter().map(|&e| items.sequence(inputs, items.entries[e].0, items.entries[e].1)).collect() })
            .collect();
        let started = Instant::now();
        let hidden = self.model.last_hidden(queries, &groups);
        let row_labels: Vec<&[u32]> = runs.iter().flat_map(|run| std::iter::repeat_n(&*input_of(run).labels, run.len())).collect();
        let labels = LabelTable::new(&row_labels);
        // One sweep over the vocabulary serves every row of the pass: rows that want only a
        // softmax over their labels get it from log-probabilities just as well (the normalizer
        // cancels).
        let full_vocab = runs.iter().any(|run| !input_of(run).apply_softmax);
        let values = if full_vocab { self.model.label_logprobs(hidden, &labels) } else { self.model.label_logits(hidden, &labels) };
        let values = B::start_read(values);
        self.stats.pass_issue_seconds.observe(started.elapsed().as_secs_f64());
        let rows = runs.concat();
        PassRead { values, rows, width: labels.width() }
    }

    /// The batch in the engine's counters: its size, what was scored, what was abandoned.
    fn count_batch(&self, inputs: &[impl Borrow<ScoreInput>], dropped: &[bool]) {
        self.stats.batch_requests.observe(inputs.len() as f64);
        let kept = || inputs.iter().map(Borrow::borrow).zip(dropped).filter(|(_, &dropped)| !dropped).map(|(input, _): (&ScoreInput, _)| input);
        self.stats.items_scored.fetch_add(kept().map(|i| i.items.len() as u64).sum(), Relaxed);
        self.stats.tokens_scored.fetch_add(kept().map(|i| i.prompt_tokens() as u64).sum(), Relaxed);
        self.stats.requests_abandoned.fetch_add(dropped.iter().filter(|&&d| d).count() as u64, Relaxed);
    }
}

/// `scoring`'s outcome, waited for where the host can wait for the device (not the browser,
/// which awaits the async API).
pub(crate) fn block_on<T>(scoring: impl std::future::Future<Output = Result<T, EngineError>>) -> Result<T, EngineError> {
    burn::tensor::try_read_sync(scoring).unwrap_or_else(|| Err(DeviceReadError("this platform cannot wait for the device synchronously: use the async API".into()).into()))
}
