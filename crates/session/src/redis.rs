//! `--store redis=URL`: sessions in a shared Redis, with a local cache in front.
//!
//! rustls asks for sessions synchronously, inside the handshake, so the store never blocks on
//! the network for long: writes are queued to a worker thread that owns the Redis connection,
//! and a lookup that misses locally waits for Redis at most `wait`. When Redis is down, slow or
//! returns something that does not open, the lookup is a miss — the client gets a full
//! handshake, never an error — and the miss is counted as a fallback.
//!
//! Three deployments, one worker ([`Target`], parsed from the URL without I/O):
//!
//! - one server, `redis://[USER:PASSWORD@]HOST:PORT/[DB]`;
//! - Redis Sentinel, `redis+sentinel://[USER:PASSWORD@]H1:P1,H2:P2,.../PRIMARY[/DB]`: the worker
//!   asks the sentinels (the `redis` crate's `SentinelClient`) for the current primary of the
//!   set named PRIMARY, connects to it, and asks again whenever the connection fails or the
//!   server stops being the primary (READONLY after a demotion): a failover is followed to the
//!   promoted replica. The credentials are the data nodes'; sentinels are asked without.
//! - Redis Cluster, `redis+cluster://[USER:PASSWORD@]H1:P1,H2:P2,.../`: the `redis` crate's
//!   cluster client routes each key to the primary of its hash slot (so sessions spread over
//!   the shards) and follows MOVED redirects; a shard failing over is, for its keys, what a
//!   Sentinel failover is.
//!
//! While the store is lost (between a primary's death and the worker's reconnection to the
//! one that replaces it), lookups are misses answered at once and counted as fallbacks, and
//! writes are dropped and counted; every reconnection after the first is counted too.
//!
//! A session whose ticket will allow early data is written differently
//! ([`SessionStore::put_acknowledged`]): the handshake waits (at most `wait`) for Redis to
//! answer the SET, so that the ticket reaches the client only once every agent's GETDEL finds
//! it; unanswered in time, no ticket is sent. While writes are slower than `wait` (measured on
//! every SET) or Redis is lost, [`SessionStore::acknowledges_promptly`] says so, and the agent
//! sends tickets without early data, written without waiting.
//!
//! Values in Redis are sealed with the cluster key (AEAD, key id, issuer) and carry their
//! expiry inside the sealed part, so Redis (and anyone reading it) never sees a secret and a
//! stale or foreign blob is a miss.
//!
//! Single use (`take_once`, for 0-RTT): a GETDEL runs on one primary — the server, Sentinel's
//! current primary, or the primary of the key's shard in a Cluster (a key lives in exactly one
//! slot, and GETDEL is one atomic command there) — so of all the agents only one can get the
//! value. Replication is asynchronous, though: a primary that dies right after a GETDEL may
//! not have passed the deletion on, and the replica promoted in its place may still hold the
//! key. So for [`RECONNECT_QUARANTINE`] after every reconnection a take is not called
//! exclusive (a 1-RTT resumption, no early data): a replayed flight is only accepted within
//! the ticket-age tolerance of the original, which ended before the old primary died. The
//! agent's first connection is one too: it cannot tell a primary just promoted (or restarted
//! from a snapshot older than some GETDEL) from any other.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use zeroize::Zeroizing;

use crate::memory::MemoryStore;
use crate::peers::SharedRing;
use crate::store::{SessionStore, StoreStats};

/// Operations waiting for the worker, at most.
const QUEUE_LEN: usize = 8192;
const KEY_PREFIX: &[u8] = b"baton:session:";
const SEAL_CONTEXT: &[u8] = b"baton redis session v1";

/// How long after a reconnection a take is not called exclusive (see the module docs): the
/// agent's ticket-age tolerance for early data (10 s, `early::AGE_TOLERANCE_MS` in
/// baton-agent) and a margin.
pub const RECONNECT_QUARANTINE: Duration = Duration::from_secs(12);
/// Connecting to one Redis server; each command's answer (and each write).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const IO_TIMEOUT: Duration = Duration::from_secs(1);
/// Asking the sentinels for the primary, checking its ROLE included.
const DISCOVERY_DEADLINE: Duration = Duration::from_secs(2);
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// A cluster's slot map is re-read at most this often while a shard fails.
const SLOT_REFRESH: Duration = Duration::from_millis(250);
/// Most hosts one URL may list.
const MAX_HOSTS: usize = 64;

pub const SENTINEL_SCHEME: &str = "redis+sentinel://";
pub const CLUSTER_SCHEME: &str = "redis+cluster://";
const DEFAULT_SENTINEL_PORT: u16 = 26379;
const DEFAULT_PORT: u16 = 6379;

#[derive(Clone)]
pub struct RedisConfig {
    /// `redis://...`, `redis+sentinel://...` or `redis+cluster://...` ([`Target::parse`]).
    pub url: String,
    pub agent_id: u16,
    /// Local cache size and session lifetime.
    pub capacity: usize,
    pub ttl: Duration,
    /// Longest a handshake waits for Redis on a local miss.
    pub wait: Duration,
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &redact(&self.url))
            .field("agent_id", &self.agent_id)
            .finish_non_exhaustive()
    }
}

/// A host and port from a store URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    pub host: String,
    pub port: u16,
}

/// The data nodes' credentials from a store URL (percent-decoded). Debug hides the password.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    pub username: Option<String>,
    pub password: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// Where the sessions live, from the store URL: plain parsing, no I/O.
#[derive(Clone, PartialEq, Eq)]
pub enum Target {
    /// One server: `redis://[USER:PASSWORD@]HOST[:PORT][/DB]`, as the `redis` crate reads it.
    Single { url: String },
    /// `redis+sentinel://[USER:PASSWORD@]H1[:P1],H2[:P2],.../PRIMARY[/DB]` (port 26379 by
    /// default): the sentinels, and the name of the set they watch.
    Sentinel {
        sentinels: Vec<HostPort>,
        primary: String,
        credentials: Credentials,
        db: i64,
    },
    /// `redis+cluster://[USER:PASSWORD@]H1[:P1],H2[:P2],.../` (port 6379 by default): some of
    /// the cluster's nodes, from which the client learns the rest.
    Cluster {
        nodes: Vec<HostPort>,
        credentials: Credentials,
    },
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Single { url } => f.debug_struct("Single").field("url", &redact(url)).finish(),
            Target::Sentinel {
                sentinels,
                primary,
                credentials,
                db,
            } => f
                .debug_struct("Sentinel")
                .field("sentinels", sentinels)
                .field("primary", primary)
                .field("credentials", credentials)
                .field("db", db)
                .finish(),
            Target::Cluster { nodes, credentials } => f
                .debug_struct("Cluster")
                .field("nodes", nodes)
                .field("credentials", credentials)
                .finish(),
        }
    }
}

