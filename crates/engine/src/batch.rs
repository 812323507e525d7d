//! A batch of requests on its way through the model ([`BatchRun`]): its queries prefilled or
//! found in the prefix cache, its items planned into shared passes, the passes issued one at a
//! time and read back in the order they were issued. A caller that issues the next pass (or the
//! next batch's first) before it reads the last keeps the device busy while the host builds
//! passes and turns values into scores: see [`crate::Scorer::begin_batch`] and the scheduler.

use std::borrow::Borrow;
use std::collections::VecDeque;

use tally_core::{ItemShape, ScoreInput};
use tally_model::{DeviceRead, ScoringBackend};

use crate::prefill::{BatchQueries, PrefixCacheUse};

/// One batch between [`crate::Scorer::begin_batch`] and [`crate::Scorer::finish_batch`]. `I`
/// is how it holds its requests: borrowed where the caller keeps them for the whole call, owned
/// by the scheduler, which keeps a batch running past the call that started it.
pub struct BatchRun<B: ScoringBackend, I> {
    pub(crate) inputs: Vec<I>,
    pub(crate) items: BatchItems,
    /// The batch's queries (the passes' prefixes), until its last pass is issued.
    pub(crate) queries: Option<BatchQueries<B>>,
    /// Per request: the index in `queries` of the query its items attend to.
    pub(crate) query_of: Vec<usize>,
    /// Per request: how its query was found in the prefix cache.
    pub(crate) cache_uses: Vec<PrefixCacheUse>,
    /// Passes planned and not yet issued (entries of `items`).
    pub(crate) passes: std::vec::IntoIter<Vec<usize>>,
    /// Passes issued and not yet read, oldest first.
    pub(crate) unread: VecDeque<PassRead>,
    /// `scores[r][i]`: item `i` of request `r`'s label probabilities, once its pass is read.
    pub(crate) scores: Vec<Vec<Vec<f64>>>,
    /// Requests nobody waits for any more, left out of the passes issued since.
    pub(crate) dropped: Vec<bool>,
}

impl<B: ScoringBackend, I: Borrow<ScoreInput>> BatchRun<B, I> {
    /// Passes issued whose values have not been read yet.
    pub fn passes_unread(&self) -> usize {
        self.unread.len()
    }

    /// Keeps the values of the oldest pass read, as each item's label probabilities.
    pub(crate) fn keep_scores(&mut self, rows: &[usize], values: &[f32], width: usize) {
        for (&entry, row) in rows.iter().zip(values.chunks_exact(width)) {
            let (r, i) = self.items.entries[entry];
            let input = self.inputs[r].borrow();
            let row: Vec<f64> = row[..input.labels.len()].iter().map(|&v| f64::from(v)).collect();
            self.scores[r][i] = if input.apply_softmax { softmax(&row) } else { row.iter().map(|v| v.exp()).collect() };
        }
    }
}

/// A pass issued, its label values on their way to the host.
pub(crate) struct PassRead {
    pub(crate) values: DeviceRead,
    /// The entry of each row of `values`, in order.
    pub(crate) rows: Vec<usize>,
    /// Values per row: the pass's widest label list.
    pub(crate) width: usize,
}

/// Every item of a batch as the passes see it.
pub(crate) struct BatchItems {
    /// (request, item) of every item of the batch: the planner's entries.
    pub(crate) entries: Vec<(usize, usize)>,
    /// Per request with `item_first`, `item + query` for each item: nothing can be shared, so
    /// each is a sequence of its own with an empty prefix.
    joined: Vec<Option<Vec<Vec<u32>>>>,
}

impl BatchItems {
    pub(crate) fn new(inputs: &[impl Borrow<ScoreInput>]) -> Self {
        let joined = inputs
            .iter()
            .map(Borrow::borrow)
            .map(|input: &ScoreInput| input.item_first.then(|| input.items.iter().map(|item| [item.as_slice(), &input.query].concat()).collect()))
            .collect();
        let entries = inputs.iter().enumerate().flat_map(|(r, input)| (0..input.borrow().items.len()).map(move |i| (r, i))).collect();
        BatchItems { entries, joined }
    }

    /// The tokens item `i` of request `r` runs.
    pub(crate) fn sequence<'s>(&'s self, inputs: &'s [impl Borrow<ScoreInput>], r: usize, i: usize) -> &'s [u32] {
        match &self.joined[r] {
            Some(joined) => &joined[i],
            None => &inputs[r].borrow().items[i],
        }
    }

    /// What the pass planner needs of each entry; `queries[r]`: the query request `r`'s items
    /// attend to (`None`: none).
    pub(crate) fn shapes(&self, inputs: &[impl Borrow<ScoreInput>], queries: &[Option<&[u32]>]) -> Vec<ItemShape> {
        self.entries
            .iter()
            .map(|&(r, i)| ItemShape { prefix_len: queries[r].map_or(0, <[u32]>::len), len: self.sequence(inputs, r, i).len(), group: r, labels: inputs[r].borrow().labels.len() })
            .collect()
    }
}

fn softmax(logits: &[f64]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}
