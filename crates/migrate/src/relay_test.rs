//! The handoff protocol without sockets: frames round-trip, the splitter walks any chunking,
//! and the dispatcher's relay keeps the invariants (every client byte reaches exactly one
//! agent, in order, cut only at a record boundary; exactly one agent is told to use the keys).

use proptest::prelude::*;

use super::*;
use crate::relay::*;

fn record(typ: u8, body_len: usize, fill: u8) -> Vec<u8> {
    let mut r = vec![typ, 3, 3, (body_len >> 8) as u8, body_len as u8];
    r.extend(std::iter::repeat_n(fill, body_len));
    r
}

fn all_frames() -> Vec<Frame> {
    vec![
        Frame::Offer {
            home: 513,
            binding: [7; BINDING_LEN],
        },
        Frame::Decline,
        Frame::Switch {
            cut: 0x0102_0304,
            sealed: vec![1, 2, 3],
        },
        Frame::Kept { cut: 517 },
        Frame::Abort,
        Frame::Done,
        Frame::Resume,
        Frame::Import(vec![9; 300]),
        Frame::Ready,
        Frame::Refused(RefuseReason::Expired),
        Frame::Commit,
    ]
}

#[test]
fn frames_round_trip_and_hide_sessions_in_debug() {
    for f in all_frames() {
        let bytes = f.to_bytes();
        assert_eq!(bytes[0], FRAME_TYPE);
        let s = Splitter::new().split(&bytes).unwrap();
        assert_eq!(s.frame.as_ref(), Some(&f));
        assert_eq!(s.consumed, bytes.len());
        assert!(s.tls.is_empty());
    }
    let dbg = format!(
        "{:?}",
        Frame::Switch {
            cut: 9,
            sealed: vec![0x41; 40]
        }
    );
    assert_eq!(dbg, "Switch { cut: 9, <40 sealed bytes> }");
}

/// Frames as the code before `baton_wire::codec` wrote them, in the order of [`all_frames`]
/// (Switch and Kept as the exchange without Freeze/Frozen writes them: new kinds, so that a
/// peer of the old exchange cannot read them as its own; the link's version keeps such peers
/// apart in the first place).
#[test]
fn encoding_is_unchanged() {
    let golden = [
        format!("ba42540023010201{}", "07".repeat(32)),
        "ba4254000103".into(),
        "ba42540008 0f 01020304 010203".replace(' ', ""),
        "ba42540005 10 00000205".replace(' ', ""),
        "ba4254000106".into(),
        "ba4254000107".into(),
        "ba4254000108".into(),
        format!("ba4254012d09{}", "09".repeat(300)),
        "ba425400010a".into(),
        "ba425400020b02".into(),
        "ba425400010c".into(),
    ];
    let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
    for (f, golden) in all_frames().iter().zip(golden) {
        assert_eq!(hex(&f.to_bytes()), golden, "{f:?}");
    }
    let other = Frame::Refused(RefuseReason::Other).to_bytes();
    assert_eq!(hex(&other), "ba425400020bff");
    let empty = Frame::Switch {
        cut: 0,
        sealed: vec![],
    };
    assert_eq!(hex(&empty.to_bytes()), "ba425400050f00000000");
    // the retired kinds (Freeze, Frozen, the old Switch) are unknown now
    for k in [2u8, 4, 5] {
        assert_eq!(
            Splitter::new().split(&[0xBA, b'B', b'T', 0, 1, k]),
            Err(MigrationError::UnknownKind(k))
        );
    }
}

