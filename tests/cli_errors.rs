//! Every bad input to `tally score` (and a tile candidate that does not exist) gets a one-line
//! message on stderr and a non-zero exit, never a panic. Broken model directories name the file
//! or tensor at fault.

mod common;

use std::path::Path;

use common::{model, tally};
use serde_json::json;

/// Runs `tally score` on `model_dir` with `request` on stdin; asserts failure, no panic, and
/// that stderr mentions `needle`.
fn assert_rejected(model_dir: &Path, request: &str, needle: &str) {
    let out = tally(&["score", "--model", model_dir.to_str().unwrap(), "--request", "-"], request);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted {request}");
    assert!(!stderr.contains("panicked"), "panicked on {request}: {stderr}");
    assert!(stderr.contains(needle), "for {request}: expected {needle:?} in {stderr:?}");
    assert!(out.stdout.is_empty(), "printed a response for {request}");
}

#[test]
fn invalid_requests_are_rejected_with_a_message() {
    let tied = model("tied-gqa"); // vocab 512, 4096 positions
    let long_query: Vec<u32> = vec![1; 4095];
    let cases = [
        (json!({"query": [1], "items": [], "label_token_ids": [1]}).to_string(), "at least one item"),
        (json!({"query": [1], "items": [[2], []], "label_token_ids": [1]}).to_string(), "item 1 is empty"),
        (json!({"query": [], "items": [[2]], "label_token_ids": [1]}).to_string(), "`query` is empty"),
        (json!({"query": "text", "items": [[2]], "label_token_ids": [1]}).to_string(), "both be text or both be token ids"),
        (json!({"query": [1], "items": ["text"], "label_token_ids": [1]}).to_string(), "both be text or both be token ids"),
        (json!({"query": [1], "items": [[2]], "label_token_ids": []}).to_string(), "at least one token id"),
        (json!({"query": [1], "items": [[2]], "label_token_ids": [-1]}).to_string(), "token id -1 in `label_token_ids`"),
        (json!({"query": [1], "items": [[2]], "label_token_ids": [512]}).to_string(), "token id 512 in `label_token_ids`"),
        (json!({"query": [512], "items": [[2]], "label_token_ids": [1]}).to_string(), "token id 512 in `query`"),
        (json!({"query": [1], "items": [[2], [-7]], "label_token_ids": [1]}).to_string(), "token id -7 in `items[1]`"),
        (json!({"query": long_query, "items": [[2], [2, 3]], "label_token_ids": [1]}).to_string(), "item 1: query + item is 4097 tokens"),
        (json!({"query": [1], "items": [[2.5]], "label_token_ids": [1]}).to_string(), "invalid request"),
        (json!({"query": [1], "items": [[2]]}).to_string(), "label_token_ids"),
        ("{not json".to_owned(), "invalid request"),
    ];
    for (request, needle) in cases {
        assert_rejected(&tied, &request, needle);
    }
    // Text needs a tokenizer; this model ships none.
    assert_rejected(&tied, &json!({"query": "q", "items": ["a"], "label_token_ids": [1]}).to_string(), "no tokenizer.json");
    // An empty text item tokenizes to nothing.
    let wide = model("wide-vocab");
    assert_rejected(&wide, &json!({"query": "q", "items": ["a", ""], "label_token_ids": [1]}).to_string(), "item 1 is empty");
}

