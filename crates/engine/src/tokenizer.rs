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
