//! The handoff protocol without sockets: frames round-trip, the splitter walks any chunking,
//! and the dispatcher's relay keeps the invariants (every client byte reaches exactly one
//! agent, in order, cut only at a record boundary; exactly one agent is told to use the keys).

use proptest::prelude::*;

use super::*;
use crate::handoff::relay::*;

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
        Frame::Freeze,
        Frame::Decline,
        Frame::Frozen,
        Frame::Switch(vec![1, 2, 3]),
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
    let dbg = format!("{:?}", Frame::Switch(vec![0x41; 40]));
    assert_eq!(dbg, "Switch(<40 sealed bytes>)");
}

/// Frames as the code before `baton_wire::codec` wrote them, in the order of [`all_frames`]
/// (a dispatcher and its agents may run different versions during an upgrade).
#[test]
fn encoding_is_unchanged() {
    let golden = [
        format!("ba42540023010201{}", "07".repeat(32)),
        "ba4254000102".into(),
        "ba4254000103".into(),
        "ba4254000104".into(),
        "ba4254000405010203".into(),
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
    assert_eq!(hex(&Frame::Switch(vec![]).to_bytes()), "ba4254000105");
}

#[test]
fn malformed_frames_are_errors() {
    let mut s = Splitter::new();
    assert_eq!(s.split(&[0xBA, b'X', b'Y']), Err(HandoffError::Magic));
    assert_eq!(
        Splitter::new().split(&[0xBA, b'B', b'T', 0, 1, 99]),
        Err(HandoffError::UnknownKind(99))
    );
    assert_eq!(
        Splitter::new().split(&[0xBA, b'B', b'T', 0, 2, 2, 0]),
        Err(HandoffError::Malformed("Freeze"))
    );
    assert_eq!(
        Splitter::new().split(&[0xBA, b'B', b'T', 0, 0]),
        Err(HandoffError::Malformed("empty"))
    );
    assert_eq!(
        Splitter::new().split(b"GET / HTTP/1.1"),
        Err(HandoffError::NotARecord(b'G'))
    );
    assert_eq!(
        Splitter::new().split(&[23, 3, 3, 0xff, 0xff]),
        Err(HandoffError::RecordTooLarge(0xffff))
    );
}

#[test]
fn splitter_stops_after_each_frame() {
    let mut stream = record(23, 10, 1);
    stream.extend(Frame::Freeze.to_bytes());
    stream.extend(record(23, 3, 2));
    let mut s = Splitter::new();
    let first = s.split(&stream).unwrap();
    assert_eq!(first.tls, record(23, 10, 1));
    assert_eq!(first.frame, Some(Frame::Freeze));
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
    // the agent asks to freeze while the client is in the middle of a record
    relay.from_agent(&Frame::Freeze.to_bytes()).unwrap();
    p.drain(&mut relay);
    assert!(!p.to_agent.ends_with(&Frame::Frozen.to_bytes()));
    // the rest of that record passes; what follows is held
    relay.from_client(&client[500..]).unwrap();
    p.drain(&mut relay);
    let (tls, frames) = unpack(&p.to_agent);
    assert_eq!(frames, vec![(tls.len(), Frame::Frozen)]);
    let cut = tls.len();
    assert_eq!(tls, client[..cut]);
    assert!(cut > 500 && cut < client.len());

    relay
        .from_agent(&Frame::Switch(vec![7; 200]).to_bytes())
        .unwrap();
    p.drain(&mut relay);
    assert_eq!(p.connect_home, 1);
    relay.home_connected();
    p.drain(&mut relay);
    assert_eq!(p.to_home, Frame::Import(vec![7; 200]).to_bytes());
    relay.from_home(&Frame::Ready.to_bytes()).unwrap();
    p.drain(&mut relay);
    // the home agent's first response, after Commit: its stream is the agent's now
    relay.from_agent(&record(23, 40, 0xB0)).unwrap();
    p.drain(&mut relay);
    assert!(p.agent_closed);
    assert_eq!(p.spliced, Some(Target::HomeAgent));
    assert_eq!(relay.outcome(), Some(Outcome::Migrated));
    assert!(p.to_agent.ends_with(&Frame::Done.to_bytes()));
    let home_tls = &p.to_home[Frame::Import(vec![7; 200]).to_bytes().len()..];
    let (tls, frames) = unpack(home_tls);
    assert_eq!(
        frames,
        vec![(0, Frame::Commit)],
        "Commit before any client byte"
    );
    assert_eq!(tls, &client[cut..]);
    let mut expect_client = record(22, 90, 0x02);
    expect_client.extend(record(23, 40, 0xB0));
    assert_eq!(p.to_client, expect_client);
}

#[test]
fn freeze_at_a_boundary_answers_at_once() {
    let client = client_stream();
    let mut relay = Relay::new();
    let mut p = Peers::default();
    relay
        .from_client(&client[..record(22, 300, 0).len()])
        .unwrap();
    relay.from_agent(&Frame::Freeze.to_bytes()).unwrap();
    p.drain(&mut relay);
    assert!(p.to_agent.ends_with(&Frame::Frozen.to_bytes()));
}

#[test]
fn refused_or_unreachable_home_falls_back_to_the_handshake_agent() {
    for refuse in [Some(RefuseReason::Replay), None] {
        let client = client_stream();
        let mut relay = Relay::new();
        let mut p = Peers::default();
        relay.from_client(&client[..400]).unwrap();
        relay.from_agent(&Frame::Freeze.to_bytes()).unwrap();
        relay.from_client(&client[400..]).unwrap();
        relay
            .from_agent(&Frame::Switch(vec![1]).to_bytes())
            .unwrap();
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
        let (tls, frames) = unpack(&p.to_agent);
        assert_eq!(
            tls, client,
            "every client byte reaches the handshake agent once"
        );
        let kinds: Vec<_> = frames.into_iter().map(|(_, f)| f).collect();
        assert_eq!(kinds, vec![Frame::Frozen, Frame::Resume]);
        // a late Ready changes nothing: the home agent is never told Commit
        relay.from_home(&Frame::Ready.to_bytes()).unwrap();
        assert_eq!(relay.poll_action(), None);
    }
}

#[test]
fn decline_and_abort_keep_the_handshake_agent() {
    let client = client_stream();
    let mut relay = Relay::new();
    let mut p = Peers::default();
    relay.from_client(&client[..400]).unwrap();
    let mut agent = Frame::Decline.to_bytes();
    agent.extend(record(23, 10, 3)); // bytes right behind the Decline are passed through
    relay.from_agent(&agent).unwrap();
    relay.from_client(&client[400..]).unwrap();
    p.drain(&mut relay);
    assert_eq!(p.spliced, Some(Target::HandshakeAgent));
    assert_eq!(p.to_agent, client);
    assert_eq!(p.to_client, record(23, 10, 3));
    assert_eq!(relay.outcome(), Some(Outcome::Declined));

    let mut relay = Relay::new();
    let mut p = Peers::default();
    relay.from_client(&client[..400]).unwrap();
    relay.from_agent(&Frame::Freeze.to_bytes()).unwrap();
    relay.from_client(&client[400..]).unwrap();
    relay.from_agent(&Frame::Abort.to_bytes()).unwrap();
    p.drain(&mut relay);
    assert_eq!(p.spliced, Some(Target::HandshakeAgent));
    assert_eq!(unpack(&p.to_agent).0, client);
    assert_eq!(relay.outcome(), Some(Outcome::Aborted));
}

#[test]
fn abort_while_freezing_still_marks_the_boundary() {
    // the agent went over its plaintext cap before the client reached a record boundary
    let client = client_stream();
    let mut relay = Relay::new();
    let mut p = Peers::default();
    relay.from_client(&client[..400]).unwrap();
    relay.from_agent(&Frame::Freeze.to_bytes()).unwrap();
    relay.from_agent(&Frame::Abort.to_bytes()).unwrap();
    p.drain(&mut relay);
    assert_eq!(p.spliced, None);
    relay.from_client(&client[400..]).unwrap();
    p.drain(&mut relay);
    assert_eq!(p.spliced, Some(Target::HandshakeAgent));
    assert_eq!(relay.outcome(), Some(Outcome::Aborted));
    let (tls, frames) = unpack(&p.to_agent);
    assert_eq!(tls, client);
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].1, Frame::Frozen);
    assert_eq!(p.connect_home, 0);
}