#[test]
fn unsupported_backend_and_dtype_pairs_are_refused() {
    let tied = model("tied-gqa");
    let request = json!({"query": [1], "items": [[2]], "label_token_ids": [1]}).to_string();
    let out = tally(&["score", "--model", tied.to_str().unwrap(), "--request", "-", "--dtype", "bfloat16"], &request);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dtype bfloat16 needs --backend cuda"));
    let out = tally(&["score", "--model", tied.to_str().unwrap(), "--request", "-", "--matmul", "cublas"], &request);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--matmul cublas needs --backend cuda"));
    let out = tally(&["score", "--model", tied.to_str().unwrap(), "--request", "-", "--cublas-ordering", "sync"], &request);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--cublas-ordering applies to --matmul cublas only"));
    let out = tally(&["score", "--model", tied.to_str().unwrap(), "--request", "-", "--cublas-algos", "8"], &request);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--cublas-algos applies to --matmul cublas only"));
    for out_of_range in ["0", "17"] {
        let out = tally(&["score", "--model", tied.to_str().unwrap(), "--request", "-", "--matmul", "cublas", "--cublas-algos", out_of_range], &request);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("--cublas-algos"), "{}", String::from_utf8_lossy(&out.stderr));
    }
    // Bare or `true` asks for it (CUDA's default); `false` is what every other backend does.
    for asked in [&["--flush-denormals"][..], &["--flush-denormals", "true"]] {
        let out = tally(&[&["score", "--model", tied.to_str().unwrap(), "--request", "-"], asked].concat(), &request);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("--flush-denormals is an NVRTC option: it needs --backend cuda"));
    }
}

/// `--tile-candidates` names the tiles a tuning times: a name no backend has is refused as the
/// flags are read, one the backend does not try where its candidates are listed.
#[test]
fn tile_candidates_that_do_not_exist_are_named() {
    let out = tally(&["bench", "tile-candidates", "--backend", "cuda", "--tile-candidates", "filled,wide"], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && !stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("`wide` is not a tile candidate (they are: default, filled, split-barriers, ahead, warps12, ahead12, square)"), "{stderr}");
    let out = tally(&["bench", "tile-candidates", "--backend", "cuda", "--tile-candidates", "square"], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && !stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("`square` is not one of cuda's tile candidates (default, filled, split-barriers, ahead, warps12, ahead12)"), "{stderr}");
    assert!(out.stdout.is_empty(), "listed candidates after all: {}", String::from_utf8_lossy(&out.stdout));
    let out = tally(&["bench", "tile-candidates", "--backend", "wgpu", "--tile-candidates", "square"], "");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "square --tile-rows 32 --tile-keys 32\n");
}

