//! GGUF files (llama.cpp's format, versions 2 and 3): header, metadata and tensor directory read
//! over a memory map (or bytes in memory), every offset and count checked against the file, so a truncated or
//! corrupt file is an error that says where, never a panic. Tensors are dequantised to f32 when
//! read ([`quant`]); [`checkpoint`] maps a file onto tally's model.
//!
//! A hand-written reader rather than a crate: the format is small, and the crates that read it
//! bring a tensor library along or lag behind the block types.

pub mod checkpoint;
pub mod quant;
pub mod tokenizer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::blocks::BlockBytes;
use crate::file_data::FileData;

pub use checkpoint::GgufCheckpoint;
pub use quant::TensorType;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: not a GGUF file (magic {magic:?}, expected \"GGUF\")")]
    Magic { path: PathBuf, magic: [u8; 4] },
    #[error("{path}: GGUF version {version} is not supported (2 and 3 are)")]
    Version { path: PathBuf, version: u32 },
    #[error("{path}: truncated or corrupt at byte {offset}: {what}")]
    Corrupt { path: PathBuf, offset: usize, what: String },
    #[error("{path}: tensor `{name}` has type {kind}, which tally cannot dequantise (supported: {supported})", supported = TensorType::SUPPORTED)]
    UnsupportedType { path: PathBuf, name: String, kind: String },
    #[error("{path}: metadata `{key}` is {problem}")]
    Metadata { path: PathBuf, key: String, problem: String },
    #[error("{path}: tensor `{name}` is missing")]
    MissingTensor { path: PathBuf, name: String },
    #[error("{path}: GGUF architecture `{arch}` is not supported; tally runs: {supported}", supported = crate::config::Family::names())]
    Architecture { path: PathBuf, arch: String },
    /// Parsing a file not in memory reads its header in growing prefixes; this asks for more.
    #[error("{path}: the header continues past its first {read} bytes")]
    HeaderBeyond { path: PathBuf, read: usize },
}

/// A metadata value. Arrays of numbers keep their element type.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Uint(u64),
    Int(i64),
    Float(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

/// One entry of the tensor directory.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// `ne[0]` first: the fastest-varying dimension (a Linear's input) comes first.
    pub dims: Vec<usize>,
    pub kind: TensorType,
    /// Absolute byte range in the file.
    pub start: usize,
    pub len: usize,
}

impl TensorInfo {
    pub fn elements(&self) -> usize {
        self.dims.iter().product()
    }

    /// Row-major shape, slowest dimension first: a Linear's `[out, in]`, as in HF checkpoints.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }
}

/// A GGUF file, memory-mapped or in memory, with its metadata and tensor directory parsed.
pub struct GgufFile {
    /// The file's path, or the name it goes by in memory: for error messages.
    path: PathBuf,
    map: FileData,
    metadata: HashMap<String, Value>,
    tensors: HashMap<String, TensorInfo>,
}