impl Target {
    /// Reads a store URL. Errors name the URL with its password redacted.
    pub fn parse(url: &str) -> Result<Target, String> {
        let bad = |why: &str| format!("`{}`: {why}", redact(url));
        if let Some(rest) = url.strip_prefix(SENTINEL_SCHEME) {
            let (credentials, sentinels, path) =
                split_hosts(rest, DEFAULT_SENTINEL_PORT).map_err(|e| bad(&e))?;
            let mut parts = path.split('/');
            let primary = parts.next().unwrap_or_default();
            if primary.is_empty()
                || primary.len() > 128
                || !primary
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
            {
                return Err(bad(
                    "name the primary after the sentinels: redis+sentinel://H1:26379,H2:26379/NAME",
                ));
            }
            let db = match parts.next() {
                None | Some("") => 0,
                Some(db) => db
                    .parse::<i64>()
                    .ok()
                    .filter(|db| (0..=1 << 20).contains(db))
                    .ok_or_else(|| bad("the database after the primary's name is not a number"))?,
            };
            if parts.next().is_some() {
                return Err(bad("nothing may follow /NAME/DB"));
            }
            Ok(Target::Sentinel {
                sentinels,
                primary: primary.to_string(),
                credentials,
                db,
            })
        } else if let Some(rest) = url.strip_prefix(CLUSTER_SCHEME) {
            let (credentials, nodes, path) =
                split_hosts(rest, DEFAULT_PORT).map_err(|e| bad(&e))?;
            if !path.is_empty() && path != "0" {
                return Err(bad(
                    "a Redis Cluster has one database: no path after the nodes",
                ));
            }
            Ok(Target::Cluster { nodes, credentials })
        } else if let Some(rest) = url.strip_prefix("redis://") {
            let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
            let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            if hosts.contains(',') {
                return Err(bad(
                    "several hosts: use redis-sentinel=redis+sentinel://... or \
                     redis-cluster=redis+cluster://...",
                ));
            }
            Ok(Target::Single {
                url: url.to_string(),
            })
        } else {
            Err(bad(
                "not a redis://, redis+sentinel:// or redis+cluster:// URL",
            ))
        }
    }

    /// The `--store` form that names this kind of target.
    pub fn form(&self) -> &'static str {
        match self {
            Target::Single { .. } => "redis",
            Target::Sentinel { .. } => "redis-sentinel",
            Target::Cluster { .. } => "redis-cluster",
        }
    }
}

/// The store URL for an agent's `--store` value `redis=URL` (any of the three forms),
/// `redis-sentinel=URL` (`redis+sentinel://...`, or `redis://` with the sentinels) or
/// `redis-cluster=URL` (`redis+cluster://...`, or `redis://` with some of the nodes). `None`
/// when the value is none of these forms; an error (password redacted) when the URL is wrong.
pub fn store_url(value: &str) -> Option<Result<String, String>> {
    let (form, url) = value.split_once('=')?;
    let url = match form {
        "redis" => url.to_string(),
        "redis-sentinel" => rescheme(url, SENTINEL_SCHEME),
        "redis-cluster" => rescheme(url, CLUSTER_SCHEME),
        _ => return None,
    };
    Some(Target::parse(&url).and_then(|target| {
        if form == "redis" || target.form() == form {
            Ok(url)
        } else {
            Err(format!(
                "`{}` is a {} URL, not a {form} one",
                redact(&url),
                target.form()
            ))
        }
    }))
}

fn rescheme(url: &str, scheme: &str) -> String {
    match url.strip_prefix("redis://") {
        Some(rest) => format!("{scheme}{rest}"),
        None => url.to_string(),
    }
}

/// `[CREDENTIALS@]HOST[:PORT],...[/PATH]`: the credentials, the hosts, and the path without
/// its leading and trailing slashes.
fn split_hosts(
    rest: &str,
    default_port: u16,
) -> Result<(Credentials, Vec<HostPort>, &str), String> {
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if path.contains(['?', '#']) {
        return Err("no query or fragment allowed".into());
    }
    let (credentials, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (credentials(userinfo)?, hosts),
        None => (Credentials::default(), authority),
    };
    if hosts.contains(['?', '#']) {
        return Err("no query or fragment allowed".into());
    }
    let hosts = hosts
        .split(',')
        .map(|h| host_port(h, default_port))
        .collect::<Result<Vec<_>, _>>()?;
    if hosts.len() > MAX_HOSTS {
        return Err(format!("more than {MAX_HOSTS} hosts"));
    }
    Ok((credentials, hosts, path.trim_end_matches('/')))
}

fn host_port(s: &str, default_port: u16) -> Result<HostPort, String> {
    let (host, port) = match s.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("`{s}`: no closing ] after an IPv6 address"))?;
            match after {
                "" => (host, None),
                _ => (
                    host,
                    Some(
                        after
                            .strip_prefix(':')
                            .ok_or_else(|| format!("`{s}`: expected :PORT after ]"))?,
                    ),
                ),
            }
        }
        None => match s.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (s, None),
        },
    };
    let v6 = s.starts_with('[');
    if host.is_empty()
        || host.len() > 253
        || !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-_".contains(c) || (v6 && c == ':'))
    {
        return Err(format!("`{s}` is not HOST[:PORT]"));
    }
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| format!("`{s}`: bad port"))?,
    };
    Ok(HostPort {
        host: host.to_string(),
        port,
    })
}