#[test]
fn malformed_frames_are_errors() {
    let mut s = Splitter::new();
    assert_eq!(s.split(&[0xBA, b'X', b'Y']), Err(MigrationError::Magic));
    assert_eq!(
        Splitter::new().split(&[0xBA, b'B', b'T', 0, 1, 99]),
        Err(MigrationError::UnknownKind(99))
    );
    assert_eq!(
        Splitter::new().split(&[0xBA, b'B', b'T', 0, 2, 3, 0]),
        Err(MigrationError::Malformed("Decline"))
    );
    assert_eq!(
        Splitter::new().split(&[0xBA, b'B', b'T', 0, 3, 15, 0, 0]),
        Err(MigrationError::Malformed("Switch")),
        "a Switch without its whole cut"
    );
    assert_eq!(
        Splitter::new().split(&[0xBA, b'B', b'T', 0, 0]),
        Err(MigrationError::Malformed("empty"))
    );
    assert_eq!(
        Splitter::new().split(b"GET / HTTP/1.1"),
        Err(MigrationError::NotARecord(b'G'))
    );
    assert_eq!(
        Splitter::new().split(&[23, 3, 3, 0xff, 0xff]),
        Err(MigrationError::RecordTooLarge(0xffff))
    );
}

#[test]
fn splitter_stops_after_each_frame() {
    let mut stream = record(23, 10, 1);
    stream.extend(Frame::Decline.to_bytes());
    stream.extend(record(23, 3, 2));
    let mut s = Splitter::new();
    let first = s.split(&stream).unwrap();
    assert_eq!(first.tls, record(23, 10, 1));
    assert_eq!(first.frame, Some(Frame::Decline));
    let second = s.split(&stream[first.consumed..]).unwrap();
    assert_eq!(second.tls, record(23, 3, 2));
    assert_eq!(second.frame, None);
    assert!(s.at_boundary());
}

/// A relay driven by a script; collects what each peer received.
#[derive(Default)]
struct Peers {
    to_client: Vec<u8>,
    to_agent: Vec<u8>,
    to_home: Vec<u8>,
    connect_home: usize,
    agent_closed: bool,
    home_closed: bool,
    spliced: Option<Target>,
}

impl Peers {
    fn drain(&mut self, relay: &mut Relay) {
        while let Some(a) = relay.poll_action() {
            match a {
                Action::ToClient(b) => self.to_client.extend(b),
                Action::ToAgent(b) => self.to_agent.extend(b),
                Action::ToHome(b) => self.to_home.extend(b),
                Action::ConnectHome => self.connect_home += 1,
                Action::CloseAgent => self.agent_closed = true,
                Action::CloseHome => self.home_closed = true,
                Action::Splice(t) => {
                    assert!(self.spliced.is_none(), "spliced twice");
                    self.spliced = Some(t)
                }
                Action::ChooseHome => panic!("no agent asked to leave"),
            }
        }
    }
}

/// Splits a stream received by an agent into its TLS bytes and frames, in order.
fn unpack(stream: &[u8]) -> (Vec<u8>, Vec<(usize, Frame)>) {
    let mut s = Splitter::new();
    let (mut tls, mut frames, mut rest) = (Vec::new(), Vec::new(), stream);
    while !rest.is_empty() {
        let out = s.split(rest).unwrap();
        tls.extend(out.tls);
        if let Some(f) = out.frame {
            assert!(s.at_boundary());
            frames.push((tls.len(), f));
        }
        rest = &rest[out.consumed..];
    }
    (tls, frames)
}

fn client_stream() -> Vec<u8> {
    let mut c = record(22, 300, 0x16); // ClientHello
    c.extend(record(20, 1, 1)); // CCS
    c.extend(record(23, 53, 0xF1)); // Finished
    c.extend(record(23, 700, 0xA1)); // a request
    c.extend(record(23, 5000, 0xA2)); // a body
    c
}

fn switch(cut: usize, sealed: Vec<u8>) -> Vec<u8> {
    Frame::Switch {
        cut: cut as u32,
        sealed,
    }
    .to_bytes()
}

/// The length of the ClientHello, CCS and Finished records of [`client_stream`].
const HANDSHAKE: usize = 305 + 6 + 58;

