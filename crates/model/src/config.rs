//! The architecture of a checkpoint, whichever family it comes from. Qwen3, Llama and Qwen2 are
//! one decoder; what tells them apart is data here (q/k norms, attention bias, RoPE scaling, a
//! tied head), read from `config.json` (transformers 4.x and 5.x layouts) or from GGUF metadata.

use serde::Deserialize;

/// The model families tally runs. Only names and defaults differ; the forward is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Qwen3,
    Llama,
    Qwen2,
}

/// Every family once: its `config.json` `model_type` (also its GGUF `general.architecture`) and
/// its transformers class (`architectures[0]`). Everything that names a family reads this.
const FAMILIES: [(Family, &str, &str); 3] = [
    (Family::Qwen3, "qwen3", "Qwen3ForCausalLM"),
    (Family::Llama, "llama", "LlamaForCausalLM"),
    (Family::Qwen2, "qwen2", "Qwen2ForCausalLM"),
];

impl Family {
    /// The family a `config.json` `model_type` or a GGUF `general.architecture` names.
    pub fn from_model_type(model_type: &str) -> Option<Self> {
        FAMILIES.iter().find(|&&(_, name, _)| name == model_type).map(|&(family, ..)| family)
    }

    fn from_architecture(architecture: &str) -> Option<Self> {
        FAMILIES.iter().find(|&&(.., class)| class == architecture).map(|&(family, ..)| family)
    }

    pub fn model_type(self) -> &'static str {
        FAMILIES.iter().find(|&&(family, ..)| family == self).map(|&(_, name, _)| name).expect("every family is in the table")
    }

    pub fn architecture(self) -> &'static str {
        FAMILIES.iter().find(|&&(family, ..)| family == self).map(|&(.., class)| class).expect("every family is in the table")
    }

    /// The `model_type`s tally runs, for error messages: `qwen3, llama, qwen2`.
    pub fn names() -> String {
        FAMILIES.map(|(_, name, _)| name).join(", ")
    }
}

/// How rotary frequencies are stretched for long contexts.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor` (transformers' `linear`).
    Linear { factor: f64 },
    /// Llama 3.1's piecewise scaling: long wavelengths divided by `factor`, short ones kept,
    /// a smooth blend in between.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: f64 },
    /// One divisor per frequency, as GGUF files store Llama 3.1 scaling (`rope_freqs.weight`).
    Factors(Vec<f64>),
}

/// Rotary position embedding: base and scaling.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    pub theta: f64,
    pub scaling: RopeScaling,
}

impl RopeConfig {
    /// The `head_dim / 2` angular frequencies, scaling applied (rotate-half layout).
    pub fn inverse_frequencies(&self, head_dim: usize) -> Vec<f64> {
        let base = (0..head_dim / 2).map(|i| self.theta.powf(-2.0 * i as f64 / head_dim as f64));
        match &self.scaling {
            RopeScaling::None => base.collect(),
            RopeScaling::Linear { factor } => base.map(|f| f / factor).collect(),
            RopeScaling::Factors(factors) => base.zip(factors).map(|(f, factor)| f / factor).collect(),
            &RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings: context } => base
                .map(|f| {
                    let wavelength = std::f64::consts::TAU / f;
                    if wavelength < context / high_freq_factor {
                        f
                    } else if wavelength > context / low_freq_factor {
                        f / factor
                    } else {
                        let smooth = (context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect(),
        }
    }
}

/// The resolved architecture of a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Independent of `hidden_size / num_attention_heads` in Qwen3.
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope: RopeConfig,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// RMSNorm of every query and key head before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Biases on the q, k and v projections (Qwen2; optional in Llama).
    pub attention_bias: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config.json is not valid: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("config.json: {0}")]
    Invalid(String),
    #[error("unsupported model type `{0}`; tally runs: {types}", types = Family::names())]
    UnknownFamily(String),
}

/// config.json as written by transformers; 4.x puts `rope_theta` and `rope_scaling` at the top
/// level, 5.x nests both in `rope_parameters`.
#[derive(Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    #[serde(default)]
    architectures: Vec<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_parameters: Option<RopeParameters>,
    rope_scaling: Option<RopeParameters>,
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    attention_bias: Option<bool>,
    #[serde(default)]
    mlp_bias: bool,
    #[serde(default)]
    use_sliding_window: bool,
    hidden_act: Option<String>,
}

#[derive(Deserialize)]
struct RopeParameters {
    rope_theta: Option<f64>,
    // 4.x Llama 3.1 configs say `rope_type`, older ones `type`.
    #[serde(alias = "type")]
    rope_type: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<f64>,
}

