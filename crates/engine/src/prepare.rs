//! Request preparation: tokenize text, validate against the model. Cheap and shareable, so the
//! HTTP layer runs it on its own threads and only valid work reaches the model's queue.

use std::sync::Arc;

use tally_core::{ModelLimits, RequestInput, ScoreInput, ScoreRequest};

use crate::scorer::EngineError;
use crate::tokenizer::TextTokenizer;

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
    pub fn tokenizer(&self) -> Result<&TextTokenizer, EngineError> {
        self.tokenizer.as_deref().ok_or_else(|| EngineError::NoTokenizer(self.model_name.clone()))
    }

    /// Tokenizes text (if any) and validates everything against the model.
    pub fn prepare(&self, request: &ScoreRequest) -> Result<ScoreInput, EngineError> {
        let (query, items) = match request.input()? {
            RequestInput::Ids { query, items } => (query.to_vec(), items.to_vec()),
            RequestInput::Text { query, items } => {
                // The sequence's first text gets the BOS token, if the tokenizer adds one.
                let tokenizer = self.tokenizer()?;
                let encode = |text: &str, first: bool| if first { tokenizer.encode_sequence_start(text) } else { tokenizer.encode(text) };
                let items = items.iter().map(|item| encode(item, request.item_first)).collect::<Result<Vec<_>, _>>()?;
                (encode(query, !request.item_first)?, items)
            }
        };
        Ok(ScoreInput::new(&query, &items, &request.label_token_ids, request.apply_softmax, request.item_first, self.limits)?)
    }
}
