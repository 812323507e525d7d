//! Command-line arguments.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::backend::DeviceArgs;

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
    /// Serve /v1/score, /v1/rerank and friends over HTTP.
    Serve(ServeArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Write a seeded random checkpoint of a released shape (bf16, HF layout) for benchmarks.
    MakeModel(MakeModelArgs),
}

#[derive(Args)]
pub struct MakeModelArgs {
    /// One of: tiny, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b, smollm2-135m, llama-3.2-1b.
    #[arg(long)]
    pub preset: String,
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// tokenizer.json to copy next to the weights, for presets with the Qwen3 vocabulary (default:
    /// the Qwen3 tokenizer in the repo's fixtures). Other presets get none: token-id requests only.
    #[arg(long, default_value = "tests/fixtures/models/wide-vocab/tokenizer.json")]
    pub tokenizer: PathBuf,
    /// Largest safetensors shard, in MiB.
    #[arg(long, default_value_t = 4096)]
    pub max_shard_mib: usize,
}

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Poisson load against a running server's /v1/score; prints latency percentiles and items/s.
    Load(tally_bench::load::LoadArgs),
    /// The seed benchmark scenarios (S1, S2) through the engine: items/s, ms per item, seconds.
    Scenario(ScenarioCommand),
    /// One layer's multi-item attention, every route (`--attention`), against dense-masked attention.
    Attention(AttentionCommand),
    /// Starts `tally serve` and runs mixed valid and invalid load at a multiple of its capacity
    /// for minutes; reports requests lost, status counts and the RSS slope.
    Soak(tally_bench::soak::SoakArgs),
    /// A PNG chart of a folder of results: scenarios beside the PyTorch peers, load's P99 latency.
    Chart(tally_bench::chart::ChartArgs),
    /// The flash tiles `--tile-tuning` times on this backend (narrowed by `--tile-candidates`),
    /// a line each: its name, then the flags that run it alone, untimed (the GPU suite's flash
    /// variants).
    TileCandidates(DeviceArgs),
}