impl RopeParameters {
    fn scaling(&self) -> Result<RopeScaling, ConfigError> {
        let need = |value: Option<f64>, name: &str| {
            value.ok_or_else(|| ConfigError::Invalid(format!("RoPE scaling `{}` needs `{name}`", self.rope_type.as_deref().unwrap_or(""))))
        };
        match self.rope_type.as_deref().unwrap_or("default") {
            "default" => Ok(RopeScaling::None),
            "linear" => Ok(RopeScaling::Linear { factor: need(self.factor, "factor")? }),
            "llama3" => Ok(RopeScaling::Llama3 {
                factor: need(self.factor, "factor")?,
                low_freq_factor: need(self.low_freq_factor, "low_freq_factor")?,
                high_freq_factor: need(self.high_freq_factor, "high_freq_factor")?,
                original_max_position_embeddings: need(self.original_max_position_embeddings, "original_max_position_embeddings")?,
            }),
            other => Err(ConfigError::Invalid(format!("RoPE scaling `{other}` is not supported; default, linear and llama3 are"))),
        }
    }
}

impl ModelConfig {
    /// Reads `config.json`, dispatching on `model_type` (or `architectures`).
    pub fn from_json(json: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig = serde_json::from_str(json)?;
        let family = match &raw.model_type {
            Some(model_type) => Family::from_model_type(model_type).ok_or_else(|| ConfigError::UnknownFamily(model_type.clone()))?,
            None => match raw.architectures.first() {
                Some(architecture) => Family::from_architecture(architecture).ok_or_else(|| ConfigError::UnknownFamily(architecture.clone()))?,
                None => return Err(ConfigError::Invalid("neither `model_type` nor `architectures` is set".into())),
            },
        };
        let invalid = |msg: String| Err(ConfigError::Invalid(msg));
        if raw.mlp_bias {
            return invalid("`mlp_bias: true` is not supported".into());
        }
        if raw.use_sliding_window {
            return invalid("sliding-window attention (`use_sliding_window: true`) is not supported".into());
        }
        if let Some(act) = raw.hidden_act.as_deref().filter(|act| *act != "silu") {
            return invalid(format!("activation `{act}` is not supported; only silu is"));
        }
        let Some(rope_theta) = raw.rope_parameters.as_ref().and_then(|r| r.rope_theta).or(raw.rope_theta) else {
            return invalid("neither `rope_theta` nor `rope_parameters.rope_theta` is set".into());
        };
        let scaling = match raw.rope_parameters.as_ref().or(raw.rope_scaling.as_ref()) {
            Some(parameters) => parameters.scaling()?,
            None => RopeScaling::None,
        };
        let heads = raw.num_attention_heads;
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        let head_dim = match raw.head_dim {
            Some(dim) => dim,
            None if heads > 0 && raw.hidden_size.is_multiple_of(heads) => raw.hidden_size / heads,
            None => return invalid("head_dim is missing and hidden_size is not a multiple of the heads".into()),
        };
        let config = ModelConfig {
            family,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope: RopeConfig { theta: rope_theta, scaling },
            max_position_embeddings: raw.max_position_embeddings,
            tie_word_embeddings: raw.tie_word_embeddings,
            qk_norm: family == Family::Qwen3,
            // Qwen2 always has q/k/v biases; Llama and Qwen3 say so in `attention_bias`.
            attention_bias: family == Family::Qwen2 || raw.attention_bias.unwrap_or(false),
        };
        config.check()?;
        Ok(config)
    }

