//! The queries of a batch of requests: each taken from the prefix cache, or prefilled — every
//! cache miss of the batch together, one pass per chunk rather than one per query, each
//! resuming from the longest beginning it shares with a cached query, to the token (so a
//! shared system prompt is computed once, across requests and, through chunk-aligned parts
//! cached first, within a batch).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;

use tally_model::{DecoderModel, QueryBatch, QueryKv, ScoringBackend, PREFILL_CHUNK};

use crate::prefix_cache::PrefixLru;
use crate::stats::EngineStats;

/// How a request's query was found in the prefix cache (a server tells its client, so a router
/// can see whether its prefix affinity pays).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefixCacheUse {
    /// The whole query was cached (or computed earlier in the same batch).
    Hit,
    /// A cached beginning was resumed; the rest was prefilled.
    Partial,
    /// Prefilled from scratch: not cached, the cache is off, or nothing could be shared.
    Miss,
}

impl PrefixCacheUse {
    pub fn as_str(self) -> &'static str {
        match self {
            PrefixCacheUse::Hit => "hit",
            PrefixCacheUse::Partial => "partial",
            PrefixCacheUse::Miss => "miss",
        }
    }

    /// Of one client request made of several queries: a hit only if every query was, a miss
    /// only if every query was.
    pub fn combine(self, other: PrefixCacheUse) -> PrefixCacheUse {
        if self == other { self } else { PrefixCacheUse::Partial }
    }
}

/// A batch's queries as its passes read them: each distinct query once, its K/V so far and,
/// where the batch's first item pass can take them, its last tokens still to run (its tail, see
/// [`QueryBatch`]); which of them each request reads, and how it was found in the cache.
pub struct BatchQueries<B: ScoringBackend> {
    pub queries: QueryBatch<B>,
    /// Per request: its query's index in `queries`, and how that query was found in the cache.
    pub of_request: Vec<(usize, PrefixCacheUse)>,
    /// Queries to cache once their tails have run: index in `queries`, and the whole query.
    to_cache: Vec<(usize, Vec<u32>)>,
}

impl<B: ScoringBackend> BatchQueries<B> {
    /// Caches the queries whose tails have run (call after the batch's first pass): the last of
    /// them that fit the cache together (those the batch's own inserts would not evict again),
    /// in buffers shared by them alone — the pass's prefix buffers themselves where they are all
    /// of it, as in a batch of new queries, so caching them copies nothing.
    pub fn cache_run_tails(&mut self, cache: &mut PrefixLru<B>, stats: &EngineStats) {
        if self.to_cache.is_empty() || self.queries.tail_tokens() > 0 {
            return;
        }
        let mut kept = Vec::new();
        let mut bytes = 0;
        for (index, query) in self.to_cache.drain(..).rev() {
            bytes += self.queries.query(index).size_bytes();
            if bytes > cache.capacity_bytes() {
                break;
            }
            kept.push((index, query));
        }
        kept.reverse();
        let copies = self.queries.own_copies(&kept.iter().map(|&(index, _)| index).collect::<Vec<_>>());
        cache.insert_sharing(kept.into_iter().map(|(_, query)| query).zip(copies).collect());
        stats.prefix_cache_bytes.store(cache.used_bytes() as u64, Relaxed);
    }
}

