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
    }
}

async fn listener(agent_id: u16, key: &str) -> (LinkListener, SocketAddr) {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    (LinkListener::new(tcp, agent_id, ring(key)), addr)
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
        LinkListener::new(tcp, 6, ring(KEY))
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
