//! Engine-level batching: requests with different queries share forward passes, the prefix
//! cache returns what a fresh prefill computes (exactly on a hit, to float rounding where it
//! resumes), and the warm-up leaves no trace.

use std::sync::atomic::Ordering::Relaxed;

use burn::backend::NdArray;
use tally_core::{ScoreInput, ScoreRequest};
use tally_engine::{PrefixCacheUse, Scored, Scorer, ScorerOptions};

// The probability comparison and fixture paths the `tally` package's end-to-end tests use.
#[path = "common/fixtures.rs"]
#[allow(dead_code)]
mod fixtures;

use fixtures::{assert_close, fixtures};

type Cpu = NdArray<f32>;

fn scorer(prefix_cache_bytes: usize) -> Scorer<Cpu> {
    let options = ScorerOptions { prefix_cache_bytes, ..ScorerOptions::default() };
    Scorer::load(&fixtures().join("models/tied-gqa"), &Default::default(), options).unwrap()
}

/// Every request's answer, with how its query was found in the prefix cache.
fn scored(scorer: &mut Scorer<Cpu>, inputs: &[&ScoreInput]) -> Vec<Scored> {
    scorer.score_batch_while(inputs, &|_| true).unwrap().into_iter().map(Option::unwrap).collect()
}

/// A fixture case's request and its float64 reference scores.
fn case(name: &str) -> (ScoreRequest, Vec<Vec<f64>>) {
    let case = fixtures::case(name);
    (serde_json::from_value(case["request"].clone()).unwrap(), fixtures::expected(&case))
}

#[test]
fn requests_with_different_queries_share_passes_and_keep_their_answers() {
    let names = ["tied_long_query", "tied_one_token_query_many_items", "tied_item_first"];
    let mut scorer = scorer(0);
    let cases: Vec<_> = names.iter().map(|name| case(name)).collect();
    let inputs: Vec<ScoreInput> = cases.iter().map(|(request, _)| scorer.preparer().prepare(request).unwrap()).collect();
    let batched = scorer.score_batch(&inputs.iter().collect::<Vec<_>>()).unwrap();
    for (input, (got, (_, expected))) in inputs.iter().zip(batched.iter().zip(&cases)) {
        assert_close(got, expected, 1e-3, "against float64");
        let alone = scorer.score_batch(&[input]).unwrap().remove(0);
        assert_close(got, &alone, 1e-4, "batched against alone");
    }
    // One batch of three requests (bucket (2, 4]), then three of one.
    let (buckets, _) = scorer.stats().batch_requests.snapshot();
    let at_most = |n: f64| buckets.iter().find(|(bound, _)| *bound >= n).unwrap().1;
    assert_eq!((at_most(1.0), at_most(4.0) - at_most(2.0)), (3, 1));
}

