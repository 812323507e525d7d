//! Loads a model for any command, with a progress bar on a terminal (hidden otherwise).

use std::path::Path;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use tally_core::PassBudget;
use tally_engine::{Scorer, ScorerOptions};
use tally_model::ScoringBackend;

use crate::backend::{device_name, DeviceArgs, TileTuning};
use crate::tile_picks::TilePicks;


/// Loads `model` with a prefix cache of `prefix_cache_bytes`, the routes and weight form `flags`
/// ask for, and passes of `max_batch_tokens` (`--max-batch-tokens`) or, if not given, as many as
/// the device's free memory allows, else [`PassBudget::default`]'s; the cascade's score cells a
/// pass may hold likewise from the device's memory where it tells; then, where the flags ask
/// (`--tile-tuning`), the flash kernel's tile timed on the device ([`Scorer::tune_flash_tile`])
/// or kept from an earlier start ([`TilePicks`]).
pub fn load_scorer<B: ScoringBackend>(model: &Path, device: &B::Device, prefix_cache_bytes: usize, max_batch_tokens: Option<usize>, flags: &DeviceArgs) -> Result<Scorer<B>> {
    let routes = flags.routes();
    let options = ScorerOptions { prefix_cache_bytes, weights: flags.weights.into(), ..ScorerOptions::default() };
    let bar = ProgressBar::new(0).with_style(ProgressStyle::with_template("loading {msg} {bar:30} {pos}/{len} layers {elapsed}").expect("a valid template"));
    bar.set_message(model.file_name().map_or_else(String::new, |name| name.to_string_lossy().into_owned()));
    let mut progress = |done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
    let scorer = Scorer::<B>::load_with_progress(model, device, options, &mut progress).with_context(|| format!("cannot load model {}", model.display()));
    bar.finish_and_clear();
    let mut scorer = scorer?;
    release_loading_memory();
    tracing::info!("weights: {}", scorer.weight_storage());
    scorer.set_routes(routes);
    // Whether Burn's fusion layer queues the ops (`--fusion`): the CPU has none.
    let fusion = match flags.backend {
        crate::backend::BackendKind::Cpu => "",
        _ if flags.fused() => ", through Burn's fusion",
        _ => ", unfused",
    };
    if scorer.routes() == routes {
        tracing::info!("hot paths: {routes}{fusion}");
    } else {
        tracing::info!("hot paths: {}{fusion} (asked for {routes}: plain Burn ops where this backend has no kernel)", scorer.routes());
    }
    let tokens = match (max_batch_tokens, scorer.device_pass_tokens()) {
        (Some(tokens), _) => tokens,
        (None, Some(tokens)) => {
            tracing::info!("passes of up to {tokens} item tokens, from the device's free memory");
            tokens
        }
        (None, None) => PassBudget::default().max_tokens,
    };
    scorer.set_max_pass_tokens(tokens);
    // Measured with the token budget's, before any pass has taken memory: a later reading would
    // count the pools the passes keep as used.
    if let Some(cells) = scorer.device_attention_cells() {
        scorer.set_max_attention_cells(cells);
    }
    if flags.tunes_tile() {
        pick_flash_tile(&mut scorer, flags)?;
    }
    Ok(scorer)
}

/// The flash tile an earlier start on this device, dtype, model shape and candidate list picked
/// ([`TilePicks`]), else (or with `--tile-tuning retime`) the candidates timed now and the pick
/// kept for later starts.
fn pick_flash_tile<B: ScoringBackend>(scorer: &mut Scorer<B>, flags: &DeviceArgs) -> Result<()> {
    let candidates: Vec<_> = flags.tuning_candidates()?.into_iter().map(|candidate| candidate.tile).collect();
    let shape = scorer.flash_tuning_shape();
    let key = TilePicks::key(&device_name(flags.backend), &format!("{:?}", flags.dtype), &shape, &candidates);
    let mut picks = TilePicks::default_path().map(TilePicks::open);
    let kept = picks.as_ref().filter(|_| flags.tile_tuning != TileTuning::Retime).and_then(|picks| Some((picks.path(), picks.get(&key, shape, &candidates)?)));
    if let Some((path, tuning)) = kept {
        let described = tuning.to_string();
        if scorer.adopt_flash_tile(tuning) {
            tracing::info!("kept in {}: {described}", path.display());
        }
        return Ok(());
    }
    let started = std::time::Instant::now();
    let Some(tuning) = scorer.tune_flash_tile(&candidates)? else { return Ok(()) };
    tracing::info!("timed in {:.1} s: {tuning}", started.elapsed().as_secs_f64());
    if let Some(picks) = &mut picks {
        // A pick not kept costs the next start a tuning, not this one its model.
        if let Err(error) = picks.keep(key, &tuning, &candidates) {
            tracing::warn!("the flash tile picked is not kept for later starts: {error:#}");
        }
    }
    Ok(())
}

/// Hands the loader's freed heap back to the system. Loading parses the file's metadata and
/// builds the tokenizer in many small allocations (a ~44 MB peak for SmolLM2's GGUF, most freed
/// at once); glibc keeps freed small chunks resident, and the passes' large buffers come from
/// fresh mappings, so without this they stay in the process's memory for its whole life
/// (SmolLM2: a peak of 176 MiB in `tally score`, of which 94 are the weights).
fn release_loading_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap memory to the system; it is safe to call at
    // any time from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}