    /// The consistency every source must meet, whatever file it came from.
    pub fn check(&self) -> Result<(), ConfigError> {
        let invalid = |msg: String| Err(ConfigError::Invalid(msg));
        let (heads, kv_heads) = (self.num_attention_heads, self.num_key_value_heads);
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return invalid(format!("num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return invalid(format!("head_dim ({}) must be even for RoPE", self.head_dim));
        }
        if let RopeScaling::Factors(factors) = &self.rope.scaling {
            if factors.len() != self.head_dim / 2 {
                return invalid(format!("{} RoPE frequency factors for head_dim {}", factors.len(), self.head_dim));
            }
        }
        for (name, value) in [("vocab_size", self.vocab_size), ("hidden_size", self.hidden_size), ("num_hidden_layers", self.num_hidden_layers)] {
            if value == 0 {
                return invalid(format!("{name} must be positive"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMON: &str = r#""vocab_size": 100, "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 512"#;

    fn read(model_type: &str, extra: &str) -> Result<ModelConfig, ConfigError> {
        ModelConfig::from_json(&format!(r#"{{"model_type": "{model_type}", {COMMON}{extra}}}"#))
    }

    #[test]
    fn reads_both_transformers_layouts() {
        let v4 = read("qwen3", r#", "num_key_value_heads": 2, "head_dim": 24, "rope_theta": 10000.0"#).unwrap();
        let v5 = read("qwen3", r#", "num_key_value_heads": 2, "head_dim": 24, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}"#).unwrap();
        assert_eq!(v4, v5);
        assert_eq!((v4.head_dim, v4.num_key_value_heads, v4.rope.theta), (24, 2, 10000.0));
        assert!(!v4.tie_word_embeddings);
    }

    #[test]
    fn defaults_head_dim_and_kv_heads() {
        let config = read("qwen3", r#", "rope_theta": 1e6"#).unwrap();
        assert_eq!((config.head_dim, config.num_key_value_heads), (12, 4));
    }

    #[test]
    fn families_differ_in_norms_and_biases_only() {
        let qwen3 = read("qwen3", r#", "rope_theta": 1e6"#).unwrap();
        let llama = read("llama", r#", "rope_theta": 1e6"#).unwrap();
        let qwen2 = read("qwen2", r#", "rope_theta": 1e6"#).unwrap();
        assert_eq!((qwen3.qk_norm, qwen3.attention_bias), (true, false));
        assert_eq!((llama.qk_norm, llama.attention_bias), (false, false));
        assert_eq!((qwen2.qk_norm, qwen2.attention_bias), (false, true));
        assert!(read("llama", r#", "rope_theta": 1e6, "attention_bias": true"#).unwrap().attention_bias);
        let by_architecture = ModelConfig::from_json(&format!(r#"{{"architectures": ["LlamaForCausalLM"], {COMMON}, "rope_theta": 1e6}}"#)).unwrap();
        assert_eq!(by_architecture, llama);
    }

    #[test]
    fn an_unknown_family_lists_the_supported_ones() {
        let error = read("mamba", r#", "rope_theta": 1e6"#).unwrap_err().to_string();
        assert!(error.contains("mamba") && error.contains("qwen3, llama, qwen2"), "{error}");
    }

    #[test]
    fn llama3_scaling_matches_the_transformers_formula() {
        // Llama 3.2-1B's scaling, both layouts.
        let scaling = r#""factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192"#;
        let v4 = read("llama", &format!(r#", "rope_theta": 500000.0, "rope_scaling": {{"rope_type": "llama3", {scaling}}}"#)).unwrap();
        let v5 = read("llama", &format!(r#", "rope_parameters": {{"rope_theta": 500000.0, "rope_type": "llama3", {scaling}}}"#)).unwrap();
        assert_eq!(v4, v5);
        let base = RopeConfig { theta: 500000.0, scaling: RopeScaling::None }.inverse_frequencies(64);
        let scaled = v4.rope.inverse_frequencies(64);
        // Short wavelengths (< 8192 / 4) are kept; long ones (> 8192) are divided by 32.
        for (f, s) in base.iter().zip(&scaled) {
            let wavelength = std::f64::consts::TAU / f;
            if wavelength < 2048.0 {
                assert_eq!(f, s);
            } else if wavelength > 8192.0 {
                assert!((f / 32.0 - s).abs() < 1e-15);
            } else {
                assert!(*s < *f && *s > f / 32.0);
            }
        }
        assert!(base.iter().zip(&scaled).any(|(f, s)| f != s));
    }

    #[test]
    fn rejects_inconsistent_configs() {
        for bad in [
            read("qwen3", ""),
            read("qwen3", r#", "rope_theta": 1e6, "num_key_value_heads": 3"#),
            read("qwen3", r#", "rope_theta": 1e6, "head_dim": 7"#),
            read("qwen3", r#", "rope_parameters": {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0}"#),
            read("llama", r#", "rope_theta": 1e6, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}"#),
            read("llama", r#", "rope_theta": 1e6, "mlp_bias": true"#),
            read("qwen2", r#", "rope_theta": 1e6, "use_sliding_window": true"#),
            read("llama", r#", "rope_theta": 1e6, "hidden_act": "gelu""#),
            ModelConfig::from_json(r#"{"vocab_size": 100}"#),
        ] {
            assert!(bad.is_err(), "{bad:?}");
        }
    }
}