#[test]
fn prefix_cache_hits_equal_fresh_prefills() {
    let (request, expected) = case("tied_long_query");
    let mut cached = scorer(64 << 20);
    let input = cached.preparer().prepare(&request).unwrap();
    let miss = scored(&mut cached, &[&input]).remove(0);
    let hit = scored(&mut cached, &[&input]).remove(0);
    assert_eq!((miss.prefix_cache, hit.prefix_cache), (PrefixCacheUse::Miss, PrefixCacheUse::Hit));
    assert_eq!(miss.scores, hit.scores);
    assert_close(&hit.scores, &expected, 1e-3, "against float64");
    let stats = cached.stats();
    assert_eq!((stats.prefix_cache_misses.load(Relaxed), stats.prefix_cache_hits.load(Relaxed)), (1, 1));

    // Same first 1,590 tokens ("system prompt"), another suffix: all 1,590 are reused, to the
    // token, and only the suffix is prefilled. It runs as 5 rows of the item pass where a fresh
    // prefill runs it inside the chunk from 1,536, so the two agree to float rounding.
    let mut other = input.clone();
    other.query.truncate(1590);
    other.query.extend([3, 1, 4, 1, 5]);
    let prefilled = stats.prefill_tokens.load(Relaxed);
    let passes = || (stats.prefill_passes.load(Relaxed), stats.pass_items.count());
    let passes_before = passes();
    let partial = scored(&mut cached, &[&other]).remove(0);
    assert_eq!(partial.prefix_cache, PrefixCacheUse::Partial);
    assert_eq!((stats.prefix_cache_partial_hits.load(Relaxed), stats.prefill_tokens.load(Relaxed) - prefilled), (1, 5));
    // The suffix runs in the item pass: the request is one forward pass.
    assert_eq!((passes().0 - passes_before.0, passes().1 - passes_before.1), (0, 1), "(prefill passes, item passes) of a request cached but for its suffix");
    let fresh = scored(&mut scorer(0), &[&other]).remove(0);
    assert_eq!(fresh.prefix_cache, PrefixCacheUse::Miss, "no cache: a miss");
    assert_close(&partial.scores, &fresh.scores, 1e-5, "resumed at 1,590 tokens against a fresh prefill");

    // A beginning of a cached query is a hit: its K/V is the cached one's first tokens.
    let mut inside = input.clone();
    inside.query.truncate(1000);
    let prefilled = stats.prefill_tokens.load(Relaxed);
    let hit_inside = scored(&mut cached, &[&inside]).remove(0);
    assert_eq!((hit_inside.prefix_cache, stats.prefill_tokens.load(Relaxed) - prefilled), (PrefixCacheUse::Hit, 0));
    assert_close(&hit_inside.scores, &scored(&mut scorer(0), &[&inside]).remove(0).scores, 1e-5, "the beginning of a cached query against a fresh prefill");
}

/// Concurrent requests' queries are prefilled together (one pass per chunk); each gets what a
/// lone prefill gives, a repeated query runs once, and a beginning two queries share within
/// the batch is computed once.
#[test]
fn a_batchs_cache_misses_are_prefilled_together_and_share_their_common_part() {
    let (request, _) = case("tied_long_query");
    let mut cached = scorer(64 << 20);
    let long = cached.preparer().prepare(&request).unwrap();
    assert!((1537..2048).contains(&long.query.len()), "its cacheable part is three chunks");
    let mut shorter = long.clone();
    shorter.query.truncate(1100);
    let mut short = long.clone();
    short.query = long.query[..40].iter().rev().copied().collect();
    let inputs = [&long, &shorter, &short, &long];
    let together = scored(&mut cached, &inputs);
    for (input, got) in inputs.iter().zip(&together) {
        let alone = scorer(0).score_batch(&[input]).unwrap().remove(0);
        assert_close(&got.scores, &alone, 1e-4, "batched against alone");
    }
    // `long` repeated is a hit, as a later request would be; `shorter` resumes from nothing
    // cached before the batch, so it is a miss even though `long` shares its beginning.
    let uses: Vec<PrefixCacheUse> = together.iter().map(|s| s.prefix_cache).collect();
    assert_eq!(uses, [PrefixCacheUse::Miss, PrefixCacheUse::Miss, PrefixCacheUse::Miss, PrefixCacheUse::Hit]);
    let stats = cached.stats();
    // `shorter`'s first 1,024 tokens once (the start of `long`'s cacheable 1,536 too), then
    // `long`'s next 512 and its rest, `short`; `shorter` is the beginning of `long`'s first
    // 1,536, so none of its own.
    assert_eq!(stats.prefill_tokens.load(Relaxed) as usize, long.query.len() + 40);
    let counts = [&stats.prefix_cache_hits, &stats.prefix_cache_partial_hits, &stats.prefix_cache_misses].map(|c| c.load(Relaxed));
    assert_eq!(counts, [1, 0, 3]);
}

