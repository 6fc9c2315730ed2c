//! Connection slots for listeners that strangers can reach before they prove anything (the
//! metrics and admin endpoints, the agent's link listener before authentication).
//!
//! A fixed cap that refuses newcomers when full lets whoever fills it first keep everybody
//! else out for as long as it likes: silent connections that reconnect when closed hold every
//! slot. Here a newcomer is always let in, and the oldest unproven connection makes room for
//! it: one of the newcomer's own source once that source holds its share, else any; among
//! those, the oldest that has not been heard from ([`Slot::heard`]: sent what its protocol
//! asks first) in [`GRACE`], else the oldest that has held its slot for longer than that, else
//! the oldest not heard from yet, else the oldest. A newcomer has its [`GRACE`] whatever the
//! others do (silent, or talking without ever proving anything), so a peer that finishes its
//! business in less time than an attacker takes to open the cap's worth of new connections is
//! never pushed out; one that has proved itself ([`Slot::prove`]) is never pushed out at all,
//! and counts against a cap of its own.
//!
//! [`Table`] is the decision, plain data; [`Slots`] shares it between tasks and tells an
//! evicted connection's task through its [`Slot`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// How long a newcomer may take to be heard from before it counts as silent: without it, the
/// connection just opened would be the silent one that the next newcomer pushes out.
pub const GRACE: Duration = Duration::from_secs(1);

/// One unproven connection.
#[derive(Debug, Clone, Copy)]
struct Holder {
    source: IpAddr,
    since: Instant,
    heard: bool,
}

/// What a newcomer costs the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// In, with this ticket; `evicted` lists the tickets pushed out to make room.
    In { ticket: u64, evicted: Vec<u64> },
    /// The table is full of proven connections: nobody can be pushed out.
    Full,
}

/// The slot table as data: who holds a slot, in the order they came.
#[derive(Debug)]
pub struct Table {
    cap: usize,
    per_source: usize,
    proven_cap: usize,
    next: u64,
    /// Unproven holders by ticket (tickets grow, so the first is the oldest): their source,
    /// and whether they have been heard from.
    unproven: BTreeMap<u64, Holder>,
    proven: BTreeMap<u64, IpAddr>,
}

impl Table {
    /// At most `cap` unproven connections, `per_source` of them from one address, and
    /// `proven_cap` proven ones.
    pub fn new(cap: usize, per_source: usize, proven_cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            per_source: per_source.clamp(1, cap.max(1)),
            proven_cap,
            next: 0,
            unproven: BTreeMap::new(),
            proven: BTreeMap::new(),
        }
    }

    /// Lets a connection from `source` in at `now`, pushing out the oldest unproven ones as
    /// needed.
    pub fn admit(&mut self, source: IpAddr, now: Instant) -> Admission {
        let mut evicted = Vec::new();
        let same = self
            .unproven
            .values()
            .filter(|h| h.source == source)
            .count();
        if same >= self.per_source {
            if let Some(t) = self.victim(|s| s == source, now) {
                self.unproven.remove(&t);
                evicted.push(t);
            }
        }
        if self.unproven.len() >= self.cap {
            match self.victim(|_| true, now) {
                Some(t) => {
                    self.unproven.remove(&t);
                    evicted.push(t);
                }
                None => return Admission::Full,
            }
        }
        let ticket = self.next;
        self.next += 1;
        self.unproven.insert(
            ticket,
            Holder {
                source,
                since: now,
                heard: false,
            },
        );
        Admission::In { ticket, evicted }
    }

    /// Who makes room among the unproven connections `from` picks by source: the oldest one
    /// silent for longer than [`GRACE`], else the oldest past its grace, else the oldest
    /// silent one, else the oldest.
    fn victim(&self, from: impl Fn(IpAddr) -> bool, now: Instant) -> Option<u64> {
        let candidates = || self.unproven.iter().filter(|(_, h)| from(h.source));
        let past_grace = |h: &Holder| now.saturating_duration_since(h.since) >= GRACE;
        candidates()
            .find(|(_, h)| !h.heard && past_grace(h))
            .or_else(|| candidates().find(|(_, h)| past_grace(h)))
            .or_else(|| candidates().find(|(_, h)| !h.heard))
            .or_else(|| candidates().next())
            .map(|(t, _)| *t)
    }

    /// The connection sent what its protocol asks first: it goes after the silent ones.
    pub fn heard(&mut self, ticket: u64) {
        if let Some(h) = self.unproven.get_mut(&ticket) {
            h.heard = true;
        }
    }

    /// The connection proved itself: it can no longer be pushed out. `false` (and the
    /// connection stays unproven) when the proven cap is reached or the ticket is gone.
    pub fn prove(&mut self, ticket: u64) -> bool {
        if self.proven.len() >= self.proven_cap {
            return false;
        }
        match self.unproven.remove(&ticket) {
            Some(h) => {
                self.proven.insert(ticket, h.source);
                true
            }
            None => false,
        }
    }

    /// The connection ended (or was pushed out): its slot is free.
    pub fn release(&mut self, ticket: u64) {
        self.unproven.remove(&ticket);
        self.proven.remove(&ticket);
    }

    pub fn unproven(&self) -> usize {
        self.unproven.len()
    }

    pub fn proven(&self) -> usize {
        self.proven.len()
    }

    fn holds(&self, ticket: u64) -> bool {
        self.unproven.contains_key(&ticket) || self.proven.contains_key(&ticket)
    }
}