#[test]
fn migration_happy_path() {
    let client = client_stream();
    let mut relay = Relay::new();
    let mut p = Peers::default();
    // the handshake flight, and half of the request record
    relay.from_client(&client[..500]).unwrap();
    relay.from_agent(&record(22, 90, 0x02)).unwrap();
    p.drain(&mut relay);
    assert_eq!(p.to_client, record(22, 90, 0x02));
    assert_eq!(p.to_agent, client[..500], "forwarded as it comes");
    assert_eq!(relay.held_len(), 500, "and copied");
    // the agent cut after the Finished (the request it read part of is not consumed); its
    // Switch reaches the dispatcher while the client is in the middle of that record
    relay.from_agent(&switch(HANDSHAKE, vec![7; 200])).unwrap();
    p.drain(&mut relay);
    assert_eq!(p.connect_home, 0, "the record in flight is finished first");
    assert!(relay.awaiting_cut());
    // the rest of that record passes to the agent; what follows is held
    relay.from_client(&client[500..]).unwrap();
    p.drain(&mut relay);
    let request_end = HANDSHAKE + 705;
    assert_eq!(p.to_agent, client[..request_end]);
    assert_eq!(p.connect_home, 1);
    assert_eq!(relay.held_len(), client.len() - HANDSHAKE);
    relay.home_connected();
    p.drain(&mut relay);
    let import = Frame::Import(vec![7; 200]).to_bytes();
    assert_eq!(p.to_home, import);
    relay.from_home(&Frame::Ready.to_bytes()).unwrap();
    p.drain(&mut relay);
    // the home agent's first response, after Commit: its stream is the agent's now
    relay.from_agent(&record(23, 40, 0xB0)).unwrap();
    p.drain(&mut relay);
    assert!(p.agent_closed);
    assert_eq!(p.spliced, Some(Target::HomeAgent));
    assert_eq!(relay.outcome(), Some(Outcome::Migrated));
    assert!(p.to_agent.ends_with(&Frame::Done.to_bytes()));
    let (tls, frames) = unpack(&p.to_home[import.len()..]);
    assert_eq!(
        frames,
        vec![(0, Frame::Commit)],
        "Commit before any client byte"
    );
    assert_eq!(
        tls,
        &client[HANDSHAKE..],
        "the home agent gets the copy from the cut"
    );
    let mut expect_client = record(22, 90, 0x02);
    expect_client.extend(record(23, 40, 0xB0));
    assert_eq!(p.to_client, expect_client);
}

#[test]
fn a_switch_at_a_boundary_connects_at_once() {
    // also: client bytes that reached the dispatcher between the agent's cut and its Switch
    // (a whole record after the cut) go to the home agent
    let client = client_stream();
    let mut relay = Relay::new();
    let mut p = Peers::default();
    let upto = HANDSHAKE + 705;
    relay.from_client(&client[..upto]).unwrap();
    relay.from_agent(&switch(HANDSHAKE, vec![1])).unwrap();
    p.drain(&mut relay);
    assert_eq!(p.connect_home, 1);
    relay.from_client(&client[upto..]).unwrap();
    relay.home_connected();
    relay.from_home(&Frame::Ready.to_bytes()).unwrap();
    p.drain(&mut relay);
    assert_eq!(
        p.to_agent,
        [&client[..upto], &Frame::Done.to_bytes()].concat()
    );
    let import = Frame::Import(vec![1]).to_bytes();
    let (tls, _) = unpack(&p.to_home[import.len()..]);
    assert_eq!(tls, &client[HANDSHAKE..]);
}

#[test]
fn a_cut_that_is_no_record_boundary_or_not_forwarded_is_refused() {
    let client = client_stream();
    for cut in [1, 305 + 1, HANDSHAKE - 1, 600, 10_000] {
        let mut relay = Relay::new();
        relay.from_client(&client[..500]).unwrap();
        assert_eq!(
            relay.from_agent(&switch(cut, vec![1])),
            Err(MigrationError::Malformed("cut")),
            "cut {cut}"
        );
    }
    // a boundary, but not yet forwarded to the agent
    let mut relay = Relay::new();
    relay.from_client(&client[..300]).unwrap();
    assert!(relay.from_agent(&switch(305, vec![1])).is_err());
    // zero is a boundary (nothing consumed), and so is every whole record
    for cut in [0, 305, 311, HANDSHAKE] {
        let mut relay = Relay::new();
        relay.from_client(&client[..500]).unwrap();
        relay.from_agent(&switch(cut, vec![1])).unwrap();
    }
}

