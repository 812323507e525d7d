//! The scoring pipeline over one loaded model.

use std::path::Path;

use burn::tensor::backend::Backend;
use tally_core::{plan_passes, ModelLimits, PassBudget, RequestInput, ScoreInput, ScoreRequest, ScoreResponse, ValidationError};
use tally_model::{LoadError, PrefixCache, Qwen3};

use crate::tokenizer::{TextTokenizer, TokenizerError};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request is invalid: the caller's fault (HTTP 4xx).
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("text input needs a tokenizer, and {0} has no tokenizer.json: send token ids instead")]
    NoTokenizer(String),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("cannot read results back from the device: {0}")]
    Device(String),
}

#[derive(Debug, Clone, Copy, Default)]
pub struct ScorerOptions {
    pub pass_budget: PassBudget,
}

/// A model, its tokenizer and the scoring pipeline.
pub struct Scorer<B: Backend> {
    model: Qwen3<B>,
    tokenizer: Option<TextTokenizer>,
    model_name: String,
    options: ScorerOptions,
}

impl<B: Backend> Scorer<B> {
    /// Loads a HF-layout model directory; `tokenizer.json` is optional (token-id requests only).
    pub fn load(dir: &Path, device: &B::Device, options: ScorerOptions) -> Result<Self, EngineError> {
        let model = Qwen3::load(dir, device)?;
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer = tokenizer_path.is_file().then(|| TextTokenizer::from_file(&tokenizer_path)).transpose()?;
        let model_name = dir.file_name().map_or_else(|| dir.display().to_string(), |name| name.to_string_lossy().into_owned());
        Ok(Scorer { model, tokenizer, model_name, options })
    }

    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    pub fn limits(&self) -> ModelLimits {
        let config = self.model.config();
        ModelLimits { vocab_size: config.vocab_size, max_positions: config.max_position_embeddings }
    }

    pub fn tokenizer(&self) -> Option<&TextTokenizer> {
        self.tokenizer.as_ref()
    }

    /// Validates, tokenizes and scores a request.
    pub fn score(&self, request: &ScoreRequest) -> Result<ScoreResponse, EngineError> {
        let input = self.prepare(request)?;
        let scores = self.score_input(&input)?;
        let model = request.model.clone().unwrap_or_else(|| self.model_name.clone());
        Ok(ScoreResponse::new(scores, model, input.prompt_tokens()))
    }

    /// Tokenizes text (if any) and validates everything against the model.
    pub fn prepare(&self, request: &ScoreRequest) -> Result<ScoreInput, EngineError> {
        let (query, items) = match request.input()? {
            RequestInput::Ids { query, items } => (query.to_vec(), items.to_vec()),
            RequestInput::Text { query, items } => {
                let tokenizer = self.tokenizer.as_ref().ok_or_else(|| EngineError::NoTokenizer(self.model_name.clone()))?;
                let items = items.iter().map(|item| tokenizer.encode(item)).collect::<Result<Vec<_>, _>>()?;
                (tokenizer.encode(query)?, items)
            }
        };
        Ok(ScoreInput::new(&query, &items, &request.label_token_ids, request.apply_softmax, request.item_first, self.limits())?)
    }

    /// `scores[i][j]` for a validated input. The query runs once; items run in passes that share
    /// its K/V. With `item_first` nothing can be shared, so each `item + query` is its own sequence.
    pub fn score_input(&self, input: &ScoreInput) -> Result<Vec<Vec<f64>>, EngineError> {
        let (prefix, sequences): (PrefixCache<B>, Vec<Vec<u32>>) = if input.item_first {
            let joined = input.items.iter().map(|item| [item.as_slice(), &input.query].concat()).collect();
            (self.model.empty_prefix(), joined)
        } else {
            (self.model.prefill(&input.query), input.items.clone())
        };
        let lens: Vec<usize> = sequences.iter().map(Vec::len).collect();
        let mut scores = vec![Vec::new(); sequences.len()];
        for pass in plan_passes(prefix.len(), &lens, self.options.pass_budget) {
            let batch: Vec<&[u32]> = pass.iter().map(|&i| sequences[i].as_slice()).collect();
            for (&index, row) in pass.iter().zip(self.label_probabilities(&prefix, &batch, input)?) {
                scores[index] = row;
            }
        }
        Ok(scores)
    }

    fn label_probabilities(&self, prefix: &PrefixCache<B>, batch: &[&[u32]], input: &ScoreInput) -> Result<Vec<Vec<f64>>, EngineError> {
        let hidden = self.model.last_hidden(prefix, batch);
        let labels = input.labels.len();
        let logits = to_host(self.model.label_logits(hidden.clone(), &input.labels))?;
        if input.apply_softmax {
            return Ok(logits.chunks_exact(labels).map(softmax).collect());
        }
        let normalizers = to_host(self.model.log_normalizer(hidden))?;
        Ok(logits
            .chunks_exact(labels)
            .zip(normalizers)
            .map(|(row, log_z)| row.iter().map(|&logit| (logit - log_z).exp()).collect())
            .collect())
    }
}

fn softmax(logits: &[f64]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

fn to_host<B: Backend, const D: usize>(tensor: burn::tensor::Tensor<B, D>) -> Result<Vec<f64>, EngineError> {
    let data = tensor.into_data().convert::<f32>();
    let values = data.to_vec::<f32>().map_err(|e| EngineError::Device(format!("{e:?}")))?;
    Ok(values.into_iter().map(f64::from).collect())
}
