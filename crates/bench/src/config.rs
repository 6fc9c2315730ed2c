//! `baton bench` settings: flags, the same keys in a TOML file (the SSL benchmark tool paper's text configuration),
//! and the resolved configuration.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::scenario::{file_and_weight, Mix, Scenario, Think};
use crate::sweep::Sweep;
use crate::threshold::Threshold;

/// `baton bench URL`: TLS transactions per second with exact handshake accounting.
#[derive(clap::Args, Debug, Default, Clone, Deserialize)]
#[command(after_help = AFTER_HELP)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct BenchArgs {
    /// https://HOST:PORT/PATH to load.
    #[arg(value_name = "URL")]
    pub url: Option<String>,
    /// TOML file with any of these settings (keys are the flag names); flags override it.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Requests in total, as h2load's -n counts them: -n / --requests-per-conn connections
    /// (give a multiple of it). Default 1000 connections unless -d is given.
    #[arg(
        short = 'n',
        long = "requests",
        value_name = "N",
        conflicts_with = "connections"
    )]
    pub requests: Option<u64>,
    /// Connections (transactions) in total, each making --requests-per-conn requests (what
    /// -n counted before it counted requests; the same with one request per connection).
    #[arg(long = "connections", value_name = "N")]
    pub connections: Option<u64>,
    /// Run for this long instead (e.g. 10s, 2m).
    #[arg(short = 'd', long = "duration", value_name = "DURATION")]
    pub duration: Option<String>,
    /// Virtual clients, each a loop of connections. Default 10.
    #[arg(short = 'c', long = "clients", value_name = "C")]
    pub clients: Option<usize>,
    /// Requests per connection (1 = one transaction per connection; more = keep-alive).
    #[arg(long, value_name = "K")]
    pub requests_per_conn: Option<u32>,
    /// HTTP method. Default GET.
    #[arg(long, value_name = "METHOD")]
    pub method: Option<String>,
    /// Extra request header `Name: value` (repeatable).
    #[arg(short = 'H', long = "header", value_name = "HEADER")]
    pub header: Vec<String>,
    /// Request body.
    #[arg(long, value_name = "TEXT")]
    pub body: Option<String>,
    /// Replay this scenario file on each connection (its requests in order, keep-alive;
    /// repeatable: connections take the files round-robin, or by `FILE:WEIGHT`). The URL then
    /// gives only the host. See `baton scenario import-har`.
    #[arg(long, value_name = "FILE[:WEIGHT]")]
    pub scenario: Vec<String>,
    /// Scenario think times: recorded (default), none, or a scale factor (0.5 = half).
    #[arg(long, value_name = "recorded|none|SCALE")]
    pub think: Option<String>,
    /// Plain URL runs with --requests-per-conn > 1: pause this long (e.g. 300ms) between the
    /// requests of one keep-alive connection, as an HTTP/1.1 client that holds its connection
    /// and sends a request every so often. Not counted in any latency. Scenarios: --think.
    #[arg(long, value_name = "DURATION")]
    pub think_time: Option<String>,
    /// TLS client engine: rustls (default) or openssl (the system libssl: TLS 1.0-1.3, RSA key
    /// exchange, DHE, CBC, anonymous suites; --suite then takes OpenSSL cipher strings).
    #[arg(long, value_name = "ENGINE")]
    pub engine: Option<String>,
    /// TLS version: 1.2 or 1.3 (with --engine openssl also 1.0, 1.1). Default: all offered.
    #[arg(long, value_name = "V")]
    pub tls_version: Option<String>,
    /// Cipher suite to offer (IANA or OpenSSL name; repeatable or comma separated). With --engine
    /// openssl: OpenSSL cipher names or strings (e.g. AES128-SHA, 'ADH-AES128-SHA:@SECLEVEL=0'),
    /// TLS_* names for TLS 1.3.
    #[arg(long, value_name = "SUITE", value_delimiter = ',')]
    pub suite: Vec<String>,
    /// Key exchange group to offer (x25519, secp256r1, secp384r1, x25519mlkem768; repeatable or
    /// comma separated).
    #[arg(long, value_name = "GROUP", value_delimiter = ',')]
    pub group: Vec<String>,
    /// Signature scheme to accept from the server (e.g. ecdsa_secp256r1_sha256,
    /// rsa_pss_rsae_sha256, rsa_pkcs1_sha256, ed25519; repeatable or comma separated).
    #[arg(long, value_name = "SCHEME", value_delimiter = ',')]
    pub sigalg: Vec<String>,
    /// Server name to send (SNI). Default: the URL's host.
    #[arg(long, value_name = "NAME")]
    pub sni: Option<String>,
    /// ALPN protocol: http/1.1 (default) or h2.
    #[arg(long, value_name = "PROTO")]
    pub alpn: Option<String>,
    /// HTTP/2 streams in flight per connection, as h2load's -m: a connection's
    /// --requests-per-conn requests go up to N at a time. Needs --alpn h2. Default 1.
    #[arg(short = 'm', long, value_name = "N")]
    pub max_concurrent_streams: Option<u32>,
    /// CA certificates (PEM) to verify the server with. Default: the system's.
    #[arg(long, value_name = "PEM")]
    pub ca: Option<PathBuf>,
    /// Do not verify the server certificate.
    #[arg(long)]
    #[serde(default)]
    pub insecure: bool,
    /// TLS 1.3 0-RTT: a resumed connection sends its first request as early data where the
    /// server's ticket allows it (sent again after the handshake if the server refuses it).
    /// HTTP/1.1, rustls engine.
    #[arg(long)]
    #[serde(default)]
    pub early_data: bool,
    /// Client certificate chain (PEM), for mutual TLS.
    #[arg(long, value_name = "PEM")]
    pub cert: Option<PathBuf>,
    /// Client private key (PEM).
    #[arg(long, value_name = "PEM")]
    pub key: Option<PathBuf>,
    /// Every K-th connection of a virtual client is a full handshake, the others resume the
    /// client's last session (3 = the SSL benchmark tool paper's 1 full : 2 resumed). Default 1 (all full) with
    /// --resume none, else 3.
    #[arg(long, value_name = "K")]
    pub full_every: Option<u64>,
    /// How to resume: none (every handshake full), id (TLS 1.2: session ids only, no tickets),
    /// ticket or auto (TLS 1.2: tickets, else session id). TLS 1.3 always resumes with the
    /// server's tickets (stateful or not, the client cannot tell). Default auto.
    #[arg(long, value_name = "MODE")]
    pub resume: Option<String>,
    /// Open loop: start this many transactions per second in total, latency measured from
    /// when each should have started (coordinated omission corrected).
    #[arg(long, value_name = "R")]
    pub rate: Option<f64>,
    /// Bind virtual clients to these source addresses in turn (repeatable or comma separated, e.g.
    /// 127.0.0.2).
    #[arg(long, value_name = "IP", value_delimiter = ',')]
    pub source_ip: Vec<IpAddr>,
    /// Per-phase timeout (connect, handshake, response). Default 10s.
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    /// Write the result as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write a self-contained HTML report (tables and charts, nothing fetched) to this file.
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
    /// A Baton agent's metrics URL (http://HOST:PORT/metrics), scraped before and after.
    #[arg(long, value_name = "URL")]
    pub server_metrics: Vec<String>,
    /// Pass/fail criterion (repeatable): METRIC OP VALUE, e.g. 'p99<200ms',
    /// 'handshake.p50<=10ms', 'failed<1%', 'failed<=5', 'handshakes_per_sec>500'. Exit 1 when
    /// one is crossed. See below.
    #[arg(long, value_name = "EXPR", value_parser = crate::threshold::parse)]
    pub threshold: Vec<Threshold>,
    /// Serve live figures during the run at http://ADDR/metrics (Prometheus): requests,
    /// failures, handshakes by kind, request latency, connections open.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Runtime worker threads. Default: one per CPU.
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// No progress bar, no summary (JSON only).
    #[arg(long)]
    #[serde(default)]
    pub quiet: bool,
    /// Response sizes to sweep, one run each (e.g. 128,1k,4k,8k,16k,32k): the URL's `{size}`
    /// becomes the size in bytes, and one table compares the runs.
    #[arg(long, value_name = "SIZES", value_delimiter = ',')]
    pub body_size: Vec<String>,
    /// Config file only: `[sweep]` lists (body-size, suite, group, sigalg, tls-version, url)
    /// run as a matrix, one run per combination.
    #[arg(skip)]
    pub sweep: Option<Sweep>,
}