impl GgufFile {
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let map = FileData::map(path).map_err(|source| GgufError::Io { path: path.to_owned(), source })?;
        Self::from_data(path.to_owned(), map)
    }

    /// A GGUF file not on disk; `path` names it in errors. Where its bytes are not in memory,
    /// only the header is copied in (in growing prefixes), then one tensor at a time.
    pub fn from_data(path: PathBuf, map: FileData) -> Result<Self, GgufError> {
        Self::from_data_reading(path, map, HEADER_PREFIX)
    }

    fn from_data_reading(path: PathBuf, map: FileData, first_read: usize) -> Result<Self, GgufError> {
        let mut read = if map.in_memory().is_some() { map.len() } else { map.len().min(first_read) };
        let (metadata, tensors) = loop {
            let prefix = map.get(0..read).expect("a prefix of the file");
            match parse(&path, &prefix, map.len()) {
                Err(GgufError::HeaderBeyond { .. }) if read < map.len() => read = read.saturating_mul(4).min(map.len()),
                parsed => break parsed?,
            }
        };
        Ok(GgufFile { path, map, metadata, tensors })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn metadata(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    /// The tensor's bytes as they are stored: a view of the file where it is in memory
    /// (natively mapped), a copy where it is read a range at a time (the browser).
    pub fn stored_bytes(&self, info: &TensorInfo) -> Option<BlockBytes> {
        BlockBytes::from_file(&self.map, info.start..info.start + info.len)
    }

    /// The tensor's elements as f32, dequantised, in storage order.
    pub fn read_f32(&self, info: &TensorInfo) -> Vec<f32> {
        let bytes = self.map.get(info.start..info.start + info.len).expect("tensor ranges are checked against the file at parse");
        info.kind.dequantize(&bytes, info.elements()).expect("the parser refuses tensor types it cannot dequantise")
    }

    fn metadata_error(&self, key: &str, problem: impl Into<String>) -> GgufError {
        GgufError::Metadata { path: self.path.clone(), key: key.to_owned(), problem: problem.into() }
    }

    /// A required unsigned integer (any integer type).
    pub fn usize(&self, key: &str) -> Result<usize, GgufError> {
        match self.metadata.get(key) {
            Some(Value::Uint(v)) => usize::try_from(*v).map_err(|_| self.metadata_error(key, "too large")),
            Some(Value::Int(v)) => usize::try_from(*v).map_err(|_| self.metadata_error(key, format!("negative ({v})"))),
            Some(other) => Err(self.metadata_error(key, format!("not an integer: {other:?}"))),
            None => Err(self.metadata_error(key, "missing")),
        }
    }

    pub fn optional_usize(&self, key: &str) -> Result<Option<usize>, GgufError> {
        self.metadata.contains_key(key).then(|| self.usize(key)).transpose()
    }

    pub fn optional_f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        match self.metadata.get(key) {
            Some(Value::Float(v)) => Ok(Some(*v)),
            Some(Value::Uint(v)) => Ok(Some(*v as f64)),
            Some(Value::Int(v)) => Ok(Some(*v as f64)),
            Some(other) => Err(self.metadata_error(key, format!("not a number: {other:?}"))),
            None => Ok(None),
        }
    }

    pub fn optional_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.metadata.get(key) {
            Some(Value::Bool(v)) => Ok(Some(*v)),
            Some(other) => Err(self.metadata_error(key, format!("not a bool: {other:?}"))),
            None => Ok(None),
        }
    }

    pub fn string(&self, key: &str) -> Result<&str, GgufError> {
        match self.metadata.get(key) {
            Some(Value::String(v)) => Ok(v),
            Some(other) => Err(self.metadata_error(key, format!("not a string: {other:?}"))),
            None => Err(self.metadata_error(key, "missing")),
        }
    }

    /// A required array of strings.
    pub fn strings(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        match self.metadata.get(key) {
            Some(Value::Array(values)) => values
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.as_str()),
                    other => Err(self.metadata_error(key, format!("holds a non-string: {other:?}"))),
                })
                .collect(),
            Some(other) => Err(self.metadata_error(key, format!("not an array: {other:?}"))),
            None => Err(self.metadata_error(key, "missing")),
        }
    }

    /// An optional array of integers.
    pub fn optional_ints(&self, key: &str) -> Result<Option<Vec<i64>>, GgufError> {
        match self.metadata.get(key) {
            Some(Value::Array(values)) => values
                .iter()
                .map(|v| match v {
                    Value::Int(i) => Ok(*i),
                    Value::Uint(u) => i64::try_from(*u).map_err(|_| self.metadata_error(key, "holds a huge integer")),
                    other => Err(self.metadata_error(key, format!("holds a non-integer: {other:?}"))),
                })
                .collect::<Result<_, _>>()
                .map(Some),
            Some(other) => Err(self.metadata_error(key, format!("not an array: {other:?}"))),
            None => Ok(None),
        }
    }
}

/// Bytes of a GGUF header read at first from a file not in memory: SmolLM2's is 2 MB, Qwen3's
/// (151,936 tokens and their merges) about 7.
const HEADER_PREFIX: usize = 8 << 20;

/// A bounds-checked cursor over the first bytes of a file of `file_len` bytes.
struct Reader<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    file_len: usize,
    at: usize,
}

