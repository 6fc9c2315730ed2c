//! The writer thread: takes lines off the queue, formats them into one reused buffer, writes
//! through a `BufWriter`, and flushes whenever the queue runs dry. It wakes for the first line
//! of a batch, then gathers for [`GATHER`] before it drains the queue: a connection's send then
//! rarely has a sleeping thread to wake (a futex call and two context switches per line
//! otherwise), and lines go out in large writes; a line is on disk within about [`GATHER`].
//! Reopens the file when asked.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use super::format::{self, Line};
use super::record::Msg;
use super::{Counters, Format};

/// Bytes gathered before a write, when lines come faster than the disk takes them.
const BUFFER: usize = 64 * 1024;
/// How long the writer lets lines gather after the first one wakes it. The queue
/// (`super::QUEUE` lines) must hold what arrives meanwhile at the rates an agent serves.
const GATHER: std::time::Duration = std::time::Duration::from_millis(10);

pub enum Target {
    Stdout,
    File(PathBuf),
}

impl Target {
    pub fn of(path: &Path) -> Target {
        if path == Path::new("-") {
            Target::Stdout
        } else {
            Target::File(path.to_owned())
        }
    }

    /// Opens for appending: the file is created (owner and group may read it) if missing.
    pub fn open(&self) -> io::Result<BufWriter<Box<dyn Write + Send>>> {
        let out: Box<dyn Write + Send> = match self {
            Target::Stdout => Box::new(io::stdout()),
            Target::File(path) => Box::new(open_file(path)?),
        };
        Ok(BufWriter::with_capacity(BUFFER, out))
    }
}

fn open_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .open(path)
}

pub struct Writer {
    pub target: Target,
    pub format: Format,
    pub out: BufWriter<Box<dyn Write + Send>>,
    pub reopen: Arc<AtomicBool>,
    pub counters: Arc<Counters>,
}

impl Writer {
    pub fn run(mut self, rx: Receiver<Msg>) {
        let mut buf = Vec::with_capacity(1024);
        // Ends when every sender is gone, or on Close.
        while let Ok(first) = rx.recv() {
            if !matches!(first, Msg::Close(_)) {
                std::thread::sleep(GATHER);
            }
            let mut next = Some(first);
            while let Some(msg) = next.take() {
                match msg {
                    Msg::Close(ack) => {
                        self.flush();
                        let _ = ack.send(());
                        return;
                    }
                    msg => self.line(&msg, &mut buf),
                }
                next = rx.try_recv().ok();
            }
            if self.reopen.swap(false, Ordering::AcqRel) {
                self.reopen();
            }
            self.flush();
        }
        self.flush();
    }

    fn line(&mut self, msg: &Msg, buf: &mut Vec<u8>) {
        let line = match msg {
            Msg::Request(p) => Line::of_request(p),
            Msg::Connection(c) => Some(Line::of_connection(c)),
            Msg::Wake | Msg::Close(_) => None,
        };
        let Some(line) = line else { return };
        buf.clear();
        format::write(buf, self.format, &line);
        match self.out.write_all(buf) {
            Ok(()) => {
                self.counters.written.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn flush(&mut self) {
        if self.out.flush().is_err() {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What is buffered goes to the old file; then the path is opened again (a file renamed
    /// away is replaced by a new one). On failure the old file stays in use.
    fn reopen(&mut self) {
        let Target::File(path) = &self.target else {
            return;
        };
        let path = path.clone();
        self.flush();
        match open_file(&path) {
            Ok(f) => {
                self.out = BufWriter::with_capacity(BUFFER, Box::new(f));
                self.counters.reopened.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(path = %path.display(), error = %e, "reopening the access log failed; still writing to the old file");
            }
        }
    }
}
