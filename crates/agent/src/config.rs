//! The agent's settings: command-line flags, the same keys in a TOML file, and the resolved
//! configuration with every default filled in.
//!
//! One struct serves both sources (clap for flags, serde for the file) so a flag cannot exist
//! without its key. Flags override the file; the file overrides defaults.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;

pub use crate::route_config::UpstreamBalance;

/// `baton agent`: terminate TLS 1.2/1.3 and serve HTTP.
#[derive(clap::Args, Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct AgentArgs {
    /// TOML file with any of these settings (keys are the flag names); flags override it. The
    /// reverse proxy's routes and upstream pools (`[[route]]`, `[pool.NAME]`) are set there
    /// only: see examples/agent-routes.toml.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// Address to accept TLS on (repeatable or comma separated). Default 127.0.0.1:8443. Port 0
    /// picks a free port; the agent prints `listening tls ADDR` for each on stdout.
    #[arg(long, value_name = "ADDR", value_delimiter = ',')]
    pub listen: Vec<SocketAddr>,

    /// Certificate chain (PEM), paired in order with --key (repeatable). The names the
    /// certificate is for (its subjectAltNames) select it by SNI.
    #[arg(long, value_name = "PEM")]
    pub cert: Vec<PathBuf>,

    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1) for the --cert at the same position.
    #[arg(long, value_name = "PEM")]
    pub key: Vec<PathBuf>,

    /// A directory of certificate/key pairs: every `NAME.crt` with its `NAME.key` (PEM) is
    /// served for the names in its certificate (subjectAltNames), beside any --cert. Reread
    /// on SIGHUP; one bad or unpaired file fails the reload and the running set stays.
    #[arg(long, value_name = "DIR")]
    pub cert_dir: Option<PathBuf>,

    /// OCSP stapling for certificates whose issuer names a responder (AIA OCSP URL) and is in
    /// the chain: the response is fetched, checked, refreshed half-way to its nextUpdate and
    /// dropped once past it. Default on.
    #[arg(long, value_name = "MODE")]
    pub ocsp_stapling: Option<Toggle>,

    /// Names whose certificates get the opposite of --ocsp-stapling (repeatable or comma
    /// separated).
    #[arg(long, value_name = "NAME", value_delimiter = ',')]
    pub ocsp_stapling_except: Vec<String>,

    /// Sign with a private key held by `baton signer` at this socket (`unix:PATH`) instead of
    /// a --key: each --cert is then a chain alone, and the signer must hold the key for its
    /// public key (checked at start).
    #[arg(long, value_name = "unix:PATH")]
    pub key_signer: Option<String>,

    /// The signer's shared auth key (the file given to `baton signer --auth-key-file`).
    #[arg(long, value_name = "FILE")]
    pub key_signer_auth_key_file: Option<PathBuf>,

    /// When the signer is unreachable: `closed` fails the handshake; `local` signs with the
    /// --key given for the same --cert (a local copy), with a warning and a metric. Default
    /// closed.
    #[arg(long, value_name = "POLICY")]
    pub key_signer_fallback: Option<SignerFallback>,

    /// Longest one signature may take at the signer before the handshake gives up on it
    /// (or falls back). Default 2s.
    #[arg(long, value_name = "DURATION")]
    pub key_signer_timeout: Option<HumanDuration>,

    /// Generate a self-signed certificate in memory (repeatable or comma separated), for
    /// --server-name.
    #[arg(long, value_name = "KIND", value_delimiter = ',')]
    pub self_signed: Vec<KeyKind>,

    /// Names (DNS names or IP addresses) put in generated self-signed certificates.
    /// Default: localhost, 127.0.0.1, ::1.
    #[arg(long, value_name = "NAME", value_delimiter = ',')]
    pub server_name: Vec<String>,

    /// Write the generated self-signed certificates (public part only, PEM) to this file, so
    /// clients can trust them.
    #[arg(long, value_name = "FILE")]
    pub self_signed_out: Option<PathBuf>,

    /// CA certificates (PEM) that client certificates must chain to (mutual TLS).
    #[arg(long, value_name = "PEM")]
    pub client_ca: Option<PathBuf>,

    /// Whether a client certificate is required or optional. Default: required when
    /// --client-ca is given.
    #[arg(long, value_name = "MODE")]
    pub client_auth: Option<ClientAuth>,

    /// TLS versions to accept, of 1.2 and 1.3 (repeatable or comma separated). Default both.
    #[arg(long, value_name = "VERSION", value_delimiter = ',')]
    pub tls_versions: Vec<String>,

    /// Cipher suites to accept, IANA names (e.g. TLS13_AES_128_GCM_SHA256,
    /// TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256), repeatable or comma separated, in preference
    /// order.
    #[arg(long, value_name = "SUITE", value_delimiter = ',')]
    pub suites: Vec<String>,

    /// Key exchange groups (x25519, secp256r1, secp384r1, x25519mlkem768, ...), repeatable or comma
    /// separated, in preference order.
    #[arg(long, value_name = "GROUP", value_delimiter = ',')]
    pub groups: Vec<String>,

    /// Sessions kept for TLS 1.2 session-id resumption and TLS 1.3 stateful tickets.
    /// 0 disables the cache. Default 20480.
    #[arg(long, value_name = "N")]
    pub session_cache_size: Option<usize>,

    /// How long a cached session may be resumed. Default 1h.
    #[arg(long, value_name = "DURATION")]
    pub session_lifetime: Option<HumanDuration>,

    /// Issue stateless session tickets (TLS 1.2 tickets, TLS 1.3 tickets). Default true.
    #[arg(long, value_name = "BOOL")]
    pub tickets: Option<bool>,

    /// TLS 1.3 tickets sent after each full handshake. Default 2.
    #[arg(long, value_name = "N")]
    pub tls13_tickets: Option<usize>,

    /// How long a ticket stays valid (and how often keys rotate when no key file is given).
    /// Default 6h.
    #[arg(long, value_name = "DURATION")]
    pub ticket_lifetime: Option<HumanDuration>,

    /// Ticket keys from a file (see `baton ticket-key`), reloaded on SIGHUP; share it between
    /// agents to resume each other's tickets. Default: random keys, rotated in memory.
    #[arg(long, value_name = "FILE")]
    pub ticket_key_file: Option<PathBuf>,

    /// Where sessions live: `memory` (this agent only), `peers` (replicated to every --peer),
    /// `redis` or `redis=URL` (a shared Redis; default redis://127.0.0.1:6379/),
    /// `redis-sentinel=redis+sentinel://H1:26379,H2:26379/NAME` (the primary Redis Sentinel
    /// names, followed through failovers) or `redis-cluster=redis://H1:7000,H2:7001/` (a Redis
    /// Cluster, sessions spread over its shards). Default memory.
    #[arg(long, value_name = "KIND")]
    pub store: Option<String>,

    /// Another agent's replication address, for `--store peers` (repeatable or comma separated).
    #[arg(long, value_name = "ADDR", value_delimiter = ',')]
    pub peer: Vec<SocketAddr>,

    /// Where this agent accepts replication from its peers, for `--store peers`.
    #[arg(long, value_name = "ADDR")]
    pub peer_listen: Option<SocketAddr>,

    /// A network besides the --peer addresses that may open replication connections, for
    /// `--store peers` (ADDR/PREFIX or an address; repeatable or comma separated): peers behind
    /// NAT, or connecting from another address than they listen on. Anyone else is closed at
    /// accept. Default: the --peer addresses only.
    #[arg(long, value_name = "CIDR", value_delimiter = ',')]
    pub peer_allow: Vec<baton_ops::cidr::Cidr>,

    /// Cluster key file (same format as --ticket-key-file) sealing sessions between agents and
    /// in Redis; reloaded on SIGHUP. Required by `peers` and `redis`.
    #[arg(long, value_name = "FILE")]
    pub cluster_key_file: Option<PathBuf>,

    /// Longest a handshake waits for the shared store on a local miss; then it is a miss
    /// (full handshake). Default 20ms.
    #[arg(long, value_name = "DURATION")]
    pub store_wait: Option<HumanDuration>,

    /// This agent's id in a cluster: written into the tickets it issues. Default 0.
    #[arg(long, value_name = "N")]
    pub agent_id: Option<u16>,

    /// Accept up to BYTES of TLS 1.3 early data (0-RTT) from resuming clients, where a ticket
    /// can be made single-use cluster-wide: stateful tickets (`--tickets false`) in
    /// `--store redis` (taken with GETDEL) or `memory`, no `--client-ca`. Elsewhere early data
    /// is refused and the handshake goes on as 1-RTT. Default 0 (off).
    #[arg(long, value_name = "BYTES")]
    pub early_data: Option<u32>,

    /// Methods besides the safe ones (GET, HEAD, OPTIONS, TRACE) served when they arrive in
    /// early data (comma separated, e.g. POST); others get `425 Too Early` (RFC 8470).
    #[arg(long, value_name = "METHOD", value_delimiter = ',')]
    pub early_data_methods: Vec<String>,

    /// Take part in session migration (CSSL-SF, `baton dispatch --policy migration`): hand a
    /// finished handshake's session to the home agent the dispatcher names, and import sessions
    /// handed to this agent. Needs --cluster-key-file (it seals the session objects). Only for
    /// agents reachable from the dispatcher alone. Default false. (`--handoff`: its old name.)
    #[arg(long = "migration", alias = "handoff", value_name = "BOOL")]
    #[serde(rename = "migration", alias = "handoff")]
    pub handoff: Option<bool>,

    /// Where the dispatcher's agent link connects (`baton dispatch --agent-link`): a few
    /// long-lived connections, authenticated both ways with --cluster-key-file, carrying every
    /// client the dispatcher sends as a multiplexed stream. Never the public TLS port; needed
    /// by --migration.
    #[arg(long, value_name = "ADDR")]
    pub link_listen: Option<SocketAddr>,

    /// A network the dispatchers' link connections come from (ADDR/PREFIX or an address;
    /// repeatable or comma separated). Connections from anywhere else are closed at accept, unread.
    /// Default: any address (a warning says so when --link-listen is not on loopback).
    #[arg(long, value_name = "CIDR", value_delimiter = ',')]
    pub link_allow: Vec<baton_ops::cidr::Cidr>,

    /// The step every migration deadline is a multiple of, the same setting as the
    /// dispatcher's: an agent waits 2 steps for a moved session's Import and 4 for the
    /// dispatcher's verdict (past them it closes the connection; it never uses the keys on
    /// its own). Default 1s.
    #[arg(long, value_name = "DURATION")]
    pub migration_timeout: Option<HumanDuration>,

    /// Deprecated (use --migration-timeout, half of it): the agent's wait for a verdict was
    /// twice this.
    #[arg(long, value_name = "DURATION", hide = true)]
    pub handoff_timeout: Option<HumanDuration>,

    /// Bytes returned by `GET /` from the built-in responder. Default 1024.
    #[arg(long, value_name = "N")]
    pub body_size: Option<usize>,

    /// Largest N served by `GET /bytes/N` (400 beyond). Default 64 MiB.
    #[arg(long, value_name = "N")]
    pub max_bytes: Option<u64>,

    /// Plain-HTTP backend (http://HOST:PORT) to proxy every request to, instead of the
    /// built-in responder (repeatable: the agent is then a TLS proxy in front of several
    /// backends, balanced by --upstream-balance). The one-pool shorthand of the config file's
    /// routes: it makes the pool `default`, which takes every request when there are no routes.
    #[arg(long, value_name = "URL")]
    pub upstream: Vec<String>,

    /// How requests are spread over several --upstream backends: `round-robin` (each request
    /// to the next) or `client-ip` (a client's requests always to the same backend, by a
    /// stable hash of its address). Default round-robin.
    #[arg(long, value_name = "POLICY")]
    pub upstream_balance: Option<UpstreamBalance>,

    /// Upstream pools (config file only: `[pool.NAME]` tables with `upstreams`, `balance`,
    /// `protocol`, `ca`, `sni`, `client-cert`/`client-key`, timeouts, keep-alive limits and
    /// `[pool.NAME.health]` checks). See examples/agent-routes.toml.
    #[arg(skip)]
    pub pool: std::collections::BTreeMap<String, crate::route_config::PoolSpec>,

    /// Routes (config file only: `[[route]]` entries matching `hosts` and `path-prefix` to a
    /// `pool`, with header changes and a body limit). See examples/agent-routes.toml.
    #[arg(skip)]
    pub route: Vec<crate::route_config::RouteSpec>,

    /// Status for a request whose host no route takes (config file only). Default 421.
    #[arg(skip)]
    pub unknown_host_status: Option<u16>,

    /// Status for a request whose host routes take but not its path (config file only).
    /// Default 404.
    #[arg(skip)]
    pub no_route_status: Option<u16>,

    /// Address for Prometheus metrics (plain HTTP, /metrics). Off by default.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,

    /// Expect a PROXY protocol v2 header on every connection (from `baton dispatch
    /// --proxy-protocol` or an L4 balancer) and use the client address it carries. Default false.
    #[arg(long, value_name = "BOOL")]
    pub proxy_protocol: Option<bool>,

    /// With --proxy-protocol: a network the balancers or dispatchers connect from
    /// (ADDR/PREFIX or an address; repeatable or comma separated). Connections from anywhere else
    /// are refused: a PROXY header names the client, so only they may send one. Default: loopback
    /// only. Given explicitly (with or without --proxy-protocol), it also names the trusted proxies
    /// of --upstream: a client in these networks keeps its X-Forwarded-For/-Proto/-Host and
    /// Forwarded headers (this hop is appended); anyone else's are replaced.
    #[arg(long, value_name = "CIDR", value_delimiter = ',')]
    pub proxy_protocol_from: Vec<baton_ops::cidr::Cidr>,

    /// Runtime worker threads (1: a current-thread runtime). Default: one per CPU.
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,

    /// Connections served at once; more are closed at accept. Default 20000.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,

    /// Time allowed from accept to the end of the TLS handshake. Default 10s.
    #[arg(long, value_name = "DURATION")]
    pub handshake_timeout: Option<HumanDuration>,

    /// Time a connection may go without any byte read or written; also how long an HTTP/1.1
    /// connection waits for its next request, and an HTTP/2 connection with no stream open
    /// before it gets a GOAWAY (and, after another, is closed), keep-alive PINGs or not.
    /// Default 60s.
    #[arg(long, value_name = "DURATION")]
    pub idle_timeout: Option<HumanDuration>,

    /// Time allowed for an HTTP request head to arrive once started: for HTTP/2, from the first
    /// byte of a header block (or of any frame but DATA) to its last. Bytes that trickle in do
    /// not extend it. Default 10s.
    #[arg(long, value_name = "DURATION")]
    pub header_timeout: Option<HumanDuration>,

    /// Time allowed from accept (or a migrated session's arrival) until the first request's
    /// head is complete, handshake included. Bytes that trickle in do not extend it (nor the
    /// wait for a later request, bounded by --idle-timeout from the previous response).
    /// Default 30s.
    #[arg(long, value_name = "DURATION")]
    pub request_timeout: Option<HumanDuration>,

    /// Slowest request head accepted, in bytes per second, after a 2-second grace: a head
    /// arriving slower than this is cut before --header-timeout (HTTP/1.1 and HTTP/2). 0 turns
    /// it off. Default 512.
    #[arg(long, value_name = "BYTES")]
    pub min_header_rate: Option<u64>,

    /// HTTP/2: how long a connection may go without receiving anything before the agent sends
    /// a PING; 0 turns the PINGs off. Default 30s.
    #[arg(long, value_name = "DURATION")]
    pub h2_keepalive: Option<HumanDuration>,

    /// HTTP/2: how long a keep-alive PING waits for its answer before the connection is closed.
    /// Default 10s.
    #[arg(long, value_name = "DURATION")]
    pub h2_keepalive_timeout: Option<HumanDuration>,

    /// HTTP/2: streams a client may have open at once on one connection (more are refused).
    /// Default 256.
    #[arg(long, value_name = "N")]
    pub h2_max_streams: Option<u32>,

    /// HTTP/2: open streams a client may cancel (RST_STREAM) in 10 seconds on one connection;
    /// one more and the connection is cut (GOAWAY, then closed) and counted in
    /// baton_h2_connections_cut_total{reason="resets"} (rapid reset, CVE-2023-44487). Beside
    /// it, 64 streams reset before they were accepted, or 128 the agent had to reset for the
    /// client's errors, end a connection too. Default 200.
    #[arg(long, value_name = "N")]
    pub h2_max_resets: Option<u32>,

    /// Time SIGTERM waits for connections to finish before closing them. Default 30s.
    #[arg(long, value_name = "DURATION")]
    pub drain_timeout: Option<HumanDuration>,

    /// An HTTP/1.1 connection that waits this long for its next request (or its first) is
    /// parked: it gives back everything but its socket, keys and sequence numbers (rustls'
    /// buffers, the connection's task state) until the client sends again. 0 parks at once.
    /// Default 50ms.
    #[arg(long, value_name = "DURATION")]
    pub park_after: Option<HumanDuration>,

    /// Largest HTTP request head, in bytes. Default 16384.
    #[arg(long, value_name = "N")]
    pub max_header_bytes: Option<usize>,

    /// Most HTTP request header fields. Default 100.
    #[arg(long, value_name = "N")]
    pub max_headers: Option<usize>,

    /// ACME (RFC 8555) directory to order certificates from for --acme-domain, e.g.
    /// https://acme-v02.api.letsencrypt.org/directory. Agents sharing a store (peers, redis)
    /// order each name once for the cluster and share the certificate.
    #[arg(long, value_name = "URL")]
    pub acme_directory: Option<String>,

    /// A name to get a certificate for from --acme-directory (repeatable; one certificate
    /// per name). Served as soon as it is issued, beside any --cert.
    #[arg(long, value_name = "NAME", value_delimiter = ',')]
    pub acme_domain: Vec<String>,

    /// CA certificate (PEM) to trust for the --acme-directory's HTTPS (a private CA's, e.g.
    /// Pebble's). Default: the system's roots.
    #[arg(long, value_name = "PEM")]
    pub acme_directory_ca: Option<PathBuf>,

    /// Contact address given to the CA when the ACME account is created.
    #[arg(long, value_name = "EMAIL")]
    pub acme_email: Option<String>,

    /// How the CA checks control of a name: tls-alpn-01 (answered on the TLS port: the
    /// CA must reach port 443 of the name here), http-01 (the plain-HTTP listener, port 80) or
    /// dns-01 (a TXT record set by --acme-dns-hook). Default tls-alpn-01.
    #[arg(long, value_name = "TYPE")]
    pub acme_challenge: Option<AcmeChallenge>,

    /// Command that sets the TXT record of a dns-01 challenge: run (no shell) as `CMD present
    /// _acme-challenge.NAME VALUE` before the CA is told to look, and `CMD cleanup
    /// _acme-challenge.NAME VALUE` after; it must exit 0 within 2 minutes, once the record is
    /// visible to the CA.
    #[arg(long, value_name = "CMD")]
    pub acme_dns_hook: Option<PathBuf>,

    /// Key kinds of the ACME certificates (repeatable or comma separated: dual certificates, e.g.
    /// ecdsa-p256 and rsa-2048, one of each per name). Default ecdsa-p256.
    #[arg(long, value_name = "KIND", value_delimiter = ',')]
    pub acme_key: Vec<KeyKind>,

    /// Write one line per request (and one per TLS connection that carried none) to this file,
    /// or `-` for standard output. Lines are queued for a writer thread, never waited for: if
    /// the disk falls behind, lines are dropped and counted
    /// (baton_access_log_dropped_total). SIGUSR1 reopens the file (rename, then signal:
    /// logrotate without copytruncate). Off by default.
    #[arg(long, value_name = "PATH")]
    pub access_log: Option<PathBuf>,

    /// The access log's lines: `text` (combined-like, key=value after the status and size) or
    /// `json` (one object a line, snake_case keys). Default text.
    #[arg(long, value_name = "FORMAT")]
    pub access_log_format: Option<AccessLogFormat>,

    /// Plain-HTTP address (repeatable or comma separated) that redirects every request to https
    /// (308, same host and path, and the port of the first --listen unless it is 443), except ACME
    /// HTTP-01 challenges (`/.well-known/acme-challenge/TOKEN`), answered here. Off by default.
    #[arg(long, value_name = "ADDR", value_delimiter = ',')]
    pub http_listen: Vec<SocketAddr>,

    /// Add `Via: 1.1 baton` (`2 baton` for HTTP/2 clients) to requests sent to --upstream.
    /// Default false.
    #[arg(long, value_name = "BOOL")]
    pub via: Option<bool>,
}