const AFTER_HELP: &str = "\
Handshakes are counted as negotiated: a resumption the server refused is full, and also
`resume_refused`. Every connection is one of full, resumed or failed handshake, or never
connected (connect error or timeout); every request is ok (2xx/3xx), failed by status, or
failed unanswered.

--json FILE: handshakes, negotiated (version suite group: count), requests (ok, failed,
unsent, by_status), errors by class (connect, tls, timeout, http, io, closed) and the first
cause of each (error_examples), latency_ms per phase (connect, handshake, ttfb, total; and
request: each request of a connection, from when it started to its last byte, think time
and open-loop lag excluded: p50 p90 p99 p999 max mean count), tps, rps, bytes, duration_s, client_cpu_s, the effective config, the
--server-metrics deltas, and raw histograms (microseconds, [value, count] pairs of HdrHistogram
buckets, 3 significant figures) that add up exactly across runs, and a timeline (transactions
completed and failed per 100 ms). --report FILE.html: the same as one self-contained page.

--body-size LIST (URL with {size}) or a [sweep] table in --config: a matrix of runs, one table.
Subcommands: `baton bench merge RUN.json...` (several machines' runs as one, exactly) and
`baton bench find-max URL` (the highest rate at zero loss in a steady state); see their --help.

--threshold METRIC OP VALUE (repeatable; `threshold = [...]` in --config), OP one of < <= > >=:
  p50 p90 p99 p99.9 max mean   latency of each request (VALUE 200ms, 1.5s, 800us); prefix a
                               phase for another: connect. handshake. ttfb. total.
  failed                       failed requests: VALUE N% of the requests, or N requests
  tps rps handshakes_per_sec   per second (VALUE 500 or 500/s)
Each is reported after the run (and in --json `thresholds`) as passed or CROSSED with the
measured figure; one that the run did not measure (no latency recorded) is crossed.

-n counts requests as h2load's -n does (connections = N / --requests-per-conn); --connections N
counts connections. -m N (with --alpn h2): N streams in flight per connection.

Exit status: 0 when at least one request succeeded and every --threshold passed, 1 when none
succeeded (a dead or refusing target) or a threshold was crossed, 2 on a bad flag, threshold,
config file or URL.";

/// How the client resumes sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Resume {
    None,
    Id,
    Ticket,
    Auto,
}

