//! Where weights come from: [`TensorSource`] hands the model f32 tensors under Hugging Face names;
//! [`Checkpoint`] reads safetensors (single file or sharded with an index), and
//! [`GgufCheckpoint`](crate::gguf::GgufCheckpoint) reads GGUF.

use std::collections::HashMap;
use std::path::PathBuf;

use safetensors::{tensor::Metadata, Dtype, SafeTensors};

use crate::file_data::FileData;

#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: not a valid safetensors file: {message}")]
    Format { path: PathBuf, message: String },
    #[error("{path}: not a valid shard index: {message}")]
    Index { path: PathBuf, message: String },
    #[error("no model.safetensors or model.safetensors.index.json in {0}")]
    NoWeights(PathBuf),
    #[error("tensor `{name}` is missing from the checkpoint")]
    MissingTensor { name: String },
    #[error("tensor `{name}` in {path} has shape {found:?}, expected {expected:?}")]
    Shape { name: String, path: PathBuf, found: Vec<usize>, expected: Vec<usize> },
    #[error("tensor `{name}` in {path} has dtype {dtype:?}; only F32, BF16 and F16 are supported")]
    Dtype { name: String, path: PathBuf, dtype: Dtype },
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    #[error("{path}: GGUF architecture `{arch}` is not supported; tally runs: {supported}", supported = crate::gguf::checkpoint::ARCHITECTURES)]
    Architecture { path: PathBuf, arch: String },
}

/// Tensors by their Hugging Face names, as row-major f32.
pub trait TensorSource {
    /// The tensor `name` after checking that its shape is `expected`.
    fn read(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>, WeightsError>;
}

struct Shard {
    /// The file's path, or the name it goes by in memory.
    path: PathBuf,
    map: FileData,
    data_start: usize,
    metadata: Metadata,
}

/// Every tensor of a checkpoint, memory-mapped (or in memory); a tensor is converted to f32 when it is read.
pub struct Checkpoint {
    shards: Vec<Shard>,
    shard_of: HashMap<String, usize>,
}

impl Checkpoint {
    /// Opens `model.safetensors`, or the shards listed in `model.safetensors.index.json`.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(dir: &std::path::Path) -> Result<Self, WeightsError> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let files = if single.is_file() {
            vec![single]
        } else if index.is_file() {
            shard_files(&index)?
        } else {
            return Err(WeightsError::NoWeights(dir.to_owned()));
        };
        let shards = files
            .into_iter()
            .map(|path| {
                let map = FileData::map(&path).map_err(|source| WeightsError::Io { path: path.clone(), source })?;
                Shard::new(path, map)
            })
            .collect::<Result<_, _>>()?;
        Ok(Self::from_shards(shards))
    }

    /// Safetensors files already in memory (one, or every shard), each with the name that
    /// stands for its path in errors.
    pub fn from_bytes(files: Vec<(String, Vec<u8>)>) -> Result<Self, WeightsError> {
        let shards = files.into_iter().map(|(name, bytes)| Shard::new(name.into(), FileData::Owned(bytes))).collect::<Result<_, _>>()?;
        Ok(Self::from_shards(shards))
    }

    fn from_shards(shards: Vec<Shard>) -> Self {
        let mut shard_of = HashMap::new();
        for (index, shard) in shards.iter().enumerate() {
            for name in shard.metadata.tensors().into_keys() {
                shard_of.insert(name, index);
            }
        }
        Checkpoint { shards, shard_of }
    }

}

impl TensorSource for Checkpoint {
    fn read(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>, WeightsError> {
        let missing = || WeightsError::MissingTensor { name: name.to_owned() };
        let shard = &self.shards[*self.shard_of.get(name).ok_or_else(missing)?];
        let info = shard.metadata.info(name).ok_or_else(missing)?;
        if info.shape != expected {
            return Err(WeightsError::Shape {
                name: name.to_owned(),
                path: shard.path.clone(),
                found: info.shape.clone(),
                expected: expected.to_vec(),
            });
        }
        let (start, end) = info.data_offsets;
        let bytes = shard.map.get(shard.data_start + start..shard.data_start + end).ok_or_else(|| WeightsError::Format {
            path: shard.path.clone(),
            message: format!("tensor `{name}` lies outside the file"),
        })?;
        let values = match info.dtype {
            Dtype::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
            Dtype::BF16 => bytes.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            Dtype::F16 => bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            dtype => return Err(WeightsError::Dtype { name: name.to_owned(), path: shard.path.clone(), dtype }),
        };
        Ok(values)
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn shard_files(index: &std::path::Path) -> Result<Vec<PathBuf>, WeightsError> {
    let bad = |message: String| WeightsError::Index { path: index.to_owned(), message };
    let text = std::fs::read_to_string(index).map_err(|source| WeightsError::Io { path: index.to_owned(), source })?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let weight_map = json.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| bad("no `weight_map` object".into()))?;
    let mut files: Vec<&str> = weight_map.values().map(|file| file.as_str().ok_or_else(|| bad(format!("{file} is not a file name")))).collect::<Result<_, _>>()?;
    files.sort_unstable();
    files.dedup();
    let dir = index.parent().unwrap_or(std::path::Path::new("."));
    Ok(files.into_iter().map(|file| dir.join(file)).collect())
}

impl Shard {
    fn new(path: PathBuf, map: FileData) -> Result<Self, WeightsError> {
        let (header_len, metadata) =
            SafeTensors::read_metadata(&map).map_err(|e| WeightsError::Format { path: path.clone(), message: e.to_string() })?;
        Ok(Shard { path, map, data_start: 8 + header_len, metadata })
    }
}