/// How the ACME CA checks control of a name.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AcmeChallenge {
    #[value(name = "tls-alpn-01")]
    #[serde(rename = "tls-alpn-01")]
    TlsAlpn01,
    #[value(name = "http-01")]
    #[serde(rename = "http-01")]
    Http01,
    #[value(name = "dns-01")]
    #[serde(rename = "dns-01")]
    Dns01,
}

/// Largest `--early-data` accepted: rustls holds early data in memory until it is read.
pub const MAX_EARLY_DATA: u32 = 1 << 20;

/// How the access log's lines look.
#[derive(clap::ValueEnum, Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AccessLogFormat {
    /// Combined-like: `client - - [time] "METHOD path VERSION" status bytes key=value...`.
    #[default]
    Text,
    /// One JSON object a line, snake_case keys.
    Json,
}

/// Key types for generated certificates.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyKind {
    #[value(alias = "p256")]
    #[serde(alias = "p256")]
    EcdsaP256,
    #[value(alias = "p384")]
    #[serde(alias = "p384")]
    EcdsaP384,
    #[value(name = "rsa-2048", alias = "rsa2048")]
    #[serde(rename = "rsa-2048", alias = "rsa2048")]
    Rsa2048,
    #[value(name = "rsa-3072", alias = "rsa3072")]
    #[serde(rename = "rsa-3072", alias = "rsa3072")]
    Rsa3072,
    #[value(name = "rsa-4096", alias = "rsa4096")]
    #[serde(rename = "rsa-4096", alias = "rsa4096")]
    Rsa4096,
    Ed25519,
}