/// Which TLS library the client uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    #[default]
    Rustls,
    Openssl,
}

/// The resolved configuration (also written into the JSON result, and read back by `merge`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchConfig {
    pub url: String,
    pub host: String,
    pub port: u16,
    pub path: String,
    pub connections: Option<u64>,
    pub duration_s: Option<f64>,
    pub clients: usize,
    /// 0 when the run's scenarios differ in length (each connection makes its own's).
    pub requests_per_conn: u32,
    pub method: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<String>,
    /// `--scenario`: the files, their weights and request counts (absent without).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scenarios: Vec<ScenarioRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub think: Option<String>,
    /// `--think-time`: the pause between the requests of a plain keep-alive connection, in
    /// seconds (0 without; absent in results of older versions).
    #[serde(default)]
    pub think_time_s: f64,
    /// The parsed scenarios with their weights.
    #[serde(skip)]
    pub loaded: Vec<(Scenario, u32)>,
    /// (absent in results written before there was a choice: rustls)
    #[serde(default)]
    pub engine: Engine,
    pub tls_version: Option<String>,
    pub suites: Vec<String>,
    pub groups: Vec<String>,
    pub sigalgs: Vec<String>,
    pub sni: String,
    pub alpn: String,
    pub ca: Option<PathBuf>,
    pub insecure: bool,
    /// `--early-data` (absent in results of older versions: off).
    #[serde(default)]
    pub early_data: bool,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// `-m`: HTTP/2 streams in flight per connection (1 in results of older versions).
    #[serde(default = "one")]
    pub streams: u32,
    /// `--threshold`, canonically written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thresholds: Vec<Threshold>,
    /// `--metrics`: where live figures are served.
    #[serde(skip)]
    pub metrics: Option<SocketAddr>,
    pub full_every: u64,
    pub resume: Resume,
    pub rate: Option<f64>,
    pub source_ips: Vec<IpAddr>,
    pub timeout_s: f64,
    #[serde(skip)]
    pub json: Option<PathBuf>,
    #[serde(skip)]
    pub report: Option<PathBuf>,
    pub server_metrics: Vec<String>,
    pub workers: usize,
    #[serde(skip)]
    pub quiet: bool,
}