#[test]
fn the_copy_is_bounded_until_the_cut_then_the_record_in_flight_is_read() {
    // a client that pipelines far more than the copy may hold before the agent cuts
    let mut relay = Relay::new();
    let hello = record(22, 300, 1);
    relay.from_client(&hello).unwrap();
    let mut sent = hello.len();
    while relay.wants_client_bytes() {
        let r = record(23, 16_000, 2);
        relay.from_client(&r[..8_000]).unwrap();
        relay.from_client(&r[8_000..]).unwrap();
        sent += r.len();
    }
    assert!(relay.held_len() >= MAX_HELD && relay.held_len() < MAX_HELD + 16_100);
    // the shell stops reading here; the agent's handshake never needed more
    relay.from_client(&record(23, 16_000, 3)[..100]).unwrap();
    sent += 100;
    assert!(!relay.wants_client_bytes());
    relay.from_agent(&switch(hello.len(), vec![1])).unwrap();
    assert!(
        relay.wants_client_bytes(),
        "the record in flight is read to its end whatever is held"
    );
    relay.from_client(&record(23, 16_000, 3)[100..]).unwrap();
    sent += 16_005 - 100;
    let mut p = Peers::default();
    p.drain(&mut relay);
    assert_eq!(p.connect_home, 1);
    assert_eq!(relay.held_len(), sent - hello.len());
    assert!(
        !relay.wants_client_bytes(),
        "held past the bound: read no more"
    );
}

#[test]
fn refused_or_unreachable_home_falls_back_to_the_handshake_agent() {
    for refuse in [Some(RefuseReason::Replay), None] {
        let client = client_stream();
        let mut relay = Relay::new();
        let mut p = Peers::default();
        relay.from_client(&client[..400]).unwrap();
        relay.from_agent(&switch(HANDSHAKE, vec![1])).unwrap();
        relay.from_client(&client[400..]).unwrap();
        relay.home_connected();
        match refuse {
            Some(r) => relay.from_home(&Frame::Refused(r).to_bytes()).unwrap(),
            None => relay.home_failed(),
        }
        p.drain(&mut relay);
        assert!(p.home_closed);
        assert!(!p.agent_closed);
        assert_eq!(p.spliced, Some(Target::HandshakeAgent));
        assert_eq!(relay.outcome(), Some(Outcome::FellBack(refuse)));
        // the agent had the stream up to the end of the record in flight at its Switch, then
        // Resume, then the client's bytes again from its cut
        let (tls, frames) = unpack(&p.to_agent);
        let request_end = HANDSHAKE + 705;
        assert_eq!(frames, vec![(request_end, Frame::Resume)]);
        assert_eq!(tls[..request_end], client[..request_end]);
        assert_eq!(tls[request_end..], client[HANDSHAKE..]);
        // a late Ready changes nothing: the home agent is never told Commit
        relay.from_home(&Frame::Ready.to_bytes()).unwrap();
        assert_eq!(relay.poll_action(), None);
    }
}

#[test]
fn kept_gives_the_agent_its_bytes_from_the_cut() {
    let client = client_stream();
    let mut relay = Relay::new();
    let mut p = Peers::default();
    relay.from_client(&client[..400]).unwrap();
    relay
        .from_agent(&Frame::Kept { cut: 311 }.to_bytes())
        .unwrap();
    p.drain(&mut relay);
    assert_eq!(p.spliced, None, "the request in flight comes first");
    relay.from_client(&client[400..]).unwrap();
    p.drain(&mut relay);
    assert_eq!(p.connect_home, 0);
    assert_eq!(p.spliced, Some(Target::HandshakeAgent));
    assert_eq!(relay.outcome(), Some(Outcome::Aborted));
    let (tls, frames) = unpack(&p.to_agent);
    assert_eq!(frames, vec![(HANDSHAKE + 705, Frame::Resume)]);
    assert_eq!(tls[HANDSHAKE + 705..], client[311..]);
}

