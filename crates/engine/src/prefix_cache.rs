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
        let bytes = prefix.size_bytes();
        if bytes > self.capacity_bytes || self.entries.contains_key(tokens) {
            return;
        }
        let prefix = prefix.compacted();
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

#[cfg(test)]
mod tests {
    use burn::backend::NdArray;
    use burn::tensor::Tensor;
    use tally_model::PrefixKv;
    use tally_model::QueryKv;

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
}