fn one() -> u32 {
    1
}

/// A scenario file of a run, as the JSON result names it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScenarioRef {
    pub file: String,
    pub weight: u32,
    pub requests: u32,
}

impl BenchConfig {
    /// The scenario mix, when `--scenario` was given.
    pub fn mix(&self) -> anyhow::Result<Option<Mix>> {
        if self.loaded.is_empty() {
            return Ok(None);
        }
        let think = Think::parse(self.think.as_deref().unwrap_or("recorded"))?;
        Ok(Some(Mix::new(&self.loaded, think, &self.sni)))
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_s)
    }

    /// `--think-time` (zero without).
    pub fn think_time(&self) -> Duration {
        Duration::from_secs_f64(self.think_time_s)
    }
}

/// A positive duration, in the grammar of every `baton` flag (`baton_ops::duration`).
pub fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let d = s
        .parse::<baton_ops::duration::HumanDuration>()
        .map_err(anyhow::Error::msg)?
        .0;
    if d.is_zero() {
        bail!("`{}` must be a positive duration", s.trim());
    }
    Ok(d)
}

impl BenchArgs {
    /// The flags over the `--config` file's settings (read once: the result has no `config`).
    pub fn load(self) -> anyhow::Result<BenchArgs> {
        let Some(path) = self.config.clone() else {
            return Ok(self);
        };
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        let file: BenchArgs =
            toml::from_str(&text).with_context(|| format!("config file {}", path.display()))?;
        Ok(BenchArgs {
            config: None,
            ..self.over(file)
        })
    }

    /// Everything swept: the `--body-size` flag and the config file's `[sweep]`.
    pub fn sweep(&self) -> Sweep {
        let mut s = self.sweep.clone().unwrap_or_default();
        if !self.body_size.is_empty() {
            s.body_size = self.body_size.clone();
        }
        s
    }