#[test]
fn decline_and_abort_keep_the_handshake_agent() {
    for (frame, outcome) in [
        (Frame::Decline, Outcome::Declined),
        (Frame::Abort, Outcome::Aborted),
    ] {
        let client = client_stream();
        let mut relay = Relay::new();
        let mut p = Peers::default();
        relay.from_client(&client[..400]).unwrap();
        let mut agent = frame.to_bytes();
        agent.extend(record(23, 10, 3)); // bytes right behind the frame are passed through
        relay.from_agent(&agent).unwrap();
        relay.from_client(&client[400..]).unwrap();
        p.drain(&mut relay);
        assert_eq!(p.spliced, Some(Target::HandshakeAgent));
        assert!(p.to_agent == client, "nothing cut, nothing held");
        assert_eq!(relay.held_len(), 0, "the copy is dropped");
        assert_eq!(p.to_client, record(23, 10, 3));
        assert_eq!(relay.outcome(), Some(outcome));
        assert_eq!(p.connect_home, 0);
    }
}

#[test]
fn timeout_after_ready_is_too_late_to_fall_back() {
    let client = client_stream();
    let mut relay = Relay::new();
    let mut p = Peers::default();
    relay.from_client(&client).unwrap();
    relay.from_agent(&switch(HANDSHAKE, vec![1])).unwrap();
    relay.home_connected();
    relay.from_home(&Frame::Ready.to_bytes()).unwrap();
    relay.home_failed();
    p.drain(&mut relay);
    assert_eq!(relay.outcome(), Some(Outcome::Migrated));
    let (_, frames) = unpack(&p.to_agent);
    assert!(!frames.iter().any(|(_, f)| *f == Frame::Resume));
}

#[test]
fn a_home_agent_past_its_deadline_is_given_up_and_the_handshake_agent_resumes() {
    let t = Timeouts::new(std::time::Duration::from_millis(500));
    let client = client_stream();
    let mut relay = Relay::new().with_timeouts(t);
    let mut p = Peers::default();
    let start = std::time::Instant::now();
    assert_eq!(relay.poll_timeout(start), None, "nothing to wait on yet");
    relay.from_client(&client).unwrap();
    relay.from_agent(&switch(HANDSHAKE, vec![1])).unwrap();
    p.drain(&mut relay);
    assert_eq!(p.connect_home, 1);
    let due = relay.poll_timeout(start).unwrap();
    assert_eq!(due, start + t.home());
    // the stream opens and Import goes out: one wait, one deadline, not re-armed
    relay.home_connected();
    p.drain(&mut relay);
    assert_eq!(relay.poll_timeout(start + t.home() / 2), Some(due));
    assert_eq!(relay.handle_timeout(due - t.home() / 10), Expired::NotYet);
    assert_eq!(relay.handle_timeout(due), Expired::FellBack);
    p.drain(&mut relay);
    assert!(p.home_closed);
    assert_eq!(relay.outcome(), Some(Outcome::FellBack(None)));
    let (tls, frames) = unpack(&p.to_agent);
    let Some(&(at, Frame::Resume)) = frames.last() else {
        panic!("no Resume last: {frames:?}");
    };
    assert!(
        tls[at..] == client[HANDSHAKE..],
        "after Resume, the copy from the cut"
    );
    assert_eq!(relay.poll_timeout(due), None, "serving: no deadline");
}

#[test]
fn a_cut_that_never_comes_closes_the_connection() {
    let t = Timeouts::new(std::time::Duration::from_millis(500));
    let client = client_stream();
    let mut relay = Relay::new().with_timeouts(t);
    let mut p = Peers::default();
    let start = std::time::Instant::now();
    // the client stops in the middle of the request record the agent cut before
    relay.from_client(&client[..500]).unwrap();
    relay.from_agent(&switch(HANDSHAKE, vec![1])).unwrap();
    p.drain(&mut relay);
    assert!(relay.awaiting_cut());
    let due = relay.poll_timeout(start).unwrap();
    assert_eq!(due, start + t.cut());
    assert_eq!(relay.handle_timeout(start + t.home()), Expired::NotYet);
    assert_eq!(relay.handle_timeout(due), Expired::Close);
    p.drain(&mut relay);
    assert_eq!(p.connect_home, 0, "no agent was given the keys");
    assert!(!frames_in(&p.to_agent).contains(&Frame::Resume));
}

