//! What a scoring pass shares between items: the query's K/V, computed once per request.

use std::cell::OnceCell;
use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor};

use crate::kv::{spans_end_to_end, PrefixKv};

/// Query tokens per prefill chunk. A query resumed from a cached part a multiple of this long
/// keeps a fresh prefill's chunk boundaries, so it is bit-identical to one; resumed elsewhere
/// it equals one to float rounding (its last tokens run in a pass of another size).
pub const PREFILL_CHUNK: usize = 512;

/// The query's K/V for every layer, computed once and attended to by all items of a request.
///
/// A window of tokens over buffers it may share (a pass's queries end to end, or a longer
/// query's beginning): taking one query of a pass, or a query's beginning, is a new window, not a
/// tensor view a layer. On Burn's fusion every view is an operation registered with the device's
/// thread, so views a layer for each of a load batch's 64 queries were most of the host's time
/// on it (`tests/cuda_launches.rs`); a layer's view is made where a pass reads that layer.
#[derive(Clone, Debug)]
pub struct QueryKv<B: Backend> {
    /// Per layer, `[kv_heads, tokens, head_dim]`, this query's tokens among them.
    buffers: Arc<[PrefixKv<B>]>,
    /// This query's first token in the buffers.
    start: usize,
    len: usize,
}

impl<B: Backend> QueryKv<B> {
    /// No query at all: items then attend only to themselves (used for `item_first`).
    pub(crate) fn empty(layers: usize, kv_heads: usize, head_dim: usize, device: &B::Device) -> Self {
        // `empty`, not `zeros`: a fill of zero elements is a zero-block launch, which CUDA rejects.
        let empty = Tensor::<B, 3>::empty([kv_heads, 0, head_dim], device);
        Self::from_layers(vec![PrefixKv { keys: empty.clone(), values: empty }; layers])
    }

    /// A query whose K/V per layer is `layers` (`[kv_heads, len, head_dim]` each, RoPE applied).
    pub fn from_layers(layers: Vec<PrefixKv<B>>) -> Self {
        let len = layers.first().map_or(0, PrefixKv::len);
        assert!(layers.iter().all(|kv| kv.len() == len), "every layer covers the same tokens");
        QueryKv { buffers: layers.into(), start: 0, len }
    }

    /// Tokens `start..start + len` of every layer of `joined`, no copy: one query of a pass
    /// that ran several end to end.
    pub(crate) fn window_of(joined: &Arc<[PrefixKv<B>]>, start: usize, len: usize) -> Self {
        assert!(joined.iter().all(|kv| start + len <= kv.len()), "tokens {start}..{} of a buffer of fewer", start + len);
        QueryKv { buffers: Arc::clone(joined), start, len }
    }

    /// Layer `layer`'s K/V of this query: its buffer, or a view of the query's tokens in it.
    pub(crate) fn layer(&self, layer: usize) -> PrefixKv<B> {
        let kv = &self.buffers[layer];
        if self.shares_buffers() {
            kv.tokens(self.start, self.len)
        } else {
            kv.clone()
        }
    }

    /// Whether the buffers hold more than this query (a longer query's, or every query of a
    /// pass): such a query keeps that memory alive unseen by [`Self::size_bytes`];
    /// [`Self::compacted`] copies it out.
    fn shares_buffers(&self) -> bool {
        self.buffers.first().is_some_and(|kv| kv.len() != self.len)
    }

    /// This query in buffers of its own, copied out of the ones it shares (a view, kept, would
    /// hold a whole pass's queries alive); itself when it shares none.
    pub fn compacted(self) -> Self {
        if !self.shares_buffers() {
            return self;
        }
        // Burn's `cat` writes a new buffer even for a lone part.
        let copy = |tensor: Tensor<B, 3>| Tensor::cat(vec![tensor], 1);
        Self::from_layers((0..self.buffers.len()).map(|layer| self.layer(layer)).map(|kv| PrefixKv { keys: copy(kv.keys), values: copy(kv.values) }).collect())
    }