    pub fn resolve(self) -> anyhow::Result<BenchConfig> {
        let a = self.load()?;
        let url = a
            .url
            .clone()
            .context("no URL: give https://HOST:PORT/PATH")?;
        let (host, port, path) = split_url(&url)?;
        let resume = match a.resume.as_deref().unwrap_or("auto") {
            "none" => Resume::None,
            "id" => Resume::Id,
            "ticket" => Resume::Ticket,
            "auto" => Resume::Auto,
            other => bail!("--resume `{other}`: none, id, ticket or auto"),
        };
        let full_every = a
            .full_every
            .unwrap_or(if resume == Resume::None { 1 } else { 3 });
        if full_every == 0 {
            bail!("--full-every must be at least 1");
        }
        if (a.connections.is_some() || a.requests.is_some()) && a.duration.is_some() {
            bail!("give -n (or --connections) or -d, not both");
        }
        if a.connections.is_some() && a.requests.is_some() {
            bail!("give -n (requests) or --connections, not both");
        }
        let duration_s = a
            .duration
            .as_deref()
            .map(parse_duration)
            .transpose()?
            .map(|d| d.as_secs_f64());
        let connections = match (a.connections, duration_s) {
            (Some(0), _) => bail!("--connections must be at least 1"),
            (Some(n), _) => Some(n),
            (None, Some(_)) => None,
            (None, None) => Some(1000),
        };
        let clients = a.clients.unwrap_or(10);
        if clients == 0 {
            bail!("-c must be at least 1");
        }
        let (loaded, scenarios) = load_scenarios(&a.scenario)?;
        if let Some(t) = &a.think {
            if loaded.is_empty() {
                bail!("--think is for --scenario");
            }
            Think::parse(t)?;
        }
        let requests_per_conn = match scenarios.first() {
            None => a.requests_per_conn.unwrap_or(1),
            Some(_) if a.requests_per_conn.is_some() => {
                bail!("--requests-per-conn and --scenario: a scenario's requests are its connection's")
            }
            // one count for all, or 0: each connection makes its scenario's (exact per
            // connection; `requests.expected` adds them up)
            Some(first) if scenarios.iter().all(|s| s.requests == first.requests) => first.requests,
            Some(_) => 0,
        };
        if requests_per_conn == 0 && scenarios.is_empty() {
            bail!("--requests-per-conn must be at least 1");
        }
        let connections = match a.requests {
            None => connections,
            Some(0) => bail!("-n must be at least 1"),
            Some(_) if requests_per_conn == 0 => bail!(
                "-n counts requests, and these scenarios differ in length: give --connections"
            ),
            Some(n) if n % u64::from(requests_per_conn) != 0 => bail!(
                "-n {n} requests at {requests_per_conn} per connection: -n counts requests (as \
                 h2load's), give a multiple of {requests_per_conn}, or --connections"
            ),
            Some(n) => {
                let c = n / u64::from(requests_per_conn);
                if requests_per_conn > 1 {
                    // what -n meant before, where it differs: said once per run
                    tracing::warn!(
                        "-n {n} counts requests, as h2load's -n: {c} connections of \
                         {requests_per_conn} requests (--connections counts connections)"
                    );
                }
                Some(c)
            }
        };
        let streams = a.max_concurrent_streams.unwrap_or(1);
        if streams == 0 {
            bail!("-m must be at least 1");
        }
        let think_time_s = match a.think_time.as_deref().map(parse_duration).transpose()? {
            None => 0.0,
            Some(_) if !scenarios.is_empty() => {
                bail!("--think-time is for plain URL runs; a scenario's think times are its own (--think)")
            }
            Some(_) if requests_per_conn < 2 => {
                bail!("--think-time is the pause between the requests of one connection: give --requests-per-conn 2 or more")
            }
            Some(d) => d.as_secs_f64(),
        };
        if let Some(r) = a.rate {
            if !(r > 0.0 && r.is_finite()) {
                bail!("--rate must be a positive number of transactions per second");
            }
        }
        let engine = match a.engine.as_deref().unwrap_or("rustls") {
            "rustls" => Engine::Rustls,
            "openssl" => Engine::Openssl,
            other => bail!("--engine `{other}`: rustls or openssl"),
        };
        if let Some(v) = &a.tls_version {
            let legacy = engine == Engine::Openssl && (v == "1.0" || v == "1.1");
            if v != "1.2" && v != "1.3" && !legacy {
                bail!("--tls-version `{v}`: 1.2 or 1.3 (older versions need --engine openssl)");
            }
        }
        if a.cert.is_some() != a.key.is_some() {
            bail!("--cert and --key go together");
        }
        if a.insecure && a.ca.is_some() {
            bail!("--insecure and --ca contradict each other");
        }
        let alpn = a.alpn.clone().unwrap_or_else(|| "http/1.1".into());
        if alpn != "http/1.1" && alpn != "h2" {
            bail!("--alpn `{alpn}`: http/1.1 or h2");
        }
        let mut headers = Vec::new();
        for h in &a.header {
            let (name, value) = h
                .split_once(':')
                .with_context(|| format!("-H `{h}`: expected `Name: value`"))?;
            headers.push((name.trim().to_string(), value.trim().to_string()));
        }
        let timeout_s = a
            .timeout
            .as_deref()
            .map(parse_duration)
            .transpose()?
            .map_or(10.0, |d| d.as_secs_f64());
        if a.early_data && engine == Engine::Openssl {
            bail!("--early-data needs --engine rustls");
        }
        if streams > 1 && alpn != "h2" {
            bail!("-m {streams}: streams in flight are HTTP/2's; add --alpn h2");
        }
        if streams > 1 && (!scenarios.is_empty() || think_time_s > 0.0) {
            bail!("-m {streams} sends a connection's requests at once: not with --scenario or --think-time, which pace them");
        }
        if a.early_data && alpn == "h2" {
            bail!(
                "--early-data sends the first HTTP/1.1 request as early data: not with --alpn h2"
            );
        }
        Ok(BenchConfig {
            sni: a.sni.clone().unwrap_or_else(|| host.clone()),
            url,
            host,
            port,
            path,
            connections,
            duration_s,
            clients,
            requests_per_conn,
            method: a
                .method
                .clone()
                .unwrap_or_else(|| "GET".into())
                .to_ascii_uppercase(),
            headers,
            body: a.body,
            scenarios,
            think: a.think,
            think_time_s,
            loaded,
            engine,
            tls_version: a.tls_version,
            suites: a.suite,
            groups: a.group,
            sigalgs: a.sigalg,
            alpn,
            ca: a.ca,
            insecure: a.insecure,
            early_data: a.early_data,
            cert: a.cert,
            key: a.key,
            streams,
            thresholds: a.threshold,
            metrics: a.metrics,
            full_every,
            resume,
            rate: a.rate,
            source_ips: a.source_ip,
            timeout_s,
            json: a.json,
            report: a.report,
            server_metrics: a.server_metrics,
            workers: a
                .workers
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
                .max(1),
            quiet: a.quiet,
        })
    }

