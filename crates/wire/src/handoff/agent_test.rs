//! The agents' machines without sockets: the handshake agent decrypts exactly the records
//! before Frozen, keeps the connection past the plaintext cap, and serves the session only on
//! Resume; the home agent uses the keys only on Commit; both give up by closing.

use std::time::{Duration, Instant};

use super::*;

fn record(body_len: usize, fill: u8) -> Vec<u8> {
    let mut r = vec![23, 3, 3, (body_len >> 8) as u8, body_len as u8];
    r.extend(std::iter::repeat_n(fill, body_len));
    r
}

const T: Duration = Duration::from_secs(1);

#[test]
fn exporter_happy_path_and_resume() {
    let now = Instant::now();
    for done in [true, false] {
        let (mut x, freeze) = Exporter::freeze(1000, T, now);
        assert_eq!(freeze, Frame::Freeze.to_bytes());
        let mut input = record(100, 1);
        input.extend(record(50, 2));
        input.extend(Frame::Frozen.to_bytes());
        let got = x.from_dispatcher(&input[..70]).unwrap();
        assert_eq!(got.decrypt, input[..70]);
        assert_eq!(got.event, None);
        let got = x.from_dispatcher(&input[70..]).unwrap();
        assert_eq!(got.decrypt, input[70..input.len() - 6]);
        assert_eq!(got.event, Some(ExportEvent::Frozen));
        assert_eq!(x.decrypted(150), None);
        assert_eq!(
            x.deadline(),
            None,
            "the caller extracts; nothing to wait for"
        );
        let switch = x.switch(vec![9; 20], now).unwrap();
        assert_eq!(switch, Frame::Switch(vec![9; 20]).to_bytes());
        assert_eq!(x.deadline(), Some(now + 2 * T));
        if done {
            let got = x.from_dispatcher(&Frame::Done.to_bytes()).unwrap();
            assert_eq!(got.event, Some(ExportEvent::Migrated));
        } else {
            let mut v = Frame::Resume.to_bytes();
            v.extend(record(3, 7));
            let got = x.from_dispatcher(&v).unwrap();
            assert_eq!(
                got.event,
                Some(ExportEvent::ServeHere {
                    ciphertext: record(3, 7)
                })
            );
        }
        assert_eq!(x.deadline(), None);
    }
}

#[test]
fn exporter_over_the_cap_aborts_at_once_and_keeps_ciphertext() {
    let now = Instant::now();
    let (mut x, _) = Exporter::freeze(100, T, now);
    let got = x.from_dispatcher(&record(150, 1)).unwrap();
    assert_eq!(got.decrypt, record(150, 1));
    // 150 bytes of plaintext: past the cap while still freezing
    assert_eq!(x.decrypted(150), Some(Frame::Abort.to_bytes()));
    // further records are not decrypted, only kept
    let got = x.from_dispatcher(&record(40, 2)).unwrap();
    assert!(got.decrypt.is_empty());
    let mut tail = Frame::Frozen.to_bytes();
    tail.extend(record(5, 3)); // the dispatcher releases held bytes right after Frozen
    let got = x.from_dispatcher(&tail).unwrap();
    let mut kept = record(40, 2);
    kept.extend(record(5, 3));
    assert_eq!(got.event, Some(ExportEvent::Keep { ciphertext: kept }));
    assert!(x.switch(vec![1], now).is_err(), "no Switch after an abort");
}

#[test]
fn exporter_refuses_protocol_breaks_and_times_out() {
    let now = Instant::now();
    let (mut x, _) = Exporter::freeze(100, T, now);
    assert!(x.from_dispatcher(&Frame::Done.to_bytes()).is_err());
    let (mut x, _) = Exporter::freeze(100, T, now);
    let mut v = Frame::Frozen.to_bytes();
    v.extend(record(1, 1));
    assert!(
        x.from_dispatcher(&v).is_err(),
        "bytes behind Frozen are held by the dispatcher"
    );
    let (mut x, _) = Exporter::freeze(100, T, now);
    x.from_dispatcher(&Frame::Frozen.to_bytes()).unwrap();
    x.switch(vec![1], now).unwrap();
    assert!(
        x.from_dispatcher(&record(1, 1)).is_err(),
        "TLS before the verdict"
    );
    let (mut x, _) = Exporter::freeze(100, T, now);
    assert!(!x.timed_out(now + T));
    assert!(x.timed_out(now + 2 * T));
    x.from_dispatcher(&Frame::Frozen.to_bytes()).unwrap();
    x.switch(vec![1], now + T).unwrap();
    assert!(!x.timed_out(now + 2 * T));
    assert!(x.timed_out(now + 3 * T));
}