/// A [`Table`] shared by a listener's tasks.
#[derive(Debug)]
pub struct Slots {
    table: Mutex<Table>,
    /// Each holder's eviction signal, by ticket.
    signals: Mutex<BTreeMap<u64, CancellationToken>>,
}

impl Slots {
    pub fn new(table: Table) -> Arc<Self> {
        Arc::new(Self {
            table: Mutex::new(table),
            signals: Mutex::new(BTreeMap::new()),
        })
    }

    /// A slot for a connection from `source`, and how many connections were pushed out for
    /// it; `None` when every slot is held by a proven connection.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Option<(Slot, usize)> {
        let admission = self.table().admit(source, Instant::now());
        let Admission::In { ticket, evicted } = admission else {
            return None;
        };
        let evict = CancellationToken::new();
        let mut signals = self.signals.lock().unwrap_or_else(|p| p.into_inner());
        for t in &evicted {
            if let Some(signal) = signals.remove(t) {
                signal.cancel();
            }
        }
        signals.insert(ticket, evict.clone());
        let slot = Slot {
            slots: self.clone(),
            ticket,
            evict,
        };
        Some((slot, evicted.len()))
    }

    /// Unproven connections holding a slot now.
    pub fn unproven(&self) -> usize {
        self.table().unproven()
    }

    /// Proven connections holding a slot now.
    pub fn proven(&self) -> usize {
        self.table().proven()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One connection's slot, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    ticket: u64,
    evict: CancellationToken,
}

