//! The agent link over real sockets on 127.0.0.1: authentication, one client per stream with
//! its metadata, flow control that keeps a stalled stream from stalling the others, the three
//! ways a stream ends (EOF, reset, release), and a pool that comes back after the agent
//! restarts. Every wait is bounded; nothing here measures speed.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use baton_link::{is_release, LinkListener, LinkPool, LinkStream, StreamMeta};
use baton_session::{KeyRing, SharedRing};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::time::timeout;

const KEY: &str = "00000001 1111111111111111111111111111111111111111111111111111111111111111";
const OTHER: &str = "00000001 2222222222222222222222222222222222222222222222222222222222222222";
const WAIT: Duration = Duration::from_secs(10);

fn ring(k: &str) -> SharedRing {
    Arc::new(RwLock::new(
        KeyRing::parse_key_file(k, Instant::now()).unwrap(),
    ))
}

fn meta(port: u16) -> StreamMeta {
    StreamMeta {
        source: SocketAddr::from(([192, 0, 2, 7], port)),
        destination: "127.0.0.1:443".parse().unwrap(),
        token: None,
        drain: false,
        shed: None,
        follows: false,
        reattach: None,
    }
}

async fn listener(agent_id: u16, key: &str) -> (LinkListener, SocketAddr) {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    (
        LinkListener::new(tcp, agent_id, ring(key), Vec::new()),
        addr,
    )
}