/// `USER:PASSWORD`, `:PASSWORD` or `PASSWORD` (percent-encoded). Errors never quote it.
fn credentials(userinfo: &str) -> Result<Credentials, String> {
    let (user, password) = match userinfo.split_once(':') {
        Some((user, password)) => (user, password),
        None => ("", userinfo),
    };
    let decode = |s: &str| percent_decode(s).ok_or("the credentials are not well percent-encoded");
    let user = decode(user)?;
    let password = decode(password)?;
    Ok(Credentials {
        username: (!user.is_empty()).then_some(user),
        password: (!password.is_empty()).then_some(password),
    })
}

fn percent_decode(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

/// The worker's answer to a Get.
enum Reply {
    Value(Vec<u8>),
    Nil,
    /// Redis down or failing: a miss the caller must not take for "absent".
    Failed,
}

enum Op {
    Get {
        key: Vec<u8>,
        take: bool,
        reply: SyncSender<Reply>,
    },
    Set {
        key: Vec<u8>,
        sealed: Vec<u8>,
        ttl: Duration,
        /// Told whether Redis stored it (a put waiting for the answer).
        ack: Option<SyncSender<bool>>,
        queued: Instant,
    },
    /// Takes or renews (`ttl`) or releases (`None`) the lock `key` for `token`.
    Lock {
        key: Vec<u8>,
        token: Vec<u8>,
        ttl: Option<Duration>,
        reply: Option<SyncSender<bool>>,
    },
}

/// `SET NX PX`, or the holder's renewal: 1 when `ARGV[1]` holds `KEYS[1]` for `ARGV[2]` ms.
const LOCK_SCRIPT: &str = "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then \
     return 1 end \
     if redis.call('GET', KEYS[1]) == ARGV[1] then \
     redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end \
     return 0";
/// The longest a lock's answer is waited for.
const LOCK_WAIT: Duration = Duration::from_secs(2);
/// Compare-and-delete: only the holder's token releases the lock.
const UNLOCK_SCRIPT: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     return redis.call('DEL', KEYS[1]) end return 0";

#[derive(Debug)]
struct Counters {
    sent: AtomicU64,
    received: AtomicU64,
    dropped: AtomicU64,
    rejected: AtomicU64,
    fallbacks: AtomicU64,
    reconnects: AtomicU64,
    unacknowledged: AtomicU64,
    /// The worker lost its connection after having had one, and has not got one back:
    /// lookups fail at once instead of waiting.
    down: AtomicBool,
    /// Until when (ms after `epoch`) a take is not exclusive.
    quarantine_until_ms: AtomicU64,
    /// Connected, and the last SET was answered within `wait` of being queued.
    prompt: AtomicBool,
    wait: Duration,
    epoch: Instant,
}

impl Counters {
    fn new(wait: Duration) -> Counters {
        Counters {
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            unacknowledged: AtomicU64::new(0),
            down: AtomicBool::new(false),
            quarantine_until_ms: AtomicU64::new(0),
            prompt: AtomicBool::new(false),
            wait,
            epoch: Instant::now(),
        }
    }

    fn ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }

    fn quarantined(&self, now: Instant) -> bool {
        self.ms(now) < self.quarantine_until_ms.load(Ordering::Relaxed)
    }
}

#[derive(Debug)]
pub struct RedisStore {
    local: MemoryStore,
    ops: SyncSender<Op>,
    ring: SharedRing,
    agent_id: u16,
    wait: Duration,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Op::Get { .. } => "Get",
            Op::Set { .. } => "Set",
            Op::Lock { .. } => "Lock",
        })
    }
}

/// `url` with its password (or a credential without a user) replaced by `***`: for messages
/// and logs, which must not carry the Redis password. Works on every store URL form (several
/// hosts after one `USER:PASSWORD@`).
pub fn redact(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let rest = &url[start..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let Some(at) = authority.rfind('@') else {
        return url.to_string();
    };
    let user = match authority[..at].split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => "***".to_string(),
    };
    format!("{}{user}{}", &url[..start], &rest[at..])
}

impl RedisStore {
    /// Checks the URL and starts the worker thread (which connects, and reconnects, by itself:
    /// an agent starts even while Redis is down).
    pub fn start(config: RedisConfig, ring: SharedRing) -> Result<Arc<Self>, String> {
        let target = Target::parse(&config.url).map_err(|e| format!("--store: {e}"))?;
        let connector = Connector::new(target)
            .map_err(|e| format!("--store redis={}: {e}", redact(&config.url)))?;
        let (tx, rx) = mpsc::sync_channel(QUEUE_LEN);
        let counters = Arc::new(Counters::new(config.wait));
        let worker_counters = counters.clone();
        std::thread::Builder::new()
            .name("baton-redis".into())
            .spawn(move || worker(connector, rx, worker_counters))
            .map_err(|e| format!("starting Redis worker: {e}"))?;
        Ok(Arc::new(Self {
            local: MemoryStore::new(config.capacity, config.ttl),
            ops: tx,
            ring,
            agent_id: config.agent_id,
            wait: config.wait,
            counters,
        }))
    }

    fn seal(&self, key: &[u8], value: &[u8], expires_ms: u64) -> Option<Vec<u8>> {
        let mut plain = Zeroizing::new(Vec::with_capacity(8 + value.len()));
        plain.extend_from_slice(&expires_ms.to_be_bytes());
        plain.extend_from_slice(value);
        let ring = self.ring.read().unwrap_or_else(|p| p.into_inner());
        ring.seal(self.agent_id, &plain, &[SEAL_CONTEXT, key].concat())
    }

    /// The value and its remaining lifetime, if the blob opens and has not expired.
    fn open(&self, key: &[u8], sealed: &[u8]) -> Option<(Zeroizing<Vec<u8>>, Duration)> {
        let ring = self.ring.read().unwrap_or_else(|p| p.into_inner());
        let plain = Zeroizing::new(ring.open(sealed, &[SEAL_CONTEXT, key].concat())?);
        let expires = u64::from_be_bytes(plain.get(..8)?.try_into().ok()?);
        let left = expires.checked_sub(unix_ms())?;
        Some((
            Zeroizing::new(plain[8..].to_vec()),
            Duration::from_millis(left),
        ))
    }

