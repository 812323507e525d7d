//! What a scoring pass shares between items: the query's K/V, computed once per request.

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

/// Items that share one query: the items of one request in a pass over several requests.
pub struct ItemGroup<'a, B: Backend> {
    pub query: &'a QueryKv<B>,
    pub items: Vec<&'a [u32]>,
}
