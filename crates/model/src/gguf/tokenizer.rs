//! The `tokenizer.json` a GGUF vocabulary describes, built the way llama.cpp tokenizes it:
//! byte-level BPE with the pre-tokenizer `tokenizer.ggml.pre` names. The engine loads it with
//! the `tokenizers` crate; this module only knows the format.

use serde_json::{json, Value};

use super::checkpoint::GgufVocabulary;

/// Why a vocabulary describes no tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum VocabularyError {
    #[error("{types} token types for {tokens} tokens")]
    TokenTypes { types: usize, tokens: usize },
    #[error("BOS id {0} is outside the vocabulary")]
    BosOutside(u32),
}

/// The pre-tokenizer llama.cpp uses for a GGUF `tokenizer.ggml.pre`.
fn pre_tokenizer(pre: Option<&str>) -> Value {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |pattern: &str| {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
            byte_level(false),
        ]})
    };
    match pre {
        // Digits one by one, then GPT-2's byte-level split.
        Some("smollm") => json!({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true)]}),
        Some("qwen2") => split(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
        Some("llama-bpe") => split(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
        _ => byte_level(true),
    }
}

impl GgufVocabulary {
    /// A `tokenizer.json` document for this byte-level BPE vocabulary: tokens in id order,
    /// merges as given, control (3) and user-defined (4) tokens as special tokens, BOS when
    /// `add_bos`.
    pub fn tokenizer_json(&self) -> Result<Value, VocabularyError> {
        if !self.token_types.is_empty() && self.token_types.len() != self.tokens.len() {
            return Err(VocabularyError::TokenTypes { types: self.token_types.len(), tokens: self.tokens.len() });
        }
        let vocab: serde_json::Map<String, Value> = self.tokens.iter().enumerate().map(|(id, token)| (token.clone(), json!(id))).collect();
        let special: Vec<Value> = self
            .token_types
            .iter()
            .enumerate()
            .filter(|&(_, &kind)| kind == 3 || kind == 4)
            .map(|(id, _)| json!({"id": id, "content": self.tokens[id], "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
            .collect();
        let post_processor = match self.bos_token_id.filter(|_| self.add_bos) {
            Some(bos) => {
                let token = self.tokens.get(bos as usize).ok_or(VocabularyError::BosOutside(bos))?;
                json!({"type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": token, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                    "pair": [{"SpecialToken": {"id": token, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                    "special_tokens": {token: {"id": token, "ids": [bos], "tokens": [token]}}})
            }
            None => json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}),
        };
        Ok(json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": special,
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer(self.pre.as_deref()),
            "post_processor": post_processor,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": self.merges},
        }))
    }
}
