//! `tally score`: a /v1/score request file in, the exact response JSON out; or a readable table
//! for text given on the command line.

use std::io::Read;

use anyhow::{Context, Result};
use tally_model::ScoringBackend;
use tally_core::{Items, Query, ScoreRequest};
use tally_engine::Scorer;

use crate::backend::{dispatch, WithBackend};
use crate::cli::ScoreArgs;

pub fn run(args: ScoreArgs) -> Result<()> {
    let device = args.device;
    print!("{}", dispatch(device, args)?);
    Ok(())
}

impl WithBackend for ScoreArgs {
    type Output = String;

    fn run<B: ScoringBackend>(self, device: B::Device) -> Result<String> {
        // A malformed request fails before a possibly large model is loaded.
        let request = self.request.as_deref().map(read_request).transpose()?;
        let mut scorer = crate::loading::load_scorer::<B>(&self.model, &device, 0, self.max_batch_tokens, &self.device)?;
        match request {
            Some(request) => Ok(serde_json::to_string(&scorer.score(&request)?)? + "\n"),
            None => table(&mut scorer, &self),
        }
    }
}

fn read_request(path: &std::path::Path) -> Result<ScoreRequest> {
    let text = if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("cannot read the request from stdin")?;
        text
    } else {
        std::fs::read_to_string(path).with_context(|| format!("cannot read request {}", path.display()))?
    };
    serde_json::from_str(&text).context("invalid request")
}

fn table<B: ScoringBackend>(scorer: &mut Scorer<B>, args: &ScoreArgs) -> Result<String> {
    let tokenizer = scorer.preparer().tokenizer()?;
    let label_ids = args.labels.iter().map(|label| tokenizer.label_id(label).map(i64::from)).collect::<Result<_, _>>()?;
    let request = ScoreRequest {
        query: Query::Text(args.query.clone().unwrap_or_default()),
        items: Items::Texts(args.items.clone()),
        label_token_ids: label_ids,
        apply_softmax: args.apply_softmax,
        item_first: args.item_first,
        model: None,
    };
    let response = scorer.score(&request)?;

    let item_width = args.items.iter().map(|item| item.chars().count()).max().unwrap_or(0).clamp(4, 48);
    let mut out = format!("{:<item_width$}", "item");
    for label in &args.labels {
        out += &format!("  {:>12}", format!("P({label})"));
    }
    out.push('\n');
    for (item, scores) in args.items.iter().zip(&response.scores) {
        let shown: String = if item.chars().count() > item_width { item.chars().take(item_width - 1).chain(['…']).collect() } else { item.clone() };
        out += &format!("{shown:<item_width$}");
        for score in scores {
            out += &format!("  {score:>12.6}");
        }
        out.push('\n');
    }
    Ok(out)
}
