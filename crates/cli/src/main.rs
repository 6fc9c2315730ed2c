//! `baton`: one binary, one subcommand per role (see README.md).

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand};

mod check;
mod reference;

#[derive(Parser)]
#[command(
    name = "baton",
    version,
    about = "TLS termination cluster and TLS benchmark",
    after_help = "Diagnostic logs go to standard error. RUST_LOG selects what is logged, as \
                  tracing's EnvFilter reads it: a level (error, warn, info, debug, trace; \
                  default info) or per-module directives, e.g. \
                  RUST_LOG=warn,baton_agent=debug."
)]
struct Cli {
    /// Diagnostic logs (standard error) as `text` or `json` (one object a line: timestamp,
    /// level, target, fields). The access log is another thing: `baton agent --access-log`.
    /// Levels: RUST_LOG (default info).
    #[arg(long, value_name = "FORMAT", global = true, default_value = "text")]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

/// How diagnostic logs are written.
#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Terminate TLS 1.2/1.3 and serve HTTP (built-in responder or reverse proxy).
    Agent(Box<baton_agent::AgentArgs>),
    /// Measure TLS transactions per second of any TLS server.
    Bench(Box<baton_bench::BenchCli>),
    /// Scenario files for `baton bench --scenario`: `import-har` converts a browser's HAR export.
    Scenario(baton_bench::ScenarioCli),
    /// Record a browser's HTTPS requests into a scenario file (an intercepting proxy).
    Record(Box<baton_recorder::RecordArgs>),
    /// Spread TLS connections over agents by policy (the TLS-aware dispatcher).
    Dispatch(Box<baton_dispatch::DispatchArgs>),
    /// Local clusters under load, side by side: round robin with and without shared sessions,
    /// and session affinity (the CSSL paper's Scenario B).
    Demo(baton_lab::DemoArgs),
    /// Reproduce the source documents' experiments (docs/references.md) on this machine, baselines beside Baton.
    Lab(baton_lab::LabArgs),
    /// Start a local cluster: a dispatcher and N agents on this machine.
    Up(Box<baton_cluster::UpArgs>),
    /// Restart the agents of `baton up --admin ADDR` one at a time (each drains first), or with
    /// --restart hot-restart its dispatchers, and print what each took.
    Rollout(baton_cluster::RolloutArgs),
    /// Hold private keys in a process of their own and sign for agents (`baton agent
    /// --key-signer`).
    Signer(Box<baton_signer::SignerArgs>),
    /// Generate a ticket key file for `baton agent --ticket-key-file`.
    TicketKey(baton_agent::TicketKeyArgs),
    /// Check a configuration file without starting anything: every problem listed, exit 0 when
    /// the process would start, 2 when it would not.
    #[command(subcommand)]
    Check(check::Check),
    /// Write man pages, or print shell completions, for this binary.
    #[command(subcommand)]
    Generate(Generate),
}

