//! Command-line arguments.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::backend::BackendKind;

#[derive(Parser)]
#[command(name = "tally", version, about = "Scores label tokens after query + item with a decoder LLM")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Score items against a query, from a /v1/score request file or from text arguments.
    Score(ScoreArgs),
}

#[derive(Args)]
pub struct ScoreArgs {
    /// Model directory in Hugging Face layout (config.json, safetensors, tokenizer.json).
    #[arg(long)]
    pub model: PathBuf,
    /// A /v1/score request as JSON (`-` reads stdin); prints the response JSON.
    #[arg(long, conflicts_with_all = ["query", "items", "labels"])]
    pub request: Option<PathBuf>,
    /// Query text (table mode).
    #[arg(long, required_unless_present = "request")]
    pub query: Option<String>,
    /// Item text; repeat for several items (table mode).
    #[arg(long = "item", required_unless_present = "request")]
    pub items: Vec<String>,
    /// Label text that must be a single token, e.g. `--label Yes --label No` (table mode).
    #[arg(long = "label", required_unless_present = "request")]
    pub labels: Vec<String>,
    /// Softmax over the labels only instead of full-vocabulary probabilities (table mode).
    #[arg(long)]
    pub apply_softmax: bool,
    /// Score item + query instead of query + item (table mode).
    #[arg(long)]
    pub item_first: bool,
    #[arg(long, value_enum, default_value_t = BackendKind::default())]
    pub backend: BackendKind,
    /// Most padded item tokens per forward pass; larger item lists are split into several passes.
    #[arg(long, default_value_t = tally_core::PassBudget::default().max_tokens)]
    pub max_batch_tokens: usize,
}
