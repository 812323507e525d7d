//! Architectures of released Qwen3 checkpoints (and a tiny one for tests), for random
//! benchmark checkpoints that need no download.

use crate::config::Qwen3Config;

pub const PRESETS: &[&str] = &["tiny", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b"];

pub fn preset(name: &str) -> Option<Qwen3Config> {
    // (hidden, intermediate, layers, heads, kv heads, tied)
    let (hidden, intermediate, layers, heads, kv_heads, tied) = match name {
        "tiny" => (64, 192, 2, 4, 2, true),
        "qwen3-0.6b" => (1024, 3072, 28, 16, 8, true),
        "qwen3-1.7b" => (2048, 6144, 28, 16, 8, true),
        "qwen3-4b" => (2560, 9728, 36, 32, 8, true),
        "qwen3-8b" => (4096, 12288, 36, 32, 8, false),
        _ => return None,
    };
    Some(Qwen3Config {
        vocab_size: 151_936,
        hidden_size: hidden,
        intermediate_size: intermediate,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim: if name == "tiny" { 32 } else { 128 },
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        max_position_embeddings: 40_960,
        tie_word_embeddings: tied,
    })
}
