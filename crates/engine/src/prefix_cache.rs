//! A bounded LRU of prefilled queries, keyed by token ids, sized by device bytes.
//!
//! Entries may share buffers: the queries a pass ran side by side are cached as windows of one
//! buffer a layer (no copy where the pass's own prefix buffer is exactly them). Such a buffer is
//! freed only with the last entry in it, so the cache counts each buffer whole until then.

use std::collections::HashMap;

use burn::tensor::backend::Backend;
use tally_model::QueryKv;

struct Entry<B: Backend> {
    prefix: QueryKv<B>,
    /// The buffers it lives in (an index into `PrefixLru::buffers`).
    buffer: u64,
    last_used: u64,
}

/// Buffers entries live in: their bytes, and how many entries still do.
struct SharedBuffer {
    bytes: usize,
    entries: usize,
}

pub struct PrefixLru<B: Backend> {
    entries: HashMap<Vec<u32>, Entry<B>>,
    buffers: HashMap<u64, SharedBuffer>,
    next_buffer: u64,
    capacity_bytes: usize,
    /// Bytes of the buffers entries live in.
    used_bytes: usize,
    clock: u64,
}

impl<B: Backend> PrefixLru<B> {
    pub fn new(capacity_bytes: usize) -> Self {
        PrefixLru { entries: HashMap::new(), buffers: HashMap::new(), next_buffer: 0, capacity_bytes, used_bytes: 0, clock: 0 }
    }

