//! What a scoring pass shares between items: the query's K/V, computed once per request.

use std::cell::OnceCell;

use burn::tensor::{backend::Backend, Tensor};

use crate::attention::PrefixKv;

/// Query tokens per prefill chunk. A query cached at a multiple of this length resumes with
/// the same chunk boundaries as a fresh prefill, so a cache hit is bit-identical to a miss.
pub const PREFILL_CHUNK: usize = 512;

/// The query's K/V for every layer, computed once and attended to by all items of a request.
#[derive(Clone, Debug)]
pub struct QueryKv<B: Backend> {
    pub(crate) layers: Vec<PrefixKv<B>>,
    len: usize,
}

impl<B: Backend> QueryKv<B> {
    /// No query at all: items then attend only to themselves (used for `item_first`).
    pub(crate) fn empty(layers: usize, kv_heads: usize, head_dim: usize, device: &B::Device) -> Self {
        // `empty`, not `zeros`: a fill of zero elements is a zero-block launch, which CUDA rejects.
        let empty = Tensor::<B, 3>::empty([kv_heads, 0, head_dim], device);
        QueryKv { layers: vec![PrefixKv { keys: empty.clone(), values: empty }; layers], len: 0 }
    }

    /// A query whose K/V per layer is `layers` (`[kv_heads, len, head_dim]` each, RoPE applied).
    pub fn from_layers(layers: Vec<PrefixKv<B>>) -> Self {
        let len = layers.first().map_or(0, PrefixKv::len);
        assert!(layers.iter().all(|kv| kv.len() == len), "every layer covers the same tokens");
        QueryKv { layers, len }
    }

    /// Query tokens covered.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device memory held by the K/V tensors.
    pub fn size_bytes(&self) -> usize {
        self.layers.iter().map(|kv| 2 * kv.keys.shape().num_elements() * kv.keys.dtype().size()).sum()
    }

    /// This query followed by `len` more tokens whose per-layer K/V is `next`.
    pub(crate) fn extended(self, next: Vec<PrefixKv<B>>, len: usize) -> Self {
        let layers = self
            .layers
            .into_iter()
            .zip(next)
            .map(|(old, new)| PrefixKv {
                keys: Tensor::cat(vec![old.keys, new.keys], 1),
                values: Tensor::cat(vec![old.values, new.values], 1),
            })
            .collect();
        QueryKv { layers, len: self.len + len }
    }
}

/// The queries of a batch of requests, for every pass over their items. The plain path reads
/// each query's K/V as it is; the kernels read one buffer per layer with every query end to end
/// along the token axis (`[kv_heads, Σ len, head_dim]`), joined on first use — once per batch,
/// not per pass or per layer — and a batch of one query is that query, no copy.
pub struct QueryBatch<B: Backend> {
    queries: Vec<QueryKv<B>>,
    /// Per query: its first token and length in the joined K/V.
    spans: Vec<(usize, usize)>,
    joined: OnceCell<Vec<PrefixKv<B>>>,
}

impl<B: Backend> QueryBatch<B> {
    /// `queries` of one model (at least one; an empty query stands for none).
    pub fn new(queries: Vec<QueryKv<B>>) -> Self {
        assert!(!queries.is_empty(), "a batch has at least one query");
        let mut spans = Vec::with_capacity(queries.len());
        let mut total = 0;
        for query in &queries {
            spans.push((total, query.len()));
            total += query.len();
        }
        QueryBatch { queries, spans, joined: OnceCell::new() }
    }

    /// Query `index`'s K/V in layer `layer`.
    pub(crate) fn layer_of(&self, index: usize, layer: usize) -> &PrefixKv<B> {
        &self.queries[index].layers[layer]
    }

    /// Query `index`'s length.
    pub fn query_len(&self, index: usize) -> usize {
        self.spans[index].1
    }

    /// (first token, length) of query `index` in [`Self::joined`].
    pub fn span(&self, index: usize) -> (usize, usize) {
        self.spans[index]
    }

    /// Every query's K/V in layer `layer`, end to end (one unread token when all are empty:
    /// a buffer can't be empty).
    pub fn joined(&self, layer: usize) -> &PrefixKv<B> {
        &self.joined.get_or_init(|| self.join())[layer]
    }

    fn join(&self) -> Vec<PrefixKv<B>> {
        let non_empty: Vec<&QueryKv<B>> = self.queries.iter().filter(|q| !q.is_empty()).collect();
        let layers = self.queries[0].layers.len();
        (0..layers)
            .map(|layer| match non_empty.as_slice() {
                [] => {
                    let empty = &self.queries[0].layers[layer].keys;
                    let [kv_heads, _, head_dim] = empty.dims();
                    let unread = Tensor::empty([kv_heads, 1, head_dim], &empty.device());
                    PrefixKv { keys: unread.clone(), values: unread }
                }
                [query] => query.layers[layer].clone(),
                _ => {
                    let part = |pick: fn(&PrefixKv<B>) -> &Tensor<B, 3>| Tensor::cat(non_empty.iter().map(|q| pick(&q.layers[layer]).clone()).collect(), 1);
                    PrefixKv { keys: part(|kv| &kv.keys), values: part(|kv| &kv.values) }
                }
            })
            .collect()
    }
}

/// One layer's prefixes in a pass: group `g` attends to query `group_queries[g]` of `batch`.
pub struct LayerPrefixes<'a, B: Backend> {
    batch: &'a QueryBatch<B>,
    layer: usize,
    group_queries: &'a [usize],
}

impl<'a, B: Backend> LayerPrefixes<'a, B> {
    pub fn new(batch: &'a QueryBatch<B>, layer: usize, group_queries: &'a [usize]) -> Self {
        LayerPrefixes { batch, layer, group_queries }
    }

    /// Each group's prefix, as its own tensors (the plain path).
    pub fn per_group(&self) -> Vec<&'a PrefixKv<B>> {
        self.group_queries.iter().map(|&q| self.batch.layer_of(q, self.layer)).collect()
    }

    /// Every query of the batch end to end, one buffer (the kernels); see [`QueryBatch::joined`].
    pub fn joined(&self) -> &'a PrefixKv<B> {
        self.batch.joined(self.layer)
    }
}

/// Items that share one query: the items of one request in a pass over several requests.
pub struct ItemGroup<'a> {
    /// The request's query: an index into the pass's [`QueryBatch`].
    pub query: usize,
    pub items: Vec<&'a [u32]>,
}
