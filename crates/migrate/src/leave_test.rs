//! Moving an established connection off an agent that drains (Leave): the spliced stream is
//! followed without copies, the agent's Leave starts the same two-phase move (the dispatcher's
//! Offer is the cut), the
//! connection can move again from its new agent, and Stay leaves it where it is.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::relay::*;

fn record(typ: u8, body_len: usize, fill: u8) -> Vec<u8> {
    let mut r = vec![typ, 3, 3, (body_len >> 8) as u8, body_len as u8];
    r.extend(std::iter::repeat_n(fill, body_len));
    r
}

const BINDING: [u8; BINDING_LEN] = [5; BINDING_LEN];

/// What the relay asked for, by peer.
#[derive(Default)]
struct Seen {
    to_client: Vec<u8>,
    to_agent: Vec<u8>,
    to_home: Vec<u8>,
    connect_home: usize,
    choose_home: usize,
    agent_closed: bool,
    spliced: Vec<Target>,
}

impl Seen {
    fn take(&mut self, relay: &mut Relay) {
        while let Some(a) = relay.poll_action() {
            match a {
                Action::ToClient(b) => self.to_client.extend(b),
                Action::ToAgent(b) => self.to_agent.extend(b),
                Action::ToHome(b) => self.to_home.extend(b),
                Action::ConnectHome => self.connect_home += 1,
                Action::ChooseHome => self.choose_home += 1,
                Action::CloseAgent => self.agent_closed = true,
                Action::CloseHome => panic!("the home agent was not refused"),
                Action::Splice(t) => self.spliced.push(t),
            }
        }
    }
}

/// The agent's bytes while serving, as the shell's splice feeds them: what goes to the client.
fn pass_agent(relay: &mut Relay, mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let p = relay.watch_agent(data).unwrap();
        out.extend_from_slice(&data[..p.tls]);
        data = &data[p.consumed..];
        if p.frame.is_some() {
            assert!(data.is_empty(), "nothing follows a Leave");
        }
    }
    out
}

#[test]
fn a_served_connection_leaves_moves_and_can_leave_again() {
    let mut relay = Relay::serving();
    let mut seen = Seen::default();
    // the handshake and a request pass both ways, followed but not copied
    let hello = record(22, 300, 1);
    relay.watch_client(&hello).unwrap();
    let flight = [record(22, 90, 2), record(23, 400, 3)].concat();
    assert_eq!(pass_agent(&mut relay, &flight), flight);
    relay.watch_client(&record(23, 80, 4)).unwrap();
    let response = record(23, 1200, 5);
    // the response and the Leave come in one read: the response passes, then the agent asks
    let mut read = response.clone();
    read.extend(Frame::Leave.to_bytes());
    assert_eq!(pass_agent(&mut relay, &read), response);
    seen.take(&mut relay);
    assert_eq!(seen.choose_home, 1);
    assert!(!relay.is_serving());
    // the shell picks a home: the offer at once (the client is at a boundary): the cut
    relay.move_to(7, BINDING);
    seen.take(&mut relay);
    let expect = Frame::Offer {
        home: 7,
        binding: BINDING,
    }
    .to_bytes();
    assert_eq!(seen.to_agent, expect);
    // the client's next request is held
    let next = record(23, 90, 6);
    relay.from_client(&next).unwrap();
    assert!(
        relay
            .from_agent(
                &Frame::Switch {
                    cut: 5,
                    sealed: vec![9; 100]
                }
                .to_bytes()
            )
            .is_err(),
        "after a Leave the cut is the Offer"
    );
    relay
        .from_agent(
            &Frame::Switch {
                cut: 0,
                sealed: vec![9; 100],
            }
            .to_bytes(),
        )
        .unwrap();
    seen.take(&mut relay);
    assert_eq!(seen.connect_home, 1);
    relay.home_connected();
    relay.from_home(&Frame::Ready.to_bytes()).unwrap();
    seen.take(&mut relay);
    let mut home = Frame::Import(vec![9; 100]).to_bytes();
    home.extend(Frame::Commit.to_bytes());
    home.extend(&next);
    assert_eq!(
        seen.to_home, home,
        "the held request goes to the new home, once"
    );
    assert!(seen.agent_closed);
    assert_eq!(seen.spliced, vec![Target::HomeAgent]);
    assert_eq!(relay.outcome(), Some(Outcome::Migrated));
    assert_eq!(relay.reason(), MoveReason::Drain);
    assert!(relay.is_serving());

    // The new agent serves (its stream is now the agent's) and later drains too.
    let answer = record(23, 700, 7);
    assert_eq!(pass_agent(&mut relay, &answer), answer);
    // the client is mid-record when the second Leave comes: the Offer waits for its end
    let upload = record(23, 3000, 8);
    relay.watch_client(&upload[..1000]).unwrap();
    pass_agent(&mut relay, &Frame::Leave.to_bytes());
    seen = Seen::default();
    seen.take(&mut relay);
    assert_eq!(seen.choose_home, 1);
    relay.move_to(2, BINDING);
    relay.from_client(&upload[1000..]).unwrap();
    relay.from_client(&record(23, 10, 9)).unwrap();
    seen.take(&mut relay);
    let mut expect = upload[1000..].to_vec();
    expect.extend(
        Frame::Offer {
            home: 2,
            binding: BINDING,
        }
        .to_bytes(),
    );
    assert_eq!(
        seen.to_agent, expect,
        "the rest of the record, then the Offer"
    );
    // this time the agent cannot export it and keeps it: the held record goes back to it
    relay.from_agent(&Frame::Abort.to_bytes()).unwrap();
    seen = Seen::default();
    seen.take(&mut relay);
    assert_eq!(seen.to_agent, record(23, 10, 9));
    assert_eq!(seen.spliced, vec![Target::HandshakeAgent]);
    assert_eq!(relay.outcome(), Some(Outcome::Aborted));
    assert!(relay.is_serving());

    // a third Leave finds nowhere to go: no outcome, the last one is not told twice
    pass_agent(&mut relay, &Frame::Leave.to_bytes());
    relay.stay();
    assert_eq!(relay.outcome(), None);
    assert!(relay.is_serving());
}