/// The queries of a batch (`None`: a request without one), each taken from the cache or
/// prefilled, cache misses together. Distinct queries are computed once; each prefill pass holds
/// at most `max_tokens` query tokens (at least one query). Where the first item pass has room
/// for the misses' last chunks (`tails_fit` of their tokens in all), they are left as tails for
/// it (no pass of their own: a request whose query is cached but for a new suffix is then one
/// pass).
pub fn prefill_queries<B: ScoringBackend>(
    model: &DecoderModel<B>,
    cache: &mut PrefixLru<B>,
    stats: &EngineStats,
    queries: &[Option<&[u32]>],
    max_tokens: usize,
    tails_fit: &dyn Fn(usize) -> bool,
) -> BatchQueries<B> {
    let mut distinct: Vec<&[u32]> = Vec::new();
    for query in queries.iter().flatten() {
        if !distinct.contains(query) {
            distinct.push(query);
        }
    }
    // Each distinct query's K/V so far and its tail.
    let mut done: HashMap<&[u32], (QueryKv<B>, &[u32])> = HashMap::new();
    let mut to_cache: Vec<&[u32]> = Vec::new();
    // Each distinct query's lookup (a miss unless the cache says otherwise), taken by its first
    // occurrence below: its repeats within the batch are hits.
    let mut found: HashMap<&[u32], PrefixCacheUse> = distinct.iter().map(|&query| (query, PrefixCacheUse::Miss)).collect();
    if !cache.is_enabled() {
        let empty = || model.empty_query();
        let work = distinct.iter().map(|&q| (empty(), q)).collect();
        done.extend(distinct.iter().copied().zip(prefill_leaving_tails(model, stats, work, max_tokens, tails_fit)));
    } else {
        // A query repeated within the batch is a hit, as it would be a request later.
        stats.prefix_cache_hits.fetch_add((queries.iter().flatten().count() - distinct.len()) as u64, Relaxed);
        let mut missed = Vec::new();
        for &query in &distinct {
            // A hit when a cached query is this one or begins with it.
            let (lookup, counter) = match cache.longest_prefix(query) {
                Some(whole) if whole.len() == query.len() => {
                    done.insert(query, (whole, &[]));
                    (PrefixCacheUse::Hit, &stats.prefix_cache_hits)
                }
                Some(_) => (PrefixCacheUse::Partial, &stats.prefix_cache_partial_hits),
                None => (PrefixCacheUse::Miss, &stats.prefix_cache_misses),
            };
            counter.fetch_add(1, Relaxed);
            found.insert(query, lookup);
            if lookup != PrefixCacheUse::Hit {
                missed.push(query);
            }
        }
        // Each miss's longest chunk-aligned part (strictly shorter than it) is computed first,
        // once, so that the misses of this batch that begin the same way share it. A part that
        // extends another part of this batch waits for it (a wave later) and resumes from it.
        // A part the cache already covers is not computed again.
        let mut pending: Vec<&[u32]> = Vec::new();
        for &query in &missed {
            let part = &query[..aligned_len(query)];
            if !part.is_empty() && !pending.contains(&part) && !cache.covers(part) {
                pending.push(part);
            }
        }
        while !pending.is_empty() {
            let (wave, later): (Vec<&[u32]>, Vec<&[u32]>) = pending.iter().copied().partition(|part| !pending.iter().any(|other| other.len() < part.len() && part.starts_with(other)));
            let work = wave.iter().map(|&part| resume_point(model, cache, part)).collect();
            for (part, kv) in wave.iter().zip(prefill_in_passes(model, stats, work, max_tokens)) {
                cache.insert(part, kv);
            }
            pending = later;
        }
        let work: Vec<_> = missed.iter().map(|&query| resume_point(model, cache, query)).collect();
        // A query a part of this batch turned out to cover whole is a view of that part: not
        // stored again (the cache would count a view's bytes, not the buffer it keeps alive).
        let computed: Vec<bool> = work.iter().map(|(_, rest)| !rest.is_empty()).collect();
        for ((&query, (kv, tail)), computed) in missed.iter().zip(prefill_leaving_tails(model, stats, work, max_tokens, tails_fit)).zip(computed) {
            if !tail.is_empty() {
                to_cache.push(query);
            } else if computed {
                cache.insert(query, kv.clone());
            }
            done.insert(query, (kv, tail));
        }
        stats.prefix_cache_bytes.store(cache.used_bytes() as u64, Relaxed);
    }

    // The batch: each distinct query once, and one empty query for the requests without one.
    let mut index_of: HashMap<&[u32], usize> = HashMap::new();
    let (mut kvs, mut tails) = (Vec::new(), Vec::new());
    for &query in &distinct {
        let (kv, tail) = done.remove(query).expect("every distinct query is done");
        index_of.insert(query, kvs.len());
        kvs.push(kv);
        tails.push(tail.to_vec());
    }
    let no_query = kvs.len();
    if queries.iter().any(Option::is_none) || kvs.is_empty() {
        kvs.push(model.empty_query());
        tails.push(Vec::new());
    }
    let of_request = queries
        .iter()
        .map(|query| match query {
            None => (no_query, PrefixCacheUse::Miss),
            Some(q) => (index_of[q], found.remove(q).unwrap_or(PrefixCacheUse::Hit)),
        })
        .collect();
    let to_cache = to_cache.into_iter().map(|query| (index_of[query], query.to_vec())).collect();
    BatchQueries { queries: QueryBatch::with_tails(kvs, tails), of_request, to_cache }
}

/// The longest multiple of [`PREFILL_CHUNK`] strictly shorter than `query`: the part a batch's
/// misses share first (resuming there keeps a fresh prefill's chunk boundaries, so a resumed
/// prefill is bit-identical to one from scratch).
fn aligned_len(query: &[u32]) -> usize {
    query.len().saturating_sub(1) / PREFILL_CHUNK * PREFILL_CHUNK
}

/// Where `query` resumes (the longest beginning it shares with a cached query, possibly all of
/// it, or nothing) and the tokens left to prefill.
fn resume_point<'q, B: ScoringBackend>(model: &DecoderModel<B>, cache: &mut PrefixLru<B>, query: &'q [u32]) -> (QueryKv<B>, &'q [u32]) {
    let base = cache.longest_prefix(query).unwrap_or_else(|| model.empty_query());
    let rest = &query[base.len()..];
    (base, rest)
}

