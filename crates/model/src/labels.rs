//! The labels a pass scores: which vocabulary ids each item row reads.

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};

/// The label ids of every scored row, `[rows, width]`: rows of one request share its labels;
/// a row with fewer labels than `width` repeats its first one (those columns are ignored).
/// Also the pass's distinct labels, so the head's label rows are gathered once, not per row.
#[derive(Clone, Debug)]
pub struct LabelTable {
    ids: Vec<u32>,
    rows: usize,
    width: usize,
    /// Sorted, without repeats.
    distinct: Vec<u32>,
}

impl LabelTable {
    /// One label list per row (each non-empty).
    pub fn new(rows: &[&[u32]]) -> Self {
        let width = rows.iter().map(|labels| labels.len()).max().unwrap_or(0);
        let ids: Vec<u32> = rows.iter().flat_map(|labels| (0..width).map(move |j| *labels.get(j).unwrap_or(&labels[0]))).collect();
        let mut distinct = ids.clone();
        distinct.sort_unstable();
        distinct.dedup();
        LabelTable { ids, rows: rows.len(), width, distinct }
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn to_tensor<B: Backend>(&self, device: &B::Device) -> Tensor<B, 2, Int> {
        let ids: Vec<i64> = self.ids.iter().map(|&id| id as i64).collect();
        Tensor::from_data(TensorData::new(ids, [self.rows, self.width]), device)
    }

    /// The distinct label ids, sorted.
    pub(crate) fn distinct(&self) -> &[u32] {
        &self.distinct
    }

    /// Where each row's labels sit among [`Self::distinct`], `[rows, width]`.
    pub(crate) fn columns<B: Backend>(&self, device: &B::Device) -> Tensor<B, 2, Int> {
        let columns: Vec<i64> = self.ids.iter().map(|id| self.distinct.binary_search(id).expect("every id is distinct's") as i64).collect();
        Tensor::from_data(TensorData::new(columns, [self.rows, self.width]), device)
    }
}
