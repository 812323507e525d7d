//! `tally make-model`: a random checkpoint of a preset shape, plus a tokenizer where the repo
//! has one for its vocabulary (the Qwen3 one).

use anyhow::{Context, Result};
use tally_model::{presets, random};

use crate::cli::MakeModelArgs;

/// The vocabulary of the tokenizer `--tokenizer` defaults to.
const QWEN3_VOCAB: usize = 151_936;

pub fn run(args: MakeModelArgs) -> Result<()> {
    let config = presets::preset(&args.preset)
        .with_context(|| format!("unknown preset {:?}; choose one of {}", args.preset, presets::PRESETS.join(", ")))?;
    random::write_random_checkpoint(&args.out, &config, args.seed, args.max_shard_mib << 20)?;
    if config.vocab_size == QWEN3_VOCAB {
        let tokenizer = args.out.join("tokenizer.json");
        std::fs::copy(&args.tokenizer, &tokenizer).with_context(|| format!("cannot copy tokenizer {} (see --tokenizer)", args.tokenizer.display()))?;
    }
    println!("wrote {} ({} preset, seed {})", args.out.display(), args.preset, args.seed);
    Ok(())
}