#[test]
fn importer_uses_keys_only_on_commit() {
    let now = Instant::now();
    let mut m = Importer::new(T, now);
    assert!(m.timed_out(now + T));
    let got = m.from_dispatcher(&Frame::Import(vec![4; 30]).to_bytes());
    assert_eq!(got, Ok(Some(ImportEvent::Open(vec![4; 30]))));
    assert_eq!(m.deadline(), None, "opening is the caller's");
    assert_eq!(m.ready(now).unwrap(), Frame::Ready.to_bytes());
    assert_eq!(m.deadline(), Some(now + 2 * T));
    let mut v = Frame::Commit.to_bytes();
    v.extend(record(2, 9));
    assert_eq!(
        m.from_dispatcher(&v),
        Ok(Some(ImportEvent::Commit {
            ciphertext: record(2, 9)
        }))
    );
    assert_eq!(m.deadline(), None);

    let mut m = Importer::new(T, now);
    m.from_dispatcher(&Frame::Import(vec![4]).to_bytes())
        .unwrap();
    m.ready(now).unwrap();
    assert_eq!(
        m.from_dispatcher(&Frame::Abort.to_bytes()),
        Ok(Some(ImportEvent::Aborted))
    );

    let mut m = Importer::new(T, now);
    m.from_dispatcher(&Frame::Import(vec![4]).to_bytes())
        .unwrap();
    assert_eq!(
        m.refuse(RefuseReason::Replay).unwrap(),
        Frame::Refused(RefuseReason::Replay).to_bytes()
    );
    assert!(m.from_dispatcher(&Frame::Commit.to_bytes()).is_err());
}

#[test]
fn importer_refuses_client_bytes_before_commit() {
    let now = Instant::now();
    let mut m = Importer::new(T, now);
    assert!(
        m.from_dispatcher(&record(5, 1)).is_err(),
        "a ClientHello is not an Import"
    );
    let mut m = Importer::new(T, now);
    let mut v = Frame::Import(vec![4]).to_bytes();
    v.extend(record(5, 1));
    assert!(m.from_dispatcher(&v).is_err());
    let mut m = Importer::new(T, now);
    m.from_dispatcher(&Frame::Import(vec![4]).to_bytes())
        .unwrap();
    m.ready(now).unwrap();
    assert!(m.from_dispatcher(&record(5, 1)).is_err());
    assert!(m.ready(now).is_err());
}

#[test]
fn exporter_continues_where_the_tls_engine_stopped_reading() {
    // The engine read the first record and 1000 bytes of the second during the handshake;
    // the rest of the second, a third record and Frozen follow on the stream.
    let now = Instant::now();
    let mut stream = record(40, 1);
    stream.extend(record(5000, 2));
    let cut = 40 + 5 + 5 + 1000;
    let mut rest = stream[cut..].to_vec();
    rest.extend(record(7, 3));
    rest.extend(Frame::Frozen.to_bytes());
    for split_header in [false, true] {
        // also: the engine stopped three bytes into a header
        let (read_len, tail) = if split_header {
            let mut s = stream.clone();
            s.extend(&record(7, 3)[..3]);
            let mut t = record(7, 3)[3..].to_vec();
            t.extend(Frame::Frozen.to_bytes());
            (s, t)
        } else {
            (stream[..cut].to_vec(), rest.clone())
        };
        let mut read = Splitter::new();
        read.track(&read_len).unwrap();
        let (mut x, _) = Exporter::freeze(100_000, T, now);
        x.continue_from(read);
        let got = x.from_dispatcher(&tail).unwrap();
        assert_eq!(got.event, Some(ExportEvent::Frozen));
        assert_eq!(got.decrypt, tail[..tail.len() - 6]);
    }
    // whatever came from the client is records only
    assert_eq!(
        Splitter::new().track(&Frame::Frozen.to_bytes()),
        Err(HandoffError::FrameFromClient)
    );
}

proptest::proptest! {
    /// Wherever the TLS engine stopped reading, a splitter that takes over from the tracker
    /// passes on exactly the bytes the engine did not take.
    #[test]
    fn takeover_from_a_tracker_anywhere(
        lens in proptest::collection::vec(0usize..3000, 1..6),
        cut in 0.0f64..1.0,
    ) {
        let stream: Vec<u8> = lens.iter().enumerate().flat_map(|(i, &n)| record(n, i as u8)).collect();
        let k = (stream.len() as f64 * cut) as usize;
        let mut read = Splitter::new();
        read.track(&stream[..k]).unwrap();
        let out = read.split(&stream[k..]).unwrap();
        proptest::prop_assert_eq!(&out.tls[..], &stream[k..]);
        proptest::prop_assert!(read.at_boundary());
    }
}