    /// Whether `next`'s tokens come right after this query's in the same buffers.
    fn is_followed_in_its_buffers_by(&self, next: &QueryKv<B>) -> bool {
        Arc::ptr_eq(&self.buffers, &next.buffers) && self.start + self.len == next.start
    }

    /// Query tokens covered.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device memory this query's K/V takes (of its buffers, its own tokens').
    pub fn size_bytes(&self) -> usize {
        let token_bytes = |kv: &PrefixKv<B>| {
            let [kv_heads, _, head_dim] = kv.keys.dims();
            2 * kv_heads * head_dim * kv.keys.dtype().size()
        };
        self.buffers.iter().map(|kv| self.len * token_bytes(kv)).sum()
    }

    /// The K/V of this query's first `len` tokens, no copy: attention is causal, so a token's
    /// K/V depends only on the tokens up to it, and a query's beginning is the K/V of any query
    /// that begins the same way.
    pub fn truncated(&self, len: usize) -> Self {
        assert!(len <= self.len, "{len} tokens of a query of {}", self.len);
        QueryKv { buffers: Arc::clone(&self.buffers), start: self.start, len }
    }
}

/// The queries of a batch of requests, for every pass over their items. Every route of
/// attention reads one buffer per layer with every query end to end along the token axis
/// (`[kv_heads, Σ len, head_dim]`, see [`PrefixKv::join`]), joined once per batch, not per pass
/// or per layer; a batch of one query is that query, no copy.
///
/// A query may come with a *tail*: its last tokens, not yet run. Tails run in the batch's first
/// pass, as rows of their own before the items (each tail attends to its query's K/V so far
/// and causally to itself, as an item does), and the items of that pass already see their
/// whole query — so a request whose query is cached but for a new suffix is one forward pass,
/// not a prefill pass and an item pass.
pub struct QueryBatch<B: Backend> {
    queries: Vec<QueryKv<B>>,
    /// Per query: its tokens not yet run (empty once they have).
    tails: Vec<Vec<u32>>,
    /// Per query, tail included: its first token and length in the joined K/V.
    spans: Vec<(usize, usize)>,
    joined: OnceCell<Arc<[PrefixKv<B>]>>,
}

impl<B: Backend> QueryBatch<B> {
    /// `queries` of one model (at least one; an empty query stands for none), all run.
    pub fn new(queries: Vec<QueryKv<B>>) -> Self {
        let tails = vec![Vec::new(); queries.len()];
        Self::with_tails(queries, tails)
    }

    /// `queries` of one model (at least one), query `q` followed by `tails[q]`, which the
    /// batch's first pass runs.
    pub fn with_tails(queries: Vec<QueryKv<B>>, tails: Vec<Vec<u32>>) -> Self {
        assert!(!queries.is_empty(), "a batch has at least one query");
        assert_eq!(queries.len(), tails.len(), "one tail per query");
        let spans = spans_end_to_end(queries.iter().zip(&tails).map(|(query, tail)| query.len() + tail.len()));
        QueryBatch { queries, tails, spans, joined: OnceCell::new() }
    }

    /// Query `index`'s length, its tail included.
    pub fn query_len(&self, index: usize) -> usize {
        self.spans[index].1
    }

    /// (first token, length) of query `index`, its tail included, in [`Self::joined`].
    pub fn span(&self, index: usize) -> (usize, usize) {
        self.spans[index]
    }

    /// Tokens of tails still to run, in all.
    pub fn tail_tokens(&self) -> usize {
        self.tails.iter().map(Vec::len).sum()
    }

    /// Each query's K/V so far and its tail (empty once run).
    pub(crate) fn parts(&self) -> impl Iterator<Item = (&QueryKv<B>, &[u32])> {
        self.queries.iter().zip(self.tails.iter().map(Vec::as_slice))
    }

    /// Query `index`, whole: only once its tail has run.
    pub fn query(&self, index: usize) -> &QueryKv<B> {
        assert!(self.tails[index].is_empty(), "query {index}'s tail has not run yet");
        &self.queries[index]
    }