    pub fn is_enabled(&self) -> bool {
        self.capacity_bytes > 0
    }

    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes
    }

    pub fn used_bytes(&self) -> usize {
        self.used_bytes
    }

    /// Whether `tokens` is cached, as is (not counted as a use).
    pub fn contains(&self, tokens: &[u32]) -> bool {
        self.entries.contains_key(tokens)
    }

    /// The longest beginning of `tokens` (all of it at most) that some cached query shares:
    /// that query's K/V truncated to it (a query's beginning has the same K/V whatever follows
    /// it), or `None` if no cached query shares a first token. The query it came from counts as
    /// used. A scan of every cached query: each holds megabytes of K/V (Qwen3-0.6B: 114 KB a
    /// token in bf16), so a cache holds tens, and comparing stops at the first different token.
    pub fn longest_prefix(&mut self, tokens: &[u32]) -> Option<QueryKv<B>> {
        let common = |cached: &[u32]| cached.iter().zip(tokens).take_while(|(a, b)| a == b).count();
        // Of equally long candidates the most recent, so the choice (and the float rounding of
        // what resumes from it) does not depend on the map's order.
        let (key, len) = self
            .entries
            .iter()
            .map(|(key, entry)| (key, common(key), entry.last_used))
            .filter(|&(_, len, _)| len > 0)
            .max_by_key(|&(_, len, last_used)| (len, last_used))
            .map(|(key, len, _)| (key.clone(), len))?;
        self.clock += 1;
        let entry = self.entries.get_mut(&key).expect("the key was just found");
        entry.last_used = self.clock;
        Some(entry.prefix.truncated(len))
    }

    /// Whether a cached query is `tokens` or begins with it (counted as used, as a lookup is).
    pub fn covers(&mut self, tokens: &[u32]) -> bool {
        self.longest_prefix(tokens).is_some_and(|kv| kv.len() == tokens.len())
    }

    /// Stores a prefix, evicting the least recently used ones to make room. A prefix larger than
    /// the whole cache is not stored. One that is a view into a larger buffer (a query of a pass
    /// that ran several) is stored as a copy of its own: the cache counts the bytes it holds, and
    /// the view would hold the whole buffer.
    pub fn insert(&mut self, tokens: &[u32], prefix: QueryKv<B>) {
        if prefix.size_bytes() > self.capacity_bytes || self.contains(tokens) {
            return;
        }
        self.insert_sharing(vec![(tokens.to_vec(), prefix.compacted())]);
    }

    /// Stores prefixes that are together all of the buffers they are windows of (see
    /// `QueryBatch::own_copies`), none of them cached yet, evicting the least recently used to
    /// make room; none if together they are larger than the whole cache. The buffers stay
    /// counted until the last of them is evicted.
    pub fn insert_sharing(&mut self, prefixes: Vec<(Vec<u32>, QueryKv<B>)>) {
        let bytes: usize = prefixes.iter().map(|(_, prefix)| prefix.size_bytes()).sum();
        if prefixes.is_empty() || bytes > self.capacity_bytes {
            return;
        }
        debug_assert!(prefixes.iter().all(|(tokens, _)| !self.contains(tokens)), "prefixes already cached would leave part of the buffers uncounted");
        while self.used_bytes + bytes > self.capacity_bytes && self.evict_least_recent() {}
        let buffer = self.next_buffer;
        self.next_buffer += 1;
        self.buffers.insert(buffer, SharedBuffer { bytes, entries: prefixes.len() });
        self.used_bytes += bytes;
        for (tokens, prefix) in prefixes {
            self.clock += 1;
            self.entries.insert(tokens, Entry { prefix, buffer, last_used: self.clock });
        }
    }

    /// Evicts the least recently used entry (false: none left); its buffer goes with the last
    /// entry in it.
    fn evict_least_recent(&mut self) -> bool {
        let Some(oldest) = self.entries.iter().min_by_key(|(_, e)| e.last_used).map(|(k, _)| k.clone()) else { return false };
        let entry = self.entries.remove(&oldest).expect("the key was just found");
        let buffer = self.buffers.get_mut(&entry.buffer).expect("an entry's buffer is counted");
        buffer.entries -= 1;
        if buffer.entries == 0 {
            self.used_bytes -= buffer.bytes;
            self.buffers.remove(&entry.buffer);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::NdArray;
    use burn::tensor::Tensor;
    use tally_model::{PrefixKv, QueryBatch, QueryKv};

    use super::PrefixLru;

    type B = NdArray<f32>;

    /// A one-layer prefix of `tokens` tokens.
    fn prefix(tokens: usize) -> QueryKv<B> {
        let kv = || Tensor::<B, 3>::zeros([2, tokens, 4], &Default::default());
        QueryKv::from_layers(vec![PrefixKv { keys: kv(), values: kv() }])
    }

    fn cached(cache: &mut PrefixLru<B>, keys: &[u32]) -> Vec<bool> {
        keys.iter().map(|&key| cache.longest_prefix(&[key]).is_some()).collect()
    }

    #[test]
    fn the_longest_shared_beginning_is_found_truncated_and_counts_as_used() {
        let one = prefix(1).size_bytes();
        let mut cache = PrefixLru::<B>::new(100 * one);
        cache.insert(&[1, 2, 3, 4, 5], prefix(5));
        cache.insert(&[1, 2, 9], prefix(3));
        cache.insert(&[7], prefix(1));
        let found = |cache: &mut PrefixLru<B>, tokens: &[u32]| cache.longest_prefix(tokens).map(|kv| kv.len());
        // Shorter, as long as and longer than the shared part; the longest of two candidates.
        assert_eq!(found(&mut cache, &[1, 2, 3, 4, 6]), Some(4));
        assert_eq!(found(&mut cache, &[1, 2, 3]), Some(3), "a query inside a cached one is whole");
        assert_eq!(found(&mut cache, &[1, 2, 9, 9]), Some(3));
        assert_eq!(found(&mut cache, &[1, 2, 3, 4, 5, 6]), Some(5));
        // No more than the query; nothing shares a first token; an empty query.
        assert_eq!(found(&mut cache, &[1, 2]), Some(2));
        assert_eq!(found(&mut cache, &[8, 1, 2]), None);
        assert_eq!(found(&mut cache, &[]), None);
        // The one used is the most recent: a tight cache evicts the others first.
        let mut tight = PrefixLru::<B>::new(2 * one);
        tight.insert(&[1], prefix(1));
        tight.insert(&[2], prefix(1));
        assert_eq!(found(&mut tight, &[1, 5]), Some(1));
        tight.insert(&[3], prefix(1));
        assert_eq!(cached(&mut tight, &[1, 2, 3]), [true, false, true]);
    }

    #[test]
    fn evicts_the_least_recently_used_to_stay_within_its_bytes() {
        let one = prefix(1).size_bytes();
        assert_eq!(one, 2 * 2 * 4 * 4, "keys and values, 2 heads × 4 dims of f32");
        let mut cache = PrefixLru::<B>::new(3 * one);
        for key in [1, 2, 3] {
            cache.insert(&[key], prefix(1));
        }
        assert_eq!(cache.used_bytes(), 3 * one);
        // Using 1 makes 2 the least recent: a fourth prefix evicts 2, exactly at the budget.
        assert_eq!(cached(&mut cache, &[1]), [true]);
        cache.insert(&[4], prefix(1));
        assert_eq!(cached(&mut cache, &[2, 1, 3, 4]), [false, true, true, true]);
        assert_eq!(cache.used_bytes(), 3 * one);
        // A two-token prefix evicts the two least recent (1, then 3), not more.
        cache.insert(&[5], prefix(2));
        assert_eq!(cached(&mut cache, &[1, 3, 4, 5]), [false, false, true, true]);
        assert_eq!(cache.used_bytes(), 3 * one);
        // Larger than the whole cache: not stored, and nothing evicted for it.
        cache.insert(&[6], prefix(4));
        assert_eq!(cached(&mut cache, &[6, 4, 5]), [false, true, true]);
        // A key already there is kept once.
        cache.insert(&[4], prefix(1));
        assert_eq!(cache.used_bytes(), 3 * one);
        // Just under the budget: a prefix that fits beside the rest evicts nothing.
        let mut roomy = PrefixLru::<B>::new(3 * one + one - 1);
        for key in [1, 2, 3] {
            roomy.insert(&[key], prefix(1));
        }
        assert_eq!(cached(&mut roomy, &[1, 2, 3]), [true, true, true]);
        assert!(!PrefixLru::<B>::new(0).is_enabled());
    }

    #[test]
    fn queries_sharing_buffers_are_counted_until_the_last_of_them_goes() {
        let one = prefix(1).size_bytes();
        let copies = QueryBatch::new(vec![prefix(1), prefix(2), prefix(1)]).own_copies(&[0, 1, 2]);
        assert_eq!(copies.iter().map(QueryKv::len).collect::<Vec<_>>(), [1, 2, 1]);
        let mut cache = PrefixLru::<B>::new(6 * one);
        cache.insert_sharing(vec![(vec![1], copies[0].clone()), (vec![2], copies[1].clone()), (vec![3], copies[2].clone())]);
        cache.insert(&[4], prefix(2));
        assert_eq!(cache.used_bytes(), 6 * one);
        assert_eq!(cached(&mut cache, &[2]), [true], "2 is now the most recent");
        // Room for one token: evicting 1, then 3 frees nothing while 2 keeps their buffer alive,
        // so 4 goes too.
        cache.insert(&[5], prefix(1));
        assert_eq!(cached(&mut cache, &[1, 3, 4, 2, 5]), [false, false, false, true, true]);
        assert_eq!(cache.used_bytes(), (4 + 1) * one, "the shared buffer, counted whole, and 5");
        // The last of them evicted, their buffer is freed.
        cache.insert(&[6], prefix(2));
        assert_eq!(cached(&mut cache, &[2, 5, 6]), [false, true, true]);
        assert_eq!(cache.used_bytes(), 3 * one);
        // Together larger than the whole cache: none stored.
        let copies = QueryBatch::new(vec![prefix(4), prefix(3)]).own_copies(&[0, 1]);
        cache.insert_sharing(vec![(vec![7], copies[0].clone()), (vec![8], copies[1].clone())]);
        assert_eq!(cached(&mut cache, &[7, 8, 5, 6]), [false, false, true, true]);
    }
}