    fn over(self, f: Self) -> Self {
        fn list<T>(a: Vec<T>, b: Vec<T>) -> Vec<T> {
            if a.is_empty() {
                b
            } else {
                a
            }
        }
        Self {
            config: self.config,
            url: self.url.or(f.url),
            // -n and --connections are one setting: a flag overrides the file's either
            requests: self.requests.or(if self.connections.is_some() {
                None
            } else {
                f.requests
            }),
            connections: self.connections.or(if self.requests.is_some() {
                None
            } else {
                f.connections
            }),
            max_concurrent_streams: self.max_concurrent_streams.or(f.max_concurrent_streams),
            threshold: list(self.threshold, f.threshold),
            metrics: self.metrics.or(f.metrics),
            duration: self.duration.or(f.duration),
            clients: self.clients.or(f.clients),
            requests_per_conn: self.requests_per_conn.or(f.requests_per_conn),
            method: self.method.or(f.method),
            header: list(self.header, f.header),
            body: self.body.or(f.body),
            scenario: list(self.scenario, f.scenario),
            think: self.think.or(f.think),
            think_time: self.think_time.or(f.think_time),
            engine: self.engine.or(f.engine),
            tls_version: self.tls_version.or(f.tls_version),
            suite: list(self.suite, f.suite),
            group: list(self.group, f.group),
            sigalg: list(self.sigalg, f.sigalg),
            sni: self.sni.or(f.sni),
            alpn: self.alpn.or(f.alpn),
            ca: self.ca.or(f.ca),
            insecure: self.insecure || f.insecure,
            early_data: self.early_data || f.early_data,
            cert: self.cert.or(f.cert),
            key: self.key.or(f.key),
            full_every: self.full_every.or(f.full_every),
            resume: self.resume.or(f.resume),
            rate: self.rate.or(f.rate),
            source_ip: list(self.source_ip, f.source_ip),
            timeout: self.timeout.or(f.timeout),
            json: self.json.or(f.json),
            report: self.report.or(f.report),
            server_metrics: list(self.server_metrics, f.server_metrics),
            workers: self.workers.or(f.workers),
            quiet: self.quiet || f.quiet,
            body_size: list(self.body_size, f.body_size),
            sweep: self.sweep.or(f.sweep),
        }
    }
}

/// The scenarios with their weights, and how the JSON names them.
type Loaded = (Vec<(Scenario, u32)>, Vec<ScenarioRef>);

/// `--scenario FILE[:WEIGHT]...`: read and checked. Their request counts may differ: each
/// connection's requests are counted against its own scenario's length.
fn load_scenarios(specs: &[String]) -> anyhow::Result<Loaded> {
    let mut loaded = Vec::new();
    let mut refs: Vec<ScenarioRef> = Vec::new();
    for spec in specs {
        let (file, weight) = file_and_weight(spec)?;
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading scenario file {file}"))?;
        let s = crate::scenario::parse(&text).with_context(|| format!("scenario file {file}"))?;
        let requests = u32::try_from(s.requests.len()).context("too many requests")?;
        refs.push(ScenarioRef {
            file,
            weight,
            requests,
        });
        loaded.push((s, weight));
    }
    Ok((loaded, refs))
}

