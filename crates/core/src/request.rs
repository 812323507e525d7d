//! The `/v1/score` request, field for field as SGLang accepts it.

use serde::{Deserialize, Serialize};

/// A score request: for every item, the probability of each label as the next token after
/// `query + item` (or `item + query` with `item_first`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScoreRequest {
    pub query: Query,
    pub items: Items,
    pub label_token_ids: Vec<i64>,
    /// `false`: full-vocabulary probabilities; `true`: softmax over the label logits only.
    #[serde(default)]
    pub apply_softmax: bool,
    /// Score `item + query` instead of `query + item`.
    #[serde(default)]
    pub item_first: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// The query: text or token ids. Ids are `i64` so that negative ids reach validation and get a
/// precise error instead of a generic JSON type error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum Query {
    Text(String),
    Ids(Vec<i64>),
}

/// The items: one text, several texts, or several token-id lists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum Items {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<Vec<i64>>),
}

impl ScoreRequest {
    /// Bytes of text in the query and items (0 for token ids): a cheap bound on tokenization
    /// work, known before any of it is done.
    pub fn text_bytes(&self) -> usize {
        let query = match &self.query {
            Query::Text(text) => text.len(),
            Query::Ids(_) => 0,
        };
        let items = match &self.items {
            Items::Text(text) => text.len(),
            Items::Texts(texts) => texts.iter().map(String::len).sum(),
            Items::Ids(_) => 0,
        };
        query + items
    }
}

impl Items {
    pub fn len(&self) -> usize {
        match self {
            Items::Text(_) => 1,
            Items::Texts(texts) => texts.len(),
            Items::Ids(ids) => ids.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
