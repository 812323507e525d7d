//! Architectures of released checkpoints (and a tiny one for tests), for random benchmark
//! checkpoints that need no download.

use crate::config::{Family, ModelConfig, RopeConfig, RopeScaling};

pub const PRESETS: &[&str] = &["tiny", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "smollm2-135m", "llama-3.2-1b"];

pub fn preset(name: &str) -> Option<ModelConfig> {
    let qwen3 = |hidden, intermediate, layers, heads, kv_heads, head_dim, tied| ModelConfig {
        family: Family::Qwen3,
        vocab_size: 151_936,
        hidden_size: hidden,
        intermediate_size: intermediate,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim,
        rms_norm_eps: 1e-6,
        rope: RopeConfig { theta: 1_000_000.0, scaling: RopeScaling::None },
        max_position_embeddings: 40_960,
        tie_word_embeddings: tied,
        qk_norm: true,
        attention_bias: false,
    };
    Some(match name {
        "tiny" => qwen3(64, 192, 2, 4, 2, 32, true),
        "qwen3-0.6b" => qwen3(1024, 3072, 28, 16, 8, 128, true),
        "qwen3-1.7b" => qwen3(2048, 6144, 28, 16, 8, 128, true),
        "qwen3-4b" => qwen3(2560, 9728, 36, 32, 8, 128, true),
        "qwen3-8b" => qwen3(4096, 12288, 36, 32, 8, 128, false),
        "smollm2-135m" => ModelConfig {
            family: Family::Llama,
            vocab_size: 49_152,
            rms_norm_eps: 1e-5,
            rope: RopeConfig { theta: 100_000.0, scaling: RopeScaling::None },
            max_position_embeddings: 8192,
            qk_norm: false,
            ..qwen3(576, 1536, 30, 9, 3, 64, true)
        },
        "llama-3.2-1b" => ModelConfig {
            family: Family::Llama,
            vocab_size: 128_256,
            rms_norm_eps: 1e-5,
            rope: RopeConfig {
                theta: 500_000.0,
                scaling: RopeScaling::Llama3 { factor: 32.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192.0 },
            },
            max_position_embeddings: 131_072,
            qk_norm: false,
            ..qwen3(2048, 8192, 16, 32, 8, 64, true)
        },
        _ => return None,
    })
}
