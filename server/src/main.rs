//! `tally`: the command-line entry point. Parses arguments, picks a backend, and reports
//! errors as one readable line on stderr with a non-zero exit status.

mod attention_bench;
mod backend;
mod cli;
mod http;
mod hub;
mod load;
mod loading;
mod make_model;
mod report;
mod rng;
mod scenario;
mod score;
mod serve;
mod soak;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Score(args) => score::run(args),
        cli::Command::Serve(args) => serve::run(args),
        cli::Command::Bench(cli::BenchCommand::Load(args)) => load::run(args),
        cli::Command::Bench(cli::BenchCommand::Scenario(args)) => scenario::run(args),
        cli::Command::Bench(cli::BenchCommand::Attention(args)) => attention_bench::run(args),
        cli::Command::Bench(cli::BenchCommand::Soak(args)) => soak::run(args),
        cli::Command::MakeModel(args) => make_model::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