fn frames_in(stream: &[u8]) -> Vec<Frame> {
    unpack(stream).1.into_iter().map(|(_, f)| f).collect()
}

#[test]
fn protocol_violations_are_errors() {
    // a client cannot forge frames towards an agent
    let mut relay = Relay::new();
    assert_eq!(
        relay.from_client(&Frame::Resume.to_bytes()),
        Err(MigrationError::FrameFromClient)
    );
    // the verdict frames from the agent
    let mut relay = Relay::new();
    assert!(matches!(
        relay.from_agent(&Frame::Done.to_bytes()),
        Err(MigrationError::Unexpected("Done", "relaying"))
    ));
    // TLS from the agent after its Switch
    let mut relay = Relay::new();
    relay.from_client(&record(22, 10, 0)[..7]).unwrap();
    relay.from_agent(&switch(0, vec![1])).unwrap();
    assert!(relay.from_agent(&record(23, 5, 0)).is_err());
    // a second Switch
    let mut relay = Relay::new();
    relay.from_agent(&switch(0, vec![1])).unwrap();
    assert!(relay.from_agent(&switch(0, vec![1])).is_err());
    // the home agent must answer before it sends TLS
    let mut relay = Relay::new();
    relay.from_agent(&switch(0, vec![1])).unwrap();
    relay.home_connected();
    assert!(relay.from_home(&record(23, 5, 0)).is_err());
    assert_eq!(relay.outcome(), Some(Outcome::FellBack(None)));
}

fn chunks(data: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
    points.push(0);
    points.push(data.len());
    points.sort_unstable();
    points.dedup();
    points
        .windows(2)
        .map(|w| data[w[0]..w[1]].to_vec())
        .collect()
}

fn any_frame() -> impl Strategy<Value = Frame> {
    let payload = proptest::collection::vec(any::<u8>(), 0..2000);
    prop_oneof![
        (any::<u16>(), any::<[u8; BINDING_LEN]>())
            .prop_map(|(home, binding)| Frame::Offer { home, binding }),
        (any::<u32>(), payload.clone()).prop_map(|(cut, sealed)| Frame::Switch { cut, sealed }),
        any::<u32>().prop_map(|cut| Frame::Kept { cut }),
        payload.prop_map(Frame::Import),
        any::<u8>().prop_map(|r| Frame::Refused(RefuseReason::from_u8(r))),
        proptest::sample::select(all_frames()),
    ]
}