/// A feature turned on or off.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Toggle {
    On,
    Off,
}

/// `--ocsp-stapling` and its exceptions, resolved.
#[derive(Debug, Clone, Default)]
pub struct OcspStapling {
    pub on: bool,
    /// Lower-case names that get the opposite of `on`.
    pub except: Vec<String>,
}

impl OcspStapling {
    /// Whether a certificate for `names` is stapled.
    pub fn applies_to(&self, names: &[String]) -> bool {
        let excepted = names.iter().any(|n| self.except.contains(n));
        self.on != excepted
    }
}

/// What the agent does while its key signer is unreachable.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SignerFallback {
    /// Handshakes fail (the key exists only in the signer).
    Closed,
    /// Sign with the local copy of the key (--key).
    Local,
}

/// `--key-signer` and its settings, resolved.
#[derive(Debug, Clone)]
pub struct KeySigner {
    pub path: PathBuf,
    pub auth_key_file: PathBuf,
    pub fallback: SignerFallback,
    pub timeout: Duration,
}

/// Client certificate policy.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientAuth {
    Required,
    Optional,
}

pub use baton_ops::duration::HumanDuration;

/// Where sessions live.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreKind {
    Memory,
    Peers {
        listen: SocketAddr,
        peers: Vec<SocketAddr>,
        /// Who else may connect (`--peer-allow`).
        allow: Vec<baton_ops::cidr::Cidr>,
    },
    Redis {
        url: String,
    },
}

