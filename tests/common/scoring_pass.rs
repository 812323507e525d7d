//! One scoring pass of a fixture model through a backend, as the engine runs it (two queries
//! prefilled together, items packed after them, label log-probabilities), for the tests that
//! run whole models on the CubeCL backends.

use std::path::{Path, PathBuf};

use tally_model::{AttentionRoute, DecoderModel, ElementwiseRoute, ItemGroup, LabelRoute, LabelTable, ModelFiles, PrefixSplits, QueryBatch, Routes, ScoringBackend, TileShape};

/// The routes a whole model is run on: the backend's kernels (the row attention kernel with
/// Burn's elementwise ops; the tile kernels, the flash kernel also with its prefix walk in three
/// parts, and the cascade with its softmax kernel, with the fused elementwise and label
/// kernels), then plain Burn ops.
pub fn whole_model_routes() -> [Routes; 6] {
    let tiled = Routes { attention: AttentionRoute::Tiled(TileShape::default()), elementwise: ElementwiseRoute::Kernels, labels: LabelRoute::Kernel };
    let with = |attention| Routes { attention, ..tiled };
    let split = TileShape::default().with_splits(PrefixSplits::Parts(3));
    [Routes::default(), tiled, with(AttentionRoute::Flash(TileShape::default())), with(AttentionRoute::Flash(split)), with(AttentionRoute::Cascade), Routes::PLAIN]
}

/// Every fixture model's directory: beside the sources, or where `TALLY_FIXTURES` says (a test
/// binary carried to the GPU machine).
pub fn fixture_models() -> Vec<PathBuf> {
    let fixtures = std::env::var_os("TALLY_FIXTURES").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures"));
    let mut dirs: Vec<_> = std::fs::read_dir(fixtures.join("models")).unwrap().map(|e| e.unwrap().path()).collect();
    dirs.sort();
    assert!(dirs.len() >= 6, "fixture models are missing");
    dirs
}

/// Label log-probabilities on `routes` of three items after two queries prefilled together (a
/// short one whose last tokens run in the item pass, and one of two chunks), two items on the
/// first, one on the second, and of one item with no query at all (`item_first`),
/// `[items][labels]`.
pub fn label_logprobs<B: ScoringBackend>(model_dir: &Path, routes: Routes) -> Vec<f32> {
    let opened = ModelFiles::locate(model_dir).and_then(|files| files.open()).expect("fixture model opens");
    let device = B::Device::default();
    let mut model = DecoderModel::<B>::load(opened.config.clone(), opened.weights.as_ref(), &device, &mut |_, _| {}).expect("fixture model loads");
    model.set_routes(routes);
    let vocab = opened.config.vocab_size as u32;
    let token = |i: u32| (i * 37 + 11) % vocab;
    let queries: [Vec<u32>; 2] = [(0..23).map(token).collect(), (500..1030).map(token).collect()];
    let items: Vec<Vec<u32>> = [1, 6, 19].iter().map(|&len| (100..100 + len).map(token).collect()).collect();
    // The short query's last 3 tokens are its tail, which runs in the item pass.
    let prefixes = model.prefill_batch(vec![model.empty_query(), model.empty_query()], &[&queries[0][..20], &queries[1]]);
    let queries = prefixes.into_iter().chain([model.empty_query()]).collect();
    let mut batch = QueryBatch::with_tails(queries, vec![(20..23).map(token).collect(), Vec::new(), Vec::new()]);
    let groups = [ItemGroup { query: 0, items: vec![&items[0], &items[1]] }, ItemGroup { query: 1, items: vec![&items[2]] }, ItemGroup { query: 2, items: vec![&items[1]] }];
    let hidden = model.last_hidden(&mut batch, &groups);
    let labels = LabelTable::new(&[&[0, 1, vocab - 1], &[2, 3, 4], &[5, vocab / 2, 6], &[7, 8, vocab - 2]]);
    model.label_logprobs(hidden, &labels).into_data().convert::<f32>().to_vec().expect("f32 log-probabilities")
}
