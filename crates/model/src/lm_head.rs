//! The LM head, only where scoring reads it: label logits at the item ends, and — for
//! full-vocabulary probabilities — a log-sum-exp streamed over vocabulary chunks, so
//! `[rows, vocab]` never exists at once. Plain Burn ops: the reference and the CPU path.

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};

/// Vocabulary rows per chunk of the streamed log-sum-exp: `[rows, chunk]` logits at a time.
pub const VOCAB_CHUNK: usize = 16_384;

/// The label ids of every scored row, `[rows, width]`: rows of one request share its labels;
/// a row with fewer labels than `width` repeats its first one (those columns are ignored).
#[derive(Clone, Debug)]
pub struct LabelTable {
    ids: Vec<u32>,
    rows: usize,
    width: usize,
}

impl LabelTable {
    /// One label list per row (each non-empty).
    pub fn new(rows: &[&[u32]]) -> Self {
        let width = rows.iter().map(|labels| labels.len()).max().unwrap_or(0);
        let ids = rows.iter().flat_map(|labels| (0..width).map(move |j| *labels.get(j).unwrap_or(&labels[0]))).collect();
        LabelTable { ids, rows: rows.len(), width }
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn to_tensor<B: Backend>(&self, device: &B::Device) -> Tensor<B, 2, Int> {
        let ids: Vec<i64> = self.ids.iter().map(|&id| id as i64).collect();
        Tensor::from_data(TensorData::new(ids, [self.rows, self.width]), device)
    }
}

/// Logits of each row's labels, `[rows, width]`. `hidden`: `[rows, hidden]`; `head`: `[vocab, hidden]`.
pub fn label_logits<B: Backend>(hidden: Tensor<B, 2>, head: Tensor<B, 2>, labels: Tensor<B, 2, Int>) -> Tensor<B, 2> {
    let [rows, width] = labels.dims();
    let size = hidden.dims()[1];
    let label_rows = head.select(0, labels.reshape([rows * width])).reshape([rows, width, size]);
    (label_rows * hidden.unsqueeze_dim::<3>(1)).sum_dim(2).reshape([rows, width])
}

/// Full-vocabulary log-probabilities of each row's labels, `[rows, width]`.
pub fn label_logprobs<B: Backend>(hidden: Tensor<B, 2>, head: Tensor<B, 2>, labels: Tensor<B, 2, Int>) -> Tensor<B, 2> {
    let log_normalizer = log_normalizer(hidden.clone(), head.clone());
    label_logits(hidden, head, labels) - log_normalizer
}

/// `log Σ_v exp(logit_v)` per row, `[rows, 1]`, one vocabulary chunk at a time.
fn log_normalizer<B: Backend>(hidden: Tensor<B, 2>, head: Tensor<B, 2>) -> Tensor<B, 2> {
    let vocab = head.dims()[0];
    let mut running: Option<(Tensor<B, 2>, Tensor<B, 2>)> = None; // (max, Σ exp(logit − max))
    for start in (0..vocab).step_by(VOCAB_CHUNK) {
        let chunk = VOCAB_CHUNK.min(vocab - start);
        let logits = hidden.clone().matmul(head.clone().narrow(0, start, chunk).transpose());
        let chunk_max = logits.clone().max_dim(1);
        running = Some(match running {
            None => (chunk_max.clone(), (logits - chunk_max).exp().sum_dim(1)),
            Some((max, sum)) => {
                let new_max = max.clone().max_pair(chunk_max);
                let sum = sum * (max - new_max.clone()).exp() + (logits - new_max.clone()).exp().sum_dim(1);
                (new_max, sum)
            }
        });
    }
    let (max, sum) = running.expect("vocab_size > 0");
    max + sum.log()
}
