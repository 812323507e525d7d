//! Finds a model on disk — a Hugging Face directory or a GGUF file — and says where its
//! architecture, weights and tokenizer come from.

use std::path::{Path, PathBuf};

use crate::config::{ConfigError, ModelConfig};
use crate::file_data::FileData;
use crate::gguf::checkpoint::GgufVocabulary;
use crate::gguf::{GgufCheckpoint, GgufError, GgufFile};
use crate::weights::{Checkpoint, TensorSource, WeightsError};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {source}")]
    Config { path: PathBuf, source: ConfigError },
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{0}: not a model: expected a directory with config.json, a .gguf file, or a directory holding one .gguf")]
    NotAModel(PathBuf),
    #[error("{dir} holds several .gguf files ({files}); pass the one to load")]
    SeveralGguf { dir: PathBuf, files: String },
}

/// A model's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelFiles {
    /// `config.json`, safetensors weights, optionally `tokenizer.json`.
    HuggingFace(PathBuf),
    /// One GGUF file: architecture, weights and tokenizer.
    Gguf(PathBuf),
}

/// A model's files opened: its architecture, its weights (read on demand) and its tokenizer.
pub struct OpenedModel {
    pub config: ModelConfig,
    pub weights: Box<dyn TensorSource>,
    pub tokenizer: TokenizerSource,
}

/// Where the text tokenizer comes from.
pub enum TokenizerSource {
    Json(PathBuf),
    /// A `tokenizer.json` document already in memory.
    JsonText(String),
    Gguf(Box<GgufVocabulary>),
    /// Token-id requests only.
    None,
}

impl OpenedModel {
    /// A Hugging Face model not on disk: `config.json`, its safetensors files (`model.safetensors`,
    /// or every shard, each with its file name) and, if it has one, `tokenizer.json` (the
    /// browser build fetches them).
    pub fn from_hf_data(config_json: &str, safetensors: Vec<(String, FileData)>, tokenizer_json: Option<String>) -> Result<Self, LoadError> {
        let config = ModelConfig::from_json(config_json).map_err(|source| LoadError::Config { path: "config.json".into(), source })?;
        let weights = Box::new(Checkpoint::from_data(safetensors)?);
        Ok(OpenedModel { config, weights, tokenizer: tokenizer_json.map_or(TokenizerSource::None, TokenizerSource::JsonText) })
    }

    /// A GGUF file not on disk; `name` stands for its path in errors.
    pub fn from_gguf_data(name: &str, data: FileData) -> Result<Self, LoadError> {
        Self::from_gguf(GgufCheckpoint::new(GgufFile::from_data(name.into(), data)?)?)
    }

    fn from_gguf(checkpoint: GgufCheckpoint) -> Result<Self, LoadError> {
        let vocabulary = checkpoint.vocabulary()?;
        let tokenizer = vocabulary.map_or(TokenizerSource::None, |v| TokenizerSource::Gguf(Box::new(v)));
        Ok(OpenedModel { config: checkpoint.config().clone(), weights: Box::new(checkpoint), tokenizer })
    }
}

impl ModelFiles {
    /// `path`: a Hugging Face directory, a `.gguf` file, or a directory holding exactly one.
    pub fn locate(path: &Path) -> Result<Self, LoadError> {
        let io = |source| LoadError::Io { path: path.to_owned(), source };
        let metadata = std::fs::metadata(path).map_err(io)?;
        if metadata.is_file() {
            let is_gguf = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
            return if is_gguf { Ok(ModelFiles::Gguf(path.to_owned())) } else { Err(LoadError::NotAModel(path.to_owned())) };
        }
        if path.join("config.json").is_file() {
            return Ok(ModelFiles::HuggingFace(path.to_owned()));
        }
        let mut ggufs: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(io)?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")))
            .collect();
        ggufs.sort();
        match ggufs.len() {
            0 => Err(LoadError::NotAModel(path.to_owned())),
            1 => Ok(ModelFiles::Gguf(ggufs.remove(0))),
            _ => Err(LoadError::SeveralGguf {
                dir: path.to_owned(),
                files: ggufs.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy()).collect::<Vec<_>>().join(", "),
            }),
        }
    }

    /// The name responses carry: the directory's name, or the GGUF file's stem.
    pub fn name(&self) -> String {
        let named = |path: &Path, stem: bool| {
            let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
            let name = if stem { path.file_stem() } else { path.file_name() };
            name.map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
        };
        match self {
            ModelFiles::HuggingFace(dir) => named(dir, false),
            ModelFiles::Gguf(file) => named(file, true),
        }
    }

    /// Reads the architecture and the tokenizer's source, and maps the weights.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(&self) -> Result<OpenedModel, LoadError> {
        match self {
            ModelFiles::HuggingFace(dir) => {
                let path = dir.join("config.json");
                let json = std::fs::read_to_string(&path).map_err(|source| LoadError::Io { path: path.clone(), source })?;
                let config = ModelConfig::from_json(&json).map_err(|source| LoadError::Config { path, source })?;
                let tokenizer_path = dir.join("tokenizer.json");
                let tokenizer = if tokenizer_path.is_file() { TokenizerSource::Json(tokenizer_path) } else { TokenizerSource::None };
                Ok(OpenedModel { config, weights: Box::new(Checkpoint::open(dir)?), tokenizer })
            }
            ModelFiles::Gguf(file) => OpenedModel::from_gguf(GgufCheckpoint::open(file)?),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locates_directories_and_gguf_files() {
        let root = std::env::temp_dir().join(format!("tally-locate-{}", std::process::id()));
        let (hf, one, two) = (root.join("hf"), root.join("one"), root.join("two"));
        for dir in [&hf, &one, &two] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(hf.join("config.json"), "{}").unwrap();
        std::fs::write(one.join("m.Q4_1.gguf"), "").unwrap();
        std::fs::write(two.join("a.gguf"), "").unwrap();
        std::fs::write(two.join("b.gguf"), "").unwrap();

        assert_eq!(ModelFiles::locate(&hf).unwrap(), ModelFiles::HuggingFace(hf.clone()));
        assert_eq!(ModelFiles::locate(&one).unwrap(), ModelFiles::Gguf(one.join("m.Q4_1.gguf")));
        assert_eq!(ModelFiles::locate(&one.join("m.Q4_1.gguf")).unwrap().name(), "m.Q4_1");
        assert!(ModelFiles::locate(&two).unwrap_err().to_string().contains("a.gguf, b.gguf"));
        assert!(matches!(ModelFiles::locate(&hf.join("config.json")), Err(LoadError::NotAModel(_))));
        assert!(matches!(ModelFiles::locate(&root.join("absent")), Err(LoadError::Io { .. })));
        std::fs::remove_dir_all(root).unwrap();
    }
}
