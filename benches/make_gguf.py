#!/usr/bin/env python3
"""A `tally make-model` checkpoint (Hugging Face layout: config.json, bf16 safetensors,
tokenizer.json) as a GGUF file llama.cpp loads: the matrices quantised by the `gguf` package
(Q8_0 by default), norms in float32, the byte-level BPE tokenizer in GGUF's metadata. Qwen3 only
(no q/k permutation; Llama's would need convert_hf_to_gguf's).

    tally make-model --preset qwen3-0.6b --out /tmp/qwen3-0.6b
    python3 benches/make_gguf.py /tmp/qwen3-0.6b /tmp/qwen3-0.6b-q8_0.gguf [--type Q8_0]
"""

import argparse
import json
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import quantize

from safetensors_reader import checkpoint_tensors

LAYER_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
               "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(name):
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    if name in fixed:
        return fixed[name]
    layer, rest = name.removeprefix("model.layers.").split(".", 1)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{LAYER_NAMES[module]}.{kind}"


def add_tokenizer(writer, tokenizer_path, vocab_size):
    tokenizer = json.loads(tokenizer_path.read_text())
    vocab = tokenizer["model"]["vocab"]
    added = {t["id"]: t for t in tokenizer.get("added_tokens", [])}
    tokens, types = [], []
    by_id = {i: t for t, i in vocab.items()}
    for i in range(vocab_size):
        if i in added:
            tokens.append(added[i]["content"])
            types.append(TokenType.CONTROL if added[i].get("special") else TokenType.USER_DEFINED)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    endoftext = next((t["id"] for t in added.values() if t["content"] == "<|endoftext|>"), None)
    if endoftext is not None:
        writer.add_eos_token_id(endoftext)
        writer.add_pad_token_id(endoftext)
    writer.add_add_bos_token(False)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--type", default="Q8_0", choices=["Q8_0", "Q4_0", "Q4_1", "F16"])
    args = parser.parse_args()
    cfg = json.loads((args.checkpoint / "config.json").read_text())
    assert cfg["model_type"] == "qwen3", "Qwen3 checkpoints only"
    arch = "qwen3"
    writer = GGUFWriter(str(args.out), arch)
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    for key, value in (("context_length", cfg["max_position_embeddings"]), ("embedding_length", cfg["hidden_size"]),
                       ("block_count", cfg["num_hidden_layers"]), ("feed_forward_length", cfg["intermediate_size"]),
                       ("attention.head_count", cfg["num_attention_heads"]), ("attention.head_count_kv", cfg["num_key_value_heads"]),
                       ("attention.key_length", head_dim), ("attention.value_length", head_dim)):
        writer.add_uint32(f"{arch}.{key}", value)
    # transformers 5 writes `rope_parameters`; 4 wrote `rope_theta` at the top.
    writer.add_float32(f"{arch}.rope.freq_base", cfg.get("rope_parameters", cfg)["rope_theta"])
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    writer.add_file_type({"Q8_0": 7, "Q4_0": 2, "Q4_1": 3, "F16": 1}[args.type])
    tokenizer = args.checkpoint / "tokenizer.json"
    if tokenizer.is_file():
        add_tokenizer(writer, tokenizer, cfg["vocab_size"])
    kind = GGMLQuantizationType[args.type]
    for name, values in checkpoint_tensors(args.checkpoint):
        if values.ndim == 2:
            raw = values.astype(np.float16) if args.type == "F16" else quantize(values, kind)
            writer.add_tensor(gguf_name(name), raw, raw_dtype=None if args.type == "F16" else kind)
        else:
            writer.add_tensor(gguf_name(name), values)
        print(f"{name} -> {gguf_name(name)} {list(values.shape)}", flush=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