async fn up(pool: &LinkPool) {
    timeout(WAIT, async {
        while !pool.is_up() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the link came up");
}

/// Opens a stream from the dispatcher's side and takes it at the agent's.
async fn pair(pool: &LinkPool, agent: &LinkListener, port: u16) -> (LinkStream, LinkStream) {
    let d = pool.pick().unwrap().open(meta(port)).await.unwrap();
    let a = timeout(WAIT, agent.accept()).await.unwrap().unwrap();
    (d, a)
}

#[tokio::test]
async fn streams_carry_bytes_and_metadata_both_ways() {
    let (agent, addr) = listener(3, KEY).await;
    let pool = LinkPool::new(addr, 3, ring(KEY), 2);
    up(&pool).await;
    for port in [1000, 1001, 1002] {
        let (mut d, mut a) = pair(&pool, &agent, port).await;
        assert_eq!(a.meta().source.port(), port);
        assert_eq!(a.meta().destination, meta(port).destination);
        d.write_all(b"client hello").await.unwrap();
        let mut buf = [0u8; 12];
        timeout(WAIT, a.read_exact(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf, b"client hello");
        // several writes, vectored or not, arrive whole and in order
        a.write_all(b"server ").await.unwrap();
        let n = a
            .write_vectored(&[std::io::IoSlice::new(b"fli"), std::io::IoSlice::new(b"ght")])
            .await
            .unwrap();
        assert_eq!(n, 6, "one vectored write takes every slice that fits");
        a.shutdown().await.unwrap();
        let mut got = Vec::new();
        timeout(WAIT, d.read_to_end(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, b"server flight");
        d.shutdown().await.unwrap();
        let mut rest = Vec::new();
        timeout(WAIT, a.read_to_end(&mut rest))
            .await
            .unwrap()
            .unwrap();
        assert!(rest.is_empty(), "a clean EOF at the agent");
    }
    assert_eq!(agent.stats().streams(), 3);
}

#[tokio::test]
async fn a_stream_nobody_reads_does_not_stall_the_others() {
    let (agent, addr) = listener(1, KEY).await;
    // one link connection: both streams share it
    let pool = LinkPool::new(addr, 1, ring(KEY), 1);
    up(&pool).await;
    let (mut stalled_d, stalled_a) = pair(&pool, &agent, 1).await;
    let (mut live_d, mut live_a) = pair(&pool, &agent, 2).await;
    // 4 MiB into a stream the agent never reads: the writer waits at the stream window.
    let writer = tokio::spawn(async move {
        let chunk = vec![7u8; 64 * 1024];
        let mut sent = 0usize;
        while sent < 4 << 20 {
            match timeout(Duration::from_millis(500), stalled_d.write_all(&chunk)).await {
                Ok(Ok(())) => sent += chunk.len(),
                Ok(Err(e)) => panic!("the stalled stream failed instead of waiting: {e}"),
                Err(_) => break, // waiting for window: what should happen
            }
        }
        sent
    });
    let sent = timeout(WAIT, writer).await.unwrap().unwrap();
    assert!(sent >= 64 * 1024, "the stream took its window: {sent}");
    assert!(
        sent <= baton_link::STREAM_WINDOW as usize + 64 * 1024,
        "a stalled stream took {sent} bytes, more than its window"
    );
    // The other stream still goes both ways, many times over its window.
    let data = vec![1u8; 2 << 20];
    let send = data.clone();
    let w = tokio::spawn(async move {
        live_d.write_all(&send).await.unwrap();
        live_d.shutdown().await.unwrap();
        live_d
    });
    let mut got = Vec::new();
    timeout(WAIT, live_a.read_to_end(&mut got))
        .await
        .expect("the live stream was not stalled")
        .unwrap();
    assert_eq!(got.len(), data.len());
    drop(w.await.unwrap());
    drop(stalled_a);
}

#[tokio::test]
async fn reset_and_release_read_as_errors_and_only_release_as_a_verdict() {
    let (agent, addr) = listener(2, KEY).await;
    let pool = LinkPool::new(addr, 2, ring(KEY), 1);
    up(&pool).await;
    let mut buf = [0u8; 16];

    let (mut d, a) = pair(&pool, &agent, 1).await;
    d.write_all(b"x").await.unwrap();
    a.abort();
    let e = timeout(WAIT, async {
        loop {
            match d.read(&mut buf).await {
                Ok(0) => panic!("an abort must not read as a clean EOF"),
                Ok(_) => continue,
                Err(e) => break e,
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset);
    assert!(!is_release(&e));

    let (d, mut a) = pair(&pool, &agent, 2).await;
    d.release();
    let e = timeout(WAIT, a.read(&mut buf)).await.unwrap().unwrap_err();
    assert!(is_release(&e), "{e}");

    // dropped while the peer's side is open: the peer's read fails, never a clean EOF that
    // would pass a cut-off stream for a complete one
    let (d, mut a) = pair(&pool, &agent, 3).await;
    drop(d);
    let e = timeout(WAIT, a.read(&mut buf)).await.unwrap().unwrap_err();
    assert!(!is_release(&e), "{e}");

    // shut down, then dropped once the peer has ended too: clean EOF both ways
    let (mut d, mut a) = pair(&pool, &agent, 4).await;
    d.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
    let n = timeout(WAIT, d.read(&mut buf)).await.unwrap().unwrap();
    assert_eq!(n, 0);
    drop(d);
    let n = timeout(WAIT, a.read(&mut buf)).await.unwrap().unwrap();
    assert_eq!(n, 0);
}

/// A release that waits for company (the dispatcher's Done) reaches the agent as a release
/// both ways: alone on an idle link (its delay runs out), and with the next frame.
#[tokio::test]
async fn a_later_release_arrives_alone_or_with_the_next_frame() {
    let (agent, addr) = listener(2, KEY).await;
    let pool = LinkPool::new(addr, 2, ring(KEY), 1);
    up(&pool).await;
    let mut buf = [0u8; 16];

    // idle link: nothing else is written
    let (d, mut a) = pair(&pool, &agent, 1).await;
    d.release_later();
    let e = timeout(WAIT, a.read(&mut buf)).await.unwrap().unwrap_err();
    assert!(is_release(&e), "{e}");

    // another stream's bytes go next: the release goes with them
    let (d1, mut a1) = pair(&pool, &agent, 2).await;
    let (mut d2, mut a2) = pair(&pool, &agent, 3).await;
    d1.release_later();
    d2.write_all(b"y").await.unwrap();
    let n = timeout(WAIT, a2.read(&mut buf)).await.unwrap().unwrap();
    assert_eq!(&buf[..n], b"y");
    let e = timeout(WAIT, a1.read(&mut buf)).await.unwrap().unwrap_err();
    assert!(is_release(&e), "{e}");

    // many at once, then the link goes on carrying bytes
    let mut agents = Vec::new();
    for port in 10..20 {
        let (d, a) = pair(&pool, &agent, port).await;
        d.release_later();
        agents.push(a);
    }
    for mut a in agents {
        let e = timeout(WAIT, a.read(&mut buf)).await.unwrap().unwrap_err();
        assert!(is_release(&e), "{e}");
    }
    d2.write_all(b"z").await.unwrap();
    let n = timeout(WAIT, a2.read(&mut buf)).await.unwrap().unwrap();
    assert_eq!(&buf[..n], b"z");
}

#[tokio::test]
async fn a_dispatcher_without_the_key_gets_no_link() {
    let (agent, addr) = listener(4, KEY).await;
    let pool = LinkPool::new(addr, 4, ring(OTHER), 1);
    let stats = agent.stats();
    timeout(WAIT, async {
        while stats.auth_failures() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the agent refused the handshakes");
    assert!(!pool.is_up());
    assert!(pool.pick().is_none());
    // and a pool asking for another agent id never takes this agent's link either
    let wrong_id = LinkPool::new(addr, 5, ring(KEY), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!wrong_id.is_up());
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// The agent runs in a runtime of its own, so that dropping it ends every task and socket of
/// the agent at once, as a process exit would.
#[test]
fn the_pool_comes_back_after_the_agent_restarts() {
    let dispatcher = runtime();
    let agent_rt = runtime();
    let (agent, addr) = agent_rt.block_on(listener(6, KEY));
    let pool = dispatcher.block_on(async {
        let pool = LinkPool::new(addr, 6, ring(KEY), 1);
        up(&pool).await;
        pool
    });
    let mut d = dispatcher
        .block_on(pool.pick().unwrap().open(meta(1)))
        .unwrap();
    dispatcher.block_on(d.write_all(b"first")).unwrap();
    let a = agent_rt
        .block_on(async { timeout(WAIT, agent.accept()).await })
        .unwrap()
        .unwrap();
    drop(a);
    drop(agent);
    drop(agent_rt);
    // an open stream of the dead link ends instead of hanging
    let ended = dispatcher.block_on(async {
        let mut buf = [0u8; 8];
        let read_to_end = async {
            loop {
                match d.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => continue,
                }
            }
        };
        timeout(WAIT, read_to_end).await
    });
    assert!(ended.is_ok(), "a stream of a dead link ended");
    // a new agent on the same address: the pool reconnects by itself
    let agent_rt = runtime();
    let agent = agent_rt.block_on(async {
        let tcp = timeout(WAIT, async {
            loop {
                match TcpListener::bind(addr).await {
                    Ok(t) => break t,
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        })
        .await
        .expect("the address is free again");
        LinkListener::new(tcp, 6, ring(KEY), Vec::new())
    });
    // kept open until the agent has read it (a dropped stream is reset)
    let _stream = dispatcher.block_on(async {
        timeout(WAIT, async {
            loop {
                if let Some(h) = pool.pick() {
                    if let Ok(Ok(mut s)) = timeout(Duration::from_secs(1), h.open(meta(9))).await {
                        if s.write_all(b"again").await.is_ok() {
                            break s;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the pool reconnected")
    });
    let mut a = agent_rt
        .block_on(async { timeout(WAIT, agent.accept()).await })
        .unwrap()
        .unwrap();
    let mut buf = [0u8; 5];
    agent_rt
        .block_on(async { timeout(WAIT, a.read_exact(&mut buf)).await })
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"again");
}

// --- dispatcher handover (issue 18) ---

/// The stream a successor dispatcher opens to continue the one handed over with `token`.
async fn reattach(pool: &LinkPool, token: [u8; 16]) -> (LinkStream, [u8; 16]) {
    let link = pool.pick().unwrap();
    let mut s = link
        .open(StreamMeta {
            reattach: Some(token),
            ..meta(1)
        })
        .await
        .unwrap();
    timeout(WAIT, s.answered())
        .await
        .expect("the agent answered the re-attach stream")
        .expect("the agent took the re-attach stream");
    (s, link.id())
}

/// Reads what the agent sends until its end; returns it and whether the end acknowledged a
/// handover.
async fn read_to_handed_over(d: &mut LinkStream) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    timeout(WAIT, d.read_to_end(&mut got))
        .await
        .expect("the agent ended its side")
        .unwrap();
    (got, d.handed_over())
}

/// Reads from `d` into `got` until it holds `n` bytes.
async fn read_until(d: &mut LinkStream, got: &mut Vec<u8>, n: usize) {
    let mut buf = vec![0u8; 64 * 1024];
    timeout(WAIT, async {
        while got.len() < n {
            let k = d.read(&mut buf).await.unwrap();
            assert_ne!(k, 0, "the stream ended early");
            got.extend_from_slice(&buf[..k]);
        }
    })
    .await
    .expect("the bytes came");
}

/// 1 MiB the agent writes: 4-byte big-endian counters, so a byte lost, repeated or out of
/// order shows.
fn counters() -> Vec<u8> {
    (0u32..256 * 1024).flat_map(u32::to_be_bytes).collect()
}

#[tokio::test]
async fn a_stream_continues_on_a_successor_dispatchers_link_twice() {
    let (agent, addr) = listener(7, KEY).await;
    let stats = agent.stats();
    let pool1 = LinkPool::new(addr, 7, ring(KEY), 1);
    up(&pool1).await;
    let (mut d1, mut a) = pair(&pool1, &agent, 4242).await;
    let first_link = a.link_id();
    assert_eq!(first_link, pool1.pick().unwrap().id());
    d1.write_all(b"hello").await.unwrap();
    let mut buf = [0u8; 5];
    timeout(WAIT, a.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"hello");
    a.write_all(b"hi").await.unwrap();
    let mut buf = [0u8; 2];
    timeout(WAIT, d1.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"hi");

    // The agent as rustls drives it: a writer task in the middle of 1 MiB (four stream
    // windows), a reader task idle in a read, both on the one LinkStream.
    let (mut ra, mut wa) = tokio::io::split(a);
    let expected = counters();
    let data = expected.clone();
    let writer = tokio::spawn(async move {
        wa.write_all(&data).await.unwrap();
        wa
    });
    let (heard_tx, mut heard) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let from_successors: &[u8] = b"from successor 1|from successor 2|";
    let reader = tokio::spawn(async move {
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        while got.len() < from_successors.len() {
            let n = ra.read(&mut buf).await.expect("the agent's read waited");
            assert_ne!(n, 0, "the agent saw an end instead of waiting");
            got.extend_from_slice(&buf[..n]);
            heard_tx.send(buf[..n].to_vec()).unwrap();
        }
        ra
    });
    // The writer fills the window and waits for capacity.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t1 = baton_link::token();
    d1.hand_over(t1).unwrap();
    let e = d1.write_all(b"late").await.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe);
    let (mut got, acked) = read_to_handed_over(&mut d1).await;
    assert!(acked, "the agent acknowledged the handover");
    assert!(
        !got.is_empty() && got.len() < expected.len(),
        "{} bytes before the handover",
        got.len()
    );
    drop(d1);
    drop(pool1);

    // A new dispatcher process: its own link, a stream that re-attaches.
    let pool2 = LinkPool::new(addr, 7, ring(KEY), 1);
    up(&pool2).await;
    let (mut d2, second_link) = reattach(&pool2, t1).await;
    assert_ne!(second_link, first_link);
    d2.write_all(b"from successor 1|").await.unwrap();
    let mut heard_bytes = Vec::new();
    while heard_bytes.len() < 17 {
        let chunk = timeout(WAIT, heard.recv()).await.unwrap().unwrap();
        heard_bytes.extend(chunk);
    }
    assert_eq!(heard_bytes, b"from successor 1|");
    // Some more of the rest, then the writer waits for capacity again and a third process
    // takes over.
    let part = got.len() + 300 * 1024;
    read_until(&mut d2, &mut got, part.min(expected.len() - 1)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t2 = baton_link::token();
    d2.hand_over(t2).unwrap();
    let (more, acked) = read_to_handed_over(&mut d2).await;
    assert!(acked);
    got.extend(more);
    assert!(got.len() < expected.len(), "the writer was still writing");
    drop(d2);
    drop(pool2);

    let pool3 = LinkPool::new(addr, 7, ring(KEY), 1);
    up(&pool3).await;
    let (mut d3, third_link) = reattach(&pool3, t2).await;
    assert_ne!(third_link, second_link);
    d3.write_all(b"from successor 2|").await.unwrap();
    read_until(&mut d3, &mut got, expected.len()).await;
    assert!(
        got == expected,
        "{} bytes, first difference at {:?}",
        got.len(),
        got.iter().zip(&expected).position(|(a, b)| a != b)
    );
    let wa = timeout(WAIT, writer).await.unwrap().unwrap();
    let ra = timeout(WAIT, reader).await.unwrap().unwrap();
    let mut a = ra.unsplit(wa);
    assert_eq!(
        a.link_id(),
        third_link,
        "the stream rides the third link now"
    );
    assert_eq!(a.meta().source.port(), 4242, "the same client");
    // and it still ends as any stream does
    a.write_all(b"bye").await.unwrap();
    a.shutdown().await.unwrap();
    let (tail, acked) = read_to_handed_over(&mut d3).await;
    assert_eq!(tail, b"bye");
    assert!(!acked, "a plain end is no handover");
    d3.shutdown().await.unwrap();
    let mut rest = Vec::new();
    timeout(WAIT, a.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(rest.is_empty());
    assert_eq!(stats.reattached(), 2);
    assert_eq!(stats.reattach_failed(), 0);
    assert_eq!(stats.streams(), 1, "re-attach streams are not new clients");
}

#[tokio::test]
async fn an_agent_idle_in_a_read_that_never_answered_continues_on_the_successor() {
    let (agent, addr) = listener(8, KEY).await;
    let pool1 = LinkPool::new(addr, 8, ring(KEY), 1);
    up(&pool1).await;
    let (mut d1, mut a) = pair(&pool1, &agent, 1).await;
    // The agent reads before it has ever sent a byte (its response headers not sent yet).
    let agent_side = tokio::spawn(async move {
        let mut buf = [0u8; 5];
        a.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"again");
        let link = a.link_id();
        a.write_all(b"welcome back").await.unwrap();
        (a, link)
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    d1.hand_over([0x42; 16]).unwrap();
    let (got, acked) = read_to_handed_over(&mut d1).await;
    assert!(got.is_empty());
    assert!(acked);
    assert!(
        agent.stats().reattached() == 0 && !agent_side.is_finished(),
        "the agent's read waits"
    );
    let pool2 = LinkPool::new(addr, 8, ring(KEY), 1);
    up(&pool2).await;
    let (mut d2, link2) = reattach(&pool2, [0x42; 16]).await;
    d2.write_all(b"again").await.unwrap();
    let (_a, link_seen) = timeout(WAIT, agent_side).await.unwrap().unwrap();
    assert_eq!(link_seen, link2);
    let mut buf = [0u8; 12];
    timeout(WAIT, d2.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"welcome back");
    assert_eq!(agent.stats().reattached(), 1);
}

#[tokio::test]
async fn a_handover_nobody_takes_fails_at_its_deadline() {
    let (agent, addr) = listener(9, KEY).await;
    agent.set_reattach_timeout(Duration::from_millis(300));
    let stats = agent.stats();
    let pool = LinkPool::new(addr, 9, ring(KEY), 1);
    up(&pool).await;
    let (mut d, mut a) = pair(&pool, &agent, 1).await;
    let t = baton_link::token();
    d.hand_over(t).unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 8];
    let e = timeout(WAIT, a.read(&mut buf)).await.unwrap().unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
    assert!(started.elapsed() >= Duration::from_millis(250));
    let e = a.write_all(b"x").await.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    assert_eq!(stats.reattach_failed(), 1);
    assert_eq!(stats.reattached(), 0);
    let (_, acked) = read_to_handed_over(&mut d).await;
    assert!(acked);
    // a successor too late is refused
    let mut late = pool
        .pick()
        .unwrap()
        .open(StreamMeta {
            reattach: Some(t),
            ..meta(1)
        })
        .await
        .unwrap();
    let e = timeout(WAIT, late.answered()).await.unwrap().unwrap_err();
    assert!(baton_link::is_refused(&e), "{e}");
    assert_eq!(stats.reattach_failed(), 2);

    // A stream dropped while it waits takes its registration with it: refused at once.
    let (mut d, mut a) = pair(&pool, &agent, 2).await;
    let t = baton_link::token();
    d.hand_over(t).unwrap();
    let pending = timeout(Duration::from_millis(100), a.read(&mut buf)).await;
    assert!(pending.is_err(), "the agent's read waits for the successor");
    let (_, acked) = read_to_handed_over(&mut d).await;
    assert!(acked);
    drop(a);
    let mut gone = pool
        .pick()
        .unwrap()
        .open(StreamMeta {
            reattach: Some(t),
            ..meta(2)
        })
        .await
        .unwrap();
    let e = timeout(WAIT, gone.answered()).await.unwrap().unwrap_err();
    assert!(baton_link::is_refused(&e), "{e}");
}

#[tokio::test]
async fn a_reattach_stream_nobody_waits_for_is_refused_and_never_accepted() {
    let (agent, addr) = listener(10, KEY).await;
    let pool = LinkPool::new(addr, 10, ring(KEY), 1);
    up(&pool).await;
    let mut s = pool
        .pick()
        .unwrap()
        .open(StreamMeta {
            reattach: Some(baton_link::token()),
            ..meta(1)
        })
        .await
        .unwrap();
    let e = timeout(WAIT, s.answered()).await.unwrap().unwrap_err();
    assert!(baton_link::is_refused(&e), "{e}");
    let mut buf = [0u8; 4];
    assert!(timeout(WAIT, s.read(&mut buf)).await.unwrap().is_err());
    assert!(
        timeout(Duration::from_millis(200), agent.accept())
            .await
            .is_err(),
        "a re-attach stream is never accepted"
    );
    // the next client stream is
    let (_d, a) = pair(&pool, &agent, 77).await;
    assert_eq!(a.meta().source.port(), 77);
    assert_eq!(agent.stats().reattach_failed(), 1);
    assert_eq!(agent.stats().streams(), 1);
}

#[tokio::test]
async fn a_plain_end_is_no_handover() {
    let (agent, addr) = listener(11, KEY).await;
    let pool = LinkPool::new(addr, 11, ring(KEY), 1);
    up(&pool).await;
    let (mut d, mut a) = pair(&pool, &agent, 1).await;
    assert!(!d.handed_over());
    a.write_all(b"x").await.unwrap();
    // the agent answers with its first byte
    timeout(WAIT, d.answered()).await.unwrap().unwrap();
    timeout(WAIT, d.answered()).await.unwrap().unwrap();
    a.shutdown().await.unwrap();
    let (got, acked) = read_to_handed_over(&mut d).await;
    assert_eq!(got, b"x");
    assert!(!acked);
    d.shutdown().await.unwrap();
    let mut rest = Vec::new();
    timeout(WAIT, a.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(rest.is_empty(), "a clean EOF at the agent");
    // hand_over is the dispatcher's
    let e = a.hand_over([1; 16]).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::Unsupported);
}

#[tokio::test]
async fn an_agent_that_only_writes_notices_the_handover() {
    let (agent, addr) = listener(12, KEY).await;
    let pool1 = LinkPool::new(addr, 12, ring(KEY), 1);
    up(&pool1).await;
    let (mut d1, mut a) = pair(&pool1, &agent, 1).await;
    let expected = counters();
    let data = expected.clone();
    // No task of the agent ever reads: its writes must notice the handover.
    let writer = tokio::spawn(async move {
        a.write_all(&data).await.unwrap();
        a.shutdown().await.unwrap();
        a
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    d1.hand_over([7; 16]).unwrap();
    let (mut got, acked) = read_to_handed_over(&mut d1).await;
    assert!(acked, "the writing agent acknowledged");
    assert!(got.len() < expected.len(), "{}", got.len());
    let pool2 = LinkPool::new(addr, 12, ring(KEY), 1);
    up(&pool2).await;
    let (mut d2, link2) = reattach(&pool2, [7; 16]).await;
    let (rest, acked) = read_to_handed_over(&mut d2).await;
    assert!(!acked, "then a plain end, after the last byte");
    got.extend(rest);
    assert!(got == expected, "{} bytes", got.len());
    let a = timeout(WAIT, writer).await.unwrap().unwrap();
    assert_eq!(a.link_id(), link2);
}
