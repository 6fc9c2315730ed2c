//! Parked connections over real sockets: the agent's own connection code
//! (`conn::accept::serve_tcp`) on loopback, rustls clients in TLS 1.2 and 1.3 that idle long enough to
//! park, then send more requests, KeyUpdates, half records, close_notify; the agent's counters
//! must come out as exact as without parking (handshakes, bytes both ways).

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{self, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use super::accept::serve_tcp;
use super::decide::Waited;
use super::http1::resume;
use super::park::Parked;
use crate::context::Context;

struct Agent {
    ctx: Arc<Context>,
    addr: SocketAddr,
    roots: Arc<rustls::RootCertStore>,
}

/// An agent with `flags` (and a self-signed ECDSA certificate) serving on a loopback port.
async fn start(flags: &[&str]) -> Agent {
    let mut all = vec!["--self-signed", "ecdsa-p256"];
    all.extend_from_slice(flags);
    let (ctx, pem) = crate::context::for_test(crate::config::from_flags(&all)).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let s = ctx.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = listener.accept().await.unwrap();
            let ctx = s.clone();
            tokio::spawn(async move {
                ctx.metrics.connection_opened();
                serve_tcp(tcp, peer, ctx.clone()).await;
                ctx.metrics.connection_closed();
            });
        }
    });
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    Agent {
        ctx,
        addr,
        roots: Arc::new(roots),
    }
}

impl Agent {
    fn client_config(&self, tls13: bool) -> Arc<rustls::ClientConfig> {
        let version = match tls13 {
            true => &rustls::version::TLS13,
            false => &rustls::version::TLS12,
        };
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[version])
            .unwrap()
            .with_root_certificates(self.roots.clone())
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config.resumption = rustls::client::Resumption::disabled();
        Arc::new(config)
    }

    /// A value of the agent's metrics (`name` with its labels, as exposed).
    fn metric(&self, name: &str) -> f64 {
        let m = self.ctx.metrics.clone();
        let text = crate::metrics::tests::encoded(move |e| m.encode(e));
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    }

    /// Waits until `n` connections are parked.
    async fn parked(&self, n: i64) {
        let by = Instant::now() + Duration::from_secs(10);
        while self.ctx.metrics.parked_connections() != n {
            assert!(
                Instant::now() < by,
                "{} parked, not {n}",
                self.ctx.metrics.parked_connections()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits until the agent serves no connection.
    async fn idle(&self) {
        let by = Instant::now() + Duration::from_secs(10);
        while self.ctx.metrics.active_connections() != 0 {
            assert!(Instant::now() < by, "connections still served");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A TCP stream that counts what goes through it.
struct Counting {
    tcp: TcpStream,
    sent: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
}

impl AsyncRead for Counting {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.tcp).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        self.received.fetch_add(n as u64, Ordering::Relaxed);
        r
    }
}

impl AsyncWrite for Counting {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut task::Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.tcp).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.sent.fetch_add(n as u64, Ordering::Relaxed);
        }
        r
    }
    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

struct Client {
    tls: tokio_rustls::client::TlsStream<Counting>,
    sent: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
}

async fn connect(agent: &Agent, tls13: bool) -> Client {
    let tcp = TcpStream::connect(agent.addr).await.unwrap();
    let (sent, received) = (Arc::default(), Arc::default());
    let io = Counting {
        tcp,
        sent: Arc::clone(&sent),
        received: Arc::clone(&received),
    };
    let connector = tokio_rustls::TlsConnector::from(agent.client_config(tls13));
    let name = ServerName::try_from("localhost").unwrap();
    let tls = connector.connect(name, io).await.unwrap();
    Client {
        tls,
        sent,
        received,
    }
}

impl Client {
    async fn send(&mut self, path: &str) {
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        self.tls.write_all(req.as_bytes()).await.unwrap();
        self.tls.flush().await.unwrap();
    }

    /// One response: its status line and body (by Content-Length).
    async fn response(&mut self) -> (String, Vec<u8>) {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            let n = tokio::time::timeout(Duration::from_secs(10), self.tls.read(&mut b))
                .await
                .expect("a response")
                .unwrap();
            assert_eq!(
                n,
                1,
                "closed before a response: {:?}",
                String::from_utf8_lossy(&head)
            );
            head.push(b[0]);
        }
        let head = String::from_utf8(head).unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().unwrap())
            })
            .expect("content-length");
        let mut body = vec![0u8; len];
        self.tls.read_exact(&mut body).await.unwrap();
        (head.lines().next().unwrap().to_string(), body)
    }

    async fn get(&mut self, path: &str) -> (String, Vec<u8>) {
        self.send(path).await;
        self.response().await
    }

    /// Reads to the end: `true` if the agent closed with close_notify.
    async fn closed_cleanly(&mut self) -> bool {
        let mut rest = Vec::new();
        let r = tokio::time::timeout(Duration::from_secs(10), self.tls.read_to_end(&mut rest))
            .await
            .expect("the agent closes");
        assert!(
            rest.is_empty(),
            "{} bytes after the last response",
            rest.len()
        );
        r.is_ok()
    }
}