#[test]
fn a_warmed_up_scorer_counts_nothing_and_answers_as_before() {
    let options = ScorerOptions { pass_budget: tally_core::PassBudget { max_tokens: 64, ..Default::default() }, prefix_cache_bytes: 64 << 20, ..ScorerOptions::default() };
    let mut scorer = Scorer::<Cpu>::load(&fixtures().join("models/tied-gqa"), &Default::default(), options).unwrap();
    assert!(scorer.warmup_steps().is_empty(), "the CPU compiles and tunes nothing, so needs no warm-up");
    // The steps a CubeCL backend asks for (tally_shaders::autotune), run on the CPU: a warm-up
    // leaves no trace whatever it runs.
    let warmup = tally_engine::warmup_steps(&[16, 32, 47, 64, 95, 128, 512, 1024], 64, usize::MAX, scorer.preparer().limits());
    let mut steps = Vec::new();
    scorer.warm_up(&warmup, &mut |done, total, step| steps.push((done, total, step.query_tokens))).unwrap();
    let total = steps.len();
    assert!(total == warmup.len() && steps.iter().enumerate().all(|(i, &(done, all, _))| done == i + 1 && all == total));
    assert_eq!(steps.iter().map(|s| s.2).max(), Some(1024), "queries as long as two prefill chunks ran");

    let stats = scorer.stats();
    let counters = [&stats.items_scored, &stats.prefix_cache_hits, &stats.prefix_cache_partial_hits, &stats.prefix_cache_misses, &stats.prefix_cache_bytes, &stats.prefill_tokens];
    assert!(counters.iter().all(|c| c.load(Relaxed) == 0), "the warm-up shows in the statistics");
    let (request, expected) = case("tied_long_query");
    let input = scorer.preparer().prepare(&request).unwrap();
    assert_close(&scorer.score_batch(&[&input]).unwrap()[0], &expected, 1e-3, "against float64");
    let warmup_request = &warmup[0].batches[0][0];
    scorer.score_batch(&[warmup_request]).unwrap();
    assert_eq!(stats.prefix_cache_hits.load(Relaxed), 0, "the prefix cache starts empty after the warm-up");
}

/// A query's last chunk runs in the batch's first item pass, not in a pass of its own, where the
/// items still take as many passes with room left for it in each; later passes read the query
/// whole. Elsewhere the query is prefilled whole first, as before. Both agree with float64.
#[test]
fn a_querys_last_chunk_runs_in_the_first_item_pass_where_it_fits() {
    let with_budget = |max_tokens: usize| {
        let options = ScorerOptions { pass_budget: tally_core::PassBudget { max_tokens, ..Default::default() }, prefix_cache_bytes: 64 << 20, ..ScorerOptions::default() };
        Scorer::<Cpu>::load(&fixtures().join("models/tied-gqa"), &Default::default(), options).unwrap()
    };
    let passes = |scorer: &Scorer<Cpu>| (scorer.stats().prefill_passes.load(Relaxed), scorer.stats().pass_items.count());

    // A one-token query and 120 items of 1 to 8 tokens over several passes: under 64 tokens a
    // pass they take 10 passes with or without a token left for the query, which then runs in
    // the first of them, the rest reading it from the batch; under 8 they would take 94 passes
    // in place of 85, so the query gets a pass of its own.
    let (request, expected) = case("tied_one_token_query_many_items");
    for (max_tokens, tail_in_item_pass, item_passes) in [(64, true, 10), (8, false, 85)] {
        let mut scorer = with_budget(max_tokens);
        let input = scorer.preparer().prepare(&request).unwrap();
        assert_eq!(input.query.len(), 1);
        let scores = scored(&mut scorer, &[&input]).remove(0);
        assert_close(&scores.scores, &expected, 1e-3, &format!("a pass budget of {max_tokens} tokens, against float64"));
        assert_eq!(passes(&scorer), (u64::from(!tail_in_item_pass), item_passes), "(prefill passes, item passes) under a budget of {max_tokens}");
        // The query was cached once its tail ran: the same request again is a hit.
        assert_eq!(scored(&mut scorer, &[&input]).remove(0).prefix_cache, PrefixCacheUse::Hit);
    }

    // 1,536 tokens of whole chunks, prefilled in three passes, and a last chunk of the rest (64
    // tokens): in the item pass under the default budget, prefilled too where it would fill a
    // pass of 64 tokens.
    let (request, expected) = case("tied_long_query");
    for (max_tokens, tail_in_item_pass) in [(8192, true), (64, false)] {
        let mut scorer = with_budget(max_tokens);
        let input = scorer.preparer().prepare(&request).unwrap();
        let last_chunk = input.query.len() - 1536;
        assert_eq!(last_chunk < max_tokens, tail_in_item_pass, "a last chunk of {last_chunk} tokens");
        assert_close(&scored(&mut scorer, &[&input]).remove(0).scores, &expected, 1e-3, &format!("a pass budget of {max_tokens} tokens, against float64"));
        assert_eq!(passes(&scorer).0, if tail_in_item_pass { 3 } else { 4 }, "prefill passes under a budget of {max_tokens}");
        assert_eq!(scorer.stats().prefill_tokens.load(Relaxed) as usize, input.query.len());
    }
}

