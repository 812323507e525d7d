//! A weight matrix as the model holds it: a float tensor, or — where the backend multiplies them
//! ([`ScoringBackend::block_weight`]) — its file's blocks ([`crate::blocks`]). The decoder and the
//! LM head call these and never ask which.

use std::ops::Range;

use burn::tensor::{Int, Tensor, TensorData};

use crate::backend::{BlockWeight, ScoringBackend};

/// How a model holds its weight matrices (embeddings, head, every projection).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WeightStorage {
    /// Matrices kept as the file stores them, and their bytes.
    pub stored: usize,
    pub stored_bytes: usize,
    /// Matrices held as float tensors.
    pub float: usize,
}

impl WeightStorage {
    fn count<B: ScoringBackend>(&mut self, stored: Option<&B::BlockWeight>) {
        match stored {
            Some(weight) => {
                self.stored += 1;
                self.stored_bytes += weight.stored_bytes();
            }
            None => self.float += 1,
        }
    }
}

impl std::fmt::Display for WeightStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of {} weight matrices as the file stores them ({:.1} MiB)", self.stored, self.stored + self.float, self.stored_bytes as f64 / (1 << 20) as f64)?;
        if self.float > 0 {
            write!(f, ", {} as float", self.float)?;
        }
        Ok(())
    }
}

/// A linear layer's weight: `x · W`.
pub enum Linear<B: ScoringBackend> {
    /// `[in, out]`.
    Float(Tensor<B, 2>),
    /// `[out, in]`, as the file stores it.
    Blocks(B::BlockWeight),
}

impl<B: ScoringBackend> Linear<B> {
    pub(crate) fn count_into(&self, storage: &mut WeightStorage) {
        storage.count::<B>(match self {
            Linear::Blocks(w) => Some(w),
            Linear::Float(_) => None,
        });
    }

    /// `x · W`: `[rows, in]` → `[rows, out]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        match self {
            Linear::Float(w) => B::matmul(x, w.clone()),
            Linear::Blocks(w) => B::block_matmul(x, w, 0..w.rows()),
        }
    }
}

/// The token embeddings — also the LM head where it is tied — or an untied head: `[vocab, hidden]`.
pub enum TokenTable<B: ScoringBackend> {
    Float(Tensor<B, 2>),
    Blocks(B::BlockWeight),
}

impl<B: ScoringBackend> TokenTable<B> {
    pub(crate) fn count_into(&self, storage: &mut WeightStorage) {
        storage.count::<B>(match self {
            TokenTable::Blocks(w) => Some(w),
            TokenTable::Float(_) => None,
        });
    }

    pub fn vocab(&self) -> usize {
        match self {
            TokenTable::Float(table) => table.dims()[0],
            TokenTable::Blocks(table) => table.rows(),
        }
    }

    /// Rows `ids`, `[ids.len(), hidden]`: embeddings, or a head's label rows.
    pub fn rows(&self, ids: &[u32], device: &B::Device) -> Tensor<B, 2> {
        match self {
            TokenTable::Float(table) => {
                let ids: Vec<i64> = ids.iter().map(|&id| i64::from(id)).collect();
                let count = ids.len();
                table.clone().select(0, Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [count]), device))
            }
            TokenTable::Blocks(table) => B::block_rows(table, ids, device),
        }
    }

    /// `hidden · table[vocab_rows]ᵀ`: the logits of vocabulary rows `vocab_rows`, `[rows, vocab_rows.len()]`.
    pub fn logits(&self, hidden: Tensor<B, 2>, vocab_rows: Range<usize>) -> Tensor<B, 2> {
        match self {
            TokenTable::Float(table) => B::matmul(hidden, table.clone().narrow(0, vocab_rows.start, vocab_rows.len()).transpose()),
            TokenTable::Blocks(table) => B::block_matmul(hidden, table, vocab_rows),
        }
    }

    /// The float table, for kernels that read it whole (the label kernel); `None` for blocks.
    pub fn as_float(&self) -> Option<&Tensor<B, 2>> {
        match self {
            TokenTable::Float(table) => Some(table),
            TokenTable::Blocks(_) => None,
        }
    }
}