impl Slot {
    /// Completes when a newcomer pushed this connection out: its task should close it.
    pub fn evicted(&self) -> WaitForCancellationFuture<'_> {
        self.evict.cancelled()
    }

    /// Whether this connection has been pushed out.
    pub fn is_evicted(&self) -> bool {
        self.evict.is_cancelled()
    }

    /// The peer sent what its protocol asks first (a request head, a handshake message): it is
    /// pushed out only after every silent connection.
    pub fn heard(&self) {
        self.slots.table().heard(self.ticket);
    }

    /// The connection proved itself (authenticated): it is never pushed out from now on.
    /// `false` when it was pushed out already or the proven cap is reached.
    pub fn prove(&self) -> bool {
        !self.evict.is_cancelled() && self.slots.table().prove(self.ticket)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut table = self.slots.table();
        if table.holds(self.ticket) {
            table.release(self.ticket);
        }
        drop(table);
        self.slots
            .signals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.ticket);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn ticket(a: Admission) -> (u64, Vec<u64>) {
        match a {
            Admission::In { ticket, evicted } => (ticket, evicted),
            Admission::Full => panic!("refused"),
        }
    }

    /// `secs` seconds into a test.
    fn at(secs: u64) -> Instant {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *T0.get_or_init(Instant::now) + Duration::from_secs(secs)
    }

    #[test]
    fn a_full_table_pushes_out_the_oldest() {
        let mut t = Table::new(3, 3, 1);
        let (a, _) = ticket(t.admit(ip(1), at(0)));
        let (b, _) = ticket(t.admit(ip(2), at(0)));
        ticket(t.admit(ip(3), at(0)));
        let (_, evicted) = ticket(t.admit(ip(4), at(0)));
        assert_eq!(evicted, vec![a]);
        let (_, evicted) = ticket(t.admit(ip(5), at(0)));
        assert_eq!(evicted, vec![b]);
        assert_eq!(t.unproven(), 3);
    }

    #[test]
    fn a_source_over_its_share_pushes_out_its_own_oldest() {
        let mut t = Table::new(4, 2, 0);
        let (other, _) = ticket(t.admit(ip(9), at(0)));
        let (first, _) = ticket(t.admit(ip(1), at(0)));
        ticket(t.admit(ip(1), at(0)));
        let (_, evicted) = ticket(t.admit(ip(1), at(0)));
        assert_eq!(evicted, vec![first], "its own, not the older stranger");
        assert!(t.unproven.contains_key(&other));
    }

    #[test]
    fn a_peer_that_talks_outlasts_silent_ones() {
        let mut t = Table::new(3, 3, 0);
        let (talker, _) = ticket(t.admit(ip(1), at(0)));
        t.heard(talker);
        let (silent, _) = ticket(t.admit(ip(1), at(0)));
        let (young, _) = ticket(t.admit(ip(1), at(5)));
        let (_, evicted) = ticket(t.admit(ip(1), at(5)));
        assert_eq!(
            evicted,
            vec![silent],
            "the one silent past its grace goes first"
        );
        // none silent past its grace: a newcomer keeps its grace, and the talker that has had
        // its slot for seconds without proving anything goes
        let (_, evicted) = ticket(t.admit(ip(1), at(5)));
        assert_eq!(evicted, vec![talker]);
        assert!(t.unproven.contains_key(&young));
        // only newcomers left: the oldest silent one goes
        let (_, evicted) = ticket(t.admit(ip(1), at(5)));
        assert_eq!(evicted, vec![young]);
        // only talkers left: the oldest of them goes
        let mut t = Table::new(2, 2, 0);
        let (a, _) = ticket(t.admit(ip(1), at(0)));
        let (b, _) = ticket(t.admit(ip(1), at(0)));
        t.heard(a);
        t.heard(b);
        assert_eq!(ticket(t.admit(ip(1), at(9))).1, vec![a]);
    }

    #[test]
    fn proven_connections_stay_and_have_a_cap() {
        let mut t = Table::new(1, 1, 1);
        let (a, _) = ticket(t.admit(ip(1), at(0)));
        assert!(t.prove(a));
        let (b, evicted) = ticket(t.admit(ip(1), at(0)));
        assert!(evicted.is_empty(), "a proven connection is not pushed out");
        assert!(!t.prove(b), "the proven cap is reached");
        t.release(a);
        assert!(t.prove(b));
        assert_eq!(
            t.admit(ip(2), at(0)),
            Admission::In {
                ticket: 2,
                evicted: vec![]
            }
        );
        assert_eq!(t.proven(), 1);
    }

    #[test]
    fn a_reconnecting_flood_never_pushes_out_a_newcomer_or_a_talker() {
        // Attackers that reconnect when closed: each eviction brings one new attacker, which
        // pushes out the next-oldest attacker, never the honest peer that came after them all
        // (in its grace, or once it has talked), however long the flood goes on.
        for (attackers_talk, honest_talks) in
            [(false, false), (false, true), (true, false), (true, true)]
        {
            let mut t = Table::new(8, 8, 0);
            for _ in 0..8 {
                let (a, _) = ticket(t.admit(ip(1), at(0)));
                if attackers_talk {
                    t.heard(a);
                }
            }
            let (honest, _) = ticket(t.admit(ip(1), at(10)));
            if honest_talks {
                t.heard(honest);
            }
            for i in 0..7 {
                let (a, evicted) = ticket(t.admit(ip(1), at(10)));
                assert!(!evicted.contains(&honest), "pushed out after {i} newcomers");
                if attackers_talk {
                    t.heard(a);
                }
            }
            if honest_talks && !attackers_talk {
                // silent attackers past their grace always go before a talker
                for i in 0..100 {
                    let (_, evicted) = ticket(t.admit(ip(1), at(20 + i)));
                    assert!(!evicted.contains(&honest), "pushed out after {i} more");
                }
            }
            assert!(t.unproven.contains_key(&honest));
        }
    }

    proptest! {
        #[test]
        fn caps_always_hold(ops in proptest::collection::vec((0u8..4, 0u8..3), 0..200)) {
            let mut t = Table::new(5, 2, 2);
            let mut held: Vec<u64> = Vec::new();
            for (i, (op, src)) in ops.into_iter().enumerate() {
                match op {
                    0 | 1 => {
                        if let Admission::In { ticket, evicted } = t.admit(ip(src), at(i as u64)) {
                            held.retain(|h| !evicted.contains(h));
                            held.push(ticket);
                        }
                    }
                    2 => {
                        if let Some(h) = held.first() {
                            t.heard(*h);
                            t.prove(*h);
                        }
                    }
                    _ => { if let Some(h) = held.pop() { t.release(h); } }
                }
                prop_assert!(t.unproven() <= 5);
                prop_assert!(t.proven() <= 2);
                for s in 0..3 {
                    prop_assert!(t.unproven.values().filter(|h| h.source == ip(s)).count() <= 2);
                }
            }
        }
    }

    #[tokio::test]
    async fn an_evicted_slot_is_told_and_a_dropped_one_freed() {
        let slots = Slots::new(Table::new(1, 1, 0));
        let (first, n) = slots.admit(ip(1)).unwrap();
        assert_eq!(n, 0);
        let (second, n) = slots.admit(ip(1)).unwrap();
        assert_eq!(n, 1);
        first.evicted().await;
        assert!(first.is_evicted() && !second.is_evicted());
        drop(first);
        assert_eq!(
            slots.unproven(),
            1,
            "dropping the evicted one frees nothing twice"
        );
        drop(second);
        assert_eq!(slots.unproven(), 0);
    }
}