impl<'a> Reader<'a> {
    fn corrupt(&self, what: impl Into<String>) -> GgufError {
        GgufError::Corrupt { path: self.path.to_owned(), offset: self.at, what: what.into() }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.file_len).ok_or_else(|| self.corrupt(format!("{what} runs past the end of the file")))?;
        if end > self.bytes.len() {
            return Err(GgufError::HeaderBeyond { path: self.path.to_owned(), read: self.bytes.len() });
        }
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        Ok(self.take(N, what)?.try_into().expect("take returns N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of things that each take at least `min_size` bytes: it must fit in what is left.
    fn count(&mut self, min_size: usize, what: &str) -> Result<usize, GgufError> {
        let count = self.u64(what)?;
        let left = (self.file_len - self.at) as u64;
        if count.saturating_mul(min_size.max(1) as u64) > left {
            return Err(self.corrupt(format!("{what} ({count}) does not fit in the file")));
        }
        Ok(count as usize)
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.count(1, what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.corrupt(format!("{what} is not UTF-8")))
    }

    fn value(&mut self, kind: u32, key: &str, depth: usize) -> Result<Value, GgufError> {
        Ok(match kind {
            0 => Value::Uint(u64::from(self.array::<1>(key)?[0])),
            1 => Value::Int(i64::from(i8::from_le_bytes(self.array(key)?))),
            2 => Value::Uint(u64::from(u16::from_le_bytes(self.array(key)?))),
            3 => Value::Int(i64::from(i16::from_le_bytes(self.array(key)?))),
            4 => Value::Uint(u64::from(self.u32(key)?)),
            5 => Value::Int(i64::from(i32::from_le_bytes(self.array(key)?))),
            6 => Value::Float(f64::from(f32::from_le_bytes(self.array(key)?))),
            7 => match self.array::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.corrupt(format!("`{key}` is a bool of value {b}"))),
            },
            8 => Value::String(self.string(key)?),
            9 if depth == 0 => {
                let element = self.u32(key)?;
                let count = self.count(1, key)?;
                Value::Array((0..count).map(|_| self.value(element, key, depth + 1)).collect::<Result<_, _>>()?)
            }
            10 => Value::Uint(self.u64(key)?),
            11 => Value::Int(i64::from_le_bytes(self.array(key)?)),
            12 => Value::Float(f64::from_le_bytes(self.array(key)?)),
            other => return Err(self.corrupt(format!("`{key}` has unknown value type {other}"))),
        })
    }
}

type Parsed = (HashMap<String, Value>, HashMap<String, TensorInfo>);

