//! The access log: one line per request, and one per TLS connection that carried no request
//! (a handshake only, a preconnect, a session that moved on before asking anything), in a
//! combined-like text format or JSON.
//!
//! A line is formatted where its request ends, on the connection's own thread while what it
//! says is still in cache, and appended to one shared buffer; a writer thread of its own takes
//! the whole buffer at a time and writes it, so a connection never waits for the disk, and no
//! record crosses threads to be formatted and freed there. When the buffer is full (the disk
//! is behind) a line is dropped and counted. SIGUSR1 reopens the file (logrotate's rename, then
//! the signal: lines before it go to the renamed file, lines after to the new one, none lost).

mod counted;
mod format;
mod record;
mod writer;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

pub use counted::{finish, Pending, Unanswered};
use format::Line;
use record::ConnLine;
pub use record::{ConnFields, Handshake, Migrated};
use writer::Queue;

pub use crate::config::AccessLogFormat as Format;

/// Bytes of lines waiting for the writer at most; past it lines are dropped (and counted).
/// Several seconds of a busy agent's lines.
const QUEUED: usize = 1 << 20;

/// What the access log counts, for /metrics.
#[derive(Debug, Default)]
pub struct Counters {
    pub written: AtomicU64,
    pub dropped: AtomicU64,
    pub errors: AtomicU64,
    pub reopened: AtomicU64,
}

/// A handle on the access log, shared by every connection.
#[derive(Clone)]
pub struct AccessLog {
    shared: Arc<Shared>,
}

struct Shared {
    queue: Arc<Queue>,
    format: Format,
    counters: Arc<Counters>,
    agent_id: u16,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The last handle gone (every connection's included): the writer writes what is left and ends.
impl Drop for Shared {
    fn drop(&mut self) {
        self.queue.close(None);
    }
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog").finish_non_exhaustive()
    }
}

impl AccessLog {
    /// Opens `path` (`-`: standard output) for appending and starts the writer thread.
    pub fn open(path: &Path, format: Format, agent_id: u16) -> anyhow::Result<AccessLog> {
        let target = writer::Target::of(path);
        let out = target
            .open()
            .with_context(|| format!("opening the access log {}", path.display()))?;
        let queue = Arc::new(Queue::default());
        let counters = Arc::new(Counters::default());
        let writer = writer::Writer {
            target,
            out,
            queue: queue.clone(),
            counters: counters.clone(),
        };
        let handle = std::thread::Builder::new()
            .name("baton-access-log".into())
            .spawn(move || writer.run())
            .context("starting the access log's writer")?;
        Ok(AccessLog {
            shared: Arc::new(Shared {
                queue,
                format,
                counters,
                agent_id,
                writer: Mutex::new(Some(handle)),
            }),
        })
    }

    pub fn counters(&self) -> Arc<Counters> {
        self.shared.counters.clone()
    }

    /// Reopens the file before the next line (SIGUSR1).
    pub fn reopen(&self) {
        self.shared.queue.reopen();
    }

    /// The log of a TLS connection whose handshake is done (`fields` from its `ConnInfo`;
    /// the agent id is the log's).
    pub fn connection(&self, mut fields: ConnFields) -> Arc<ConnLog> {
        fields.agent_id = self.shared.agent_id;
        Arc::new(ConnLog {
            log: self.clone(),
            fields,
            opened: Instant::now(),
            requests: AtomicU64::new(0),
        })
    }

    /// Writes a request's line, once the request has ended.
    fn request_done(&self, pending: &Pending) {
        if let Some(line) = Line::of_request(pending) {
            self.append(&line);
        }
    }

    /// Formats a line onto the writer's buffer; drops (and counts) it if the writer is behind.
    fn append(&self, line: &Line<'_>) {
        let s = &self.shared;
        if !s
            .queue
            .append(QUEUED, |buf| format::write(buf, s.format, line))
        {
            s.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Writes out what is buffered and stops the writer (at exit), waiting at most `within`.
    pub fn close(&self, within: Duration) {
        let (ack, acked) = std::sync::mpsc::sync_channel(1);
        self.shared.queue.close(Some(ack));
        if acked.recv_timeout(within).is_ok() {
            if let Some(h) = self.shared.writer.lock().ok().and_then(|mut h| h.take()) {
                let _ = h.join();
            }
        }
    }
}

/// One TLS connection's part of the log: what its lines say about it, and whether it carried
/// a request (if not, its own line is written when it ends, i.e. when this is dropped).
#[derive(Debug)]
pub struct ConnLog {
    log: AccessLog,
    fields: ConnFields,
    opened: Instant,
    requests: AtomicU64,
}

impl Drop for ConnLog {
    fn drop(&mut self) {
        if *self.requests.get_mut() > 0 {
            return;
        }
        let line = ConnLine {
            fields: std::mem::take(&mut self.fields),
            at: SystemTime::now(),
            lasted: self.opened.elapsed(),
        };
        self.log.append(&Line::of_connection(&line));
    }
}

/// The access log's counters as metrics.
#[derive(Debug)]
pub struct Collected(pub Arc<Counters>);

impl Collector for Collected {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let c = &self.0;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        baton_ops::metrics::counter(
            &mut e,
            "baton_access_log_lines",
            "Access log lines written.",
            load(&c.written),
        )?;
        baton_ops::metrics::counter(
            &mut e,
            "baton_access_log_dropped",
            "Access log lines dropped: the writer was behind (its queue full) or gone.",
            load(&c.dropped),
        )?;
        baton_ops::metrics::counter(
            &mut e,
            "baton_access_log_write_errors",
            "Access log writes or reopens that failed.",
            load(&c.errors),
        )?;
        baton_ops::metrics::counter(
            &mut e,
            "baton_access_log_reopens",
            "Access log files reopened (SIGUSR1).",
            load(&c.reopened),
        )
    }
}
