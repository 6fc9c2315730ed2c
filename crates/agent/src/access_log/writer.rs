//! The writer thread: takes the whole buffer of formatted lines at a time, writes it, and
//! flushes. It wakes for the first line after a pause, then lets lines gather for [`GATHER`]
//! before it takes them: a connection then rarely has a sleeping thread to wake (a futex call
//! and two context switches otherwise), and lines go out in large writes; a line is on disk
//! within about [`GATHER`]. Reopens the file when asked.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::Counters;

/// How long the writer lets lines gather after the first one wakes it. The buffer
/// (`super::QUEUED` bytes) must hold what arrives meanwhile at the rates an agent serves.
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
    /// Unbuffered: the writer hands it whole batches of lines.
    pub fn open(&self) -> io::Result<Box<dyn Write + Send>> {
        let out: Box<dyn Write + Send> = match self {
            Target::Stdout => Box::new(io::stdout()),
            Target::File(path) => Box::new(open_file(path)?),
        };
        Ok(out)
    }
}

fn open_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .open(path)
}

/// Lines formatted and not yet taken by the writer, and what it is asked to do.
#[derive(Default)]
pub struct Queue {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    lines: Vec<u8>,
    count: u64,
    reopen: bool,
    /// Write what is left and stop; answer here if someone waits for it.
    close: Option<Option<SyncSender<()>>>,
}

impl Queue {
    fn state(&self) -> MutexGuard<'_, State> {
        // a writer that panicked mid-write leaves whole lines behind: keep going
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends one line by `write`, unless `limit` bytes are already waiting; whether it did.
    pub fn append(&self, limit: usize, write: impl FnOnce(&mut Vec<u8>)) -> bool {
        let mut s = self.state();
        if s.lines.len() >= limit {
            return false;
        }
        let first = s.lines.is_empty();
        write(&mut s.lines);
        s.count += 1;
        drop(s);
        if first {
            self.wake.notify_one();
        }
        true
    }

    pub fn reopen(&self) {
        self.state().reopen = true;
        self.wake.notify_one();
    }

    pub fn close(&self, ack: Option<SyncSender<()>>) {
        self.state().close.get_or_insert(ack);
        self.wake.notify_one();
    }
}

pub struct Writer {
    pub target: Target,
    pub out: Box<dyn Write + Send>,
    pub queue: Arc<Queue>,
    pub counters: Arc<Counters>,
}

impl Writer {
    pub fn run(mut self) {
        let mut taken = Vec::new();
        loop {
            let mut s = self.queue.state();
            while s.lines.is_empty() && !s.reopen && s.close.is_none() {
                s = self.queue.wake.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            if s.close.is_none() && !s.reopen {
                drop(s);
                std::thread::sleep(GATHER);
                s = self.queue.state();
            }
            std::mem::swap(&mut s.lines, &mut taken);
            let count = std::mem::take(&mut s.count);
            let reopen = std::mem::take(&mut s.reopen);
            let close = s.close.take();
            drop(s);
            self.write(&taken, count);
            taken.clear();
            if reopen {
                self.reopen();
            }
            self.flush();
            if let Some(ack) = close {
                if let Some(ack) = ack {
                    let _ = ack.send(());
                }
                return;
            }
        }
    }

    fn write(&mut self, lines: &[u8], count: u64) {
        if lines.is_empty() {
            return;
        }
        match self.out.write_all(lines) {
            Ok(()) => {
                self.counters.written.fetch_add(count, Ordering::Relaxed);
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
                self.out = Box::new(f);
                self.counters.reopened.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(path = %path.display(), error = %e, "reopening the access log failed; still writing to the old file");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the writer wrote, kept for the test.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_are_written_whole_the_full_buffer_drops_and_close_writes_the_rest() {
        let sink = Sink::default();
        let queue = Arc::new(Queue::default());
        let counters = Arc::new(Counters::default());
        let writer = Writer {
            target: Target::Stdout,
            out: Box::new(sink.clone()),
            queue: queue.clone(),
            counters: counters.clone(),
        };
        let line = |n: u32| {
            move |buf: &mut Vec<u8>| buf.extend_from_slice(format!("line {n}\n").as_bytes())
        };
        assert!(queue.append(16, line(1)));
        assert!(queue.append(16, line(2)));
        // 14 bytes wait: a limit of 14 takes no more
        assert!(!queue.append(14, line(3)));
        let thread = std::thread::spawn(move || writer.run());
        assert!(queue.append(16, line(4)));
        let (ack, acked) = std::sync::mpsc::sync_channel(1);
        queue.close(Some(ack));
        acked.recv().unwrap();
        thread.join().unwrap();
        let written = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        assert_eq!(written, "line 1\nline 2\nline 4\n");
        assert_eq!(counters.written.load(Ordering::Relaxed), 3);
    }
}
