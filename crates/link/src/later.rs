//! Stream releases that wait for the link's next write (the dispatcher's Done).
//!
//! Once a session has moved, the dispatcher tells the handshake agent Done by releasing its
//! link stream (a reset with NO_ERROR, [`LinkStream::release`]). The agent owes no answer and
//! never uses the keys without a Resume, so nothing waits on that frame: alone it would cost a
//! write here and a wake-up, a read and a poll at the agent. So it waits, in the link's queue,
//! for the next frame the dispatcher writes to that agent anyway (another client's bytes), and
//! leaves in the same write; at most [`RELEASE_DELAY`] later it leaves by itself, so that an
//! idle link still releases promptly (the agent's verdict deadline is four steps of
//! `--migration-timeout`, seconds, never this). The link connection's driver
//! ([`crate::coalesce::flushing`]) does both; when the connection ends, the queue goes with it
//! (the agent drops its streams with the connection).

use std::sync::Mutex;
use std::task::Waker;
use std::time::Duration;

use tokio::time::Instant;

use crate::LinkStream;

/// The longest a release waits for company.
pub const RELEASE_DELAY: Duration = Duration::from_millis(4);

/// One link connection's waiting releases.
#[derive(Default)]
pub(crate) struct Later(Mutex<Queue>);

#[derive(Default)]
struct Queue {
    streams: Vec<LinkStream>,
    /// When the oldest waiting release is due.
    due: Option<Instant>,
    /// The connection's driver, woken to arm its timer when the queue fills.
    driver: Option<Waker>,
    /// The connection has ended: releases go at once (to nobody).
    closed: bool,
}

impl Later {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn push(&self, stream: LinkStream) {
        let mut q = self.lock();
        if q.closed {
            drop(q);
            stream.release();
            return;
        }
        q.streams.push(stream);
        if q.due.is_none() {
            q.due = Some(Instant::now() + RELEASE_DELAY);
            if let Some(w) = q.driver.take() {
                drop(q);
                w.wake();
            }
        }
    }

    /// The driver's look: when the oldest waiting release is due (`None`: none waits), with
    /// its waker remembered for the next push.
    pub(crate) fn due(&self, driver: &Waker) -> Option<Instant> {
        let mut q = self.lock();
        match &q.driver {
            Some(w) if w.will_wake(driver) => {}
            _ => q.driver = Some(driver.clone()),
        }
        q.due
    }

    /// Releases every waiting stream (their resets queued in h2); whether there were any.
    pub(crate) fn release_all(&self) -> bool {
        let streams = {
            let mut q = self.lock();
            q.due = None;
            std::mem::take(&mut q.streams)
        };
        let any = !streams.is_empty();
        for s in streams {
            s.release();
        }
        any
    }

    /// The connection ended: drops what waits (its streams with it) and releases later pushes
    /// at once.
    pub(crate) fn close(&self) {
        let streams = {
            let mut q = self.lock();
            q.closed = true;
            q.due = None;
            q.driver = None;
            std::mem::take(&mut q.streams)
        };
        drop(streams);
    }
}