/// `tally bench scenario`: the benchmark's flags and the backend's.
#[derive(Args)]
pub struct ScenarioCommand {
    #[command(flatten)]
    pub bench: tally_bench::scenario::ScenarioArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// `tally bench attention`: the benchmark's flags and the backend's.
#[derive(Args)]
pub struct AttentionCommand {
    #[command(flatten)]
    pub bench: tally_bench::attention::AttentionArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
}

#[derive(Args)]
pub struct ScoreArgs {
    /// A Hugging Face model directory (config.json, safetensors, tokenizer.json), a .gguf file,
    /// or a directory holding one.
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
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Most padded item tokens per forward pass; larger item lists are split into several
    /// passes. Default: what the device's free memory allows on CUDA (up to 32,768), else 8,192.
    #[arg(long)]
    pub max_batch_tokens: Option<usize>,
}

#[derive(Args)]
pub struct ServeArgs {
    /// A Hugging Face model directory, a .gguf file (or a directory holding one), or a Hugging
    /// Face repo id (downloaded into the HF cache once, then used offline).
    #[arg(long)]
    pub model: String,
    /// The names the server answers to (`model` in requests, `/v1/models`), as vLLM's and
    /// SGLang's flag: the first is the one responses carry. Default: the model's own name.
    #[arg(long, num_args = 1.., value_name = "NAME")]
    pub served_model_name: Vec<String>,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on; 0 picks a free one (the log says which).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Most padded item tokens per forward pass (and per batch of queued requests). Default:
    /// what the device's free memory allows on CUDA (up to 32,768), else 8,192.
    #[arg(long)]
    pub max_batch_tokens: Option<usize>,
    /// Device memory for prefilled queries kept across requests (MiB; 0 disables).
    #[arg(long, default_value_t = 512)]
    pub prefix_cache_mib: usize,
    /// Listen at once instead of first running a pass of every shape class the backend compiles
    /// or tunes for (GPU backends; the CPU has none): kernel compilation and matmul autotuning,
    /// minutes on a cold GPU, would otherwise land on the first requests.
    #[arg(long)]
    pub no_warmup: bool,
    /// Requests waiting for the model before new ones get 503.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Read each forward pass's scores before issuing the next (SGLang's
    /// --disable-overlap-schedule). By default on the GPU backends the next pass, or the next
    /// batch's first, is issued while the device runs the last, so the host's work between them
    /// does not leave the device idle (the CPU runs each op as it is issued: never overlapped).
    #[arg(long)]
    pub no_overlap: bool,
    /// Items per request before 413.
    #[arg(long, default_value_t = 4096)]
    pub max_items_per_request: usize,
    /// Label token ids per request before 413. Each pass's label logits (items × labels) are
    /// bounded by the pass planner whatever this is.
    #[arg(long, default_value_t = 4096)]
    pub max_labels_per_request: usize,
    /// Prompt tokens per request (query + items) before 413.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_tokens_per_request: usize,
    /// Bytes of query and item text per request before 413, checked before tokenizing.
    #[arg(long, default_value_t = 8 << 20)]
    pub max_text_bytes_per_request: usize,
    /// Request body size before 413.
    #[arg(long, default_value_t = 64 << 20)]
    pub max_body_bytes: usize,
    /// Seconds a request may wait and run before it fails with 504.
    #[arg(long, default_value_t = 120.0)]
    pub request_timeout_secs: f64,
    /// Open connections before new ones get 503 and are closed (keep it under the process's
    /// file-descriptor limit).
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    /// Seconds a client has to send a request's headers; also how long an idle keep-alive
    /// connection is kept.
    #[arg(long, default_value_t = 10.0)]
    pub header_timeout_secs: f64,
    /// Bytes of request line and headers; more gets 431.
    #[arg(long, default_value_t = 64 << 10)]
    pub max_header_bytes: usize,
    /// Seconds without progress while reading a request body before the request fails.
    #[arg(long, default_value_t = 30.0)]
    pub body_timeout_secs: f64,
    /// After SIGTERM/Ctrl-C, seconds for accepted requests to finish before exiting anyway (a
    /// second signal exits at once).
    #[arg(long, default_value_t = 30.0)]
    pub shutdown_timeout_secs: f64,
    /// Require `Authorization: Bearer <key>` on the API routes (401 otherwise).
    #[arg(long, env = "TALLY_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// With --api-key, also require it on the probes (/health, /live) and /metrics.
    #[arg(long)]
    pub protect_health_and_metrics: bool,
    /// Also give /metrics' picker gauges (requests waiting and running, prefix cache use) under
    /// vLLM's or SGLang's names, so a router's endpoint picker configured for that engine reads
    /// tally unchanged (repeat for both).
    #[arg(long, value_enum, value_name = "ENGINE")]
    pub metrics_compat: Vec<crate::http::metrics::MetricNames>,
    /// Let browser pages on this origin call the API (repeat for several; `*` for any).
    #[arg(long)]
    pub cors_allow_origin: Vec<String>,
    /// Also serve the browser page from this directory (what web/build.sh writes: web/dist) at
    /// /web/, next to the API; it scores on the visitor's WebGPU and can compare with this server.
    #[arg(long, value_name = "DIR")]
    pub web: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub rerank: RerankArgs,
}

/// How /v1/rerank turns (query, document) into a yes/no question. Defaults: Qwen3-Reranker.
#[derive(Args, Clone)]
pub struct RerankArgs {
    /// Query side of the prompt; `{instruction}` and `{query}` are substituted.
    #[arg(long, default_value = tally_engine::rerank::QWEN3_RERANKER_QUERY)]
    pub rerank_query_template: String,
    /// Document side of the prompt; `{document}` is substituted.
    #[arg(long, default_value = tally_engine::rerank::QWEN3_RERANKER_DOCUMENT)]
    pub rerank_document_template: String,
    /// Instruction used when a request gives none.
    #[arg(long, default_value = tally_engine::rerank::QWEN3_RERANKER_INSTRUCTION)]
    pub rerank_instruction: String,
    /// The "relevant" answer; must be one token.
    #[arg(long, default_value = "yes")]
    pub rerank_yes: String,
    /// The "not relevant" answer; must be one token.
    #[arg(long, default_value = "no")]
    pub rerank_no: String,
}

impl RerankArgs {
    pub fn template(&self) -> tally_engine::RerankTemplate {
        tally_engine::RerankTemplate {
            query: self.rerank_query_template.clone(),
            document: self.rerank_document_template.clone(),
            instruction: self.rerank_instruction.clone(),
            yes: self.rerank_yes.clone(),
            no: self.rerank_no.clone(),
        }
    }
}