proptest! {
    #[test]
    fn any_frame_round_trips(frame in any_frame()) {
        let bytes = frame.to_bytes();
        let s = Splitter::new().split(&bytes).unwrap();
        prop_assert_eq!(s.frame, Some(frame));
        prop_assert_eq!(s.consumed, bytes.len());
    }

    #[test]
    fn splitter_any_chunking(
        lens in proptest::collection::vec(0usize..400, 1..12),
        frame_at in proptest::collection::vec(any::<bool>(), 12),
        cuts in proptest::collection::vec(any::<usize>(), 0..20),
    ) {
        let mut stream = Vec::new();
        let mut tls = Vec::new();
        let mut frames = Vec::new();
        for (i, l) in lens.iter().enumerate() {
            let r = record(23, *l, i as u8);
            tls.extend(&r);
            stream.extend(r);
            if frame_at[i] {
                let f = Frame::Switch { cut: *l as u32, sealed: vec![i as u8; *l % 50] };
                stream.extend(f.to_bytes());
                frames.push(f);
            }
        }
        let mut s = Splitter::new();
        let (mut got_tls, mut got_frames) = (Vec::new(), Vec::new());
        for c in chunks(&stream, &cuts) {
            let mut rest = &c[..];
            loop {
                let out = s.split(rest).unwrap();
                got_tls.extend(out.tls);
                got_frames.extend(out.frame);
                rest = &rest[out.consumed..];
                if rest.is_empty() { break; }
            }
        }
        prop_assert_eq!(got_tls, tls);
        prop_assert_eq!(got_frames, frames);
    }

    /// Wherever the agent cuts (any record boundary within what reached it) and whenever its
    /// Switch reaches the dispatcher (any client chunking, mid-record or not): the agent got
    /// the stream up to a record boundary at or after its cut, and the one who serves on gets
    /// exactly the client's bytes from the cut, once, in order.
    #[test]
    fn relay_never_loses_duplicates_or_splits_a_record(
        lens in proptest::collection::vec(0usize..3000, 1..10),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
        switch_after in 0usize..12,
        cut_pick in any::<usize>(),
        accept in any::<bool>(),
        kept in any::<bool>(),
    ) {
        let mut client = Vec::new();
        let mut bounds = vec![0];
        for (i, l) in lens.iter().enumerate() {
            client.extend(record(23, *l, i as u8));
            bounds.push(client.len());
        }
        let mut relay = Relay::new();
        let mut p = Peers::default();
        let pieces = chunks(&client, &cuts);
        let mut forwarded = 0;
        let mut cut = None;
        for (i, c) in pieces.iter().enumerate() {
            if i == switch_after.min(pieces.len() - 1) {
                // a boundary among the bytes the agent has been sent
                let within: Vec<usize> = bounds.iter().copied().filter(|b| *b <= forwarded).collect();
                let at = within[cut_pick % within.len()];
                let frame = match kept {
                    true => Frame::Kept { cut: at as u32 }.to_bytes(),
                    false => switch(at, vec![5; 9]),
                };
                relay.from_agent(&frame).unwrap();
                cut = Some(at);
            }
            relay.from_client(c).unwrap();
            p.drain(&mut relay);
            if cut.is_none() {
                forwarded = p.to_agent.len();
            }
        }
        let cut = cut.unwrap();
        p.drain(&mut relay);
        let (agent_tls, frames) = unpack(&p.to_agent);
        if kept {
            // up to a boundary at or after the cut, Resume, then the client's bytes from the cut
            prop_assert_eq!(frames.len(), 1);
            let (stop, f) = frames[0].clone();
            prop_assert_eq!(f, Frame::Resume);
            prop_assert!(bounds.contains(&stop) && stop >= cut);
            prop_assert_eq!(&agent_tls[..stop], &client[..stop]);
            prop_assert_eq!(&agent_tls[stop..], &client[cut..]);
            prop_assert_eq!(relay.outcome(), Some(Outcome::Aborted));
            return Ok(());
        }
        prop_assert!(bounds.contains(&agent_tls.len()), "the agent's stream stops mid-record");
        prop_assert_eq!(&agent_tls[..], &client[..agent_tls.len()]);
        prop_assert!(frames.is_empty());
        relay.home_connected();
        if accept {
            relay.from_home(&Frame::Ready.to_bytes()).unwrap();
        } else {
            relay.home_failed();
        }
        p.drain(&mut relay);
        let import_len = Frame::Import(vec![5; 9]).to_bytes().len();
        if accept {
            let (home_tls, home_frames) = unpack(&p.to_home[import_len..]);
            prop_assert_eq!(home_frames, vec![(0, Frame::Commit)]);
            prop_assert_eq!(&home_tls[..], &client[cut..]);
            prop_assert!(p.agent_closed && !p.home_closed);
        } else {
            let (tls, frames) = unpack(&p.to_agent);
            let stop = agent_tls.len();
            prop_assert_eq!(frames, vec![(stop, Frame::Resume)]);
            prop_assert_eq!(&tls[stop..], &client[cut..]);
            prop_assert!(p.home_closed && !p.agent_closed);
            // Abort after Import (the home agent may be waiting for Commit), and no Commit
            let (_, home_frames) = unpack(&p.to_home[import_len..]);
            prop_assert_eq!(home_frames, vec![(0, Frame::Abort)]);
        }
    }

    #[test]
    fn fuzz_entry_point_holds(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        crate::fuzzing::migration(&data);
    }

    #[test]
    fn relay_never_panics(
        client in proptest::collection::vec(any::<u8>(), 0..200),
        agent in proptest::collection::vec(any::<u8>(), 0..200),
        home in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut relay = Relay::new();
        let _ = relay.from_client(&client);
        let _ = relay.from_agent(&agent);
        relay.home_connected();
        let _ = relay.from_home(&home);
        while relay.poll_action().is_some() {}
    }
}
