//! The LM head, only where scoring reads it: label logits at the item ends, and — for
//! full-vocabulary probabilities — a log-sum-exp streamed over vocabulary chunks, so
//! `[rows, vocab]` never exists at once. Plain Burn ops: the reference and the CPU path.

use burn::tensor::Tensor;

use crate::backend::ScoringBackend;
use crate::labels::LabelTable;
use crate::weight::TokenTable;

/// Vocabulary rows per chunk of the streamed log-sum-exp: `[rows, chunk]` logits at a time.
pub const VOCAB_CHUNK: usize = 16_384;

/// Logits of each row's labels, `[rows, width]`. `hidden`: `[rows, hidden]`; `head`: `[vocab, hidden]`.
/// The pass's distinct label rows of the head are gathered once and multiplied in one matmul:
/// memory `rows × distinct + distinct × hidden`, never `rows × width × hidden`.
pub fn label_logits<B: ScoringBackend>(hidden: Tensor<B, 2>, head: &TokenTable<B>, labels: &LabelTable) -> Tensor<B, 2> {
    let device = hidden.device();
    let label_rows = head.rows(labels.distinct(), &device);
    B::matmul(hidden, label_rows.transpose()).gather(1, labels.columns::<B>(&device))
}

/// Full-vocabulary log-probabilities of each row's labels, `[rows, width]`.
pub fn label_logprobs<B: ScoringBackend>(hidden: Tensor<B, 2>, head: &TokenTable<B>, labels: &LabelTable) -> Tensor<B, 2> {
    let log_normalizer = log_normalizer(hidden.clone(), head);
    label_logits(hidden, head, labels) - log_normalizer
}

/// `log Σ_v exp(logit_v)` per row, `[rows, 1]`, one vocabulary chunk at a time.
fn log_normalizer<B: ScoringBackend>(hidden: Tensor<B, 2>, head: &TokenTable<B>) -> Tensor<B, 2> {
    let vocab = head.vocab();
    let mut running: Option<(Tensor<B, 2>, Tensor<B, 2>)> = None; // (max, Σ exp(logit − max))
    for start in (0..vocab).step_by(VOCAB_CHUNK) {
        let chunk = VOCAB_CHUNK.min(vocab - start);
        let logits = head.logits(hidden.clone(), start..start + chunk);
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

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    type Cpu = burn::backend::NdArray<f32>;

    /// Rows of two requests with different, overlapping label lists: each row's logits are its
    /// own labels' dot products, in its own order.
    #[test]
    fn label_logits_gather_each_rows_own_labels() {
        let device = Default::default();
        let (vocab, size) = (7, 3);
        let head: Vec<f32> = (0..vocab * size).map(|v| (v as f32 * 0.37).sin()).collect();
        let hidden: Vec<f32> = (0..2 * size).map(|v| (v as f32 * 0.91).cos()).collect();
        let rows: [&[u32]; 2] = [&[6, 2, 4], &[2, 5]];
        let table = LabelTable::new(&rows);
        let got = label_logits::<Cpu>(
            Tensor::from_data(TensorData::new(hidden.clone(), [2, size]), &device),
            &TokenTable::Float(Tensor::from_data(TensorData::new(head.clone(), [vocab, size]), &device)),
            &table,
        );
        let got = got.into_data().to_vec::<f32>().unwrap();
        let dot = |row: usize, label: u32| (0..size).map(|k| hidden[row * size + k] * head[label as usize * size + k]).sum::<f32>();
        // The second row repeats its first label in the padding column.
        let expected = [dot(0, 6), dot(0, 2), dot(0, 4), dot(1, 2), dot(1, 5), dot(1, 2)];
        for (g, e) in got.iter().zip(expected) {
            assert!((g - e).abs() < 1e-6, "{got:?} vs {expected:?}");
        }
    }
}