/// Extends each `(base, tokens)` by its tokens but the last chunk (1 to [`PREFILL_CHUNK`] tokens,
/// the chunk a prefill would end with), which is left as its tail, where `tails_fit` the last
/// chunks' tokens in all; by all of them, leaving no tail, where it does not.
fn prefill_leaving_tails<'q, B: ScoringBackend>(model: &DecoderModel<B>, stats: &EngineStats, work: Vec<(QueryKv<B>, &'q [u32])>, max_tokens: usize, tails_fit: &dyn Fn(usize) -> bool) -> Vec<(QueryKv<B>, &'q [u32])> {
    let last_chunks: usize = work.iter().map(|(_, tokens)| tokens.len() - aligned_len(tokens)).sum();
    let leave_tails = last_chunks > 0 && tails_fit(last_chunks);
    let (work, tails): (Vec<_>, Vec<_>) = work
        .into_iter()
        .map(|(base, tokens)| {
            let (run, tail) = if leave_tails { tokens.split_at(aligned_len(tokens)) } else { (tokens, &[][..]) };
            ((base, run), tail)
        })
        .unzip();
    // The tails are query tokens run through the model too, in the first item pass.
    stats.prefill_tokens.fetch_add(tails.iter().map(|tail| tail.len() as u64).sum(), Relaxed);
    prefill_in_passes(model, stats, work, max_tokens).into_iter().zip(tails).collect()
}

/// Extends each `(base, tokens)`, as many at once as fit a pass of `max_tokens` query tokens.
fn prefill_in_passes<B: ScoringBackend>(model: &DecoderModel<B>, stats: &EngineStats, work: Vec<(QueryKv<B>, &[u32])>, max_tokens: usize) -> Vec<QueryKv<B>> {
    stats.prefill_tokens.fetch_add(work.iter().map(|(_, tokens)| tokens.len() as u64).sum(), Relaxed);
    let passes = passes(work.iter().map(|(_, tokens)| tokens.len().min(PREFILL_CHUNK)), max_tokens);
    let mut work = work.into_iter();
    let mut done = Vec::with_capacity(work.len());
    for pass in passes {
        let (bases, tokens): (Vec<_>, Vec<_>) = work.by_ref().take(pass.len()).unzip();
        let rounds = tokens.iter().map(|t| t.len().div_ceil(PREFILL_CHUNK)).max().unwrap_or(0);
        stats.prefill_passes.fetch_add(rounds as u64, Relaxed);
        done.extend(model.prefill_batch(bases, &tokens));
    }
    done
}

/// Consecutive runs of queries whose first chunks (`chunks`, tokens each) share a prefill pass
/// of at most `max_tokens` tokens; a pass always takes at least one query.
fn passes(chunks: impl Iterator<Item = usize>, max_tokens: usize) -> Vec<Range<usize>> {
    let mut passes: Vec<Range<usize>> = Vec::new();
    let mut pass_tokens = 0;
    for (index, chunk) in chunks.enumerate() {
        match passes.last_mut() {
            Some(pass) if pass_tokens + chunk <= max_tokens => {
                pass.end = index + 1;
                pass_tokens += chunk;
            }
            _ => {
                passes.push(index..index + 1);
                pass_tokens = chunk;
            }
        }
    }
    passes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_of_several_queries_is_a_hit_or_a_miss_only_if_all_are() {
        use PrefixCacheUse::{Hit, Miss, Partial};
        for (a, b, whole) in [(Hit, Hit, Hit), (Miss, Miss, Miss), (Hit, Miss, Partial), (Partial, Partial, Partial), (Miss, Partial, Partial)] {
            assert_eq!((a.combine(b), b.combine(a)), (whole, whole), "{a:?} with {b:?}");
        }
    }

    #[test]
    fn the_cached_part_is_the_longest_whole_chunks_strictly_inside_the_query() {
        let c = PREFILL_CHUNK;
        for (len, aligned) in [(0, 0), (1, 0), (c - 1, 0), (c, 0), (c + 1, c), (2 * c, c), (2 * c + 1, 2 * c)] {
            assert_eq!(aligned_len(&vec![7; len]), aligned, "a query of {len} tokens");
        }
    }

    #[test]
    fn queries_share_a_pass_up_to_the_budget_and_a_pass_takes_at_least_one() {
        let c = PREFILL_CHUNK;
        // Just under, at and past the budget.
        assert_eq!(passes([100, 99].into_iter(), 200), [0..2]);
        assert_eq!(passes([100, 100].into_iter(), 200), [0..2]);
        assert_eq!(passes([100, 101].into_iter(), 200), [0..1, 1..2]);
        // A chunk larger than the budget still runs, alone.
        assert_eq!(passes([c, 10, 10, c].into_iter(), 100), [0..1, 1..3, 3..4]);
        assert_eq!(passes(std::iter::empty(), 100), Vec::<Range<usize>>::new());
    }
}
