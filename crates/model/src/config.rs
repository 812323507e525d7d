//! `config.json` of a Qwen3 checkpoint, in both the transformers 4.x and 5.x layouts.

use serde::Deserialize;

/// The resolved architecture of a Qwen3 checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Independent of `hidden_size / num_attention_heads` in Qwen3.
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config.json is not valid: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("config.json: {0}")]
    Invalid(String),
}

/// config.json as written by transformers; 4.x puts `rope_theta` at the top level, 5.x nests it in
/// `rope_parameters`.
#[derive(Deserialize)]
struct RawConfig {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "default_rms_norm_eps")]
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    rope_parameters: Option<RopeParameters>,
    #[serde(default)]
    rope_scaling: Option<serde_json::Value>,
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
}

#[derive(Deserialize)]
struct RopeParameters {
    rope_theta: f64,
    #[serde(default)]
    rope_type: Option<String>,
}

fn default_rms_norm_eps() -> f64 {
    1e-6
}

impl Qwen3Config {
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig = serde_json::from_str(json)?;
        let invalid = |msg: String| Err(ConfigError::Invalid(msg));
        let rope_type = raw.rope_parameters.as_ref().and_then(|r| r.rope_type.as_deref()).unwrap_or("default");
        if rope_type != "default" || raw.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return invalid(format!("RoPE scaling ({rope_type}) is not supported; only default RoPE is"));
        }
        let Some(rope_theta) = raw.rope_parameters.as_ref().map(|r| r.rope_theta).or(raw.rope_theta) else {
            return invalid("neither `rope_theta` nor `rope_parameters.rope_theta` is set".into());
        };
        let heads = raw.num_attention_heads;
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return invalid(format!("num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"));
        }
        let head_dim = match raw.head_dim {
            Some(dim) => dim,
            None if raw.hidden_size.is_multiple_of(heads) => raw.hidden_size / heads,
            None => return invalid("head_dim is missing and hidden_size is not a multiple of the heads".into()),
        };
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return invalid(format!("head_dim ({head_dim}) must be even for RoPE"));
        }
        Ok(Qwen3Config {
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rms_norm_eps: raw.rms_norm_eps,
            rope_theta,
            max_position_embeddings: raw.max_position_embeddings,
            tie_word_embeddings: raw.tie_word_embeddings,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMON: &str = r#""vocab_size": 100, "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 512"#;

    #[test]
    fn reads_both_transformers_layouts() {
        let v4 = Qwen3Config::from_json(&format!(r#"{{{COMMON}, "num_key_value_heads": 2, "head_dim": 24, "rope_theta": 10000.0}}"#)).unwrap();
        let v5 = Qwen3Config::from_json(&format!(
            r#"{{{COMMON}, "num_key_value_heads": 2, "head_dim": 24, "rope_parameters": {{"rope_theta": 10000.0, "rope_type": "default"}}}}"#
        ))
        .unwrap();
        assert_eq!(v4, v5);
        assert_eq!((v4.head_dim, v4.num_key_value_heads, v4.rope_theta), (24, 2, 10000.0));
        assert!(!v4.tie_word_embeddings);
    }

    #[test]
    fn defaults_head_dim_and_kv_heads() {
        let config = Qwen3Config::from_json(&format!(r#"{{{COMMON}, "rope_theta": 1e6}}"#)).unwrap();
        assert_eq!((config.head_dim, config.num_key_value_heads), (12, 4));
    }

    #[test]
    fn rejects_inconsistent_configs() {
        for bad in [
            format!(r#"{{{COMMON}}}"#),
            format!(r#"{{{COMMON}, "rope_theta": 1e6, "num_key_value_heads": 3}}"#),
            format!(r#"{{{COMMON}, "rope_theta": 1e6, "head_dim": 7}}"#),
            format!(r#"{{{COMMON}, "rope_parameters": {{"rope_theta": 1e6, "rope_type": "yarn"}}}}"#),
            r#"{"vocab_size": 100}"#.to_owned(),
        ] {
            assert!(Qwen3Config::from_json(&bad).is_err(), "{bad}");
        }
    }
}