impl std::fmt::Debug for StoreKind {
    // The Redis URL may carry a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreKind::Memory => f.write_str("Memory"),
            StoreKind::Peers {
                listen,
                peers,
                allow,
            } => f
                .debug_struct("Peers")
                .field("listen", listen)
                .field("peers", peers)
                .field("allow", allow)
                .finish(),
            StoreKind::Redis { url } => f
                .debug_struct("Redis")
                .field("url", &baton_session::redis::redact(url))
                .finish(),
        }
    }
}

fn store_kind(
    store: Option<&str>,
    peer_listen: Option<SocketAddr>,
    peers: Vec<SocketAddr>,
    allow: Vec<baton_ops::cidr::Cidr>,
) -> anyhow::Result<StoreKind> {
    let allow_given = !allow.is_empty();
    let kind = match store.unwrap_or("memory") {
        "memory" => StoreKind::Memory,
        "peers" => StoreKind::Peers {
            listen: peer_listen
                .ok_or_else(|| anyhow::anyhow!("--store peers needs --peer-listen ADDR"))?,
            peers,
            allow,
        },
        "redis" => StoreKind::Redis {
            url: "redis://127.0.0.1:6379/".into(),
        },
        // redis=, redis-sentinel= and redis-cluster=: one Redis store, whose URL says which.
        other => match baton_session::redis::store_url(other) {
            Some(Ok(url)) => StoreKind::Redis { url },
            Some(Err(e)) => bail!("--store: {e}"),
            None => {
                bail!(
                    "--store: `{}` is not memory, peers, redis, redis=redis://HOST:PORT/, \
                     redis-sentinel=redis+sentinel://H1:PORT,H2:PORT/NAME or \
                     redis-cluster=redis://H1:PORT,H2:PORT/",
                    baton_session::redis::redact(other)
                )
            }
        },
    };
    if !matches!(kind, StoreKind::Peers { .. }) && (peer_listen.is_some()) {
        bail!("--peer-listen only applies to --store peers");
    }
    if !matches!(kind, StoreKind::Peers { .. }) && allow_given {
        bail!("--peer-allow only applies to --store peers");
    }
    Ok(kind)
}