    fn fetch(&self, key: &[u8], take: bool, now: Instant) -> Option<Vec<u8>> {
        match self.ask(key, take, now) {
            Shared::Found(v) => Some(v),
            Shared::Absent | Shared::Unavailable => None,
        }
    }

    /// Asks Redis for `key` (GETDEL when `take`), waiting at most `wait` (not at all while the
    /// worker knows Redis is lost).
    fn ask(&self, key: &[u8], take: bool, now: Instant) -> Shared {
        if self.counters.down.load(Ordering::Relaxed) {
            self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
            return Shared::Unavailable;
        }
        let (reply, answer) = mpsc::sync_channel(1);
        let op = Op::Get {
            key: key.to_vec(),
            take,
            reply,
        };
        if self.ops.try_send(op).is_err() {
            self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
            return Shared::Unavailable;
        }
        let sealed = match answer.recv_timeout(self.wait) {
            Ok(Reply::Value(sealed)) => sealed,
            Ok(Reply::Nil) => return Shared::Absent,
            // Redis down: counted by the worker.
            Ok(Reply::Failed) => return Shared::Unavailable,
            Err(_) => {
                self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
                return Shared::Unavailable;
            }
        };
        let Some((value, left)) = self.open(key, &sealed) else {
            // Deleted by the GETDEL all the same: nobody else gets it either.
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            return Shared::Absent;
        };
        self.counters.received.fetch_add(1, Ordering::Relaxed);
        if !take {
            self.local.put_for(key, &value, left, now);
        }
        Shared::Found(value.to_vec())
    }
}

/// What Redis answered for a key.
enum Shared {
    /// A blob that opened (and, for a take, that this GETDEL deleted).
    Found(Vec<u8>),
    /// Redis answered: no such key (or a blob that does not open).
    Absent,
    /// Redis did not answer in time, or is down.
    Unavailable,
}

/// The single-use decision of a take: only Redis's own GETDEL can say that this agent is the
/// one that removed the session. A copy in the local cache is never exclusive: another agent
/// may have taken the shared copy already (the local cache of the agent that issued a ticket
/// keeps it after a peer resumed it), or will take it once Redis is back. Nor is a GETDEL
/// shortly after a reconnection (`quarantined`): the primary that answered may be a promoted
/// replica that never learnt of a GETDEL its predecessor ran.
fn combine(local: Option<Vec<u8>>, shared: Shared, quarantined: bool) -> crate::Taken {
    use crate::Taken;
    match (shared, local) {
        (Shared::Found(v), _) if quarantined => Taken::Local(v),
        (Shared::Found(v), _) => Taken::Exclusive(v),
        (Shared::Absent, Some(v)) => Taken::Reused(v),
        (Shared::Unavailable, Some(v)) => Taken::Local(v),
        (Shared::Absent, None) => Taken::Absent,
        (Shared::Unavailable, None) => Taken::Unavailable,
    }
}

impl SessionStore for RedisStore {
    fn put(&self, key: &[u8], value: &[u8], now: Instant) -> bool {
        let stored = self.local.put(key, value, now);
        let ttl = self.local.ttl();
        let Some(sealed) = self.seal(key, value, unix_ms() + ttl.as_millis() as u64) else {
            return stored;
        };
        match self.ops.try_send(Op::Set {
            key: key.to_vec(),
            sealed,
            ttl,
            ack: None,
            queued: Instant::now(),
        }) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        stored
    }

