//! Reranking as scoring: each (query, document) pair becomes a yes/no question, and a document's
//! relevance is P(yes) / (P(yes) + P(no)). The default prompt is Qwen3-Reranker's.
//!
//! The query side of the prompt is the shared prefix and each document side is an item, so a
//! request's documents are scored in one packed pass like any other score request. User text
//! (query, instruction, documents) is tokenized as text: a `<|im_end|>` inside a document stays
//! characters, it cannot end the template's turn.

use tally_core::ScoreInput;

use crate::prepare::{RequestError, RequestPreparer};
use crate::tokenizer::{PromptPart, TextTokenizer, TruncationSide};

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

/// How over-long documents are cut to fit, as rerank clients ask for it (Cohere's
/// `max_tokens_per_doc`, vLLM's `truncate_prompt_tokens`, TEI's `truncate`). Only document text
/// gives way: the template and the query never do, since a prompt without its instruction or
/// its closing turn is no longer the question the model was trained to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Truncation {
    /// Tokens each document's own text may keep, before templating.
    pub document_tokens: Option<usize>,
    /// Tokens each whole prompt (template, query and document together) may have.
    pub prompt_tokens: Option<usize>,
    /// The end of a document that gives way.
    pub side: TruncationSide,
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
    labels: [u32; 2],
    preparer: RequestPreparer,
}

