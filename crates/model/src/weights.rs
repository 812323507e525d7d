//! Where weights come from: [`TensorSource`] hands the model f32 tensors by [`TensorName`];
//! [`Checkpoint`] reads safetensors (single file or sharded with an index); the `gguf` module's
//! `GgufCheckpoint` reads GGUF.

use std::collections::HashMap;
use std::path::PathBuf;

use safetensors::{tensor::Metadata, Dtype, SafeTensors};

use crate::blocks::{BlockBytes, BlockRows};
use crate::gguf::TensorType;
use crate::file_data::FileData;
use crate::tensor_names::TensorName;

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
}

/// The decoder's tensors, as row-major f32, each named as its format names it.
pub trait TensorSource {
    /// The tensor `name` after checking that its shape is `expected` (Hugging Face's).
    fn read(&self, name: TensorName, expected: &[usize]) -> Result<Vec<f32>, WeightsError>;

    /// The matrix `name` (`expected`: `[rows, cols]`) as the file stores it, rows in Hugging
    /// Face's order, for backends that multiply stored blocks ([`crate::blocks`]); `None` where
    /// it is float32. Default: none.
    fn read_blocks(&self, _name: TensorName, _expected: [usize; 2]) -> Result<Option<BlockRows>, WeightsError> {
        Ok(None)
    }
}

/// How a model holds its weight matrices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WeightForm {
    /// As the file stores them (quantised blocks, 16-bit floats) where the backend multiplies
    /// them so: a panel expanded to float at a time.
    #[default]
    Compact,
    /// Dequantised to float at load: more memory, no expansion per pass.
    Float,
}

/// A checkpoint read as float only: every matrix dequantised at load (`WeightForm::Float`; the
/// browser's kernel check: the reference it compares compact weights against).
pub struct FloatOnly(pub Box<dyn TensorSource>);

impl TensorSource for FloatOnly {
    fn read(&self, name: TensorName, expected: &[usize]) -> Result<Vec<f32>, WeightsError> {
        self.0.read(name, expected)
    }
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

    /// Safetensors files not on disk (one, or every shard), each with the name that stands for
    /// its path in errors.
    pub fn from_data(files: Vec<(String, FileData)>) -> Result<Self, WeightsError> {
        let shards = files.into_iter().map(|(name, data)| Shard::new(name.into(), data)).collect::<Result<_, _>>()?;
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

    /// The tensor `hf_name`: its shard, dtype and absolute byte range, its shape checked against
    /// `expected` (and its range against the file).
    fn tensor(&self, hf_name: &str, expected: &[usize]) -> Result<(&Shard, Dtype, std::ops::Range<usize>), WeightsError> {
        let missing = || WeightsError::MissingTensor { name: hf_name.to_owned() };
        let shard = &self.shards[*self.shard_of.get(hf_name).ok_or_else(missing)?];
        let info = shard.metadata.info(hf_name).ok_or_else(missing)?;
        if info.shape != expected {
            return Err(WeightsError::Shape { name: hf_name.to_owned(), path: shard.path.clone(), found: info.shape.clone(), expected: expected.to_vec() });
        }
        let (start, end) = info.data_offsets;
        let range = shard.data_start + start..shard.data_start + end;
        if start > end || range.end > shard.map.len() {
            return Err(WeightsError::Format { path: shard.path.clone(), message: format!("tensor `{hf_name}` lies outside the file") });
        }
        Ok((shard, info.dtype, range))
    }
}

impl TensorSource for Checkpoint {
    fn read(&self, name: TensorName, expected: &[usize]) -> Result<Vec<f32>, WeightsError> {
        let name = name.hf();
        let name = name.as_str();
        let (shard, dtype, range) = self.tensor(name, expected)?;
        let bytes = shard.map.get(range).expect("the range was checked against the file");
        let values = match dtype {
            Dtype::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
            Dtype::BF16 => bytes.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            Dtype::F16 => bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            dtype => return Err(WeightsError::Dtype { name: name.to_owned(), path: shard.path.clone(), dtype }),
        };
        Ok(values)
    }