#[tokio::test]
async fn parked_connections_serve_on_tls12_and_tls13() {
    for tls13 in [false, true] {
        let agent = start(&["--park-after", "20ms"]).await;
        let mut c = connect(&agent, tls13).await;
        // idle after the handshake: parked before its first request
        agent.parked(1).await;
        let (status, body) = c.get("/").await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert_eq!(body.len(), 1024);
        agent.parked(1).await;
        if tls13 {
            // a KeyUpdate to the parked connection, which now lives on the record layer
            c.tls.get_mut().1.refresh_traffic_keys().unwrap();
        }
        let (status, body) = c.get("/tls").await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        let tls = String::from_utf8(body).unwrap();
        let version = if tls13 { "TLSv1.3" } else { "TLSv1.2" };
        assert!(tls.contains(version), "{tls}");
        agent.parked(1).await;
        // pipelined requests, and a body larger than a record
        c.tls
            .write_all(
                b"GET /bytes/40000 HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
            )
            .await
            .unwrap();
        assert_eq!(c.response().await.1.len(), 40_000);
        assert_eq!(c.response().await.1.len(), 1024);
        agent.parked(1).await;
        if tls13 {
            c.tls.get_mut().1.refresh_traffic_keys().unwrap();
            assert_eq!(c.get("/").await.0, "HTTP/1.1 200 OK");
            agent.parked(1).await;
        }
        // close_notify from the client: the agent answers with its own
        c.tls.shutdown().await.unwrap();
        assert!(c.closed_cleanly().await, "close_notify from the agent");
        agent.idle().await;
        assert_eq!(agent.ctx.metrics.parked_connections(), 0);
        let v = if tls13 { "1.3" } else { "1.2" };
        let full = format!("baton_handshakes_total{{version=\"{v}\",kind=\"full\"}}");
        assert_eq!(agent.metric(&full), 1.0);
        // every byte counted once, as the client saw them
        let sent = c.sent.load(Ordering::Relaxed) as f64;
        let received = c.received.load(Ordering::Relaxed) as f64;
        assert_eq!(agent.metric("baton_bytes_total{direction=\"in\"}"), sent);
        assert_eq!(
            agent.metric("baton_bytes_total{direction=\"out\"}"),
            received
        );
    }
}

/// Gives a hand-driven client all of `bytes`.
fn feed(client: &mut rustls::ClientConnection, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        client.read_tls(&mut bytes).unwrap();
        client.process_new_packets().unwrap();
    }
}

#[tokio::test]
async fn half_a_record_in_flight_waits_and_is_served_whole() {
    // A plain socket and a rustls client driven by hand, to cut a record in two.
    let agent = start(&["--park-after", "20ms"]).await;
    for tls13 in [false, true] {
        let name = ServerName::try_from("localhost").unwrap();
        let mut client = rustls::ClientConnection::new(agent.client_config(tls13), name).unwrap();
        let mut tcp = TcpStream::connect(agent.addr).await.unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        while client.is_handshaking() {
            let mut out = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut out).unwrap();
            }
            tcp.write_all(&out).await.unwrap();
            if client.is_handshaking() {
                let n = tcp.read(&mut buf).await.unwrap();
                feed(&mut client, &buf[..n]);
            }
        }
        let mut wire = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut wire).unwrap();
        }
        tcp.write_all(&wire).await.unwrap();
        // The first time on rustls (unless it parked in the meantime), then on the record
        // layer it parked on: half a record, and a wait past the park time. It must not park
        // on half a record (extraction would drop it), nor answer before the rest.
        for _ in 0..2 {
            client
                .writer()
                .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            let mut record = Vec::new();
            client.write_tls(&mut record).unwrap();
            tcp.write_all(&record[..10]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert_eq!(agent.ctx.metrics.parked_connections(), 0);
            tcp.write_all(&record[10..]).await.unwrap();
            let mut plain = Vec::new();
            let whole = |p: &[u8]| {
                let end = p.windows(4).position(|w| w == b"\r\n\r\n")?;
                (p.len() >= end + 4 + 1024).then_some(())
            };
            while whole(&plain).is_none() {
                let n = tcp.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed");
                feed(&mut client, &buf[..n]);
                let _ = client.reader().read_to_end(&mut plain);
            }
            assert!(plain.starts_with(b"HTTP/1.1 200 OK"));
            agent.parked(1).await;
        }
        drop(tcp);
        agent.idle().await;
    }
}

