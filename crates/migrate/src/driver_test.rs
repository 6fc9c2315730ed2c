//! The drivers' decisions without TLS: what each side asks its caller to do, what it writes,
//! what it counts, and that every way of giving up closes rather than uses the keys.

use std::time::{Duration, Instant};

use super::*;

/// Agents wait 1 s for an Import and 2 s for a verdict.
const T: Timeouts = Timeouts::new(Duration::from_millis(500));
const BINDING: [u8; BINDING_LEN] = [5; BINDING_LEN];

fn steps(d: &mut ExportDriver) -> Vec<ExportStep> {
    std::iter::from_fn(|| d.poll_step()).collect()
}

fn offered(home: u16, usable: bool) -> Offered {
    Offered {
        me: 1,
        home,
        binding: BINDING,
        usable,
        read: Some(Splitter::new()),
        boundary: 300,
    }
}

/// A handshake driver asked to extract, with `n` bytes of plaintext decrypted.
fn at_extract(n: usize, now: Instant) -> ExportDriver {
    let mut d = ExportDriver::handshake(offered(2, true), 1000, T, now);
    assert_eq!(
        steps(&mut d),
        [ExportStep::FlushEngine, ExportStep::Decrypt(Vec::new())]
    );
    d.decrypted(Ok(n));
    d
}

#[test]
fn an_offer_to_itself_or_without_secrets_is_declined_and_kept() {
    let now = Instant::now();
    for (home, usable, counted) in [
        (1, true, ExportStep::Declined),
        (2, false, ExportStep::Failed(ExportFailure::NoSecrets)),
    ] {
        let mut d = ExportDriver::handshake(offered(home, usable), 1000, T, now);
        assert_eq!(d.poll_transmit(), Some(Frame::Decline.to_bytes()));
        assert_eq!(
            steps(&mut d),
            [
                counted,
                ExportStep::Keep {
                    ciphertext: None,
                    records: Some(Splitter::new())
                }
            ]
        );
        assert_eq!(d.poll_timeout(), None);
    }
}

#[test]
fn the_handshake_switches_at_its_cut_and_migrates_on_done_or_release() {
    let now = Instant::now();
    for release in [false, true] {
        let mut d = at_extract(100, now);
        assert_eq!(
            steps(&mut d),
            [ExportStep::Extract {
                home: 2,
                binding: BINDING
            }]
        );
        let extracted = Extraction::Extracted {
            sealed: Some(vec![9; 20]),
            keyless: false,
        };
        d.extracted(extracted, now);
        let switch = Frame::Switch {
            cut: 300,
            sealed: vec![9; 20],
        };
        assert_eq!(d.poll_transmit(), Some(switch.to_bytes()));
        assert_eq!(steps(&mut d), []);
        assert_eq!(d.poll_timeout(), Some(now + T.verdict()));
        match release {
            true => d.released(),
            false => d.handle(now, &Frame::Done.to_bytes()),
        }
        assert_eq!(steps(&mut d), [ExportStep::Migrated]);
        assert!(d.is_finished());
    }
}

#[test]
fn past_the_cap_or_not_extractable_it_aborts_and_keeps_the_connection() {
    let now = Instant::now();
    let mut d = at_extract(1001, now);
    assert_eq!(d.poll_transmit(), Some(Frame::Abort.to_bytes()));
    assert_eq!(
        steps(&mut d),
        [
            ExportStep::Failed(ExportFailure::TooMuchPlaintext),
            ExportStep::Keep {
                ciphertext: None,
                records: Some(Splitter::new())
            }
        ]
    );

    let mut d = at_extract(10, now);
    steps(&mut d);
    d.extracted(Extraction::NotExtractable, now);
    assert_eq!(d.poll_transmit(), Some(Frame::Abort.to_bytes()));
    assert_eq!(
        steps(&mut d),
        [
            ExportStep::Failed(ExportFailure::Export),
            ExportStep::Keep {
                ciphertext: None,
                records: None
            }
        ]
    );
}

