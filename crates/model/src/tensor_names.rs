//! The tensors the decoder reads and their names in each checkpoint format, in one table: the
//! loader asks for a [`TensorName`] and each checkpoint format (the `weights` module's
//! `TensorSource`s) spells it its own way (Hugging Face's module paths, GGUF's `blk.N.*`).

use std::fmt;

/// A tensor of the decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorName {
    Embeddings,
    FinalNorm,
    LmHead,
    /// Layer `index`'s `tensor`: its weight, or its bias (Qwen2's q/k/v projections).
    Layer { index: usize, tensor: LayerTensor, bias: bool },
}

/// A tensor every layer has (the q/k norms and projection biases only in some families).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerTensor {
    InputNorm,
    QProj,
    KProj,
    VProj,
    OProj,
    QNorm,
    KNorm,
    PostAttentionNorm,
    GateProj,
    UpProj,
    DownProj,
}

impl LayerTensor {
    /// (Hugging Face module path, GGUF name).
    fn names(self) -> (&'static str, &'static str) {
        match self {
            LayerTensor::InputNorm => ("input_layernorm", "attn_norm"),
            LayerTensor::QProj => ("self_attn.q_proj", "attn_q"),
            LayerTensor::KProj => ("self_attn.k_proj", "attn_k"),
            LayerTensor::VProj => ("self_attn.v_proj", "attn_v"),
            LayerTensor::OProj => ("self_attn.o_proj", "attn_output"),
            LayerTensor::QNorm => ("self_attn.q_norm", "attn_q_norm"),
            LayerTensor::KNorm => ("self_attn.k_norm", "attn_k_norm"),
            LayerTensor::PostAttentionNorm => ("post_attention_layernorm", "ffn_norm"),
            LayerTensor::GateProj => ("mlp.gate_proj", "ffn_gate"),
            LayerTensor::UpProj => ("mlp.up_proj", "ffn_up"),
            LayerTensor::DownProj => ("mlp.down_proj", "ffn_down"),
        }
    }
}

impl TensorName {
    /// Layer `index`'s `tensor`, its weight.
    pub fn layer(index: usize, tensor: LayerTensor) -> Self {
        TensorName::Layer { index, tensor, bias: false }
    }

    /// Layer `index`'s `tensor`, its bias.
    pub fn layer_bias(index: usize, tensor: LayerTensor) -> Self {
        TensorName::Layer { index, tensor, bias: true }
    }

    /// The name in a Hugging Face checkpoint (safetensors).
    pub fn hf(&self) -> String {
        match *self {
            TensorName::Embeddings => "model.embed_tokens.weight".into(),
            TensorName::FinalNorm => "model.norm.weight".into(),
            TensorName::LmHead => "lm_head.weight".into(),
            TensorName::Layer { index, tensor, bias } => format!("model.layers.{index}.{}.{}", tensor.names().0, kind(bias)),
        }
    }

    /// The name in a GGUF file (llama.cpp's).
    pub fn gguf(&self) -> String {
        match *self {
            TensorName::Embeddings => "token_embd.weight".into(),
            TensorName::FinalNorm => "output_norm.weight".into(),
            TensorName::LmHead => "output.weight".into(),
            TensorName::Layer { index, tensor, bias } => format!("blk.{index}.{}.{}", tensor.names().1, kind(bias)),
        }
    }
}

fn kind(bias: bool) -> &'static str {
    if bias {
        "bias"
    } else {
        "weight"
    }
}

/// The Hugging Face name, the one users see in configs and error messages.
impl fmt::Display for TensorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hf())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tensor_has_its_hugging_face_and_gguf_name() {
        for (name, hf, gguf) in [
            (TensorName::Embeddings, "model.embed_tokens.weight", "token_embd.weight"),
            (TensorName::FinalNorm, "model.norm.weight", "output_norm.weight"),
            (TensorName::LmHead, "lm_head.weight", "output.weight"),
            (TensorName::layer_bias(12, LayerTensor::QProj), "model.layers.12.self_attn.q_proj.bias", "blk.12.attn_q.bias"),
            (TensorName::layer(0, LayerTensor::KNorm), "model.layers.0.self_attn.k_norm.weight", "blk.0.attn_k_norm.weight"),
            (TensorName::layer(3, LayerTensor::PostAttentionNorm), "model.layers.3.post_attention_layernorm.weight", "blk.3.ffn_norm.weight"),
            (TensorName::layer(3, LayerTensor::DownProj), "model.layers.3.mlp.down_proj.weight", "blk.3.ffn_down.weight"),
        ] {
            assert_eq!((name.hf().as_str(), name.gguf().as_str()), (hf, gguf));
        }
    }
}