/// A batch of new queries (each one chunk, all of it its tail) whose tails and items fit one
/// pass is one pass, however much of it the tails take; one token more and the queries are
/// prefilled first. An item longer than the room the tails leave would get a pass of its own past
/// the budget, so there too the query is prefilled first. Every answer is what the request gets
/// alone under a large budget.
#[test]
fn new_queries_and_their_items_that_fit_one_pass_are_one_pass() {
    let with_budget = |max_tokens: usize| {
        let options = ScorerOptions { pass_budget: tally_core::PassBudget { max_tokens, ..Default::default() }, prefix_cache_bytes: 64 << 20, ..ScorerOptions::default() };
        Scorer::<Cpu>::load(&fixtures().join("models/tied-gqa"), &Default::default(), options).unwrap()
    };
    let limits = with_budget(64).preparer().limits();
    let request = |seed: u32, query_tokens: usize, item_lens: &[usize]| {
        let ids = |len: usize, salt: u32| (0..len as u32).map(|i| (seed * 31 + salt * 7 + i * 13) % 500 + 1).collect::<Vec<u32>>();
        let items = item_lens.iter().enumerate().map(|(i, &len)| ids(len, i as u32 + 1)).collect();
        ScoreInput::new(ids(query_tokens, 0), items, vec![3, 9, 27], seed % 2 == 0, false, limits).unwrap()
    };
    // Under 64 tokens a pass: tails of 26 + 26 and 4 items padded to 3 tokens fill it exactly;
    // tails of 26 + 27 leave 11 tokens, too few for the items' 12, so the items would take two
    // passes. A 60-token tail and a 10-token item: one pass each way, but 70 tokens with the tail.
    let cases: [(&[(usize, &[usize])], bool); 3] = [(&[(26, &[1, 3]), (26, &[2, 3])], true), (&[(26, &[1, 3]), (27, &[2, 3])], false), (&[(60, &[10])], false)];
    for (requests, one_pass) in cases {
        let inputs: Vec<ScoreInput> = requests.iter().enumerate().map(|(r, &(query_tokens, items))| request(r as u32, query_tokens, items)).collect();
        let inputs: Vec<&ScoreInput> = inputs.iter().collect();
        let mut scorer = with_budget(64);
        let batched = scored(&mut scorer, &inputs);
        let stats = scorer.stats();
        let passes = (stats.prefill_passes.load(Relaxed), stats.pass_items.count());
        assert_eq!(passes, if one_pass { (0, 1) } else { (1, 1) }, "(prefill passes, item passes) of queries {requests:?}");
        for (input, got) in inputs.iter().zip(&batched) {
            assert_eq!(got.prefix_cache, PrefixCacheUse::Miss);
            let alone = with_budget(8192).score_batch(&[input]).unwrap().remove(0);
            assert_close(&got.scores, &alone, 1e-4, "batched under 64 tokens a pass against alone");
        }
    }
}