impl Reranker {
    pub fn new(template: RerankTemplate, preparer: &RequestPreparer) -> Result<Self, RerankSetupError> {
        let tokenizer = preparer.tokenizer()?;
        let single_token = |answer: &str| -> Result<u32, RerankSetupError> {
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
    /// is exactly P(yes) / (P(yes) + P(no)). Documents are cut as `truncation` says.
    pub fn prepare(&self, query: &str, instruction: Option<&str>, documents: &[&str], truncation: Truncation) -> Result<ScoreInput, RequestError> {
        let tokenizer = self.preparer.tokenizer()?;
        let instruction = instruction.unwrap_or(&self.template.instruction);
        let query_parts = fill(&self.template.query, &[("{instruction}", instruction), ("{query}", query)]);
        let query_ids = tokenizer.encode_prompt(&query_parts, true)?;
        let item_ids = documents.iter().map(|document| self.document_ids(tokenizer, query_ids.len(), document, truncation)).collect::<Result<Vec<_>, _>>()?;
        Ok(ScoreInput::new(query_ids, item_ids, self.labels.to_vec(), true, false, self.preparer.limits())?)
    }

    /// The document side of the prompt for `document`, cut to `truncation`.
    fn document_ids(&self, tokenizer: &TextTokenizer, query_tokens: usize, document: &str, truncation: Truncation) -> Result<Vec<u32>, RequestError> {
        let encode = |document: &str| tokenizer.encode_prompt(&fill(&self.template.document, &[("{document}", document)]), false);
        let mut document = match truncation.document_tokens {
            Some(tokens) => tokenizer.truncate_text(document, tokens, truncation.side)?,
            None => document,
        };
        let mut ids = encode(document)?;
        let Some(budget) = truncation.prompt_tokens else {
            return Ok(ids);
        };
        // Cut by the excess, then check again: a merge across the template's edge or the cut
        // can cost a token more than counted.
        let mut keep = tokenizer.count_text(document)?;
        while query_tokens + ids.len() > budget {
            if keep == 0 {
                return Err(RequestError::NoRoomForDocument { query_tokens, template_tokens: ids.len(), budget });
            }
            keep = keep.saturating_sub(query_tokens + ids.len() - budget);
            document = tokenizer.truncate_text(document, keep, truncation.side)?;
            ids = encode(document)?;
        }
        Ok(ids)
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
    use tally_core::ModelLimits;
    use PromptPart::{Template, Text};

    /// The Qwen3-Reranker template over the real Qwen3 tokenizer (the `wide-vocab` fixture's).
    fn qwen3_reranker() -> Reranker {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/wide-vocab/tokenizer.json");
        let tokenizer = TextTokenizer::from_file(&path).unwrap();
        let preparer = RequestPreparer::new(Some(tokenizer), ModelLimits { vocab_size: 151_936, max_positions: 4096 }, "qwen3".into());
        let template = RerankTemplate {
            query: QWEN3_RERANKER_QUERY.into(),
            document: QWEN3_RERANKER_DOCUMENT.into(),
            instruction: QWEN3_RERANKER_INSTRUCTION.into(),
            yes: "yes".into(),
            no: "no".into(),
        };
        Reranker::new(template, &preparer).unwrap()
    }

    #[test]
    fn truncation_cuts_documents_only_and_fits_every_prompt() {
        let reranker = qwen3_reranker();
        let long = "Paris is the capital and largest city of France, on the Seine. ".repeat(20);
        let japanese = "東京は日本の首都です。".repeat(30);
        let documents = [long.as_str(), "Short one.", japanese.as_str()];
        let whole = reranker.prepare("capital of France", None, &documents, Truncation::default()).unwrap();
        let query_tokens = whole.query.len();
        let template_tokens = reranker.prepare("capital of France", None, &["x"], Truncation::default()).unwrap().items[0].len();
        for budget in [query_tokens + template_tokens, query_tokens + template_tokens + 1, query_tokens + 60, query_tokens + 200] {
            for side in [TruncationSide::Left, TruncationSide::Right] {
                let truncation = Truncation { prompt_tokens: Some(budget), side, ..Truncation::default() };
                let cut = reranker.prepare("capital of France", None, &documents, truncation).unwrap();
                assert_eq!(cut.query, whole.query, "the query side never gives way");
                for (index, (item, original)) in cut.items.iter().zip(&whole.items).enumerate() {
                    assert!(query_tokens + item.len() <= budget, "budget {budget} {side:?}: document {index} is {} tokens", item.len());
                    if query_tokens + original.len() <= budget {
                        assert_eq!(item, original, "a document that fits is untouched");
                    } else {
                        // Within a token or two of the budget: cut by the excess, not far past it.
                        assert!(query_tokens + item.len() + 2 >= budget, "budget {budget} {side:?}: document {index} cut to {}", item.len());
                        // The template's closing turn (the last 6 tokens) survives every cut.
                        assert_eq!(item[item.len() - 6..], original[original.len() - 6..]);
                    }
                }
            }
        }
        // The side asked for: Right keeps the document's opening words, Left its last.
        let opening = |side| {
            let truncation = Truncation { document_tokens: Some(3), side, ..Truncation::default() };
            reranker.prepare("q", None, &["one two three four five"], truncation).unwrap().items[0].clone()
        };
        let expected = |text: &str| reranker.prepare("q", None, &[text], Truncation::default()).unwrap().items[0].clone();
        assert_eq!(opening(TruncationSide::Right), expected("one two three"));
        assert_eq!(opening(TruncationSide::Left), expected("three four five"));

        let too_tight = Truncation { prompt_tokens: Some(query_tokens + 3), ..Truncation::default() };
        assert!(matches!(reranker.prepare("capital of France", None, &documents, too_tight), Err(RequestError::NoRoomForDocument { .. })));
    }

    #[test]
    fn fill_substitutes_each_placeholder_once_as_text() {
        let parts = fill("<I>: {instruction}\n<Q>: {query}\n", &[("{instruction}", "judge {query}"), ("{query}", "a {instruction} b")]);
        assert_eq!(parts, [Template("<I>: "), Text("judge {query}"), Template("\n<Q>: "), Text("a {instruction} b"), Template("\n")]);
        assert_eq!(fill("{x}{x}", &[("{x}", "1")]), [Text("1"), Text("1")]);
        assert_eq!(fill("none", &[("{x}", "1")]), [Template("none")]);
    }
}
