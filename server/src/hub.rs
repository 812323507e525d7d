//! Resolves `--model`: a local directory or GGUF file as is, or a Hugging Face repo id fetched
//! into the standard HF cache (`HF_HOME`, `~/.cache/huggingface`) and reused from there offline.
//! Returns the path and the name responses carry (the directory's name, the GGUF file's stem, or
//! the repo id).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use hf_hub::api::sync::ApiBuilder;
use hf_hub::Cache;
use tally_model::ModelFiles;

const INDEX: &str = "model.safetensors.index.json";

pub fn resolve_model(model: &str) -> Result<(PathBuf, String)> {
    let local = Path::new(model);
    if local.exists() {
        let files = ModelFiles::locate(local).with_context(|| format!("--model {model}"))?;
        return Ok((local.to_owned(), files.name()));
    }
    if model.split('/').count() != 2 || model.starts_with(['.', '/']) {
        bail!("--model {model}: no such directory or file, and not a Hugging Face repo id (owner/name)");
    }
    let cached = Cache::from_env().model(model.to_owned());
    let api = ApiBuilder::from_env().with_progress(true).build().context("cannot set up the Hugging Face client")?;
    let repo = api.model(model.to_owned());
    // Files already in the cache are used without touching the network.
    let fetch = |file: &str| -> Result<PathBuf> {
        match cached.get(file) {
            Some(path) => Ok(path),
            None => repo.get(file).with_context(|| format!("cannot download {file} from Hugging Face repo {model}")),
        }
    };
    let config = fetch("config.json")?;
    fetch("tokenizer.json")?;
    match fetch("model.safetensors") {
        Ok(_) => {}
        Err(single_error) => {
            let index = fetch(INDEX).map_err(|_| single_error)?;
            let text = std::fs::read_to_string(&index).with_context(|| format!("cannot read {}", index.display()))?;
            let json: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", index.display()))?;
            let mut shards: Vec<&str> = json["weight_map"].as_object().map(|m| m.values().filter_map(|v| v.as_str()).collect()).unwrap_or_default();
            shards.sort_unstable();
            shards.dedup();
            for shard in shards {
                fetch(shard)?;
            }
        }
    }
    Ok((config.parent().expect("a cached file has a parent directory").to_owned(), model.to_owned()))
}