#[test]
fn timeout_after_ready_is_too_late_to_fall_back() {
    let client = client_stream();
    let mut relay = Relay::new();
    let mut p = Peers::default();
    relay.from_client(&client).unwrap();
    relay.from_agent(&Frame::Freeze.to_bytes()).unwrap();
    relay
        .from_agent(&Frame::Switch(vec![1]).to_bytes())
        .unwrap();
    relay.home_connected();
    relay.from_home(&Frame::Ready.to_bytes()).unwrap();
    relay.home_failed();
    p.drain(&mut relay);
    assert_eq!(relay.outcome(), Some(Outcome::Migrated));
    let (_, frames) = unpack(&p.to_agent);
    assert!(!frames.iter().any(|(_, f)| *f == Frame::Resume));
}

#[test]
fn protocol_violations_are_errors() {
    // a client cannot forge frames towards an agent
    let mut relay = Relay::new();
    assert_eq!(
        relay.from_client(&Frame::Frozen.to_bytes()),
        Err(HandoffError::FrameFromClient)
    );
    // Switch before Frozen
    let mut relay = Relay::new();
    assert!(matches!(
        relay.from_agent(&Frame::Switch(vec![]).to_bytes()),
        Err(HandoffError::Unexpected("Switch", "relaying"))
    ));
    // TLS from the agent while frozen
    let mut relay = Relay::new();
    relay.from_agent(&Frame::Freeze.to_bytes()).unwrap();
    assert!(relay.from_agent(&record(23, 5, 0)).is_err());
    // the home agent must answer before it sends TLS
    let mut relay = Relay::new();
    relay.from_agent(&Frame::Freeze.to_bytes()).unwrap();
    relay
        .from_agent(&Frame::Switch(vec![1]).to_bytes())
        .unwrap();
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
        payload.clone().prop_map(Frame::Switch),
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
                let f = Frame::Switch(vec![i as u8; *l % 50]);
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

    #[test]
    fn relay_never_loses_duplicates_or_splits_a_record(
        lens in proptest::collection::vec(0usize..3000, 1..10),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
        freeze_after in 0usize..12,
        accept in any::<bool>(),
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
        let mut froze = false;
        for (i, c) in pieces.iter().enumerate() {
            if i == freeze_after.min(pieces.len() - 1) {
                relay.from_agent(&Frame::Freeze.to_bytes()).unwrap();
                froze = true;
            }
            relay.from_client(c).unwrap();
        }
        prop_assert!(froze);
        p.drain(&mut relay);
        let (agent_tls, frames) = unpack(&p.to_agent);
        prop_assert_eq!(frames.len(), 1);
        let cut = frames[0].0;
        prop_assert!(bounds.contains(&cut), "Frozen at {} is not a record boundary", cut);
        relay.from_agent(&Frame::Switch(vec![5; 9]).to_bytes()).unwrap();
        relay.home_connected();
        if accept {
            relay.from_home(&Frame::Ready.to_bytes()).unwrap();
        } else {
            relay.home_failed();
        }
        p.drain(&mut relay);
        let (agent_tls_after, _) = unpack(&p.to_agent);
        let import_len = Frame::Import(vec![5; 9]).to_bytes().len();
        if accept {
            prop_assert_eq!(agent_tls_after.len(), agent_tls.len());
            let (home_tls, home_frames) = unpack(&p.to_home[import_len..]);
            prop_assert_eq!(home_frames, vec![(0, Frame::Commit)]);
            let mut joined = agent_tls.clone();
            joined.extend_from_slice(&home_tls);
            prop_assert_eq!(joined, client);
            prop_assert!(p.agent_closed && !p.home_closed);
        } else {
            prop_assert_eq!(agent_tls_after, client);
            prop_assert!(p.home_closed && !p.agent_closed);
            // Abort after Import (the home agent may be waiting for Commit), and no Commit
            let (_, home_frames) = unpack(&p.to_home[import_len..]);
            prop_assert_eq!(home_frames, vec![(0, Frame::Abort)]);
        }
    }

    #[test]
    fn fuzz_entry_point_holds(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        crate::fuzzing::handoff(&data);
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