    /// Every query's K/V in layer `layer`, end to end: only once the tails have run.
    pub fn joined(&self, layer: usize) -> &PrefixKv<B> {
        &self.joined_layers()[layer]
    }

    fn joined_layers(&self) -> &Arc<[PrefixKv<B>]> {
        assert_eq!(self.tail_tokens(), 0, "tails run in the batch's first pass, before anything reads the joined K/V");
        self.joined.get_or_init(|| self.join())
    }

    /// The tails have run: `extended[q]` is query `q` whole where it had a tail, and `joined`
    /// every layer's K/V of all queries end to end (the pass that ran the tails built it; the
    /// extended queries may be windows of it).
    pub(crate) fn tails_ran(&mut self, extended: Vec<Option<QueryKv<B>>>, joined: Arc<[PrefixKv<B>]>) {
        for ((query, tail), extended) in self.queries.iter_mut().zip(&mut self.tails).zip(extended) {
            if let Some(extended) = extended {
                assert_eq!(extended.len(), query.len() + tail.len(), "a tail extends its query by its tokens");
                (*query, *tail) = (extended, Vec::new());
            }
        }
        assert_eq!(self.tail_tokens(), 0, "every tail ran");
        self.joined = OnceCell::from(joined);
    }

    /// Queries `indices` (ascending, tails run) in buffers of their own, shared by them alone:
    /// each layer's K/V of those queries end to end, copied out of the joined K/V a stretch at a
    /// time (queries next to each other there are one stretch), or the joined K/V itself where
    /// they are all of it (a batch of new queries, all to be cached: no copy). Each query comes
    /// back as a window of the new buffers, which hold nothing else (see `PrefixLru`'s shared
    /// entries).
    pub fn own_copies(&self, indices: &[usize]) -> Vec<QueryKv<B>> {
        let spans: Vec<(usize, usize)> = indices.iter().map(|&q| self.span(q)).collect();
        if spans.iter().all(|&(_, len)| len == 0) {
            // Queries of no tokens hold nothing to copy.
            return indices.iter().map(|&q| self.query(q).clone()).collect();
        }
        let mut stretches: Vec<(usize, usize)> = Vec::new();
        for &(start, len) in spans.iter().filter(|&&(_, len)| len > 0) {
            match stretches.last_mut() {
                Some((first, total)) if *first + *total == start => *total += len,
                _ => stretches.push((start, len)),
            }
        }
        let whole = self.spans.iter().map(|&(_, len)| len).sum::<usize>();
        let joined = self.joined_layers();
        let own: Arc<[PrefixKv<B>]> = match stretches.as_slice() {
            [(0, total)] if *total == whole => Arc::clone(joined),
            _ => joined
                .iter()
                .map(|layer| {
                    let copy = |tensor: &Tensor<B, 3>| Tensor::cat(stretches.iter().map(|&(start, len)| tensor.clone().narrow(1, start, len)).collect(), 1);
                    PrefixKv { keys: copy(&layer.keys), values: copy(&layer.values) }
                })
                .collect(),
        };
        spans_end_to_end(spans.iter().map(|&(_, len)| len)).into_iter().map(|(start, len)| QueryKv::window_of(&own, start, len)).collect()
    }

    /// Every query end to end, a buffer a layer. Queries lying side by side in one buffer (a
    /// pass's, cached together and met again in that order) go in as one part.
    fn join(&self) -> Arc<[PrefixKv<B>]> {
        let stretches = self.stretches();
        (0..self.queries[0].buffers.len())
            .map(|layer| {
                let parts: Vec<PrefixKv<B>> = stretches.iter().map(|stretch| stretch.layer(layer)).collect();
                PrefixKv::join(&parts.iter().collect::<Vec<_>>()).0
            })
            .collect()
    }

    /// The queries in order, those lying side by side in one buffer merged into one window.
    fn stretches(&self) -> Vec<QueryKv<B>> {
        let mut stretches: Vec<QueryKv<B>> = Vec::new();
        for query in &self.queries {
            match stretches.last_mut() {
                Some(last) if last.is_followed_in_its_buffers_by(query) => last.len += query.len,
                _ => stretches.push(query.clone()),
            }
        }
        stretches
    }
}

