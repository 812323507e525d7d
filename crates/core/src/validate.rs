//! Request validation: every bad request becomes a typed error naming the offending field.

use crate::request::{Items, Query, ScoreRequest};

/// What a model accepts: token ids below `vocab_size`, sequences up to `max_positions` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelLimits {
    pub vocab_size: usize,
    pub max_positions: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("`items` must contain at least one item")]
    NoItems,
    #[error("item {index} is empty")]
    EmptyItem { index: usize },
    #[error("`query` is empty")]
    EmptyQuery,
    #[error("`query` and `items` must both be text or both be token ids")]
    MixedInputKinds,
    #[error("`label_token_ids` must contain at least one token id")]
    NoLabels,
    #[error("token id {id} in `{field}` is out of range: the model's vocabulary has {vocab_size} tokens")]
    TokenIdOutOfRange { field: String, id: i64, vocab_size: usize },
    #[error("item {index}: query + item is {tokens} tokens, more than the model's {max_positions} positions")]
    SequenceTooLong { index: usize, tokens: usize, max_positions: usize },
}

impl ValidationError {
    /// The request field at fault, as an API error's `param`.
    pub fn param(&self) -> &str {
        match self {
            ValidationError::NoItems | ValidationError::EmptyItem { .. } => "items",
            ValidationError::EmptyQuery => "query",
            ValidationError::MixedInputKinds => "items",
            ValidationError::NoLabels => "label_token_ids",
            ValidationError::TokenIdOutOfRange { field, .. } => field.split('[').next().unwrap_or(field),
            ValidationError::SequenceTooLong { .. } => "items",
        }
    }
}

/// A request's query and items before tokenization, with kinds already checked to agree.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestInput<'a> {
    Text { query: &'a str, items: Vec<&'a str> },
    Ids { query: &'a [i64], items: &'a [Vec<i64>] },
}

impl ScoreRequest {
    /// Classifies query and items as text or ids; rejects mixed kinds.
    pub fn input(&self) -> Result<RequestInput<'_>, ValidationError> {
        match (&self.query, &self.items) {
            (Query::Text(query), Items::Text(item)) => Ok(RequestInput::Text { query, items: vec![item] }),
            (Query::Text(query), Items::Texts(items)) => {
                Ok(RequestInput::Text { query, items: items.iter().map(String::as_str).collect() })
            }
            (Query::Ids(query), Items::Ids(items)) => Ok(RequestInput::Ids { query, items }),
            // No items at all are no kind of items: `ScoreInput::new` says so.
            (Query::Text(query), Items::Ids(items)) if items.is_empty() => Ok(RequestInput::Text { query, items: Vec::new() }),
            (Query::Ids(query), Items::Texts(items)) if items.is_empty() => Ok(RequestInput::Ids { query, items: &[] }),
            _ => Err(ValidationError::MixedInputKinds),
        }
    }
}

/// Token ids as the JSON carries them (`i64`, so that a negative id gets its own error rather
/// than a JSON type error) as the `u32` ids everything past the JSON edge uses; `field` names
/// them in the error.
pub fn token_ids(ids: &[i64], field: impl Fn() -> String, limits: ModelLimits) -> Result<Vec<u32>, ValidationError> {
    ids.iter()
        .map(|&id| u32::try_from(id).map_err(|_| ValidationError::TokenIdOutOfRange { field: field(), id, vocab_size: limits.vocab_size }))
        .collect()
}

/// A validated, tokenized request: every id is inside the vocabulary, nothing is empty, and
/// every `query + item` sequence fits the model's positions. Built only by [`ScoreInput::new`],
/// so every one was checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScoreInput {
    pub query: Vec<u32>,
    pub items: Vec<Vec<u32>>,
    pub labels: Vec<u32>,
    pub apply_softmax: bool,
    pub item_first: bool,
    /// See [`ScoreInput::prompt_tokens`]; counted once, here.
    prompt_tokens: usize,
}

impl ScoreInput {
    pub fn new(query: Vec<u32>, items: Vec<Vec<u32>>, labels: Vec<u32>, apply_softmax: bool, item_first: bool, limits: ModelLimits) -> Result<Self, ValidationError> {
        if items.is_empty() {
            return Err(ValidationError::NoItems);
        }
        if let Some(index) = items.iter().position(Vec::is_empty) {
            return Err(ValidationError::EmptyItem { index });
        }
        if query.is_empty() {
            return Err(ValidationError::EmptyQuery);
        }
        if labels.is_empty() {
            return Err(ValidationError::NoLabels);
        }
        if let Some((index, item)) = items.iter().enumerate().find(|(_, item)| query.len() + item.len() > limits.max_positions) {
            return Err(ValidationError::SequenceTooLong { index, tokens: query.len() + item.len(), max_positions: limits.max_positions });
        }
        let outside = |field: &dyn Fn() -> String, ids: &[u32]| match ids.iter().find(|&&id| id as usize >= limits.vocab_size) {
            Some(&id) => Err(ValidationError::TokenIdOutOfRange { field: field(), id: i64::from(id), vocab_size: limits.vocab_size }),
            None => Ok(()),
        };
        outside(&|| "query".to_owned(), &query)?;
        for (index, item) in items.iter().enumerate() {
            outside(&|| format!("items[{index}]"), item)?;
        }
        outside(&|| "label_token_ids".to_owned(), &labels)?;
        let item_tokens: usize = items.iter().map(Vec::len).sum();
        let query_runs = if item_first { items.len() } else { 1 };
        let prompt_tokens = query_runs * query.len() + item_tokens;
        Ok(ScoreInput { query, items, labels, apply_softmax, item_first, prompt_tokens })
    }