/// The resolved configuration: every default filled in, every value checked.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub listen: Vec<SocketAddr>,
    /// `--acme-*`: the names whose certificates are ordered from an ACME CA.
    pub acme: Option<AcmeConfig>,
    pub handoff: bool,
    pub migration_timeouts: baton_migrate::Timeouts,
    pub link_listen: Option<SocketAddr>,
    /// Who may open link connections (`--link-allow`); empty: anyone.
    pub link_allow: Vec<baton_ops::cidr::Cidr>,
    pub store: StoreKind,
    pub cluster_key_file: Option<PathBuf>,
    pub store_wait: Duration,
    /// Certificate chains with their key file; no key file when the key is in the signer only.
    pub certs: Vec<(PathBuf, Option<PathBuf>)>,
    /// `--cert-dir`: pairs loaded from this directory, beside `certs`.
    pub cert_dir: Option<PathBuf>,
    pub ocsp_stapling: OcspStapling,
    pub key_signer: Option<KeySigner>,
    pub self_signed: Vec<KeyKind>,
    pub server_names: Vec<String>,
    pub self_signed_out: Option<PathBuf>,
    pub client_ca: Option<PathBuf>,
    pub client_auth: ClientAuth,
    pub tls_versions: Vec<String>,
    pub suites: Vec<String>,
    pub groups: Vec<String>,
    pub session_cache_size: usize,
    pub session_lifetime: Duration,
    pub tickets: bool,
    pub tls13_tickets: usize,
    pub ticket_lifetime: Duration,
    pub ticket_key_file: Option<PathBuf>,
    pub agent_id: u16,
    /// `--early-data`: bytes of 0-RTT data accepted (0: off).
    pub early_data: u32,
    /// Unsafe methods served in early data anyway (`--early-data-methods`).
    pub early_data_methods: Vec<http::Method>,
    pub body_size: usize,
    pub max_bytes: u64,
    /// The reverse proxy's pools and routes; `None`: the built-in responder.
    pub routing: Option<crate::route_config::Routing>,
    pub metrics: Option<SocketAddr>,
    pub proxy_protocol: bool,
    /// Who may send a PROXY header (`--proxy-protocol-from`).
    pub proxy_protocol_from: Vec<baton_ops::cidr::Cidr>,
    pub workers: usize,
    pub max_connections: usize,
    pub handshake_timeout: Duration,
    pub idle_timeout: Duration,
    pub header_timeout: Duration,
    pub request_timeout: Duration,
    /// Bytes per second; 0: no minimum.
    pub min_header_rate: u64,
    /// `--h2-keepalive`: `None` when off.
    pub h2_keepalive: Option<Duration>,
    pub h2_keepalive_timeout: Duration,
    pub h2_max_streams: u32,
    pub h2_max_resets: u32,
    pub drain_timeout: Duration,
    /// `--park-after`: how long an HTTP/1.1 connection waits for a request before it parks.
    pub park_after: Duration,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// `--access-log`: `-` is standard output.
    pub access_log: Option<PathBuf>,
    pub access_log_format: AccessLogFormat,
    pub http_listen: Vec<SocketAddr>,
    /// The forwarding headers sent to upstreams (trusted proxies, `Via`).
    pub forwarding: crate::forwarded::Forwarding,
}

impl AgentArgs {
    /// Reads `--config` (if any), lets flags override it, and fills in defaults.
    pub fn resolve(self) -> anyhow::Result<AgentConfig> {
        self.merged()?.into_config()
    }

    /// The flags over the `--config` file's keys, before defaults and rules.
    pub(crate) fn merged(self) -> anyhow::Result<Self> {
        Ok(match &self.config {
            Some(path) => self.clone().over(Self::from_file(path)?),
            None => self,
        })
    }

    fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("config file {}", path.display()))
    }

    /// `self` (flags) over `file`: a flag given wins; a list given replaces the file's list.
    fn over(self, file: Self) -> Self {
        macro_rules! pick {
            ($($list:ident),* ; $($opt:ident),*) => {
                Self {
                    config: self.config,
                    // file only
                    pool: file.pool,
                    route: file.route,
                    unknown_host_status: file.unknown_host_status,
                    no_route_status: file.no_route_status,
                    $($list: if self.$list.is_empty() { file.$list } else { self.$list },)*
                    $($opt: self.$opt.or(file.$opt),)*
                }
            };
        }
        pick!(listen, cert, key, self_signed, server_name, tls_versions, suites, groups, peer, peer_allow, link_allow, upstream,
            proxy_protocol_from, early_data_methods, ocsp_stapling_except,
            acme_domain, acme_key, http_listen;
            acme_directory, acme_directory_ca, acme_email, acme_challenge, acme_dns_hook,
            store, peer_listen, cluster_key_file, store_wait, key_signer, key_signer_auth_key_file,
            key_signer_fallback, key_signer_timeout,
            self_signed_out, client_ca, client_auth, session_cache_size, session_lifetime,
            tickets, tls13_tickets, ticket_lifetime, ticket_key_file, agent_id, early_data, handoff, migration_timeout, handoff_timeout, link_listen, body_size,
            max_bytes, upstream_balance, metrics, proxy_protocol, workers, max_connections, handshake_timeout,
            idle_timeout, header_timeout, request_timeout, min_header_rate, h2_keepalive, h2_keepalive_timeout,
            h2_max_streams, h2_max_resets, drain_timeout, park_after, max_header_bytes, max_headers,
            cert_dir, ocsp_stapling, access_log, access_log_format, via)
    }

    fn key_signer(&self) -> anyhow::Result<Option<KeySigner>> {
        let Some(spec) = &self.key_signer else {
            if self.key_signer_auth_key_file.is_some()
                || self.key_signer_fallback.is_some()
                || self.key_signer_timeout.is_some()
            {
                bail!("--key-signer-* settings need --key-signer unix:PATH");
            }
            return Ok(None);
        };
        let path = match spec.strip_prefix("unix:") {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => bail!("--key-signer `{spec}`: expected unix:PATH"),
        };
        let auth_key_file = self.key_signer_auth_key_file.clone().ok_or_else(|| {
            anyhow::anyhow!("--key-signer needs --key-signer-auth-key-file (the signer's auth key)")
        })?;
        if self.cert.is_empty() {
            bail!("--key-signer needs --cert (the chains whose keys the signer holds)");
        }
        let timeout = self
            .key_signer_timeout
            .map_or(Duration::from_secs(2), |d| d.0);
        if timeout.is_zero() {
            bail!("--key-signer-timeout must be greater than zero");
        }
        Ok(Some(KeySigner {
            path,
            auth_key_file,
            fallback: self.key_signer_fallback.unwrap_or(SignerFallback::Closed),
            timeout,
        }))
    }

    fn into_config(self) -> anyhow::Result<AgentConfig> {
        if self.migration_timeout.is_some() && self.handoff_timeout.is_some() {
            bail!("--handoff-timeout is the old name of --migration-timeout (halved): give one");
        }
        if self.upstream.is_empty() && self.upstream_balance.is_some() {
            bail!("--upstream-balance needs --upstream (the backends to balance)");
        }
        let key_signer = self.key_signer()?;
        if self.access_log_format.is_some() && self.access_log.is_none() {
            bail!("--access-log-format needs --access-log (where the lines go)");
        }
        // Only networks the operator named are trusted with forwarding headers.
        let forwarding = crate::forwarded::Forwarding {
            trusted: self.proxy_protocol_from.clone(),
            via: self.via.unwrap_or(false),
        };
        let local_keys = match &key_signer {
            Some(k) if k.fallback == SignerFallback::Closed => {
                if !self.key.is_empty() {
                    bail!(
                        "--key with --key-signer: the key stays in the signer (give \
                         --key-signer-fallback local to keep a local copy for when it is down)"
                    );
                }
                false
            }
            _ => true,
        };
        if local_keys && self.cert.len() != self.key.len() {
            bail!(
                "--cert and --key come in pairs: got {} certificate(s) and {} key(s)",
                self.cert.len(),
                self.key.len()
            );
        }
        if self.client_auth.is_some() && self.client_ca.is_none() {
            bail!("--client-auth needs --client-ca (the CAs client certificates must chain to)");
        }
        let acme = AcmeConfig::resolve(&self)?;
        let self_signed = if self.cert.is_empty()
            && self.self_signed.is_empty()
            && self.cert_dir.is_none()
            && acme.is_none()
        {
            bail!(
                "no certificate: give --cert/--key pairs, --cert-dir DIR, --self-signed KIND or \
                 --acme-domain"
            );
        } else {
            self.self_signed
        };
        let dur = |d: Option<HumanDuration>, default: u64| {
            d.map_or(Duration::from_secs(default), |d| d.0)
        };
        let store = store_kind(
            self.store.as_deref(),
            self.peer_listen,
            self.peer,
            self.peer_allow,
        )?;
        if store != StoreKind::Memory && self.cluster_key_file.is_none() {
            bail!("--store peers/redis needs --cluster-key-file (the key sealing shared sessions)");
        }
        let handoff = self.handoff.unwrap_or(false);
        if handoff && self.cluster_key_file.is_none() {
            bail!("--migration needs --cluster-key-file (the key sealing migrated sessions)");
        }
        if handoff && self.link_listen.is_none() {
            bail!("--migration needs --link-listen (migrations travel on the agent link only)");
        }
        if self.link_listen.is_some() && self.cluster_key_file.is_none() {
            bail!("--link-listen needs --cluster-key-file (the key the link authenticates with)");
        }
        if !self.link_allow.is_empty() && self.link_listen.is_none() {
            bail!("--link-allow only applies with --link-listen");
        }
        let config = AgentConfig {
            acme,
            handoff,
            link_listen: self.link_listen,
            link_allow: self.link_allow,
            migration_timeouts: baton_migrate::Timeouts::from_setting(
                self.migration_timeout
                    .map(|step| step.0)
                    .or(self.handoff_timeout.map(|old| old.0 / 2)),
            )
            .map_err(anyhow::Error::msg)?,
            store,
            cluster_key_file: self.cluster_key_file,
            store_wait: self.store_wait.map_or(Duration::from_millis(20), |d| d.0),
            listen: if self.listen.is_empty() {
                vec!["127.0.0.1:8443".parse().expect("literal address")]
            } else {
                self.listen
            },
            certs: if local_keys {
                self.cert
                    .into_iter()
                    .zip(self.key.into_iter().map(Some))
                    .collect()
            } else {
                self.cert.into_iter().map(|c| (c, None)).collect()
            },
            cert_dir: self.cert_dir,
            ocsp_stapling: OcspStapling {
                on: self.ocsp_stapling != Some(Toggle::Off),
                except: self
                    .ocsp_stapling_except
                    .iter()
                    .map(|n| n.trim_end_matches('.').to_ascii_lowercase())
                    .collect(),
            },
            key_signer,
            self_signed,
            server_names: if self.server_name.is_empty() {
                ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec()
            } else {
                self.server_name
            },
            self_signed_out: self.self_signed_out,
            client_auth: self.client_auth.unwrap_or(ClientAuth::Required),
            client_ca: self.client_ca,
            tls_versions: self.tls_versions,
            suites: self.suites,
            groups: self.groups,
            session_cache_size: self.session_cache_size.unwrap_or(20_480),
            session_lifetime: dur(self.session_lifetime, 3600),
            tickets: self.tickets.unwrap_or(true),
            tls13_tickets: self.tls13_tickets.unwrap_or(2),
            ticket_lifetime: dur(self.ticket_lifetime, 6 * 3600),
            ticket_key_file: self.ticket_key_file,
            agent_id: self.agent_id.unwrap_or(0),
            early_data: self.early_data.unwrap_or(0),
            early_data_methods: self
                .early_data_methods
                .iter()
                .map(|m| {
                    http::Method::from_bytes(m.trim().to_ascii_uppercase().as_bytes())
                        .with_context(|| format!("--early-data-methods: `{m}` is not a method"))
                })
                .collect::<anyhow::Result<_>>()?,
            body_size: self.body_size.unwrap_or(1024),
            max_bytes: self.max_bytes.unwrap_or(64 << 20),
            routing: crate::route_config::resolve(crate::route_config::Inputs {
                upstream: &self.upstream,
                upstream_balance: self.upstream_balance.unwrap_or_default(),
                pools: &self.pool,
                routes: &self.route,
                unknown_host_status: self.unknown_host_status,
                no_route_status: self.no_route_status,
                idle_timeout: dur(self.idle_timeout, 60),
            })?,
            metrics: self.metrics,
            proxy_protocol: self.proxy_protocol.unwrap_or(false),
            proxy_protocol_from: if self.proxy_protocol_from.is_empty() {
                baton_ops::cidr::Cidr::loopback()
            } else {
                self.proxy_protocol_from
            },
            workers: self
                .workers
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            max_connections: self.max_connections.unwrap_or(20_000),
            handshake_timeout: dur(self.handshake_timeout, 10),
            idle_timeout: dur(self.idle_timeout, 60),
            header_timeout: dur(self.header_timeout, 10),
            request_timeout: dur(self.request_timeout, 30),
            min_header_rate: self.min_header_rate.unwrap_or(512),
            h2_keepalive: Some(dur(self.h2_keepalive, 30)).filter(|d| !d.is_zero()),
            h2_keepalive_timeout: dur(self.h2_keepalive_timeout, 10),
            h2_max_streams: self.h2_max_streams.unwrap_or(256),
            h2_max_resets: self.h2_max_resets.unwrap_or(200),
            drain_timeout: dur(self.drain_timeout, 30),
            park_after: self.park_after.map_or(Duration::from_millis(50), |d| d.0),
            max_header_bytes: self.max_header_bytes.unwrap_or(16 * 1024),
            max_headers: self.max_headers.unwrap_or(100),
            access_log: self.access_log,
            access_log_format: self.access_log_format.unwrap_or_default(),
            http_listen: self.http_listen,
            forwarding,
        };
        config.check()?;
        Ok(config)
    }
}

impl AgentConfig {
    fn check(&self) -> anyhow::Result<()> {
        if self.workers == 0 {
            bail!("--workers must be at least 1");
        }
        if self.max_connections == 0 {
            bail!("--max-connections must be at least 1");
        }
        if self.ticket_lifetime.as_secs() == 0 || self.ticket_lifetime.as_secs() > 7 * 86400 {
            bail!("--ticket-lifetime must be between 1s and 7d (RFC 8446 section 4.6.1)");
        }
        if self.early_data > MAX_EARLY_DATA {
            bail!("--early-data must be at most {} bytes", MAX_EARLY_DATA);
        }
        if self.tls13_tickets > 16 {
            bail!("--tls13-tickets must be at most 16");
        }
        if self.max_header_bytes < 1024 {
            bail!("--max-header-bytes must be at least 1024");
        }
        if self.body_size as u64 > self.max_bytes {
            bail!("--body-size exceeds --max-bytes");
        }
        if self.h2_max_streams == 0 || self.h2_max_resets == 0 {
            bail!("--h2-max-streams and --h2-max-resets must be at least 1");
        }
        for d in [
            self.handshake_timeout,
            self.idle_timeout,
            self.header_timeout,
            self.request_timeout,
            self.h2_keepalive_timeout,
        ] {
            if d.is_zero() {
                bail!("timeouts must be greater than zero");
            }
        }
        Ok(())
    }
}