#[test]
fn nowhere_to_go_means_stay() {
    let mut relay = Relay::serving();
    relay.watch_client(&record(22, 50, 1)).unwrap();
    pass_agent(&mut relay, &Frame::Leave.to_bytes());
    // while the shell chooses, the client's bytes still go to the agent
    relay.from_client(&record(23, 20, 2)).unwrap();
    relay.stay();
    let mut seen = Seen::default();
    seen.take(&mut relay);
    let mut expect = record(23, 20, 2);
    expect.extend(Frame::Stay.to_bytes());
    assert_eq!(seen.to_agent, expect);
    assert!(relay.is_serving());
    assert_eq!(relay.outcome(), None);
}

#[test]
fn other_frames_while_serving_are_errors() {
    let mut relay = Relay::serving();
    assert!(relay
        .watch_agent(&Frame::Kept { cut: 0 }.to_bytes())
        .is_err());
    let mut relay = Relay::serving();
    assert_eq!(
        relay.watch_client(&Frame::Leave.to_bytes()),
        Err(MigrationError::FrameFromClient)
    );
    // a handshake relay is not spliced yet
    assert!(Relay::new().watch_agent(&record(23, 1, 1)).is_err());
}

#[test]
fn exporter_leaves_then_switches_or_stays() {
    let now = Instant::now();
    let t = Timeouts::new(Duration::from_millis(500));
    // Move: records before the Offer are decrypted; the Offer is the cut
    let (mut x, leave) = Exporter::leave(1000, t, now);
    assert_eq!(leave, Frame::Leave.to_bytes());
    assert_eq!(x.deadline(), Some(now + t.verdict()));
    let mut input = record(23, 40, 1);
    input.extend(
        Frame::Offer {
            home: 3,
            binding: BINDING,
        }
        .to_bytes(),
    );
    let got = x.from_dispatcher(&input).unwrap();
    assert_eq!(
        got.moved,
        Some(ExportEvent::Move {
            home: 3,
            binding: BINDING
        })
    );
    assert_eq!(got.decrypt, record(23, 40, 1));
    assert_eq!(got.event, None);
    assert_eq!(
        x.deadline(),
        None,
        "the caller extracts; nothing to wait for"
    );
    let switch = x.switch(0, vec![4; 10], now).unwrap();
    assert_eq!(
        switch,
        Frame::Switch {
            cut: 0,
            sealed: vec![4; 10]
        }
        .to_bytes()
    );
    assert_eq!(
        x.from_dispatcher(&Frame::Done.to_bytes()).unwrap().event,
        Some(ExportEvent::Migrated)
    );

    // the dispatcher holds the client's bytes after its Offer: any behind it break the protocol
    let (mut x, _) = Exporter::leave(1000, t, now);
    let mut input = Frame::Offer {
        home: 3,
        binding: BINDING,
    }
    .to_bytes();
    input.extend(record(23, 60, 2));
    assert!(x.from_dispatcher(&input).is_err());

    // Stay: what follows it is the TLS engine's
    let (mut x, _) = Exporter::leave(1000, t, now);
    let mut input = Frame::Stay.to_bytes();
    input.extend(record(23, 5, 3));
    let got = x.from_dispatcher(&input).unwrap();
    assert_eq!(
        got.event,
        Some(ExportEvent::Stay {
            ciphertext: record(23, 5, 3)
        })
    );
    assert_eq!(x.deadline(), None);

    // Over the cap before the answer: the connection stays (Abort) once the move starts
    let (mut x, _) = Exporter::leave(10, t, now);
    let got = x.from_dispatcher(&record(23, 40, 1)).unwrap();
    x.decrypted(got.decrypt.len() - 5 - 16);
    let got = x
        .from_dispatcher(
            &Frame::Offer {
                home: 3,
                binding: BINDING,
            }
            .to_bytes(),
        )
        .unwrap();
    assert!(got.moved.is_some());
    assert!(!x.within_cap());
    assert_eq!(x.abort().unwrap(), Frame::Abort.to_bytes());
    assert!(
        x.switch(0, vec![1], now).is_err(),
        "no Switch after an Abort"
    );

    // A verdict before any answer breaks the protocol
    let (mut x, _) = Exporter::leave(10, t, now);
    assert!(x.from_dispatcher(&Frame::Resume.to_bytes()).is_err());
}