#[test]
fn a_keyless_or_unsealed_session_is_kept_and_served_here_on_resume() {
    let now = Instant::now();
    for (sealed, keyless, why) in [
        (Some(vec![1; 8]), true, ExportFailure::NoSecrets),
        (None, false, ExportFailure::Export),
    ] {
        let mut d = at_extract(10, now);
        steps(&mut d);
        d.extracted(Extraction::Extracted { sealed, keyless }, now);
        assert_eq!(d.poll_transmit(), Some(Frame::Kept { cut: 300 }.to_bytes()));
        assert_eq!(steps(&mut d), [ExportStep::Failed(why)]);
        let mut resume = Frame::Resume.to_bytes();
        resume.extend([23, 3, 3, 0, 1, 0]);
        d.handle(now, &resume);
        // a Resume after Kept is expected, not a fallback
        assert_eq!(
            steps(&mut d),
            [ExportStep::ServeHere {
                ciphertext: vec![23, 3, 3, 0, 1, 0]
            }]
        );
    }
}

#[test]
fn a_silent_or_gone_dispatcher_gets_the_stream_closed_never_the_keys_used() {
    let now = Instant::now();
    let closed = [
        ExportStep::Failed(ExportFailure::Protocol),
        ExportStep::Close,
    ];
    for how in 0..3 {
        let mut d = at_extract(10, now);
        steps(&mut d);
        let extracted = Extraction::Extracted {
            sealed: Some(vec![1; 8]),
            keyless: false,
        };
        d.extracted(extracted, now);
        d.poll_transmit();
        match how {
            0 => {
                d.handle_timeout(now + T.verdict() - Duration::from_millis(1));
                assert_eq!(steps(&mut d), [], "not yet");
                d.handle_timeout(now + T.verdict());
            }
            1 => d.closed(),
            _ => d.handle(now, &Frame::Stay.to_bytes()),
        }
        assert_eq!(steps(&mut d), closed);
        assert!(d.is_finished());
        assert_eq!(d.poll_timeout(), None);
    }
}

#[test]
fn a_resume_after_a_switch_is_a_fallback() {
    let now = Instant::now();
    let mut d = at_extract(10, now);
    steps(&mut d);
    let extracted = Extraction::Extracted {
        sealed: Some(vec![1; 8]),
        keyless: false,
    };
    d.extracted(extracted, now);
    d.poll_transmit();
    d.handle(now, &Frame::Resume.to_bytes());
    assert_eq!(
        steps(&mut d),
        [
            ExportStep::Failed(ExportFailure::FellBack),
            ExportStep::ServeHere {
                ciphertext: Vec::new()
            }
        ]
    );
}

#[test]
fn a_leave_decrypts_until_the_offer_then_extracts_or_keeps_on_stay() {
    let now = Instant::now();
    let (mut d, leave) = ExportDriver::leave(false, Some(Splitter::new()), 1000, T, now);
    assert_eq!(leave, None, "cannot move: no Leave");
    assert_eq!(
        steps(&mut d),
        [ExportStep::Keep {
            ciphertext: None,
            records: None
        }]
    );

    let record = vec![23, 3, 3, 0, 2, 7, 7];
    for stay in [false, true] {
        let (mut d, leave) = ExportDriver::leave(true, Some(Splitter::new()), 1000, T, now);
        assert_eq!(leave, Some(Frame::Leave.to_bytes()));
        assert_eq!(d.poll_timeout(), Some(now + T.verdict()));
        d.handle(now, &record);
        assert_eq!(steps(&mut d), [ExportStep::Decrypt(record.clone())]);
        d.decrypted(Ok(2));
        let mut answer = record.clone();
        match stay {
            false => answer.extend(
                Frame::Offer {
                    home: 3,
                    binding: BINDING,
                }
                .to_bytes(),
            ),
            true => {
                answer.extend(Frame::Stay.to_bytes());
                answer.extend(&record);
            }
        }
        d.handle(now, &answer);
        assert_eq!(d.poll_step(), Some(ExportStep::Decrypt(record.clone())));
        d.decrypted(Ok(2));
        let rest = steps(&mut d);
        match stay {
            false => assert_eq!(
                rest,
                [ExportStep::Extract {
                    home: 3,
                    binding: BINDING
                }]
            ),
            true => assert_eq!(
                rest,
                [ExportStep::Keep {
                    ciphertext: Some(record.clone()),
                    records: None
                }]
            ),
        }
        assert_eq!(d.poll_timeout(), None, "nothing to read meanwhile");
    }
}