/// `--acme-*`, resolved.
#[derive(Debug, Clone)]
pub struct AcmeConfig {
    pub directory: String,
    pub domains: Vec<String>,
    pub directory_ca: Option<PathBuf>,
    pub email: Option<String>,
    pub challenge: AcmeChallenge,
    pub dns_hook: Option<PathBuf>,
    pub keys: Vec<KeyKind>,
}

impl AcmeConfig {
    pub fn resolve(args: &AgentArgs) -> anyhow::Result<Option<AcmeConfig>> {
        let Some(directory) = &args.acme_directory else {
            if !args.acme_domain.is_empty()
                || args.acme_directory_ca.is_some()
                || args.acme_email.is_some()
                || args.acme_challenge.is_some()
                || args.acme_dns_hook.is_some()
                || !args.acme_key.is_empty()
            {
                bail!("--acme-* settings need --acme-directory URL");
            }
            return Ok(None);
        };
        if !directory.starts_with("https://") {
            bail!("--acme-directory `{directory}`: must be an https:// URL");
        }
        if args.acme_domain.is_empty() {
            bail!("--acme-directory needs --acme-domain NAME (the names to order)");
        }
        let mut domains = Vec::new();
        for d in &args.acme_domain {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            let ok = !d.is_empty()
                && d.len() <= 253
                && d.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
            if !ok {
                bail!("--acme-domain `{d}`: not a DNS name (no wildcards: one name each)");
            }
            if !domains.contains(&d) {
                domains.push(d);
            }
        }
        let challenge = args.acme_challenge.unwrap_or(AcmeChallenge::TlsAlpn01);
        if challenge == AcmeChallenge::Dns01 && args.acme_dns_hook.is_none() {
            bail!("--acme-challenge dns-01 needs --acme-dns-hook CMD");
        }
        if challenge != AcmeChallenge::Dns01 && args.acme_dns_hook.is_some() {
            bail!("--acme-dns-hook only applies to --acme-challenge dns-01");
        }
        let mut keys = args.acme_key.clone();
        keys.dedup();
        if keys.is_empty() {
            keys.push(KeyKind::EcdsaP256);
        }
        Ok(Some(AcmeConfig {
            directory: directory.clone(),
            domains,
            directory_ca: args.acme_directory_ca.clone(),
            email: args.acme_email.clone(),
            challenge,
            dns_hook: args.acme_dns_hook.clone(),
            keys,
        }))
    }
}

