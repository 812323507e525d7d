//! Request preparation: tokenize text, validate against the model. Cheap and shareable, so the
//! HTTP layer runs it on its own threads and only valid work reaches the model's queue.

use std::sync::Arc;

use tally_core::{token_ids, ModelLimits, RequestInput, ScoreInput, ScoreRequest, ValidationError};

use crate::tokenizer::{TextTokenizer, TokenizerError};

/// Why a request cannot be scored: the caller's fault (HTTP 4xx), unlike an engine error.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("text input needs a tokenizer, and {0} has none tally can use (no tokenizer.json, or a SentencePiece GGUF vocabulary): send token ids instead")]
    NoTokenizer(String),
    #[error(transparent)]
    Tokenize(#[from] TokenizerError),
    #[error("the prompt's query side is {query_tokens} tokens and an empty document's side {template_tokens}: no document fits in {budget} tokens (only documents are truncated; shorten the query or the instruction)")]
    NoRoomForDocument { query_tokens: usize, template_tokens: usize, budget: usize },
}

#[derive(Clone)]
pub struct RequestPreparer {
    tokenizer: Option<Arc<TextTokenizer>>,
    limits: ModelLimits,
    model_name: String,
}

impl RequestPreparer {
    pub fn new(tokenizer: Option<TextTokenizer>, limits: ModelLimits, model_name: String) -> Self {
        RequestPreparer { tokenizer: tokenizer.map(Arc::new), limits, model_name }
    }

    pub fn renamed(self, model_name: String) -> Self {
        RequestPreparer { model_name, ..self }
    }

    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    pub fn limits(&self) -> ModelLimits {
        self.limits
    }

    /// The tokenizer, or the error a text request gets without one.
    pub fn tokenizer(&self) -> Result<&TextTokenizer, RequestError> {
        self.tokenizer.as_deref().ok_or_else(|| RequestError::NoTokenizer(self.model_name.clone()))
    }

    /// Tokenizes text (if any) and validates everything against the model.
    pub fn prepare(&self, request: &ScoreRequest) -> Result<ScoreInput, RequestError> {
        let limits = self.limits;
        let (query, items) = match request.input()? {
            RequestInput::Ids { query, items } => {
                let items = items.iter().enumerate().map(|(index, item)| token_ids(item, || format!("items[{index}]"), limits)).collect::<Result<_, _>>()?;
                (token_ids(query, || "query".to_owned(), limits)?, items)
            }
            RequestInput::Text { query, items } => {
                // The sequence's first text gets the BOS token, if the tokenizer adds one.
                let tokenizer = self.tokenizer()?;
                let encode = |text: &str, first: bool| if first { tokenizer.encode_sequence_start(text) } else { tokenizer.encode(text) };
                let items = items.iter().map(|item| encode(item, request.item_first)).collect::<Result<Vec<_>, _>>()?;
                (encode(query, !request.item_first)?, items)
            }
        };
        let labels = token_ids(&request.label_token_ids, || "label_token_ids".to_owned(), limits)?;
        Ok(ScoreInput::new(query, items, labels, request.apply_softmax, request.item_first, limits)?)
    }
}