fn import_steps(d: &mut ImportDriver) -> Vec<ImportStep> {
    std::iter::from_fn(|| d.poll_step()).collect()
}

#[test]
fn the_home_agent_uses_the_keys_only_on_commit() {
    let now = Instant::now();
    let import = Frame::Import(vec![4; 10]).to_bytes();
    // Ready, then Commit
    let mut d = ImportDriver::new(T, now);
    assert_eq!(d.poll_timeout(), Some(now + T.import()));
    d.handle(now, &import);
    assert_eq!(import_steps(&mut d), [ImportStep::Open(vec![4; 10])]);
    d.opened(Ok(()), now);
    assert_eq!(d.poll_transmit(), Some(Frame::Ready.to_bytes()));
    assert_eq!(d.poll_timeout(), Some(now + T.verdict()));
    let mut commit = Frame::Commit.to_bytes();
    commit.extend([23, 3, 3, 0, 0]);
    d.handle(now, &commit);
    assert_eq!(
        import_steps(&mut d),
        [ImportStep::Commit {
            ciphertext: vec![23, 3, 3, 0, 0]
        }]
    );
    assert!(d.is_finished());

    // refused: the answer, then the stream closes
    let mut d = ImportDriver::new(T, now);
    d.handle(now, &import);
    import_steps(&mut d);
    d.opened(Err(RefuseReason::Replay), now);
    assert_eq!(
        d.poll_transmit(),
        Some(Frame::Refused(RefuseReason::Replay).to_bytes())
    );
    assert_eq!(import_steps(&mut d), [ImportStep::Close]);

    // after Ready: Abort, an ended stream or the deadline drop the keys, counted
    for how in 0..3 {
        let mut d = ImportDriver::new(T, now);
        d.handle(now, &import);
        import_steps(&mut d);
        d.opened(Ok(()), now);
        d.poll_transmit();
        match how {
            0 => d.handle(now, &Frame::Abort.to_bytes()),
            1 => d.closed(),
            _ => d.handle_timeout(now + T.verdict()),
        }
        assert_eq!(
            import_steps(&mut d),
            [
                ImportStep::Failed(ImportFailure::Uncommitted),
                ImportStep::Close
            ]
        );
    }

    // before anything opened: nothing to count but a broken protocol
    let mut d = ImportDriver::new(T, now);
    d.handle_timeout(now + T.import());
    assert_eq!(import_steps(&mut d), [ImportStep::Close]);
    let mut d = ImportDriver::new(T, now);
    d.handle(now, &[23, 3, 3, 0, 0]);
    assert!(matches!(
        import_steps(&mut d)[..],
        [
            ImportStep::Failed(ImportFailure::Protocol(_)),
            ImportStep::Close
        ]
    ));
}

fn ios(d: &mut MoveDriver) -> Vec<MoveIo> {
    std::iter::from_fn(|| d.poll_io()).collect()
}