/// The metadata and tensor directory, from `bytes`: the first bytes of a file of `file_len`.
fn parse(path: &Path, bytes: &[u8], file_len: usize) -> Result<Parsed, GgufError> {
    let mut r = Reader { path, bytes, file_len, at: 0 };
    let magic = r.array::<4>("magic")?;
    if &magic != b"GGUF" {
        return Err(GgufError::Magic { path: path.to_owned(), magic });
    }
    let version = r.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::Version { path: path.to_owned(), version });
    }
    let tensor_count = r.count(24, "tensor count")?;
    let kv_count = r.count(12, "metadata count")?;
    let mut metadata = HashMap::with_capacity(kv_count);
    for _ in 0..kv_count {
        let key = r.string("metadata key")?;
        let kind = r.u32(&key)?;
        let value = r.value(kind, &key, 0)?;
        metadata.insert(key, value);
    }

    let mut directory = Vec::with_capacity(tensor_count);
    for _ in 0..tensor_count {
        let name = r.string("tensor name")?;
        let n_dims = r.u32(&name)? as usize;
        if !(1..=4).contains(&n_dims) {
            return Err(r.corrupt(format!("tensor `{name}` has {n_dims} dimensions")));
        }
        let dims = (0..n_dims).map(|_| r.u64(&name).map(|d| d as usize)).collect::<Result<Vec<_>, _>>()?;
        let kind = r.u32(&name)?;
        let offset = r.u64(&name)? as usize;
        directory.push((name, dims, kind, offset));
    }
    let alignment = match metadata.get("general.alignment") {
        None => 32,
        Some(Value::Uint(a)) if *a > 0 && a.is_power_of_two() => *a as usize,
        Some(other) => return Err(GgufError::Metadata { path: path.to_owned(), key: "general.alignment".into(), problem: format!("{other:?}, not a power of two") }),
    };
    let data_start = r.at.div_ceil(alignment) * alignment;

    let mut tensors = HashMap::with_capacity(tensor_count);
    for (name, dims, kind, offset) in directory {
        let kind = TensorType::from_id(kind);
        if let TensorType::Other(_) = kind {
            return Err(GgufError::UnsupportedType { path: path.to_owned(), name, kind: kind.to_string() });
        }
        let elements = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        let len = elements.and_then(|n| kind.byte_len(n));
        let Some(len) = len else {
            return Err(GgufError::Corrupt {
                path: path.to_owned(),
                offset: data_start,
                what: format!("tensor `{name}` of type {kind} and dims {dims:?}: size unknown or not whole blocks"),
            });
        };
        let start = data_start.checked_add(offset);
        let Some(start) = start.filter(|s| s.checked_add(len).is_some_and(|end| end <= file_len)) else {
            return Err(GgufError::Corrupt {
                path: path.to_owned(),
                offset: data_start.saturating_add(offset),
                what: format!("tensor `{name}` ({len} bytes at data offset {offset}) lies outside the file"),
            });
        };
        tensors.insert(name, TensorInfo { dims, kind, start, len });
    }
    Ok((metadata, tensors))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a GGUF v3 file in memory: metadata (key, type id, raw value bytes) and F32 tensors.
    pub fn build(metadata: &[(&str, u32, Vec<u8>)], tensors: &[(&str, Vec<usize>, Vec<f32>)]) -> Vec<u8> {
        let string = |s: &str| [(s.len() as u64).to_le_bytes().to_vec(), s.as_bytes().to_vec()].concat();
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((tensors.len() as u64).to_le_bytes());
        out.extend((metadata.len() as u64).to_le_bytes());
        for (key, kind, value) in metadata {
            out.extend(string(key));
            out.extend(kind.to_le_bytes());
            out.extend(value);
        }
        let mut offset = 0u64;
        for (name, dims, values) in tensors {
            out.extend(string(name));
            out.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| out.extend((*d as u64).to_le_bytes()));
            out.extend(0u32.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += (values.len() * 4).next_multiple_of(32) as u64;
        }
        // No padding after the last tensor: every strict prefix of the file is then truncated.
        for (_, _, values) in tensors {
            out.resize(out.len().next_multiple_of(32), 0);
            values.iter().for_each(|v| out.extend(v.to_le_bytes()));
        }
        out
    }

    pub fn string_value(s: &str) -> Vec<u8> {
        [(s.len() as u64).to_le_bytes().to_vec(), s.as_bytes().to_vec()].concat()
    }

    fn write(name: &str, bytes: &[u8]) -> PathBuf {
        let path = std::env::temp_dir().join(format!("tally-gguf-{}-{name}.gguf", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn sample() -> Vec<u8> {
        build(
            &[("general.architecture", 8, string_value("llama")), ("llama.block_count", 4, 2u32.to_le_bytes().to_vec()), ("x.eps", 6, 1e-5f32.to_le_bytes().to_vec())],
            &[("token_embd.weight", vec![3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])],
        )
    }

    #[test]
    fn reads_metadata_and_tensors() {
        let path = write("ok", &sample());
        let file = GgufFile::open(&path).unwrap();
        assert_eq!(file.string("general.architecture").unwrap(), "llama");
        assert_eq!(file.usize("llama.block_count").unwrap(), 2);
        assert!((file.optional_f64("x.eps").unwrap().unwrap() - 1e-5).abs() < 1e-12);
        let info = file.tensor("token_embd.weight").unwrap().clone();
        assert_eq!(info.shape(), vec![2, 3]);
        assert_eq!(file.read_f32(&info), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert!(file.usize("missing.key").unwrap_err().to_string().contains("`missing.key` is missing"));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_file_outside_memory_reads_the_same_and_fails_the_same() {
        use crate::file_data::tests::Remote;
        let good = sample();
        for first_read in [1, 7, 64, usize::MAX] {
            let file = GgufFile::from_data_reading("remote".into(), FileData::Ranged(Box::new(Remote(good.clone()))), first_read).unwrap();
            assert_eq!(file.usize("llama.block_count").unwrap(), 2);
            let info = file.tensor("token_embd.weight").unwrap().clone();
            assert_eq!(file.read_f32(&info), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        }
        for len in 0..good.len() {
            let cut = FileData::Ranged(Box::new(Remote(good[..len].to_vec())));
            let error = GgufFile::from_data_reading("remote".into(), cut, 8).err().unwrap_or_else(|| panic!("truncated to {len} bytes"));
            assert!(!matches!(error, GgufError::HeaderBeyond { .. }), "{error}");
        }
    }

    #[test]
    fn every_truncation_and_corruption_is_an_error() {
        let good = sample();
        // Every prefix of the file: no panic, and an error unless it is the whole file.
        for len in 0..good.len() {
            let path = write("cut", &good[..len]);
            assert!(GgufFile::open(&path).is_err(), "truncated to {len} bytes");
            std::fs::remove_file(path).unwrap();
        }
        let mut wrong_magic = good.clone();
        wrong_magic[0] = b'X';
        let mut wrong_version = good.clone();
        wrong_version[4] = 9;
        let mut huge_count = good.clone();
        huge_count[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        for (what, bytes, expected) in [("magic", wrong_magic, "not a GGUF file"), ("version", wrong_version, "version 9"), ("count", huge_count, "does not fit")] {
            let path = write(what, &bytes);
            let error = GgufFile::open(&path).err().unwrap().to_string();
            assert!(error.contains(expected), "{what}: {error}");
            std::fs::remove_file(path).unwrap();
        }
    }
}