/// Items that share one query: the items of one request in a pass over several requests.
pub struct ItemGroup<'a> {
    /// The request's query: an index into the pass's [`QueryBatch`].
    pub query: usize,
    pub items: Vec<&'a [u32]>,
}

#[cfg(test)]
mod tests {
    use burn::backend::NdArray;
    use burn::tensor::{Tensor, TensorData};

    use super::*;

    type B = NdArray<f32>;

    /// Two layers of `len` tokens, 1 KV head of 2 dims; every value names its query, layer,
    /// token and (for values) its tensor: `query·1000 + layer·100 + token·10 + dim (+ 5)`.
    fn query(id: usize, len: usize) -> QueryKv<B> {
        let tensor = |layer: usize, offset: f32| {
            let values: Vec<f32> = (0..len).flat_map(|t| (0..2).map(move |d| (id * 1000 + layer * 100 + t * 10 + d) as f32 + offset)).collect();
            Tensor::<B, 3>::from_data(TensorData::new(values, [1, len, 2]), &Default::default())
        };
        QueryKv::from_layers((0..2).map(|layer| PrefixKv { keys: tensor(layer, 0.0), values: tensor(layer, 5.0) }).collect())
    }

    fn host(tensor: &Tensor<B, 3>) -> Vec<f32> {
        tensor.to_data().to_vec().unwrap()
    }

    #[test]
    fn a_batch_joins_its_queries_end_to_end_skipping_empty_ones() {
        let device = Default::default();
        let batch = QueryBatch::new(vec![query(1, 2), QueryKv::empty(2, 1, 2, &device), query(3, 1)]);
        assert_eq!([batch.span(0), batch.span(1), batch.span(2)], [(0, 2), (2, 0), (2, 1)]);
        assert_eq!([batch.query_len(0), batch.query_len(1), batch.query_len(2)], [2, 0, 1]);
        for layer in 0..2 {
            let joined = batch.joined(layer);
            let expected: Vec<f32> = [(1, 0), (1, 1), (3, 0)].iter().flat_map(|&(q, t)| (0..2).map(move |d| (q * 1000 + layer * 100 + t * 10 + d) as f32)).collect();
            assert_eq!(host(&joined.keys), expected, "layer {layer}");
            assert_eq!(host(&joined.values), expected.iter().map(|v| v + 5.0).collect::<Vec<_>>());
            assert!(std::ptr::eq(joined, batch.joined(layer)), "joined once per batch");
        }
    }

    #[test]
    fn a_tail_counts_in_its_querys_span_until_the_first_pass_runs_it() {
        let mut batch = QueryBatch::with_tails(vec![query(1, 2), query(2, 3)], vec![vec![9; 4], Vec::new()]);
        assert_eq!([batch.span(0), batch.span(1)], [(0, 6), (6, 3)], "query 0's 2 tokens and its 4-token tail");
        assert_eq!(batch.tail_tokens(), 4);
        let whole = query(1, 6);
        let joined = (0..2).map(|layer| PrefixKv::join(&[&whole.layer(layer), &query(2, 3).layer(layer)]).0).collect();
        batch.tails_ran(vec![Some(whole), None], joined);
        assert_eq!((batch.tail_tokens(), batch.query(0).len(), batch.span(1)), (0, 6, (6, 3)));
        assert_eq!(host(&batch.joined(1).keys)[..12], host(&query(1, 6).layer(1).keys)[..], "the pass's joined K/V is the batch's");
    }

    #[test]
    fn a_lone_query_is_its_own_joined_buffer_and_no_query_leaves_one_unread_token() {
        let lone = QueryBatch::new(vec![query(7, 3)]);
        assert_eq!(host(&lone.joined(1).keys), host(&query(7, 3).layer(1).keys));
        let none = QueryBatch::<B>::new(vec![QueryKv::empty(2, 1, 2, &Default::default())]);
        assert_eq!(none.joined(0).len(), 1, "a buffer cannot be empty");
        assert_eq!(none.span(0), (0, 0));
        let sized = query(1, 4);
        assert_eq!((sized.len(), sized.size_bytes()), (4, 2 * 2 * 4 * 2 * 4), "2 layers × (keys + values) × 4 tokens × 2 dims × f32");
    }