#[tokio::test]
async fn a_parked_connection_times_out_and_drains_like_any_other() {
    // the first request never comes: cut at --request-timeout, counted as slow
    let agent = start(&["--park-after", "10ms", "--request-timeout", "300ms"]).await;
    let mut c = connect(&agent, true).await;
    agent.parked(1).await;
    let started = Instant::now();
    let _ = c.closed_cleanly().await;
    assert!(started.elapsed() >= Duration::from_millis(200));
    agent.idle().await;
    assert_eq!(
        agent.metric("baton_slow_requests_total{reason=\"deadline\"}"),
        1.0
    );
    assert_eq!(agent.ctx.metrics.parked_connections(), 0);

    // idle past --idle-timeout after a response
    let agent = start(&["--park-after", "10ms", "--idle-timeout", "300ms"]).await;
    let mut c = connect(&agent, false).await;
    assert_eq!(c.get("/").await.0, "HTTP/1.1 200 OK");
    agent.parked(1).await;
    let started = Instant::now();
    let _ = c.closed_cleanly().await;
    assert!(started.elapsed() >= Duration::from_millis(200));
    agent.idle().await;
    assert_eq!(agent.ctx.metrics.parked_connections(), 0);
    // an idle timeout, not a slow request
    assert_eq!(
        agent.metric("baton_slow_requests_total{reason=\"deadline\"}"),
        0.0
    );

    // SIGTERM's drain: a parked direct connection (it cannot move) is closed with
    // close_notify, and counted
    let agent = start(&["--park-after", "10ms"]).await;
    let mut clients = Vec::new();
    for tls13 in [false, true] {
        let mut c = connect(&agent, tls13).await;
        assert_eq!(c.get("/").await.0, "HTTP/1.1 200 OK");
        clients.push(c);
    }
    agent.parked(2).await;
    agent.ctx.draining.cancel();
    for c in &mut clients {
        assert!(c.closed_cleanly().await, "close_notify at the drain");
    }
    agent.idle().await;
    assert_eq!(agent.metric("baton_drain_closed_connections_total"), 2.0);
}

#[tokio::test]
async fn the_task_of_an_idle_connection_is_small() {
    // What a connection's task holds for its whole life: the work is boxed, and only the parked
    // state and its wait stay in the task (the whole connection future was 16.8 KB).
    let agent = start(&[]).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcp = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let peer = tcp.local_addr().unwrap();
    let task = serve_tcp(tcp, peer, agent.ctx.clone());
    let size = std::mem::size_of_val(&task);
    assert!(size <= 2048, "serve_tcp's future is {size} bytes");
    assert!(std::mem::size_of::<Parked>() <= 64);
    // and what each wake-up of a parked connection allocates and fills (it was 10.6 KB with a
    // move's future and the rustls engine inline)
    fn returned<F, A, B, R>(_: F) -> usize
    where
        F: FnOnce(A, B) -> R,
    {
        std::mem::size_of::<R>()
    }
    let wake_up = returned::<_, Parked, Waited, _>(resume);
    assert!(wake_up <= 2048, "a wake-up's future is {wake_up} bytes");
}

#[tokio::test]
async fn an_idle_timeout_is_not_a_slow_request_but_a_trickled_one_is() {
    // Not parked (the park time is past the idle timeout): the wait in `wait_request`.
    for park_after in ["10s", "10ms"] {
        let agent = start(&["--park-after", park_after, "--idle-timeout", "300ms"]).await;
        // nothing comes after the response: idle
        let mut idle = connect(&agent, true).await;
        assert_eq!(idle.get("/").await.0, "HTTP/1.1 200 OK");
        // part of a record comes after the response, never the rest: slow
        let mut slow = connect(&agent, true).await;
        assert_eq!(slow.get("/").await.0, "HTTP/1.1 200 OK");
        // a KeyUpdate, a whole record, comes after the response, and nothing else: idle
        let mut key_update = connect(&agent, true).await;
        assert_eq!(key_update.get("/").await.0, "HTTP/1.1 200 OK");
        tokio::time::sleep(Duration::from_millis(50)).await;
        slow.tls
            .get_mut()
            .0
            .tcp
            .write_all(&[0x17, 0x03])
            .await
            .unwrap();
        key_update.tls.get_mut().1.refresh_traffic_keys().unwrap();
        key_update.tls.flush().await.unwrap();
        let _ = idle.closed_cleanly().await;
        let _ = slow.closed_cleanly().await;
        let _ = key_update.closed_cleanly().await;
        agent.idle().await;
        assert_eq!(
            agent.metric("baton_slow_requests_total{reason=\"deadline\"}"),
            1.0,
            "--park-after {park_after}: the trickled request only"
        );
    }
}
