//! A model file's bytes: memory-mapped from disk natively, handed over in memory, or kept
//! outside this process's memory and copied in a range at a time (the browser keeps a fetched
//! file in JS, so the wasm heap never holds all of it).

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

/// Bytes that can only be copied out a range at a time.
pub trait RangedBytes {
    fn len(&self) -> usize;
    /// A copy of `range`, which lies within `0..len()`.
    fn copy(&self, range: Range<usize>) -> Vec<u8>;
}

pub enum FileData {
    #[cfg(not(target_arch = "wasm32"))]
    Mapped(Arc<memmap2::Mmap>),
    Owned(Arc<[u8]>),
    Ranged(Box<dyn RangedBytes>),
}

/// A file's bytes in memory, shared across threads: what weights kept in their stored blocks
/// ([`crate::blocks`]) point into, so the mapping lives as long as they do.
#[derive(Clone)]
pub enum SharedBytes {
    #[cfg(not(target_arch = "wasm32"))]
    Mapped(Arc<memmap2::Mmap>),
    Owned(Arc<[u8]>),
}

impl SharedBytes {
    pub fn bytes(&self) -> &[u8] {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            SharedBytes::Mapped(map) => map,
            SharedBytes::Owned(bytes) => bytes,
        }
    }
}

impl FileData {
    #[cfg(not(target_arch = "wasm32"))]
    pub fn map(path: &std::path::Path) -> std::io::Result<Self> {
        let file = std::fs::File::open(path)?;
        // SAFETY: model files are read-only inputs; tally never writes to a mapped file.
        Ok(FileData::Mapped(Arc::new(unsafe { memmap2::Mmap::map(&file) }?)))
    }

    pub fn len(&self) -> usize {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            FileData::Mapped(map) => map.len(),
            FileData::Owned(bytes) => bytes.len(),
            FileData::Ranged(bytes) => bytes.len(),
        }
    }

    /// The whole file, where it is in this process's memory.
    pub fn in_memory(&self) -> Option<&[u8]> {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            FileData::Mapped(map) => Some(map),
            FileData::Owned(bytes) => Some(bytes),
            FileData::Ranged(_) => None,
        }
    }

    /// The whole file, shared, where it is in this process's memory.
    pub fn shared(&self) -> Option<SharedBytes> {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            FileData::Mapped(map) => Some(SharedBytes::Mapped(Arc::clone(map))),
            FileData::Owned(bytes) => Some(SharedBytes::Owned(Arc::clone(bytes))),
            FileData::Ranged(_) => None,
        }
    }

    /// Bytes `range` of the file (borrowed in memory, copied otherwise); `None` past its end.
    pub fn get(&self, range: Range<usize>) -> Option<Cow<'_, [u8]>> {
        if range.start > range.end || range.end > self.len() {
            return None;
        }
        Some(match self {
            FileData::Ranged(bytes) => Cow::Owned(bytes.copy(range)),
            _ => Cow::Borrowed(&self.in_memory()?[range]),
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A file whose bytes are only reachable a range at a time, as in the browser.
    pub struct Remote(pub Vec<u8>);

    impl RangedBytes for Remote {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn copy(&self, range: Range<usize>) -> Vec<u8> {
            self.0[range].to_vec()
        }
    }

    #[test]
    fn ranges_read_the_same_in_memory_and_remote() {
        let bytes: Vec<u8> = (0..=255).collect();
        let owned = FileData::Owned(bytes.clone().into());
        let remote = FileData::Ranged(Box::new(Remote(bytes)));
        for range in [0..0, 0..256, 10..20, 255..256] {
            assert_eq!(owned.get(range.clone()), remote.get(range));
        }
        assert!(owned.get(250..257).is_none() && remote.get(250..257).is_none());
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = 20..10;
        assert!(remote.get(backwards).is_none());
    }
}
