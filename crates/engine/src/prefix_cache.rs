//! A bounded LRU of prefilled queries, keyed by token ids, sized by device bytes.

use std::collections::HashMap;

use burn::tensor::backend::Backend;
use tally_model::QueryKv;

struct Entry<B: Backend> {
    prefix: QueryKv<B>,
    bytes: usize,
    last_used: u64,
}

pub struct PrefixLru<B: Backend> {
    entries: HashMap<Vec<u32>, Entry<B>>,
    capacity_bytes: usize,
    used_bytes: usize,
    clock: u64,
}

impl<B: Backend> PrefixLru<B> {
    pub fn new(capacity_bytes: usize) -> Self {
        PrefixLru { entries: HashMap::new(), capacity_bytes, used_bytes: 0, clock: 0 }
    }

    pub fn is_enabled(&self) -> bool {
        self.capacity_bytes > 0
    }

    pub fn used_bytes(&self) -> usize {
        self.used_bytes
    }

    pub fn get(&mut self, tokens: &[u32]) -> Option<QueryKv<B>> {
        self.clock += 1;
        let entry = self.entries.get_mut(tokens)?;
        entry.last_used = self.clock;
        Some(entry.prefix.clone())
    }

    /// Stores a prefix, evicting the least recently used ones to make room. A prefix larger than
    /// the whole cache is not stored.
    pub fn insert(&mut self, tokens: &[u32], prefix: QueryKv<B>) {
        let bytes = prefix.size_bytes();
        if bytes > self.capacity_bytes || self.entries.contains_key(tokens) {
            return;
        }
        while self.used_bytes + bytes > self.capacity_bytes {
            let Some(oldest) = self.entries.iter().min_by_key(|(_, e)| e.last_used).map(|(k, _)| k.clone()) else { break };
            if let Some(evicted) = self.entries.remove(&oldest) {
                self.used_bytes -= evicted.bytes;
            }
        }
        self.clock += 1;
        self.used_bytes += bytes;
        self.entries.insert(tokens.to_vec(), Entry { prefix, bytes, last_used: self.clock });
    }
}