/// One pass runs the tails of new queries and of a query resumed from the cache: each layer's
/// prefix is the new tails' rows around the cached part, and every query is then a view of it.
/// Each answer is what the request gets alone; the cache then holds each query as a copy of its
/// own, and the same batch again is all hits, with the same answers.
#[test]
fn a_pass_of_new_and_resumed_queries_caches_each_query_whole() {
    let mut cached = scorer(64 << 20);
    let limits = cached.preparer().limits();
    let ids = |len: usize, salt: u32| (0..len as u32).map(|i| (salt * 31 + i * 13) % 500 + 1).collect::<Vec<u32>>();
    let request = |query: Vec<u32>, salt: u32| ScoreInput::new(query, vec![ids(3, salt + 1), ids(5, salt + 2)], vec![3, 9, 27], false, false, limits).unwrap();
    let system = ids(20, 7);
    scored(&mut cached, &[&request(system.clone(), 0)]);
    let resumed = request([system.clone(), ids(10, 8)].concat(), 1);
    let inputs = [request(ids(15, 1), 2), resumed, request(ids(12, 2), 3)];
    let inputs: Vec<&ScoreInput> = inputs.iter().collect();
    let stats = cached.stats();
    let passes = || (stats.prefill_passes.load(Relaxed), stats.pass_items.count());
    let before = passes();
    let first = scored(&mut cached, &inputs);
    assert_eq!((passes().0 - before.0, passes().1 - before.1), (0, 1), "(prefill passes, item passes) of the batch");
    assert_eq!(first.iter().map(|s| s.prefix_cache).collect::<Vec<_>>(), [PrefixCacheUse::Miss, PrefixCacheUse::Partial, PrefixCacheUse::Miss]);
    for (input, got) in inputs.iter().zip(&first) {
        let alone = scorer(0).score_batch(&[input]).unwrap().remove(0);
        assert_close(&got.scores, &alone, 1e-4, "batched against alone");
    }
    let again = scored(&mut cached, &inputs);
    for (got, first) in again.iter().zip(&first) {
        assert_eq!(got.prefix_cache, PrefixCacheUse::Hit);
        assert_close(&got.scores, &first.scores, 1e-6, "a hit against the pass that cached it");
    }
}

/// A request nobody waits for any more is dropped between passes; the others keep their answers.
#[test]
fn abandoned_requests_stop_between_passes() {
    let options = ScorerOptions { pass_budget: tally_core::PassBudget { max_tokens: 8, ..Default::default() }, prefix_cache_bytes: 0, ..ScorerOptions::default() };
    let mut scorer = Scorer::<Cpu>::load(&fixtures().join("models/tied-gqa"), &Default::default(), options).unwrap();
    let (kept, expected) = case("tied_one_token_query_many_items");
    let (abandoned, _) = case("tied_long_query");
    let inputs: Vec<ScoreInput> = [&kept, &abandoned].iter().map(|request| scorer.preparer().prepare(request).unwrap()).collect();
    let inputs: Vec<&ScoreInput> = inputs.iter().collect();
    // Request 1's client leaves after the batch has started (its query and first pass).
    let asked = std::cell::Cell::new(0);
    let wanted = |r: usize| {
        if r == 1 {
            asked.set(asked.get() + 1);
        }
        r == 0 || asked.get() <= 2
    };
    let scores = scorer.score_batch_while(&inputs, &wanted).unwrap();
    assert!(asked.get() > 2, "the batch never asked again");
    assert!(scores[1].is_none());
    assert_close(&scores[0].as_ref().unwrap().scores, &expected, 1e-3, "against float64");
    let stats = scorer.stats();
    assert_eq!(stats.requests_abandoned.load(Relaxed), 1);
    assert_eq!(stats.items_scored.load(Relaxed), expected.len() as u64);
}