#[test]
fn table_mode_rejects_labels_that_are_not_one_token() {
    let wide = model("wide-vocab");
    let out = tally(&["score", "--model", wide.to_str().unwrap(), "--query", "q", "--item", "a", "--label", "Yes please"], "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("must be exactly one token"), "{stderr}");
}

/// Copies a fixture model into a temporary directory so a test can break it.
fn broken_copy(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(model(name)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    dir
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(path, config.to_string()).unwrap();
}

#[test]
fn broken_model_directories_name_the_file_or_tensor() {
    let request = json!({"query": [1], "items": [[2]], "label_token_ids": [1]}).to_string();

    assert_rejected(Path::new("/nonexistent/model"), &request, "/nonexistent/model");

    let no_weights = broken_copy("tied-gqa");
    std::fs::remove_file(no_weights.path().join("model.safetensors")).unwrap();
    assert_rejected(no_weights.path(), &request, "no model.safetensors or model.safetensors.index.json");

    let extra_layer = broken_copy("tied-gqa");
    edit_config(extra_layer.path(), |c| c["num_hidden_layers"] = json!(3));
    assert_rejected(extra_layer.path(), &request, "tensor `model.layers.2.input_layernorm.weight` is missing");

    let wrong_width = broken_copy("tied-gqa");
    edit_config(wrong_width.path(), |c| c["hidden_size"] = json!(32));
    assert_rejected(wrong_width.path(), &request, "has shape [64], expected [32]");

    let untied = broken_copy("tied-gqa");
    edit_config(untied.path(), |c| c["tie_word_embeddings"] = json!(false));
    assert_rejected(untied.path(), &request, "tensor `lm_head.weight` is missing");

    let bad_heads = broken_copy("tied-gqa");
    edit_config(bad_heads.path(), |c| c["num_key_value_heads"] = json!(3));
    assert_rejected(bad_heads.path(), &request, "must be a multiple of num_key_value_heads");

    let missing_shard = broken_copy("untied-wide-heads");
    std::fs::remove_file(missing_shard.path().join("model-00002-of-00002.safetensors")).unwrap();
    assert_rejected(missing_shard.path(), &request, "model-00002-of-00002.safetensors");

    let truncated = broken_copy("tied-gqa");
    let weights = truncated.path().join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    assert_rejected(truncated.path(), &request, "model.safetensors");

    let bad_tokenizer = broken_copy("wide-vocab");
    std::fs::write(bad_tokenizer.path().join("tokenizer.json"), "{}").unwrap();
    assert_rejected(bad_tokenizer.path(), &request, "tokenizer.json");
}

/// Edits the bytes of a GGUF fixture copy: `at(needle)` is the offset just past `needle`.
fn broken_gguf(edit: impl FnOnce(&mut Vec<u8>, &dyn Fn(&[u8]) -> usize)) -> tempfile::TempDir {
    let dir = broken_copy("llama-gguf");
    let path = dir.path().join("llama-gguf.gguf");
    let mut bytes = std::fs::read(&path).unwrap();
    let original = bytes.clone();
    let at = move |needle: &[u8]| original.windows(needle.len()).position(|w| w == needle).expect("needle in the file") + needle.len();
    edit(&mut bytes, &at);
    std::fs::write(&path, bytes).unwrap();
    dir
}

#[test]
fn broken_gguf_files_get_clear_errors() {
    let request = json!({"query": [1], "items": [[2]], "label_token_ids": [1]}).to_string();

    let truncated = broken_gguf(|bytes, _| bytes.truncate(bytes.len() / 2));
    assert_rejected(truncated.path(), &request, "lies outside the file");

    let header_cut = broken_gguf(|bytes, at| bytes.truncate(at(b"llama.block_count")));
    assert_rejected(header_cut.path(), &request, "truncated or corrupt");

    let magic = broken_gguf(|bytes, _| bytes[..4].copy_from_slice(b"GGML"));
    assert_rejected(magic.path(), &request, "not a GGUF file");

    // A tensor's type id (after its name, dimension count and two dimensions) set to Q2_K.
    let q2_k = broken_gguf(|bytes, at| {
        let type_at = at(b"blk.0.attn_q.weight") + 4 + 2 * 8;
        bytes[type_at..type_at + 4].copy_from_slice(&10u32.to_le_bytes());
    });
    assert_rejected(q2_k.path(), &request, "`blk.0.attn_q.weight` has type Q2_K");

    let missing = broken_gguf(|bytes, at| bytes[at(b"blk.1.ffn_dow") - 1] = b'X');
    assert_rejected(missing.path(), &request, "blk.1.ffn_down.weight");

    // The metadata's feed-forward width no longer matches the tensors.
    let shape = broken_gguf(|bytes, at| {
        let value_at = at(b"llama.feed_forward_length") + 4;
        bytes[value_at..value_at + 4].copy_from_slice(&100u32.to_le_bytes());
    });
    assert_rejected(shape.path(), &request, "expected [100, 64]");

    let arch = broken_gguf(|bytes, at| {
        let value_at = at(b"general.architecture") + 4 + 8;
        bytes[value_at..value_at + 5].copy_from_slice(b"mamba");
    });
    assert_rejected(arch.path(), &request, "architecture `mamba` is not supported; tally runs: qwen3, llama, qwen2");

    let heads = broken_gguf(|bytes, at| {
        let value_at = at(b"llama.attention.head_count") + 4;
        bytes[value_at..value_at + 4].copy_from_slice(&3u32.to_le_bytes());
    });
    assert_rejected(heads.path(), &request, "must be a multiple of num_key_value_heads");

    let metadata_type = broken_gguf(|bytes, at| {
        let type_at = at(b"llama.context_length");
        bytes[type_at..type_at + 4].copy_from_slice(&6u32.to_le_bytes());
    });
    assert_rejected(metadata_type.path(), &request, "llama.context_length");
}
