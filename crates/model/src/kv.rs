//! K/V of a shared prefix (a request's query), as every route of multi-item attention reads it.

use burn::tensor::{backend::Backend, Tensor};

/// K/V of a shared prefix for one layer, `[kv_heads, prefix_len, head_dim]`, RoPE applied.
#[derive(Clone, Debug)]
pub struct PrefixKv<B: Backend> {
    pub keys: Tensor<B, 3>,
    pub values: Tensor<B, 3>,
}

impl<B: Backend> PrefixKv<B> {
    pub fn len(&self) -> usize {
        self.keys.dims()[1]
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens `start..start + len` (a view, no copy).
    pub fn tokens(&self, start: usize, len: usize) -> Self {
        PrefixKv { keys: self.keys.clone().narrow(1, start, len), values: self.values.clone().narrow(1, start, len) }
    }

    /// `parts` end to end along the token axis, and each part's (first token, length) in it.
    /// Empty parts take no room; a lone non-empty part is the result itself (no copy); when
    /// every part is empty the result holds one unread token, since a buffer can't be empty.
    pub fn join(parts: &[&PrefixKv<B>]) -> (Self, Vec<(usize, usize)>) {
        let first = parts.first().expect("at least one part");
        let spans = spans_end_to_end(parts.iter().map(|part| part.len()));
        let non_empty: Vec<&PrefixKv<B>> = parts.iter().copied().filter(|part| !part.is_empty()).collect();
        let joined = match non_empty.as_slice() {
            [] => {
                let [kv_heads, _, head_dim] = first.keys.dims();
                let unread = Tensor::empty([kv_heads, 1, head_dim], &first.keys.device());
                PrefixKv { keys: unread.clone(), values: unread }
            }
            [lone] => (*lone).clone(),
            _ => {
                let part = |pick: fn(&PrefixKv<B>) -> &Tensor<B, 3>| Tensor::cat(non_empty.iter().map(|kv| pick(kv).clone()).collect(), 1);
                PrefixKv { keys: part(|kv| &kv.keys), values: part(|kv| &kv.values) }
            }
        };
        (joined, spans)
    }
}

/// (first token, length) of parts of `lens` tokens laid end to end.
pub(crate) fn spans_end_to_end(lens: impl Iterator<Item = usize>) -> Vec<(usize, usize)> {
    let mut total = 0;
    lens.map(|len| {
        total += len;
        (total - len, len)
    })
    .collect()
}