#[test]
fn a_move_releases_the_agent_for_done() {
    let now = Instant::now();
    // a ClientHello-sized record from the client, relayed to the agent
    let hello = [&[22u8, 3, 1, 0, 4][..], &[1, 0, 0, 0]].concat();
    let mut d = MoveDriver::offered(T, &hello).unwrap();
    assert_eq!(ios(&mut d), []);
    // the agent cuts right after the hello and switches
    let switch = Frame::Switch {
        cut: hello.len() as u32,
        sealed: vec![8; 16],
    };
    d.handle_agent(&switch.to_bytes());
    assert_eq!(ios(&mut d), [MoveIo::OpenHome, MoveIo::HandshakeOver]);
    assert_eq!(d.poll_timeout(now), Some(now + T.home()));
    d.home_opened(true);
    let got = ios(&mut d);
    assert!(matches!(got[..], [MoveIo::ToHome(_)]), "{got:?}");
    d.handle_home(&Frame::Ready.to_bytes());
    // Commit to the home agent; Done is the release, neither a write nor a shutdown
    assert_eq!(
        ios(&mut d),
        [
            MoveIo::ToHome(Frame::Commit.to_bytes()),
            MoveIo::Splice(Target::HomeAgent)
        ]
    );
    assert_eq!(d.relay().outcome(), Some(Outcome::Migrated));
}

#[test]
fn a_client_eof_while_its_bytes_are_held_waits_for_the_cut() {
    let now = Instant::now();
    let hello = [&[22u8, 3, 1, 0, 4][..], &[1, 0, 0, 0]].concat();
    let mut d = MoveDriver::offered(T, &hello).unwrap();
    // half a record after the hello, then the agent cuts after the hello
    d.handle_client(&[23, 3, 3, 0, 4, 1, 2]);
    assert!(matches!(ios(&mut d)[..], [MoveIo::ToAgent(_)]));
    let switch = Frame::Switch {
        cut: hello.len() as u32,
        sealed: vec![8; 16],
    };
    d.handle_agent(&switch.to_bytes());
    assert_eq!(ios(&mut d), [MoveIo::HandshakeOver]);
    let deadline = d.poll_timeout(now).unwrap();
    d.client_ended();
    assert!(d.client_ended_held() && !d.wants_client_bytes());
    assert_eq!(ios(&mut d), []);
    // the record never ends: the cut's deadline ends the connection
    d.handle_timeout(deadline);
    assert_eq!(ios(&mut d), [MoveIo::Close]);
}

#[test]
fn a_move_falls_back_when_the_home_agent_cannot_be_reached_or_ends() {
    let now = Instant::now();
    let hello = [&[22u8, 3, 1, 0, 4][..], &[1, 0, 0, 0]].concat();
    let switch = Frame::Switch {
        cut: hello.len() as u32,
        sealed: vec![8; 16],
    };
    for how in 0..3 {
        let mut d = MoveDriver::offered(T, &hello).unwrap();
        d.handle_agent(&switch.to_bytes());
        ios(&mut d);
        let deadline = d.poll_timeout(now).unwrap();
        match how {
            0 => d.home_opened(false),
            1 => {
                d.home_opened(true);
                ios(&mut d);
                d.home_ended();
            }
            _ => {
                d.home_opened(true);
                ios(&mut d);
                d.handle_timeout(deadline);
            }
        }
        let got = ios(&mut d);
        let mut resume = Frame::Resume.to_bytes();
        resume.extend(&hello[hello.len()..]);
        assert!(got.contains(&MoveIo::ToAgent(resume)), "{how}: {got:?}");
        assert_eq!(got.last(), Some(&MoveIo::Splice(Target::HandshakeAgent)));
    }
}

#[test]
fn a_client_leaving_mid_move_or_a_broken_agent_ends_the_connection() {
    let hello = [&[22u8, 3, 1, 0, 4][..], &[1, 0, 0, 0]].concat();
    let mut d = MoveDriver::offered(T, &hello).unwrap();
    d.client_ended();
    assert_eq!(ios(&mut d), [MoveIo::Close]);
    assert_eq!(ios(&mut d), []);

    let mut d = MoveDriver::offered(T, &hello).unwrap();
    d.handle_agent(&Frame::Ready.to_bytes());
    assert!(matches!(ios(&mut d)[..], [MoveIo::Broken(_)]));

    let mut d = MoveDriver::offered(T, &hello).unwrap();
    d.agent_ended();
    assert_eq!(ios(&mut d), [MoveIo::Close]);
}