#[derive(Subcommand)]
enum Generate {
    /// One man page per command (`baton.1`, `baton-agent.1`, ...) into DIR.
    Man {
        #[arg(value_name = "DIR")]
        dir: std::path::PathBuf,
    },
    /// A completion script for SHELL, on standard output.
    Completions {
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// The configuration reference (every command's flags and config keys) as Markdown, on
    /// standard output: docs/configuration.md.
    Reference,
}

/// The command line: the derived definitions, with an environment variable for every flag of
/// the long-running processes (`BATON_LISTEN` for `--listen`, `BATON_CLUSTER_KEY_FILE`, ...),
/// so a container or a unit can be configured without a command line. A flag given wins over
/// its variable, and the variable over the `--config` file.
fn command() -> clap::Command {
    let with_env = |cmd: clap::Command| {
        let flags: Vec<(clap::Id, String)> = cmd
            .get_arguments()
            .filter(|a| !a.is_hide_set() && a.get_env().is_none())
            .filter_map(|a| Some((a.get_id().clone(), a.get_long()?.to_string())))
            .filter(|(_, long)| long != "help" && long != "version")
            .collect();
        flags.into_iter().fold(cmd, |cmd, (id, long)| {
            let var = format!("BATON_{}", long.to_uppercase().replace('-', "_"));
            cmd.mut_arg(id, |a| a.env(var))
        })
    };
    let process = |cmd| switches(with_env(cmd));
    host_names(Cli::command())
        .mut_subcommand("agent", process)
        .mut_subcommand("dispatch", process)
        .mut_subcommand("check", |check| {
            check
                .mut_subcommand("agent", process)
                .mut_subcommand("dispatch", process)
        })
}

/// Every address flag of every command takes `HOST:PORT` as well as `IP:PORT`
/// (`baton_ops::addr`), with an error that says which.
fn host_names(cmd: clap::Command) -> clap::Command {
    let addrs: Vec<clap::Id> = cmd
        .get_arguments()
        .filter(|a| {
            a.get_value_parser().type_id() == std::any::TypeId::of::<std::net::SocketAddr>()
        })
        .map(|a| a.get_id().clone())
        .collect();
    let cmd = addrs.into_iter().fold(cmd, |cmd, id| {
        cmd.mut_arg(id, |a| a.value_parser(baton_ops::addr::parse))
    });
    let subs: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    subs.into_iter()
        .fold(cmd, |cmd, name| cmd.mut_subcommand(name, host_names))
}

/// The settings that are on or off (`value_name = "BOOL"`, `Option<bool>` so that a flag can
/// override its config file key either way) read as switches: `--tickets` alone is
/// `--tickets true`, and `--no-tickets` is `--tickets false` (see [`negations`]).
/// `--tickets false` still parses, as before.
fn switches(cmd: clap::Command) -> clap::Command {
    let bools: Vec<(clap::Id, String)> = cmd
        .get_arguments()
        .filter(|a| is_bool(a))
        .filter_map(|a| Some((a.get_id().clone(), a.get_long()?.to_string())))
        .collect();
    bools.into_iter().fold(cmd, |cmd, (id, long)| {
        cmd.mut_arg(id, |a| {
            a.num_args(0..=1)
                .default_missing_value("true")
                .value_name("BOOL")
        })
        .arg(
            clap::Arg::new(format!("no-{long}"))
                .long(format!("no-{long}"))
                .action(clap::ArgAction::SetTrue)
                .help(format!("The same as --{long} false")),
        )
    })
}

fn is_bool(a: &clap::Arg) -> bool {
    a.get_value_names()
        .is_some_and(|v| v.len() == 1 && v[0].as_str() == "BOOL")
}

/// `--no-NAME` rewritten to `--NAME=false` for every on/off setting NAME, before parsing: clap
/// has no negated flags, and the configuration structs keep one field per setting.
fn negations(
    cmd: &clap::Command,
    args: impl Iterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    fn collect(cmd: &clap::Command, names: &mut std::collections::HashSet<String>) {
        names.extend(
            cmd.get_arguments()
                .filter(|a| is_bool(a))
                .filter_map(|a| a.get_long().map(String::from)),
        );
        for sub in cmd.get_subcommands() {
            collect(sub, names);
        }
    }
    let mut names = std::collections::HashSet::new();
    collect(cmd, &mut names);
    args.map(
        |arg| match arg.to_str().and_then(|a| a.strip_prefix("--no-")) {
            Some(name) if names.contains(name) => format!("--{name}=false").into(),
            _ => arg,
        },
    )
    .collect()
}

/// `baton generate`.
fn generate(what: Generate) -> anyhow::Result<ExitCode> {
    use anyhow::Context as _;
    let mut cmd = command();
    match what {
        Generate::Man { dir } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(cmd, &dir)
                .with_context(|| format!("writing man pages into {}", dir.display()))?;
        }
        Generate::Completions { shell } => {
            // into memory first: clap_complete panics on a write error (a closed pipe)
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "baton", &mut script);
            std::io::Write::write_all(&mut std::io::stdout(), &script)
                .context("writing the completion script")?;
        }
        Generate::Reference => {
            std::io::Write::write_all(&mut std::io::stdout(), reference::markdown(&cmd).as_bytes())
                .context("writing the reference")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// mimalloc rather than the system allocator: a handshake allocates and frees many small,
/// short-lived buffers (rustls' messages and records, hyper's, the task), and malloc, free and
/// memcpy were about 10 % of an agent's CPU in a full handshake. Measured (both agents
/// at once, `scripts/bench-agent-ab`): CPU per full ECDSA handshake 3.5 % lower (median of 60
/// rounds), resumptions 1-3 % lower, and RSS per idle TLS 1.3 connection 4.7 kB against 5.2.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cmd = command();
    let matches = cmd
        .clone()
        .get_matches_from(negations(&cmd, std::env::args_os()));
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    init_tracing(cli.log_format);
    let result = match cli.command {
        Command::Agent(args) => baton_agent::run(*args).map(|()| ExitCode::SUCCESS),
        Command::Bench(args) => baton_bench::main(*args),
        Command::Scenario(args) => baton_bench::scenario_main(args).map(|()| ExitCode::SUCCESS),
        Command::Record(args) => baton_recorder::main(*args).map(|()| ExitCode::SUCCESS),
        Command::Dispatch(args) => baton_dispatch::run(*args).map(|()| ExitCode::SUCCESS),
        Command::Demo(args) => baton_lab::demo(args).map(|()| ExitCode::SUCCESS),
        Command::Lab(args) => baton_lab::lab(args).map(|()| ExitCode::SUCCESS),
        Command::Up(args) => baton_cluster::up(*args).map(|()| ExitCode::SUCCESS),
        Command::Rollout(args) => baton_cluster::rollout_cli(args).map(|()| ExitCode::SUCCESS),
        Command::Signer(args) => baton_signer::run(*args).map(|()| ExitCode::SUCCESS),
        Command::TicketKey(args) => {
            baton_agent::ticket_key_command(args).map(|()| ExitCode::SUCCESS)
        }
        Command::Generate(what) => generate(what),
        Command::Check(what) => check::run(what),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("baton: error: {e:#}");
            ExitCode::from(baton_ops::exit::code_of(&e))
        }
    }
}

/// Logs go to stderr; `RUST_LOG` selects levels (default: info).
fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder.json().init(),
    }
}