    /// Queues the SET and waits for Redis's answer (the worker is told through `ack`; a SET
    /// dropped while Redis is lost drops `ack`, which ends the wait at once). The local copy
    /// is kept only once Redis has the value: a session whose ticket is never sent is dead.
    fn put_acknowledged(&self, key: &[u8], value: &[u8], now: Instant) -> bool {
        let unacknowledged = || {
            self.counters.unacknowledged.fetch_add(1, Ordering::Relaxed);
            false
        };
        // Lost, not yet connected, or slow: no wait in a handshake that would be in vain.
        if !self.acknowledges_promptly() {
            return unacknowledged();
        }
        let ttl = self.local.ttl();
        let Some(sealed) = self.seal(key, value, unix_ms() + ttl.as_millis() as u64) else {
            return unacknowledged();
        };
        let (ack, acked) = mpsc::sync_channel(1);
        let op = Op::Set {
            key: key.to_vec(),
            sealed,
            ttl,
            ack: Some(ack),
            queued: Instant::now(),
        };
        if self.ops.try_send(op).is_err() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return unacknowledged();
        }
        match acked.recv_timeout(self.wait) {
            Ok(true) => {
                self.local.put(key, value, now);
                true
            }
            // Redis failed it, or answers later than `wait` (the worker then marks writes slow)
            Ok(false) | Err(_) => unacknowledged(),
        }
    }

    fn acknowledges_promptly(&self) -> bool {
        self.counters.prompt.load(Ordering::Relaxed)
    }

    fn get(&self, key: &[u8], now: Instant) -> Option<Vec<u8>> {
        self.local
            .get(key, now)
            .or_else(|| self.fetch(key, false, now))
    }

    fn take(&self, key: &[u8], now: Instant) -> Option<Vec<u8>> {
        // Single use across the cluster: the shared copy must go whether or not we had it.
        let local = self.local.take(key, now);
        let shared = self.fetch(key, true, now);
        local.or(shared)
    }

    fn take_once(&self, key: &[u8], now: Instant) -> crate::Taken {
        let local = self.local.take(key, now);
        let shared = self.ask(key, true, now);
        combine(local, shared, self.counters.quarantined(now))
    }

    fn stats(&self) -> StoreStats {
        let c = &self.counters;
        StoreStats {
            sent: c.sent.load(Ordering::Relaxed),
            received: c.received.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            fallbacks: c.fallbacks.load(Ordering::Relaxed),
            reconnects: c.reconnects.load(Ordering::Relaxed),
            unacknowledged: c.unacknowledged.load(Ordering::Relaxed),
            ..self.local.stats()
        }
    }

    fn lock(&self, key: &[u8], token: &[u8], ttl: Duration) -> Option<bool> {
        if self.counters.down.load(Ordering::Relaxed) {
            return None;
        }
        let (reply, answer) = mpsc::sync_channel(1);
        let op = Op::Lock {
            key: key.to_vec(),
            token: token.to_vec(),
            ttl: Some(ttl),
            reply: Some(reply),
        };
        self.ops.try_send(op).ok()?;
        // not on a handshake's path: a lock may wait a little longer than a session
        answer.recv_timeout(self.wait.max(LOCK_WAIT)).ok()
    }

    fn unlock(&self, key: &[u8], token: &[u8]) {
        let _ = self.ops.try_send(Op::Lock {
            key: key.to_vec(),
            token: token.to_vec(),
            ttl: None,
            reply: None,
        });
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn redis_key(key: &[u8]) -> Vec<u8> {
    [KEY_PREFIX, key].concat()
}

/// How the worker gets a connection, for each kind of target.
enum Connector {
    Single(redis::Client),
    Sentinel(Sentinels),
    Cluster(redis::cluster::ClusterClient),
}

struct Sentinels {
    addrs: Vec<redis::ConnectionAddr>,
    primary: String,
    credentials: Credentials,
    db: i64,
    /// A query that outlived its deadline, still running on its own thread: no second one is
    /// started while it hangs.
    pending: Option<Receiver<Result<redis::Client, String>>>,
}

/// A connection to the one server, Sentinel's current primary, or the cluster.
enum Conn {
    One(Box<redis::Connection>),
    Cluster(Box<redis::cluster::ClusterConnection>),
}

impl Conn {
    fn get(&mut self) -> &mut dyn redis::ConnectionLike {
        match self {
            Conn::One(c) => c.as_mut(),
            Conn::Cluster(c) => c.as_mut(),
        }
    }
}

impl Connector {
    /// Checks what can be checked without I/O.
    fn new(target: Target) -> Result<Connector, String> {
        let tcp = |h: &HostPort| redis::ConnectionAddr::Tcp(h.host.clone(), h.port);
        Ok(match target {
            Target::Single { url } => {
                Connector::Single(redis::Client::open(url.as_str()).map_err(|e| e.to_string())?)
            }
            Target::Sentinel {
                sentinels,
                primary,
                credentials,
                db,
            } => Connector::Sentinel(Sentinels {
                addrs: sentinels.iter().map(tcp).collect(),
                primary,
                credentials,
                db,
                pending: None,
            }),
            Target::Cluster { nodes, credentials } => {
                let mut b = redis::cluster::ClusterClient::builder(nodes.iter().map(tcp))
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(IO_TIMEOUT)
                    // One retry: enough for a MOVED redirect; a dead shard primary comes back
                    // to the worker as an error (a miss, and a reconnection) at once.
                    .retries(1)
                    .min_retry_wait(10)
                    .max_retry_wait(100);
                if let Some(user) = &credentials.username {
                    b = b.username(user);
                }
                if let Some(password) = &credentials.password {
                    b = b.password(password);
                }
                Connector::Cluster(b.build().map_err(|e| e.to_string())?)
            }
        })
    }

    /// A connection and what it reaches (an address, for logs), every phase with a deadline.
    fn connect(&mut self) -> Result<(Conn, String), String> {
        let one = |client: &redis::Client| -> Result<(Conn, String), String> {
            let con = client
                .get_connection_with_timeout(CONNECT_TIMEOUT)
                .map_err(|e| e.to_string())?;
            let _ = con.set_read_timeout(Some(IO_TIMEOUT));
            let _ = con.set_write_timeout(Some(IO_TIMEOUT));
            Ok((
                Conn::One(Box::new(con)),
                client.get_connection_info().addr().to_string(),
            ))
        };
        match self {
            Connector::Single(client) => one(client),
            Connector::Sentinel(sentinels) => one(&sentinels.primary()?),
            Connector::Cluster(client) => {
                let con = client.get_connection().map_err(|e| e.to_string())?;
                let _ = con.set_read_timeout(Some(IO_TIMEOUT));
                let _ = con.set_write_timeout(Some(IO_TIMEOUT));
                Ok((Conn::Cluster(Box::new(con)), "the cluster".into()))
            }
        }
    }
}

impl Sentinels {
    /// A client for the current primary, as the sentinels name it (and as it confirms with
    /// ROLE). The `redis` crate's sentinel client has no deadlines of its own, so it runs on
    /// a thread of its own that the worker waits for at most [`DISCOVERY_DEADLINE`].
    fn primary(&mut self) -> Result<redis::Client, String> {
        if let Some(pending) = &self.pending {
            match pending.try_recv() {
                Err(TryRecvError::Empty) => {
                    return Err("the last query to the sentinels still hangs".into())
                }
                // Done meanwhile: its answer may be stale; ask again.
                _ => self.pending = None,
            }
        }
        let builder = redis::sentinel::SentinelClientBuilder::new(
            self.addrs.clone(),
            &self.primary,
            redis::sentinel::SentinelServerType::Master,
        )
        .map_err(|e| e.to_string())?
        .set_client_to_redis_db(self.db);
        let builder = match &self.credentials.username {
            Some(user) => builder.set_client_to_redis_username(user),
            None => builder,
        };
        let builder = match &self.credentials.password {
            Some(password) => builder.set_client_to_redis_password(password),
            None => builder,
        };
        let (tx, rx) = mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("baton-redis-sentinel".into())
            .spawn(move || {
                let answer = builder
                    .build()
                    .and_then(|mut client| client.get_client())
                    .map_err(|e| e.to_string());
                let _ = tx.send(answer);
            })
            .map_err(|e| format!("starting a sentinel query: {e}"))?;
        match rx.recv_timeout(DISCOVERY_DEADLINE) {
            Ok(answer) => answer,
            Err(RecvTimeoutError::Timeout) => {
                self.pending = Some(rx);
                Err(format!(
                    "the sentinels did not name a primary within {DISCOVERY_DEADLINE:?}"
                ))
            }
            Err(RecvTimeoutError::Disconnected) => Err("the sentinel query failed".into()),
        }
    }
}

/// Owns the connection: serves queued operations, reconnects with backoff (asking the
/// sentinels again, or the cluster for its slots). While Redis is unreachable, lookups are
/// answered "miss" at once (and counted), writes are dropped (and counted).
///
/// In a cluster, one shard failing does not stop the others: the worker keeps its connection
/// and re-reads the slot map (a new cluster connection, at most every [`SLOT_REFRESH`]) until
/// the shard's replica has taken over; only when no node answers is the store down.
fn worker(mut connector: Connector, ops: Receiver<Op>, counters: Arc<Counters>) {
    let mut backoff = MIN_BACKOFF;
    let mut last: Option<String> = None;
    loop {
        match connector.connect() {
            Ok((mut con, reached)) => {
                backoff = MIN_BACKOFF;
                match &last {
                    None => {
                        tracing::info!(server = %reached, "connected to Redis session store");
                        quarantine(&counters);
                    }
                    Some(before) => {
                        reconnected(&counters);
                        if *before != reached {
                            tracing::warn!(from = %before, to = %reached,
                                "Redis session store: following the failover to a new primary");
                        } else {
                            tracing::info!(server = %reached, "reconnected to Redis session store");
                        }
                    }
                }
                last = Some(reached);
                counters.down.store(false, Ordering::Relaxed);
                counters.prompt.store(true, Ordering::Relaxed);
                let mut next_refresh = Instant::now();
                loop {
                    let Ok(op) = ops.recv() else { return };
                    let Err(e) = serve(con.get(), op, &counters) else {
                        continue;
                    };
                    if !matches!(con, Conn::Cluster(_)) {
                        tracing::warn!(error = %e, "Redis session store failed; reconnecting");
                        break;
                    }
                    if Instant::now() < next_refresh {
                        tracing::debug!(error = %e, "Redis Cluster session store: a shard failed");
                        continue;
                    }
                    next_refresh = Instant::now() + SLOT_REFRESH;
                    match connector.connect() {
                        Ok((fresh, _)) => {
                            tracing::warn!(error = %e,
                                "Redis Cluster session store: a shard failed; slot map re-read");
                            con = fresh;
                            reconnected(&counters);
                        }
                        Err(again) => {
                            tracing::warn!(error = %again,
                                "Redis Cluster session store unreachable; reconnecting");
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "Redis session store unreachable"),
        }
        counters.prompt.store(false, Ordering::Relaxed);
        if last.is_some() {
            counters.down.store(true, Ordering::Relaxed);
        }
        // Down: answer everything that arrives during the backoff without waiting.
        let until = Instant::now() + backoff;
        backoff = (backoff * 2).min(MAX_BACKOFF);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match ops.recv_timeout(left) {
                Ok(Op::Get { reply, .. }) => {
                    counters.fallbacks.fetch_add(1, Ordering::Relaxed);
                    let _ = reply.try_send(Reply::Failed);
                }
                Ok(Op::Set { .. }) => {
                    counters.dropped.fetch_add(1, Ordering::Relaxed);
                }
                // its reply dropped: no answer, no lock
                Ok(Op::Lock { .. }) => {}
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

/// A connection made again: counted, and takes are not exclusive for a while.
fn reconnected(counters: &Counters) {
    counters.reconnects.fetch_add(1, Ordering::Relaxed);
    quarantine(counters);
}

/// Takes are not exclusive for [`RECONNECT_QUARANTINE`] from now.
fn quarantine(counters: &Counters) {
    let until = counters.ms(Instant::now() + RECONNECT_QUARANTINE);
    counters
        .quarantine_until_ms
        .fetch_max(until, Ordering::Relaxed);
}

fn serve(
    con: &mut dyn redis::ConnectionLike,
    op: Op,
    counters: &Counters,
) -> redis::RedisResult<()> {
    match op {
        Op::Get { key, take, reply } => {
            let cmd = if take { "GETDEL" } else { "GET" };
            match redis::cmd(cmd)
                .arg(redis_key(&key))
                .query::<Option<Vec<u8>>>(con)
            {
                Ok(v) => {
                    let _ = reply.try_send(v.map_or(Reply::Nil, Reply::Value));
                    Ok(())
                }
                Err(e) => {
                    counters.fallbacks.fetch_add(1, Ordering::Relaxed);
                    let _ = reply.try_send(Reply::Failed);
                    Err(e)
                }
            }
        }
        Op::Set {
            key,
            sealed,
            ttl,
            ack,
            queued,
        } => {
            let r = redis::cmd("SET")
                .arg(redis_key(&key))
                .arg(sealed)
                .arg("PX")
                .arg(ttl.as_millis().max(1) as u64)
                .query::<()>(con);
            match &r {
                Ok(()) => counters.sent.fetch_add(1, Ordering::Relaxed),
                Err(_) => counters.dropped.fetch_add(1, Ordering::Relaxed),
            };
            let prompt = r.is_ok() && queued.elapsed() <= counters.wait;
            counters.prompt.store(prompt, Ordering::Relaxed);
            if let Some(ack) = ack {
                let _ = ack.try_send(r.is_ok());
            }
            r
        }
        Op::Lock {
            key,
            token,
            ttl,
            reply,
        } => {
            let mut cmd = redis::cmd("EVAL");
            match ttl {
                Some(ttl) => cmd
                    .arg(LOCK_SCRIPT)
                    .arg(1)
                    .arg(redis_key(&key))
                    .arg(token)
                    .arg(ttl.as_millis().max(1) as u64),
                None => cmd
                    .arg(UNLOCK_SCRIPT)
                    .arg(1)
                    .arg(redis_key(&key))
                    .arg(token),
            };
            let r = cmd.query::<i64>(con);
            if let (Some(reply), Ok(n)) = (reply, &r) {
                let _ = reply.try_send(*n == 1);
            }
            r.map(|_| ())
        }
    }
}

#[cfg(test)]
mod take_tests {
    use super::{combine, Shared};
    use crate::TakenKind;

    /// Every combination of the local cache and Redis's answer: exclusive only when Redis's
    /// GETDEL handed the value over, whatever the local cache holds.
    #[test]
    fn only_redis_getdel_is_exclusive() {
        let v = || vec![7u8; 4];
        let shared = || [Shared::Found(v()), Shared::Absent, Shared::Unavailable];
        for local in [Some(v()), None] {
            for (i, s) in shared().into_iter().enumerate() {
                let taken = combine(local.clone(), s, false);
                let want = match (i, local.is_some()) {
                    (0, _) => TakenKind::Exclusive,
                    (1, true) => TakenKind::Reused,
                    (_, true) => TakenKind::Local,
                    (1, false) => TakenKind::Absent,
                    _ => TakenKind::Unavailable,
                };
                assert_eq!(
                    taken.kind(),
                    want,
                    "local {:?}, shared #{i}",
                    local.is_some()
                );
                assert_eq!(taken.into_value().is_some(), local.is_some() || i == 0);
            }
        }
    }

    /// After a reconnection Redis's GETDEL is no proof either: the value serves a 1-RTT
    /// resumption, never early data.
    #[test]
    fn a_getdel_right_after_a_reconnection_is_not_exclusive() {
        for local in [Some(vec![1u8]), None] {
            let taken = combine(local, Shared::Found(vec![7u8; 4]), true);
            assert_eq!(taken.kind(), TakenKind::Local);
            assert_eq!(taken.into_value(), Some(vec![7u8; 4]));
        }
    }
}

#[cfg(test)]
mod acknowledged_tests {
    use std::collections::HashMap;
    use std::io::{BufRead, BufReader, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::sync::{Arc, Mutex, RwLock};
    use std::time::{Duration, Instant};

    use super::{RedisConfig, RedisStore};
    use crate::{KeyRing, SessionStore, TakenKind, TicketKey};

    /// A Redis stand-in on 127.0.0.1 that keeps what is SET (answered `delay` late) for GET and
    /// GETDEL, and answers anything else `+OK`.
    fn fake_redis(delay: Duration) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let data = Arc::new(Mutex::new(HashMap::<Vec<u8>, Vec<u8>>::new()));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let data = data.clone();
                std::thread::spawn(move || serve(conn, &data, delay));
            }
        });
        addr
    }

    fn serve(conn: TcpStream, data: &Mutex<HashMap<Vec<u8>, Vec<u8>>>, delay: Duration) {
        let mut out = conn.try_clone().unwrap();
        let mut r = BufReader::new(conn);
        let mut line = Vec::new();
        let read_line = |r: &mut BufReader<TcpStream>, line: &mut Vec<u8>| {
            line.clear();
            matches!(r.read_until(b'\n', line), Ok(n) if n > 2)
        };
        loop {
            // *N, then N times $LEN and the bytes
            if !read_line(&mut r, &mut line) || line[0] != b'*' {
                return;
            }
            let n: usize = std::str::from_utf8(&line[1..line.len() - 2])
                .unwrap()
                .parse()
                .unwrap();
            let mut args = Vec::new();
            for _ in 0..n {
                if !read_line(&mut r, &mut line) {
                    return;
                }
                let len: usize = std::str::from_utf8(&line[1..line.len() - 2])
                    .unwrap()
                    .parse()
                    .unwrap();
                let mut arg = vec![0u8; len + 2];
                std::io::Read::read_exact(&mut r, &mut arg).unwrap();
                arg.truncate(len);
                args.push(arg);
            }
            let reply = match args[0].to_ascii_uppercase().as_slice() {
                b"SET" => {
                    std::thread::sleep(delay);
                    data.lock()
                        .unwrap()
                        .insert(args[1].clone(), args[2].clone());
                    b"+OK\r\n".to_vec()
                }
                cmd @ (b"GET" | b"GETDEL") => {
                    let mut data = data.lock().unwrap();
                    let v = match cmd {
                        b"GET" => data.get(&args[1]).cloned(),
                        _ => data.remove(&args[1]),
                    };
                    match v {
                        Some(v) => [format!("${}\r\n", v.len()).as_bytes(), &v, b"\r\n"].concat(),
                        None => b"$-1\r\n".to_vec(),
                    }
                }
                _ => b"+OK\r\n".to_vec(),
            };
            if out.write_all(&reply).is_err() {
                return;
            }
        }
    }

    fn store(addr: SocketAddr, wait: Duration) -> Arc<RedisStore> {
        let ring = KeyRing::new(vec![TicketKey::new(7, &[0x42; 32], Instant::now())]);
        let config = RedisConfig {
            url: format!("redis://{addr}/"),
            agent_id: 1,
            capacity: 16,
            ttl: Duration::from_secs(60),
            wait,
        };
        RedisStore::start(config, Arc::new(RwLock::new(ring))).unwrap()
    }

    fn until(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A put for early data returns once Redis has the value; one Redis answers later than the
    /// wait fails, leaves nothing behind locally, and the store says its writes are slow.
    #[test]
    fn a_put_for_early_data_waits_for_redis() {
        let fast = store(fake_redis(Duration::ZERO), Duration::from_secs(2));
        until("connected", || fast.acknowledges_promptly());
        assert!(fast.put_acknowledged(b"k", b"v", Instant::now()));
        assert_eq!(fast.local.get(b"k", Instant::now()), Some(b"v".to_vec()));

        let slow = store(
            fake_redis(Duration::from_millis(300)),
            Duration::from_millis(50),
        );
        until("connected", || slow.acknowledges_promptly());
        assert!(!slow.put_acknowledged(b"k", b"v", Instant::now()));
        assert_eq!(slow.local.get(b"k", Instant::now()), None);
        until("writes known slow", || !slow.acknowledges_promptly());
        assert!(!slow.put_acknowledged(b"k2", b"v", Instant::now()));
        assert_eq!(slow.stats().unacknowledged, 2);
        // an ordinary put neither waits nor fails
        assert!(slow.put(b"k3", b"v", Instant::now()));

        let nowhere = store("127.0.0.1:1".parse().unwrap(), Duration::from_millis(50));
        assert!(!nowhere.acknowledges_promptly());
        assert!(!nowhere.put_acknowledged(b"k", b"v", Instant::now()));
    }

    /// The first connection starts a quarantine as a reconnection does: Redis's GETDEL found
    /// the value, yet the take is not exclusive.
    #[test]
    fn the_first_connection_starts_a_quarantine() {
        let redis = store(fake_redis(Duration::ZERO), Duration::from_secs(2));
        until("connected", || redis.acknowledges_promptly());
        assert!(redis.put_acknowledged(b"k", b"v", Instant::now()));
        let taken = redis.take_once(b"k", Instant::now());
        assert_eq!(taken.kind(), TakenKind::Local);
        assert_eq!(redis.stats().reconnects, 0, "not a reconnection");
    }
}

#[cfg(test)]
mod redact_tests {
    #[test]
    fn redacts_the_password() {
        use super::redact;
        assert_eq!(
            redact("redis://u:secret@h:6379/0"),
            "redis://u:***@h:6379/0"
        );
        assert_eq!(redact("redis://:secret@h/"), "redis://:***@h/");
        assert_eq!(redact("rediss://secret@h"), "rediss://***@h");
        assert_eq!(redact("redis://h:6379/?a=b@c"), "redis://h:6379/?a=b@c");
        assert_eq!(redact("redis://u:p@ss@h/"), "redis://u:***@h/");
    }
}

#[cfg(test)]
mod url_tests {
    use super::{redact, store_url, Credentials, HostPort, Target};

    fn hp(host: &str, port: u16) -> HostPort {
        HostPort {
            host: host.into(),
            port,
        }
    }

    #[test]
    fn sentinel_urls() {
        assert_eq!(
            Target::parse("redis+sentinel://127.0.0.1:26379,h2,[::1]:26380/mymaster").unwrap(),
            Target::Sentinel {
                sentinels: vec![hp("127.0.0.1", 26379), hp("h2", 26379), hp("::1", 26380)],
                primary: "mymaster".into(),
                credentials: Credentials::default(),
                db: 0,
            }
        );
        assert_eq!(
            Target::parse("redis+sentinel://u:p%40ss@h:1/set-1/3/").unwrap(),
            Target::Sentinel {
                sentinels: vec![hp("h", 1)],
                primary: "set-1".into(),
                credentials: Credentials {
                    username: Some("u".into()),
                    password: Some("p@ss".into()),
                },
                db: 3,
            }
        );
        for bad in [
            "redis+sentinel://h:26379",
            "redis+sentinel://h:26379/",
            "redis+sentinel://h:26379/a b",
            "redis+sentinel://h:26379/m/x",
            "redis+sentinel://h:26379/m/1/2",
            "redis+sentinel://h:0/m",
            "redis+sentinel://h:99999/m",
            "redis+sentinel://h:1,,h:2/m",
            "redis+sentinel://[::1/m",
            "redis+sentinel://h:1/m?x=1",
            "redis+sentinel://u:%zz@h/m",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cluster_urls() {
        assert_eq!(
            Target::parse("redis+cluster://:pw@a:7000,b:7001,c/").unwrap(),
            Target::Cluster {
                nodes: vec![hp("a", 7000), hp("b", 7001), hp("c", 6379)],
                credentials: Credentials {
                    username: None,
                    password: Some("pw".into()),
                },
            }
        );
        assert!(Target::parse("redis+cluster://a:7000/1").is_err());
        let many = (0..65)
            .map(|i| format!("h{i}"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(Target::parse(&format!("redis+cluster://{many}/")).is_err());
    }

    #[test]
    fn single_urls_and_store_forms() {
        assert_eq!(
            Target::parse("redis://h:6379/0").unwrap(),
            Target::Single {
                url: "redis://h:6379/0".into()
            }
        );
        assert!(Target::parse("redis://a:1,b:2/").is_err());
        assert!(Target::parse("http://h/").is_err());

        assert_eq!(store_url("memory"), None);
        assert_eq!(store_url("peers=x"), None);
        assert_eq!(
            store_url("redis-cluster=redis://a:7000,b:7001/"),
            Some(Ok("redis+cluster://a:7000,b:7001/".into()))
        );
        assert_eq!(
            store_url("redis-sentinel=redis://a:26379,b:26379/m"),
            Some(Ok("redis+sentinel://a:26379,b:26379/m".into()))
        );
        assert_eq!(
            store_url("redis-sentinel=redis+sentinel://a/m"),
            Some(Ok("redis+sentinel://a/m".into()))
        );
        assert_eq!(
            store_url("redis=redis+cluster://a/"),
            Some(Ok("redis+cluster://a/".into()))
        );
        assert!(matches!(
            store_url("redis-sentinel=redis+cluster://a/"),
            Some(Err(_))
        ));
        assert!(matches!(
            store_url("redis-cluster=redis://a/m/x"),
            Some(Err(_))
        ));
    }

    /// No error, Debug or redacted form carries the password.
    #[test]
    fn passwords_never_show() {
        let urls = [
            "redis+sentinel://user:s3cret@h1:26379,h2:26379/m",
            "redis+sentinel://s3cret@h1/m",
            "redis+cluster://:s3cret@a:7000,b:7001/",
            "redis+cluster://u:s3cret@a:7000,b:7001/9",
            "redis+sentinel://u:s3cret@h1:26379/",
            "redis://u:s3cret@a:1,b:2/",
        ];
        for url in urls {
            assert!(!redact(url).contains("s3cret"), "{url}");
            match Target::parse(url) {
                Ok(t) => assert!(!format!("{t:?}").contains("s3cret"), "{url}"),
                Err(e) => assert!(!e.contains("s3cret"), "{url}: {e}"),
            }
            for form in ["redis", "redis-sentinel", "redis-cluster"] {
                if let Some(Err(e)) = store_url(&format!("{form}={url}")) {
                    assert!(!e.contains("s3cret"), "{form}={url}: {e}");
                }
            }
        }
        assert_eq!(
            redact("redis+sentinel://u:s3cret@h1:26379,h2:26379/m"),
            "redis+sentinel://u:***@h1:26379,h2:26379/m"
        );
        assert_eq!(
            redact("redis+cluster://s3cret@a:7000,b:7001/"),
            "redis+cluster://***@a:7000,b:7001/"
        );
    }

    /// Parsing and redaction never panic, whatever the input.
    #[test]
    fn parsing_never_panics() {
        use proptest::prelude::*;
        proptest!(|(s in "(redis(\\+sentinel|\\+cluster)?://)?[a-z0-9:@/,\\[\\]%?.-]{0,40}")| {
            let _ = Target::parse(&s);
            let _ = store_url(&format!("redis-sentinel={s}"));
            let _ = redact(&s);
        });
    }
}
