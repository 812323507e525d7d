//! A model file's bytes: memory-mapped from disk natively, or handed over in memory (the browser
//! build, which has no file system).

use std::ops::Deref;

pub enum FileData {
    #[cfg(not(target_arch = "wasm32"))]
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl FileData {
    #[cfg(not(target_arch = "wasm32"))]
    pub fn map(path: &std::path::Path) -> std::io::Result<Self> {
        let file = std::fs::File::open(path)?;
        // SAFETY: model files are read-only inputs; tally never writes to a mapped file.
        Ok(FileData::Mapped(unsafe { memmap2::Mmap::map(&file) }?))
    }
}

impl Deref for FileData {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            FileData::Mapped(map) => map,
            FileData::Owned(bytes) => bytes,
        }
    }
}
