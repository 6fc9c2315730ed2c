//! The agent's rendezvous for a dispatcher handover: agent streams whose dispatcher handed
//! them over wait here, by token, for the successor's re-attach stream.
//!
//! One registry per [`LinkListener`](crate::LinkListener), shared by every link connection it
//! serves and every stream they carry. A stream registers its token before it acknowledges the
//! handover (its END with `ack`), and the old dispatcher passes the client on only after the
//! ack, so a successor's re-attach stream never comes before the registration it looks for: a
//! re-attach stream whose token nobody waits for is refused at once (a RESET), not
//! parked. Each registration has a deadline (a timer task removes it and fails the stream's
//! reads and writes); a stream dropped while waiting removes its own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::Duration;

use crate::driver::Shared;
use crate::stream::At;
use crate::LinkStats;

/// Streams waiting for a successor at once; a handover beyond it is not acknowledged.
const MAX_WAITING: usize = 65_536;

/// A successor's re-attach stream, answered, for the waiting stream to continue on (reset if
/// nobody takes it: dropping it drops the stream).
pub(crate) struct Arrival {
    pub(crate) at: At,
    pub(crate) link_id: [u8; 16],
}

/// A stream's registration, waiting for its successor: dropped (taken, given up, or with its
/// stream), it stops the deadline and leaves the registry.
pub(crate) struct Wait {
    pub(crate) token: [u8; 16],
    pub(crate) slot: Arc<Slot>,
    timer: tokio::task::AbortHandle,
    registry: Arc<Registry>,
}

impl Drop for Wait {
    fn drop(&mut self) {
        self.timer.abort();
        self.registry.leave(self.token, &self.slot);
    }
}

/// Where a waiting stream finds its successor's stream (or learns its deadline passed), and
/// the tasks to wake then: a reader and a writer may wait at once, each in its own task.
#[derive(Default)]
pub(crate) struct Slot(Mutex<SlotState>);

#[derive(Default)]
struct SlotState {
    arrived: Option<Arrival>,
    expired: bool,
    reader: Option<Waker>,
    writer: Option<Waker>,
}

/// What a waiting stream finds in its slot.
pub(crate) enum Found {
    Arrived(Arrival),
    Expired,
    Nothing,
}

impl Slot {
    fn state(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the successor's stream if it came; otherwise remembers `waker` (the reader's if
    /// `reader`, else the writer's) to be woken when it does or the deadline passes.
    pub(crate) fn take(&self, waker: &Waker, reader: bool) -> Found {
        let mut s = self.state();
        if let Some(a) = s.arrived.take() {
            return Found::Arrived(a);
        }
        if s.expired {
            return Found::Expired;
        }
        let w = if reader { &mut s.reader } else { &mut s.writer };
        match w {
            Some(w) if w.will_wake(waker) => {}
            _ => *w = Some(waker.clone()),
        }
        Found::Nothing
    }

    fn settle(&self, arrival: Option<Arrival>) {
        let (reader, writer) = {
            let mut s = self.state();
            match arrival {
                Some(a) => s.arrived = Some(a),
                None => s.expired = true,
            }
            (s.reader.take(), s.writer.take())
        };
        for w in [reader, writer].into_iter().flatten() {
            w.wake();
        }
    }
}

pub(crate) struct Registry {
    waiting: Mutex<HashMap<[u8; 16], Arc<Slot>>>,
    /// The deadline of a registration, in milliseconds.
    timeout_ms: AtomicU64,
    stats: Arc<LinkStats>,
    runtime: tokio::runtime::Handle,
}

impl Registry {
    /// Call within a tokio runtime: deadlines run there.
    pub(crate) fn new(stats: Arc<LinkStats>) -> Self {
        let r = Self {
            waiting: Mutex::new(HashMap::new()),
            timeout_ms: AtomicU64::new(0),
            stats,
            runtime: tokio::runtime::Handle::current(),
        };
        r.set_timeout(crate::REATTACH_TIMEOUT);
        r
    }

    pub(crate) fn set_timeout(&self, timeout: Duration) {
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        self.timeout_ms.store(ms, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> &LinkStats {
        &self.stats
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 16], Arc<Slot>>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a stream waiting for `token`, with its deadline; `None` if that token is
    /// already waiting or too many are.
    pub(crate) fn enter(self: &Arc<Self>, token: [u8; 16]) -> Option<Box<Wait>> {
        let slot = Arc::new(Slot::default());
        {
            let mut map = self.map();
            if map.len() >= MAX_WAITING || map.contains_key(&token) {
                return None;
            }
            map.insert(token, slot.clone());
        }
        let timeout = Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed));
        let (me, mine) = (self.clone(), slot.clone());
        let timer = self.runtime.spawn(async move {
            tokio::time::sleep(timeout).await;
            me.expire(token, &mine);
        });
        Some(Box::new(Wait {
            token,
            slot,
            timer: timer.abort_handle(),
            registry: self.clone(),
        }))
    }

    /// The deadline passed: the registration goes, and the stream's reads and writes fail
    /// (unless the successor came first).
    fn expire(&self, token: [u8; 16], slot: &Arc<Slot>) {
        if self.remove(token, slot) {
            self.stats.reattach_failed.fetch_add(1, Ordering::Relaxed);
            slot.settle(None);
        }
    }

    /// A waiting stream gave up (dropped, or could not acknowledge).
    pub(crate) fn leave(&self, token: [u8; 16], slot: &Arc<Slot>) {
        self.remove(token, slot);
    }

    fn remove(&self, token: [u8; 16], slot: &Arc<Slot>) -> bool {
        let mut map = self.map();
        if map.get(&token).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            map.remove(&token);
            true
        } else {
            false
        }
    }

    /// A successor's re-attach stream `id` on `link` for `token`: answered (so its
    /// `answered()` returns at once, whatever the agent's task is doing) and handed to the
    /// stream waiting for it. Refused if nobody waits for the token.
    pub(crate) fn deliver(&self, token: [u8; 16], link: &Arc<Shared>, id: u32) {
        let slot = self.map().remove(&token);
        let Some(slot) = slot else {
            self.stats.reattach_failed.fetch_add(1, Ordering::Relaxed);
            let gone = link.lock().reset(id, crate::frame::Reason::Refused, false);
            drop(gone);
            return;
        };
        link.lock().answer(id);
        slot.settle(Some(Arrival {
            at: At {
                link: link.clone(),
                id,
            },
            link_id: link.link_id,
        }));
    }
}