    /// bf16 and f16 matrices as stored, two bytes a value.
    fn read_blocks(&self, name: TensorName, expected: [usize; 2]) -> Result<Option<BlockRows>, WeightsError> {
        let name = name.hf();
        let (shard, dtype, range) = self.tensor(&name, &expected)?;
        let kind = match dtype {
            Dtype::BF16 => TensorType::BF16,
            Dtype::F16 => TensorType::F16,
            _ => return Ok(None),
        };
        Ok(BlockBytes::from_file(&shard.map, range).and_then(|bytes| BlockRows::new(kind, bytes, expected[0])))
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
        let format = |message: String| WeightsError::Format { path: path.clone(), message };
        let (header_len, metadata) = match map.in_memory() {
            Some(bytes) => SafeTensors::read_metadata(bytes).map_err(|e| format(e.to_string()))?,
            None => read_metadata_in_ranges(&map).map_err(format)?,
        };
        Ok(Shard { path, map, data_start: 8 + header_len, metadata })
    }
}

/// What `SafeTensors::read_metadata` checks, reading only the header: its length, its JSON, and
/// that the tensors' data ends where the file does. Each tensor's range is checked as it is read.
fn read_metadata_in_ranges(map: &FileData) -> Result<(usize, Metadata), String> {
    let too_short = || "too short for a safetensors header".to_owned();
    let length = map.get(0..8).ok_or_else(too_short)?;
    let header_len = usize::try_from(u64::from_le_bytes(length[..].try_into().expect("8 bytes"))).map_err(|_| "header length too large".to_owned())?;
    let header = map.get(8..8usize.saturating_add(header_len)).ok_or_else(|| format!("header of {header_len} bytes runs past the end of the file"))?;
    let metadata: Metadata = serde_json::from_slice(&header).map_err(|e| format!("invalid header: {e}"))?;
    let data_len = metadata.tensors().values().map(|info| info.data_offsets.1).max().unwrap_or(0);
    if 8 + header_len + data_len != map.len() {
        return Err("incomplete metadata, file not fully covered".to_owned());
    }
    Ok((header_len, metadata))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file_data::tests::Remote;
    use safetensors::tensor::TensorView;

    fn file() -> Vec<u8> {
        let a: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let b: Vec<u8> = [0.5f32, -0.5].iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect();
        let views = [(TensorName::Embeddings.hf(), TensorView::new(Dtype::F32, vec![2, 3], &a).unwrap()), (TensorName::FinalNorm.hf(), TensorView::new(Dtype::BF16, vec![2], &b).unwrap())];
        safetensors::serialize(views, None).unwrap()
    }

    #[test]
    fn a_file_outside_memory_reads_like_one_in_it() {
        let owned = Checkpoint::from_data(vec![("in-memory".into(), FileData::Owned(file().into()))]).unwrap();
        let remote = Checkpoint::from_data(vec![("remote".into(), FileData::Ranged(Box::new(Remote(file()))))]).unwrap();
        for checkpoint in [owned, remote] {
            assert_eq!(checkpoint.read(TensorName::Embeddings, &[2, 3]).unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
            assert_eq!(checkpoint.read(TensorName::FinalNorm, &[2]).unwrap(), vec![0.5, -0.5]);
            assert!(matches!(checkpoint.read(TensorName::Embeddings, &[3, 2]), Err(WeightsError::Shape { .. })));
            assert!(matches!(checkpoint.read(TensorName::LmHead, &[2, 3]), Err(WeightsError::MissingTensor { .. })));
        }
    }

    #[test]
    fn a_truncated_or_padded_file_outside_memory_is_refused() {
        let good = file();
        for len in 0..good.len() {
            let cut = FileData::Ranged(Box::new(Remote(good[..len].to_vec())));
            assert!(Checkpoint::from_data(vec![("cut".into(), cut)]).is_err(), "truncated to {len} bytes");
        }
        let padded = FileData::Ranged(Box::new(Remote([good, vec![0; 4]].concat())));
        assert!(Checkpoint::from_data(vec![("padded".into(), padded)]).is_err());
    }
}
