//! The agents' machines without sockets: the handshake agent switches at its cut, keeps the
//! connection past the plaintext cap, discards client records after its cut, and serves the
//! session only on Resume; the home agent uses the keys only on Commit; both give up by
//! closing.

use std::time::{Duration, Instant};

use super::*;

fn record(body_len: usize, fill: u8) -> Vec<u8> {
    let mut r = vec![23, 3, 3, (body_len >> 8) as u8, body_len as u8];
    r.extend(std::iter::repeat_n(fill, body_len));
    r
}

/// Agents wait 1 s for an Import and 2 s for a verdict.
const T: Timeouts = Timeouts::new(Duration::from_millis(500));

#[test]
fn exporter_happy_path_and_resume() {
    let now = Instant::now();
    for done in [true, false] {
        let mut x = Exporter::cut(1000, T, now);
        x.decrypted(150);
        assert!(x.within_cap());
        assert_eq!(
            x.deadline(),
            None,
            "the caller extracts; nothing to wait for"
        );
        let switch = x.switch(411, vec![9; 20], now).unwrap();
        assert_eq!(
            switch,
            Frame::Switch {
                cut: 411,
                sealed: vec![9; 20]
            }
            .to_bytes()
        );
        assert_eq!(x.deadline(), Some(now + T.verdict()));
        // client records the dispatcher forwarded before it saw the Switch: discarded
        let got = x.from_dispatcher(&record(100, 1)[..70]).unwrap();
        assert_eq!(got, ExportInput::default());
        let mut rest = record(100, 1)[70..].to_vec();
        rest.extend(record(50, 2));
        let got = x.from_dispatcher(&rest).unwrap();
        assert_eq!(got, ExportInput::default());
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
fn a_release_is_done_wherever_the_stream_stood() {
    let now = Instant::now();
    let mut x = Exporter::cut(1000, T, now);
    x.switch(0, vec![1], now).unwrap();
    // half a record reached the agent, the rest was overtaken by the release
    x.from_dispatcher(&record(100, 1)[..30]).unwrap();
    assert_eq!(x.released(), Ok(ExportEvent::Migrated));
    // after Kept only Resume can come
    let mut x = Exporter::cut(1000, T, now);
    assert_eq!(x.kept(5, now).unwrap(), Frame::Kept { cut: 5 }.to_bytes());
    assert!(x.released().is_err());
    let mut x = Exporter::cut(1000, T, now);
    x.kept(5, now).unwrap();
    assert!(x.from_dispatcher(&Frame::Done.to_bytes()).is_err());
}

#[test]
fn exporter_over_the_cap_aborts() {
    let now = Instant::now();
    let mut x = Exporter::cut(100, T, now);
    x.decrypted(150);
    assert!(!x.within_cap());
    assert_eq!(x.abort().unwrap(), Frame::Abort.to_bytes());
    assert!(
        x.switch(0, vec![1], now).is_err(),
        "no Switch after an abort"
    );
    assert_eq!(x.deadline(), None, "the TLS engine reads on");
}

#[test]
fn exporter_refuses_protocol_breaks_and_times_out() {
    let now = Instant::now();
    let mut x = Exporter::cut(100, T, now);
    assert!(
        x.from_dispatcher(&record(1, 1)).is_err(),
        "nothing to read before the Switch"
    );
    let mut x = Exporter::cut(100, T, now);
    x.switch(0, vec![1], now).unwrap();
    let mut v = Frame::Done.to_bytes();
    v.extend(record(1, 1));
    assert!(
        x.from_dispatcher(&v).is_err(),
        "nothing follows Done: the stream is released"
    );
    let mut x = Exporter::cut(100, T, now);
    x.switch(0, vec![1], now).unwrap();
    assert!(x
        .from_dispatcher(
            &Frame::Offer {
                home: 1,
                binding: [0; BINDING_LEN]
            }
            .to_bytes()
        )
        .is_err());
    let mut x = Exporter::cut(100, T, now);
    x.switch(0, vec![1], now + T.import()).unwrap();
    assert!(!x.timed_out(now + T.verdict()));
    assert!(x.timed_out(now + T.import() + T.verdict()));
}

#[test]
fn importer_uses_keys_only_on_commit() {
    let now = Instant::now();
    let mut m = Importer::new(T, now);
    assert!(m.timed_out(now + T.import()));
    let got = m.from_dispatcher(&Frame::Import(vec![4; 30]).to_bytes());
    assert_eq!(got, Ok(Some(ImportEvent::Open(vec![4; 30]))));
    assert_eq!(m.deadline(), None, "opening is the caller's");
    assert_eq!(m.ready(now).unwrap(), Frame::Ready.to_bytes());
    assert_eq!(m.deadline(), Some(now + T.verdict()));
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
    // the rest of the second and a third record follow on the stream, then the verdict.
    let now = Instant::now();
    let mut stream = record(40, 1);
    stream.extend(record(5000, 2));
    let cut = 40 + 5 + 5 + 1000;
    let mut rest = stream[cut..].to_vec();
    rest.extend(record(7, 3));
    rest.extend(Frame::Resume.to_bytes());
    rest.extend(record(9, 4));
    for split_header in [false, true] {
        // also: the engine stopped three bytes into a header
        let (read_len, tail) = if split_header {
            let mut s = stream.clone();
            s.extend(&record(7, 3)[..3]);
            let mut t = record(7, 3)[3..].to_vec();
            t.extend(Frame::Resume.to_bytes());
            t.extend(record(9, 4));
            (s, t)
        } else {
            (stream[..cut].to_vec(), rest.clone())
        };
        let mut read = Splitter::new();
        // the cut: the end of the last whole record the engine read
        let boundary = read.follow(&read_len).unwrap();
        let expect = if split_header { 5050 } else { 45 };
        assert_eq!(boundary, Some(expect));
        let mut x = Exporter::cut(100_000, T, now);
        x.continue_from(read);
        x.switch(expect as u32, vec![1], now).unwrap();
        let got = x.from_dispatcher(&tail).unwrap();
        assert_eq!(
            got.event,
            Some(ExportEvent::ServeHere {
                ciphertext: record(9, 4)
            })
        );
    }
    // whatever came from the client is records only
    assert_eq!(
        Splitter::new().track(&Frame::Resume.to_bytes()),
        Err(MigrationError::FrameFromClient)
    );
}

#[test]
fn follow_finds_the_last_boundary() {
    let mut s = Splitter::new();
    assert_eq!(s.follow(&record(10, 1)[..4]), Ok(None));
    assert_eq!(s.follow(&record(10, 1)[4..]), Ok(Some(11)));
    let two = [record(0, 1), record(3, 2), record(8, 3)[..6].to_vec()].concat();
    assert_eq!(s.follow(&two), Ok(Some(13)));
    assert_eq!(s.follow(&record(8, 3)[6..]), Ok(Some(7)));
    assert_eq!(s.follow(&[]), Ok(None));
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