    /// Tokens the engine runs: the query once (once per item with `item_first`) plus all items.
    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ModelLimits = ModelLimits { vocab_size: 100, max_positions: 8 };

    /// As the engine builds an input from wire ids.
    fn input(query: &[i64], items: &[Vec<i64>], labels: &[i64]) -> Result<ScoreInput, ValidationError> {
        let items = items.iter().enumerate().map(|(index, item)| token_ids(item, || format!("items[{index}]"), LIMITS)).collect::<Result<_, _>>()?;
        ScoreInput::new(token_ids(query, || "query".into(), LIMITS)?, items, token_ids(labels, || "label_token_ids".into(), LIMITS)?, false, false, LIMITS)
    }

    #[test]
    fn accepts_a_valid_request_and_counts_tokens() {
        let ok = input(&[1, 2], &[vec![3], vec![4, 99]], &[0, 5]).unwrap();
        assert_eq!(ok.items, vec![vec![3], vec![4, 99]]);
        assert_eq!(ok.prompt_tokens(), 5);
        let item_first = ScoreInput::new(vec![1, 2], vec![vec![3], vec![4]], vec![0], false, true, LIMITS).unwrap();
        assert_eq!(item_first.prompt_tokens(), 6);
    }

    #[test]
    fn rejects_each_bad_input_with_its_own_error() {
        assert_eq!(input(&[1], &[], &[0]), Err(ValidationError::NoItems));
        assert_eq!(input(&[1], &[vec![2], vec![]], &[0]), Err(ValidationError::EmptyItem { index: 1 }));
        assert_eq!(input(&[], &[vec![2]], &[0]), Err(ValidationError::EmptyQuery));
        assert_eq!(input(&[1], &[vec![2]], &[]), Err(ValidationError::NoLabels));
        let out_of_range = |field: &str, id| Err(ValidationError::TokenIdOutOfRange { field: field.into(), id, vocab_size: 100 });
        assert_eq!(input(&[-1], &[vec![2]], &[0]), out_of_range("query", -1));
        assert_eq!(input(&[1], &[vec![2], vec![100]], &[0]), out_of_range("items[1]", 100));
        assert_eq!(input(&[1], &[vec![2]], &[5, 1 << 40]), out_of_range("label_token_ids", 1 << 40));
        assert_eq!(input(&[1], &[vec![2]], &[5, 100]), out_of_range("label_token_ids", 100));
        assert_eq!(
            input(&[1; 5], &[vec![2; 3], vec![2; 4]], &[0]),
            Err(ValidationError::SequenceTooLong { index: 1, tokens: 9, max_positions: 8 })
        );
    }

    #[test]
    fn classifies_text_and_ids_and_rejects_mixtures() {
        let parse = |json: &str| serde_json::from_str::<ScoreRequest>(json).unwrap();
        let text = parse(r#"{"query":"q","items":["a","b"],"label_token_ids":[1]}"#);
        assert_eq!(text.input(), Ok(RequestInput::Text { query: "q", items: vec!["a", "b"] }));
        let single = parse(r#"{"query":"q","items":"a","label_token_ids":[1]}"#);
        assert_eq!(single.input(), Ok(RequestInput::Text { query: "q", items: vec!["a"] }));
        let ids = parse(r#"{"query":[1],"items":[[2],[3,4]],"label_token_ids":[1]}"#);
        assert!(matches!(ids.input(), Ok(RequestInput::Ids { .. })));
        let mixed = parse(r#"{"query":"q","items":[[2]],"label_token_ids":[1]}"#);
        assert_eq!(mixed.input(), Err(ValidationError::MixedInputKinds));
        let empty = parse(r#"{"query":[1],"items":[],"label_token_ids":[1]}"#);
        assert_eq!(empty.input(), Ok(RequestInput::Ids { query: &[1], items: &[] }));
        let empty = parse(r#"{"query":"q","items":[],"label_token_ids":[1]}"#);
        assert_eq!(empty.input(), Ok(RequestInput::Text { query: "q", items: vec![] }));
    }

    #[test]
    fn rejects_malformed_json_at_parse_time() {
        for bad in [
            r#"{"query":[1],"items":[[2.5]],"label_token_ids":[1]}"#,
            r#"{"query":[1],"items":[[2]]}"#,
            r#"{"query":[1],"items":[[2]],"label_token_ids":"yes"}"#,
        ] {
            assert!(serde_json::from_str::<ScoreRequest>(bad).is_err(), "{bad}");
        }
    }
}