#[derive(Debug, Clone)]
enum Unit {
    Record(u8, usize),
    Leave,
}

fn units() -> impl Strategy<Value = Vec<Unit>> {
    prop::collection::vec(
        prop_oneof![
            4 => (20u8..=23, 0usize..3000).prop_map(|(t, n)| Unit::Record(t, n)),
            1 => Just(Unit::Leave),
        ],
        0..12,
    )
}

proptest! {
    /// However the reads cut a stream of records and frames, `pass` forwards exactly the TLS
    /// bytes, in order, and finds every frame between them.
    #[test]
    fn pass_forwards_records_and_finds_frames(units in units(), cuts in prop::collection::vec(1usize..700, 1..40)) {
        let mut stream = Vec::new();
        let mut tls = Vec::new();
        let mut frames = 0;
        for (i, u) in units.iter().enumerate() {
            match u {
                Unit::Record(t, n) => {
                    let r = record(*t, *n, i as u8);
                    tls.extend(&r);
                    stream.extend(r);
                }
                Unit::Leave => {
                    frames += 1;
                    stream.extend(Frame::Leave.to_bytes());
                }
            }
        }
        let mut s = Splitter::new();
        let (mut passed, mut found, mut at, mut cut) = (Vec::new(), 0, 0, 0);
        while at < stream.len() {
            let end = (at + cuts[cut % cuts.len()]).min(stream.len());
            cut += 1;
            let mut chunk = &stream[at..end];
            while !chunk.is_empty() {
                let p = s.pass(chunk).unwrap();
                passed.extend_from_slice(&chunk[..p.tls]);
                if let Some(f) = p.frame {
                    prop_assert_eq!(f, Frame::Leave);
                    found += 1;
                }
                chunk = &chunk[p.consumed..];
            }
            at = end;
        }
        prop_assert_eq!(passed, tls);
        prop_assert_eq!(found, frames);
        prop_assert!(s.at_boundary());
    }
}