/// The configuration `baton agent FLAGS...` would run with (tests).
#[cfg(test)]
pub(crate) fn from_flags(flags: &[&str]) -> AgentConfig {
    tests::parse(flags).resolve().expect("flags")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: AgentArgs,
    }

    pub(super) fn parse(flags: &[&str]) -> AgentArgs {
        Cli::try_parse_from(std::iter::once("agent").chain(flags.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn upstream_urls() {
        assert_eq!(
            crate::route_config::parse_upstream("http://127.0.0.1:8080")
                .unwrap()
                .as_str(),
            "127.0.0.1:8080"
        );
        assert!(crate::route_config::parse_upstream("https://127.0.0.1:8080").is_err());
        assert!(crate::route_config::parse_upstream("http://127.0.0.1:8080/app").is_err());
        assert!(crate::route_config::parse_upstream("127.0.0.1:8080").is_err());
    }

    #[test]
    fn list_flags_repeat_or_take_commas_alike() {
        let repeated = parse(&[
            "--tls-versions",
            "1.3",
            "--tls-versions",
            "1.2",
            "--link-allow",
            "10.0.0.0/8",
            "--link-allow",
            "192.0.2.1",
            "--server-name",
            "a.example",
            "--server-name",
            "b.example",
        ]);
        let commas = parse(&[
            "--tls-versions",
            "1.3,1.2",
            "--link-allow",
            "10.0.0.0/8,192.0.2.1",
            "--server-name",
            "a.example,b.example",
        ]);
        assert_eq!(repeated.tls_versions, ["1.3", "1.2"]);
        assert_eq!(commas.tls_versions, repeated.tls_versions);
        assert_eq!(commas.link_allow, repeated.link_allow);
        assert_eq!(commas.link_allow.len(), 2);
        assert_eq!(commas.server_name, repeated.server_name);
    }

    #[test]
    fn the_migration_flag_and_its_old_name() {
        for flag in ["--migration", "--handoff"] {
            assert_eq!(parse(&[flag, "true"]).handoff, Some(true));
        }
        for toml in ["migration = true", "handoff = true"] {
            let a: AgentArgs = toml::from_str(toml).unwrap();
            assert_eq!(a.handoff, Some(true));
        }
    }

    #[test]
    fn the_migration_timeout_and_the_old_agent_flag() {
        let step = |flags: &[&str]| {
            let mut all = vec!["--self-signed", "ecdsa-p256"];
            all.extend_from_slice(flags);
            parse(&all)
                .resolve()
                .map(|c| c.migration_timeouts.step())
                .map_err(|e| e.to_string())
        };
        assert_eq!(step(&[]), Ok(Duration::from_secs(1)));
        assert_eq!(
            step(&["--migration-timeout", "300ms"]),
            Ok(Duration::from_millis(300))
        );
        // the agent's old flag was its own wait, twice the step
        assert_eq!(
            step(&["--handoff-timeout", "2s"]),
            Ok(Duration::from_secs(1))
        );
        assert!(step(&["--handoff-timeout", "2s", "--migration-timeout", "1s"]).is_err());
        assert!(step(&["--migration-timeout", "0s"]).is_err());
    }

    #[test]
    fn front_settings_from_the_file_and_flags() {
        let file: AgentArgs = toml::from_str(
            r#"
            self-signed = ["ecdsa-p256"]
            access-log = "/var/log/baton/access.log"
            access-log-format = "json"
            http-listen = ["127.0.0.1:8080"]
            via = true
            proxy-protocol-from = ["10.0.0.0/8"]
            "#,
        )
        .unwrap();
        let c = parse(&[]).over(file).into_config().unwrap();
        assert_eq!(
            c.access_log.as_deref(),
            Some(Path::new("/var/log/baton/access.log"))
        );
        assert_eq!(c.access_log_format, AccessLogFormat::Json);
        assert_eq!(
            c.http_listen,
            ["127.0.0.1:8080".parse::<SocketAddr>().unwrap()]
        );
        assert!(c.forwarding.via);
        assert_eq!(c.forwarding.trusted.len(), 1);
        // the default PROXY sources (loopback) are not trusted with forwarding headers
        let c = from_flags(&["--self-signed", "ecdsa-p256"]);
        assert!(c.forwarding.trusted.is_empty() && !c.forwarding.via);
        assert_eq!(c.access_log, None);
        let e = parse(&["--self-signed", "ecdsa-p256", "--access-log-format", "json"])
            .resolve()
            .unwrap_err();
        assert!(e.to_string().contains("--access-log"), "{e}");
    }

    #[test]
    fn park_after() {
        let c = from_flags(&["--self-signed", "ecdsa-p256"]);
        assert_eq!(c.park_after, Duration::from_millis(50));
        let c = from_flags(&["--self-signed", "ecdsa-p256", "--park-after", "0"]);
        assert_eq!(c.park_after, Duration::ZERO);
    }

    #[test]
    fn h2_bounds() {
        let c = from_flags(&["--self-signed", "ecdsa-p256"]);
        assert_eq!(c.h2_keepalive, Some(Duration::from_secs(30)));
        assert_eq!(c.h2_keepalive_timeout, Duration::from_secs(10));
        assert_eq!((c.h2_max_streams, c.h2_max_resets), (256, 200));
        let c = from_flags(&["--self-signed", "ecdsa-p256", "--h2-keepalive", "0"]);
        assert_eq!(c.h2_keepalive, None);
        let e = parse(&["--self-signed", "ecdsa-p256", "--h2-max-resets", "0"])
            .resolve()
            .unwrap_err();
        assert!(e.to_string().contains("--h2-max-resets"), "{e}");
    }

    #[test]
    fn cert_dir_and_ocsp_stapling() {
        let file: AgentArgs = toml::from_str(
            r#"
            cert-dir = "/etc/baton/certs"
            ocsp-stapling = "off"
            ocsp-stapling-except = ["Shop.Example."]
            "#,
        )
        .unwrap();
        let c = parse(&[]).over(file).into_config().unwrap();
        assert_eq!(c.cert_dir, Some(PathBuf::from("/etc/baton/certs")));
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(!c.ocsp_stapling.applies_to(&names(&["www.example"])));
        assert!(c
            .ocsp_stapling
            .applies_to(&names(&["www.example", "shop.example"])));
        // on by default, the exceptions off
        let c = from_flags(&["--cert-dir", "d", "--ocsp-stapling-except", "a.test"]);
        assert!(c.ocsp_stapling.applies_to(&names(&["b.test"])));
        assert!(!c.ocsp_stapling.applies_to(&names(&["a.test"])));
        let e = parse(&["--ocsp-stapling", "on"]).resolve().unwrap_err();
        assert!(e.to_string().contains("--cert-dir"), "{e}");
    }

    #[test]
    fn flags_override_file() {
        let file: AgentArgs = toml::from_str(
            r#"
            listen = ["127.0.0.1:9000"]
            self-signed = ["rsa-2048"]
            body-size = 10
            idle-timeout = "5s"
            handshake-timeout = 3
            "#,
        )
        .unwrap();
        let flags = parse(&["--body-size", "20", "--self-signed", "ecdsa-p256"]);
        let c = flags.over(file).into_config().unwrap();
        assert_eq!(
            c.listen,
            vec!["127.0.0.1:9000".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(c.self_signed, vec![KeyKind::EcdsaP256]);
        assert_eq!(c.body_size, 20);
        assert_eq!(c.idle_timeout, Duration::from_secs(5));
        assert_eq!(c.handshake_timeout, Duration::from_secs(3));
    }

    #[test]
    fn unknown_keys_and_bad_pairs_are_clear_errors() {
        let e = toml::from_str::<AgentArgs>("lisen = []")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `lisen`"), "{e}");
        let e = parse(&["--cert", "a.pem"])
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(e.contains("pairs"), "{e}");
        let e = parse(&[]).resolve().unwrap_err().to_string();
        assert!(e.contains("no certificate"), "{e}");
        let e = parse(&["--cert", "a.pem", "--key-signer", "unix:/s"])
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(e.contains("--key-signer-auth-key-file"), "{e}");
        let signer = ["--key-signer", "unix:/s", "--key-signer-auth-key-file", "k"];
        let with = |extra: &[&str]| {
            let mut f = signer.to_vec();
            f.extend_from_slice(extra);
            parse(&f).resolve()
        };
        let c = with(&["--cert", "a.pem"]).unwrap();
        assert_eq!(c.certs, vec![(PathBuf::from("a.pem"), None)]);
        let e = with(&["--cert", "a.pem", "--key", "a.key"]).unwrap_err();
        assert!(e.to_string().contains("fallback local"), "{e}");
        let e = with(&["--cert", "a.pem", "--key-signer-fallback", "local"]).unwrap_err();
        assert!(e.to_string().contains("pairs"), "{e}");
        let c = with(&[
            "--cert",
            "a.pem",
            "--key",
            "a.key",
            "--key-signer-fallback",
            "local",
        ])
        .unwrap();
        assert_eq!(c.key_signer.unwrap().fallback, SignerFallback::Local,);
        let e = parse(&["--self-signed", "ed25519", "--client-auth", "optional"])
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(e.contains("--client-ca"), "{e}");
    }

    #[test]
    fn redis_store_forms() {
        let kind = |s: &str| store_kind(Some(s), None, vec![], vec![]);
        let url = |s: &str| match kind(s).unwrap() {
            StoreKind::Redis { url } => url,
            other => panic!("{other:?}"),
        };
        assert_eq!(url("redis"), "redis://127.0.0.1:6379/");
        assert_eq!(url("redis=redis://h:1/"), "redis://h:1/");
        assert_eq!(
            url("redis-sentinel=redis+sentinel://a:26379,b:26379/m"),
            "redis+sentinel://a:26379,b:26379/m"
        );
        assert_eq!(
            url("redis-cluster=redis://a:7000,b:7001/"),
            "redis+cluster://a:7000,b:7001/"
        );
        for bad in [
            "redis=redis://a:1,b:2/",
            "redis-sentinel=redis+sentinel://a:26379",
            "redis-cluster=redis+sentinel://a/m",
            "rediss",
        ] {
            assert!(kind(bad).is_err(), "{bad}");
        }
        let e = kind("redis-sentinel=redis+sentinel://u:s3cret@a:26379").unwrap_err();
        assert!(!format!("{e:#}").contains("s3cret"));
        let k = kind("redis-cluster=redis://u:s3cret@a:7000,b:7001/").unwrap();
        assert!(!format!("{k:?}").contains("s3cret"));
    }
}