/// `https://host:port/path` -> (host, port, path). Only https.
fn split_url(url: &str) -> anyhow::Result<(String, u16, String)> {
    let rest = url
        .strip_prefix("https://")
        .with_context(|| format!("`{url}`: only https:// URLs (this is a TLS benchmark)"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, "/".to_string()),
    };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, p) = v6
            .split_once(']')
            .with_context(|| format!("`{url}`: bad IPv6 host"))?;
        (h.to_string(), p.strip_prefix(':').unwrap_or("443"))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p),
            None => (authority.to_string(), "443"),
        }
    };
    if host.is_empty() {
        bail!("`{url}`: no host");
    }
    let port: u16 = port.parse().with_context(|| format!("`{url}`: bad port"))?;
    Ok((host, port, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(url: &str) -> BenchArgs {
        BenchArgs {
            url: Some(url.into()),
            ..Default::default()
        }
    }

    #[test]
    fn think_time_is_for_plain_keepalive_runs() {
        let c = BenchArgs {
            requests_per_conn: Some(4),
            think_time: Some("250ms".into()),
            ..args("https://a:1/")
        }
        .resolve()
        .unwrap();
        assert_eq!(c.think_time(), Duration::from_millis(250));
        assert_eq!(
            args("https://a:1/").resolve().unwrap().think_time(),
            Duration::ZERO
        );
        // from a config file too
        let file: BenchArgs =
            toml::from_str("url = \"https://h:2/\"\nrequests-per-conn = 2\nthink-time = \"1s\"\n")
                .unwrap();
        assert_eq!(file.resolve().unwrap().think_time_s, 1.0);
        for bad in [
            // one request per connection: nothing to pause between
            BenchArgs {
                think_time: Some("250ms".into()),
                ..args("https://a:1/")
            },
            BenchArgs {
                requests_per_conn: Some(2),
                think_time: Some("0ms".into()),
                ..args("https://a:1/")
            },
            BenchArgs {
                requests_per_conn: Some(2),
                think_time: Some("often".into()),
                ..args("https://a:1/")
            },
        ] {
            assert!(bad.resolve().is_err());
        }
    }

    #[test]
    fn urls() {
        assert_eq!(
            split_url("https://localhost:8443/x?y=1").unwrap(),
            ("localhost".into(), 8443, "/x?y=1".into())
        );
        assert_eq!(
            split_url("https://example.test").unwrap(),
            ("example.test".into(), 443, "/".into())
        );
        assert_eq!(
            split_url("https://[::1]:9/").unwrap(),
            ("::1".into(), 9, "/".into())
        );
        assert!(split_url("http://x/").is_err());
        assert!(split_url("https://x:y/").is_err());
    }

    #[test]
    fn defaults_and_errors() {
        let c = args("https://127.0.0.1:1/").resolve().unwrap();
        assert_eq!(
            (c.connections, c.clients, c.full_every, c.resume),
            (Some(1000), 10, 3, Resume::Auto)
        );
        let c = BenchArgs {
            resume: Some("none".into()),
            ..args("https://a:1/")
        }
        .resolve()
        .unwrap();
        assert_eq!((c.full_every, c.engine), (1, Engine::Rustls));
        let c = BenchArgs {
            engine: Some("openssl".into()),
            tls_version: Some("1.0".into()),
            ..args("https://a:1/")
        }
        .resolve()
        .unwrap();
        assert_eq!(c.engine, Engine::Openssl);
        for bad in [
            BenchArgs {
                resume: Some("sometimes".into()),
                ..args("https://a:1/")
            },
            BenchArgs {
                connections: Some(1),
                duration: Some("1s".into()),
                ..args("https://a:1/")
            },
            BenchArgs {
                tls_version: Some("1.1".into()),
                ..args("https://a:1/")
            },
            BenchArgs {
                engine: Some("gnutls".into()),
                ..args("https://a:1/")
            },
            BenchArgs {
                cert: Some("c".into()),
                ..args("https://a:1/")
            },
            BenchArgs {
                full_every: Some(0),
                ..args("https://a:1/")
            },
            BenchArgs {
                header: vec!["nocolon".into()],
                ..args("https://a:1/")
            },
            BenchArgs::default(),
        ] {
            assert!(bad.resolve().is_err());
        }
    }

    #[test]
    fn n_counts_requests_and_m_needs_h2() {
        let c = BenchArgs {
            requests: Some(120),
            requests_per_conn: Some(4),
            ..args("https://a:1/")
        }
        .resolve()
        .unwrap();
        assert_eq!((c.connections, c.streams), (Some(30), 1));
        let c = BenchArgs {
            connections: Some(120),
            requests_per_conn: Some(4),
            max_concurrent_streams: Some(4),
            alpn: Some("h2".into()),
            ..args("https://a:1/")
        }
        .resolve()
        .unwrap();
        assert_eq!((c.connections, c.streams), (Some(120), 4));
        // from a config file, and a flag of the other kind overrides the file's
        let file: BenchArgs =
            toml::from_str("url = \"https://h:2/\"\nrequests = 10\nthreshold = [\"p99<1s\"]\n")
                .unwrap();
        let flags = BenchArgs {
            connections: Some(3),
            ..Default::default()
        };
        let c = flags.over(file).resolve().unwrap();
        assert_eq!(c.connections, Some(3));
        assert_eq!(c.thresholds[0].to_string(), "request.p99<1000ms");
        assert!(toml::from_str::<BenchArgs>("threshold = [\"p99<1\"]").is_err());
        for bad in [
            BenchArgs {
                requests: Some(10),
                requests_per_conn: Some(4),
                ..args("https://a:1/")
            },
            BenchArgs {
                requests: Some(0),
                ..args("https://a:1/")
            },
            BenchArgs {
                requests: Some(4),
                connections: Some(4),
                ..args("https://a:1/")
            },
            BenchArgs {
                max_concurrent_streams: Some(4),
                ..args("https://a:1/")
            },
            BenchArgs {
                max_concurrent_streams: Some(0),
                alpn: Some("h2".into()),
                ..args("https://a:1/")
            },
            BenchArgs {
                max_concurrent_streams: Some(2),
                alpn: Some("h2".into()),
                requests_per_conn: Some(2),
                think_time: Some("1s".into()),
                ..args("https://a:1/")
            },
        ] {
            assert!(bad.clone().resolve().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn scenarios_set_requests_per_conn() {
        let dir = std::env::temp_dir().join(format!("baton-scen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (two, one) = (dir.join("two.toml"), dir.join("one.toml"));
        std::fs::write(
            &two,
            "[[request]]\npath = \"/\"\n[[request]]\npath = \"/b\"\n",
        )
        .unwrap();
        std::fs::write(&one, "[[request]]\npath = \"/\"\n").unwrap();
        let with = |files: &[String]| BenchArgs {
            scenario: files.to_vec(),
            ..args("https://a:1/")
        };
        let two_s = two.display().to_string();
        let c = with(&[two_s.clone(), format!("{two_s}:3")])
            .resolve()
            .unwrap();
        assert_eq!(c.requests_per_conn, 2);
        assert_eq!(c.scenarios[1].weight, 3);
        assert!(c.mix().unwrap().is_some());
        // different lengths mix: no common count, each connection makes its own
        let mixed = with(&[two_s.clone(), one.display().to_string()])
            .resolve()
            .unwrap();
        assert_eq!(mixed.requests_per_conn, 0);
        assert_eq!(crate::report::req_per_conn(&mixed), "2/1");
        for bad in [
            BenchArgs {
                requests_per_conn: Some(2),
                ..with(std::slice::from_ref(&two_s))
            },
            BenchArgs {
                think: Some("sometimes".into()),
                ..with(std::slice::from_ref(&two_s))
            },
            BenchArgs {
                think: Some("none".into()),
                ..args("https://a:1/")
            },
        ] {
            assert!(bad.resolve().is_err());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn config_file_with_flag_overrides() {
        let file: BenchArgs = toml::from_str(
            "url = \"https://h:2/p\"\nclients = 4\nfull-every = 2\nresume = \"id\"\n",
        )
        .unwrap();
        let flags = BenchArgs {
            clients: Some(8),
            ..Default::default()
        };
        let c = flags.over(file).resolve().unwrap();
        assert_eq!(
            (c.clients, c.full_every, c.resume, c.path.as_str()),
            (8, 2, Resume::Id, "/p")
        );
        assert!(toml::from_str::<BenchArgs>("clientz = 1").is_err());
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
    }
}
