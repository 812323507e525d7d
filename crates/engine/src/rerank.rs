//! Reranking as scoring: each (query, document) pair becomes a yes/no question, and a document's
//! relevance is P(yes) / (P(yes) + P(no)). The default prompt is Qwen3-Reranker's.
//!
//! The query side of the prompt is the shared prefix and each document side is an item, so a
//! request's documents are scored in one packed pass like any other score request. User text
//! (query, instruction, documents) is tokenized as text: a `<|im_end|>` inside a document stays
//! characters, it cannot end the template's turn.

use tally_core::{Items, Query, ScoreInput, ScoreRequest};

use crate::prepare::{RequestError, RequestPreparer};
use crate::tokenizer::PromptPart;

pub const QWEN3_RERANKER_QUERY: &str = "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: {instruction}\n<Query>: {query}\n";
pub const QWEN3_RERANKER_DOCUMENT: &str = "<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
pub const QWEN3_RERANKER_INSTRUCTION: &str = "Given a web search query, retrieve relevant passages that answer the query";

/// The prompt around a query and a document, and the two one-token answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RerankTemplate {
    /// Query side; `{instruction}` and `{query}` are filled in.
    pub query: String,
    /// Document side; `{document}` is filled in.
    pub document: String,
    /// The instruction when a request gives none.
    pub instruction: String,
    pub yes: String,
    pub no: String,
}

impl Default for RerankTemplate {
    fn default() -> Self {
        RerankTemplate {
            query: QWEN3_RERANKER_QUERY.into(),
            document: QWEN3_RERANKER_DOCUMENT.into(),
            instruction: QWEN3_RERANKER_INSTRUCTION.into(),
            yes: "yes".into(),
            no: "no".into(),
        }
    }
}

/// Why a model cannot rerank with a template.
#[derive(Debug, thiserror::Error)]
pub enum RerankSetupError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("rerank answer {answer:?} is {tokens} tokens, not one")]
    AnswerNotOneToken { answer: String, tokens: usize },
}

/// A template resolved against a model's tokenizer.
pub struct Reranker {
    template: RerankTemplate,
    /// `[yes, no]` token ids.
    labels: [i64; 2],
    preparer: RequestPreparer,
}

impl Reranker {
    pub fn new(template: RerankTemplate, preparer: &RequestPreparer) -> Result<Self, RerankSetupError> {
        let tokenizer = preparer.tokenizer()?;
        let single_token = |answer: &str| -> Result<i64, RerankSetupError> {
            match tokenizer.encode(answer).map_err(RequestError::from)?.as_slice() {
                [id] => Ok(*id),
                ids => Err(RerankSetupError::AnswerNotOneToken { answer: answer.to_owned(), tokens: ids.len() }),
            }
        };
        let labels = [single_token(&template.yes)?, single_token(&template.no)?];
        Ok(Reranker { template, labels, preparer: preparer.clone() })
    }

    /// The validated score input for `query` and `documents`: the query side is the prefix,
    /// each document side an item, and the labels `[yes, no]` with softmax over the two, which
    /// is exactly P(yes) / (P(yes) + P(no)).
    pub fn prepare(&self, query: &str, instruction: Option<&str>, documents: &[&str]) -> Result<ScoreInput, RequestError> {
        let tokenizer = self.preparer.tokenizer()?;
        let instruction = instruction.unwrap_or(&self.template.instruction);
        let query_parts = fill(&self.template.query, &[("{instruction}", instruction), ("{query}", query)]);
        let query_ids = tokenizer.encode_prompt(&query_parts, true)?;
        let item_ids = documents
            .iter()
            .map(|document| tokenizer.encode_prompt(&fill(&self.template.document, &[("{document}", document)]), false))
            .collect::<Result<Vec<_>, _>>()?;
        let request = ScoreRequest {
            query: Query::Ids(query_ids),
            items: Items::Ids(item_ids),
            label_token_ids: self.labels.to_vec(),
            apply_softmax: true,
            item_first: false,
            model: None,
        };
        self.preparer.prepare(&request)
    }
}

/// `template` cut at its placeholders, each replaced by its value as user text, in one
/// left-to-right pass: a value that itself contains a placeholder is never filled again.
fn fill<'a>(template: &'a str, values: &[(&str, &'a str)]) -> Vec<PromptPart<'a>> {
    let mut parts = Vec::new();
    let mut rest = template;
    while let Some((at, placeholder, value)) = values.iter().filter_map(|&(p, v)| rest.find(p).map(|at| (at, p, v))).min_by_key(|&(at, ..)| at) {
        parts.push(PromptPart::Template(&rest[..at]));
        parts.push(PromptPart::Text(value));
        rest = &rest[at + placeholder.len()..];
    }
    parts.push(PromptPart::Template(rest));
    parts.retain(|part| !matches!(part, PromptPart::Template("") | PromptPart::Text("")));
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use PromptPart::{Template, Text};

    #[test]
    fn fill_substitutes_each_placeholder_once_as_text() {
        let parts = fill("<I>: {instruction}\n<Q>: {query}\n", &[("{instruction}", "judge {query}"), ("{query}", "a {instruction} b")]);
        assert_eq!(parts, [Template("<I>: "), Text("judge {query}"), Template("\n<Q>: "), Text("a {instruction} b"), Template("\n")]);
        assert_eq!(fill("{x}{x}", &[("{x}", "1")]), [Text("1"), Text("1")]);
        assert_eq!(fill("none", &[("{x}", "1")]), [Template("none")]);
    }
}
