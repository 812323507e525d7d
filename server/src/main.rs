//! `tally`: the command-line entry point. Parses arguments, picks a backend, and reports
//! errors as one readable line on stderr with a non-zero exit status.

mod backend;
mod bench;
mod cli;
mod http;
mod hub;
mod loading;
mod make_model;
mod score;
mod serve;
mod tile_candidates;
mod tile_picks;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Score(args) => score::run(args),
        cli::Command::Serve(args) => serve::run(args),
        cli::Command::Bench(command) => bench::run(command),
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