    #[test]
    fn own_copies_are_the_joined_buffer_where_they_are_all_of_it_and_copies_elsewhere() {
        let batch = QueryBatch::new(vec![query(1, 2), query(2, 3), query(3, 1)]);
        let all = batch.own_copies(&[0, 1, 2]);
        let some = batch.own_copies(&[1, 2]);
        for (copies, ids) in [(&all, vec![1, 2, 3]), (&some, vec![2, 3])] {
            for (copy, id) in copies.iter().zip(ids) {
                let original = query(id, copy.len());
                for layer in 0..2 {
                    assert_eq!(host(&copy.layer(layer).keys), host(&original.layer(layer).keys), "query {id}, layer {layer}");
                    assert_eq!(host(&copy.layer(layer).values), host(&original.layer(layer).values), "query {id}, layer {layer}");
                }
            }
        }
        assert_eq!([some[0].len(), some[1].len()], [3, 1]);
    }

    #[test]
    fn a_query_of_a_pass_is_a_window_of_its_buffers_until_compacted() {
        let joined: Arc<[PrefixKv<B>]> = query(1, 5).buffers;
        let window = QueryKv::window_of(&joined, 1, 3);
        let tokens = |query: &QueryKv<B>, layer: usize| host(&query.layer(layer).keys);
        let expected = |layer: usize, from: usize, to: usize| (from..to).flat_map(|t| (0..2).map(move |d| (1000 + layer * 100 + t * 10 + d) as f32)).collect::<Vec<_>>();
        assert_eq!((tokens(&window, 1), window.len()), (expected(1, 1, 4), 3));
        assert_eq!(host(&window.layer(0).values), expected(0, 1, 4).iter().map(|v| v + 5.0).collect::<Vec<_>>());
        assert_eq!(window.size_bytes(), 2 * 2 * 3 * 2 * 4, "its own 3 tokens, not the buffer's 5");
        let beginning = window.truncated(2);
        assert_eq!(tokens(&beginning, 1), expected(1, 1, 3));
        assert!(beginning.shares_buffers() && window.shares_buffers());
        let own = beginning.compacted();
        assert!(!own.shares_buffers() && !Arc::ptr_eq(&own.buffers, &joined));
        assert_eq!((tokens(&own, 0), tokens(&own, 1), own.size_bytes()), (expected(0, 1, 3), expected(1, 1, 3), 2 * 2 * 2 * 2 * 4));
        let whole = QueryKv::window_of(&joined, 0, 5);
        assert!(!whole.shares_buffers(), "a window of all of its buffers is the buffers");
    }

    #[test]
    fn queries_side_by_side_in_one_buffer_join_as_one_part() {
        let cached = QueryBatch::new(vec![query(1, 2), query(2, 3), query(3, 1)]).own_copies(&[0, 1, 2]);
        let in_order = QueryBatch::new(cached.clone());
        assert_eq!(in_order.stretches().len(), 1, "one window over the three");
        let reordered = QueryBatch::new(vec![cached[2].clone(), cached[0].clone(), cached[1].clone(), query(4, 2)]);
        assert_eq!(reordered.stretches().iter().map(QueryKv::len).collect::<Vec<_>>(), [1, 5, 2], "queries 1 and 2 still side by side");
        for (batch, ids) in [(&in_order, vec![(1, 2), (2, 3), (3, 1)]), (&reordered, vec![(3, 1), (1, 2), (2, 3), (4, 2)])] {
            for layer in 0..2 {
                let expected: Vec<f32> = ids.iter().flat_map(|&(id, len)| host(&query(id, len).layer(layer).keys)).collect();
                assert_eq!(host(&batch.joined(layer).keys), expected, "layer {layer} of {ids:?}");
            }
        }
    }
}
