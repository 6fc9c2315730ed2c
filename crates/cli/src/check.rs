//! `baton check`: what `baton agent` or `baton dispatch` would run with, checked without
//! starting anything (as `nginx -t`). It takes the same flags as the process, so a unit's
//! command line checks as it is, with `check` inserted.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Subcommand)]
pub enum Check {
    /// What `baton agent` would run with: keys and values, rules between settings,
    /// certificates with their keys and dates, the CA file, modes of files holding secrets.
    /// `baton check agent FILE` is `baton check agent --config FILE`; any agent flag may follow.
    Agent {
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
        #[command(flatten)]
        args: Box<baton_agent::AgentArgs>,
    },
    /// What `baton dispatch` would run with, the agents file it names included. `baton check
    /// dispatch FILE` is `baton check dispatch --config FILE`; any dispatch flag may follow.
    Dispatch {
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
        #[command(flatten)]
        args: Box<baton_dispatch::DispatchArgs>,
    },
    /// A dispatcher's agents file (`--agents-file`).
    Agents {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
}

/// Prints every finding; exits 0 when the process would start, 2 otherwise.
pub fn run(what: Check) -> anyhow::Result<ExitCode> {
    let report = match what {
        Check::Agent { file, mut args } => {
            args.config = config(file, args.config.take())?;
            baton_agent::check(*args)
        }
        Check::Dispatch { file, mut args } => {
            args.config = config(file, args.config.take())?;
            baton_dispatch::check(*args)
        }
        Check::Agents { file } => baton_dispatch::check_agents_file(&file),
    };
    print!("{}", report.render());
    Ok(ExitCode::from(report.exit_code()))
}

fn config(file: Option<PathBuf>, flag: Option<PathBuf>) -> anyhow::Result<Option<PathBuf>> {
    match (file, flag) {
        (Some(_), Some(_)) => Err(baton_ops::exit::invalid(anyhow::anyhow!(
            "give the file once: as FILE or as --config FILE"
        ))),
        (file, flag) => Ok(file.or(flag)),
    }
}
