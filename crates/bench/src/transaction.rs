//! One transaction (the 2048-bit migration report's SSL TPS): TCP connect, TLS handshake, K HTTP requests and
//! responses, TLS close_notify, TCP close, each phase timed and under a timeout.
//!
//! Cheap on purpose, so the client is not what a run measures: the `ClientConfig` is built once
//! per virtual client, the read buffer is the client's own and reused, HTTP/1.1 is written and
//! framed by hand (no per-request allocation), the first request rides in the same TCP segment
//! as the client's Finished, and the close is close_notify then `close` (no `shutdown`).

use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use rustls::HandshakeKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{timeout, Instant};
use tokio_rustls::TlsConnector;

use crate::accounting::{classify, End, ErrorClass, Negotiated};
use crate::config::BenchConfig;
use crate::engine::{ClientTls, TlsIo};
use crate::http1::{parse_head, Chunked, Framing};
use crate::live::{Live, Tally};
use crate::scenario::Step;
use crate::stats::Stats;

/// Bytes read from the TLS stream at a time; also the longest response head accepted (a
/// longer one is an `http` error).
pub const READ_BUF: usize = 16 * 1024;

/// What a virtual client needs for each of its transactions.
pub struct Client {
    pub cfg: Arc<BenchConfig>,
    /// The engine's TLS state for this client (config and sessions).
    pub tls: ClientTls,
    pub addr: SocketAddr,
    pub source: Option<IpAddr>,
    /// The request bytes (HTTP/1.1), built once.
    pub request: Bytes,
    /// Read buffer, reused by every transaction of this client.
    pub buf: Box<[u8]>,
    /// When the run started (the timeline counts from here).
    pub start: Instant,
    /// `--scenario`: this transaction's requests (else `request`, `requests_per_conn` times).
    pub script: Option<Arc<[Step]>>,
    /// Think time slept in this transaction (not latency).
    pub thought: Duration,
    /// `--metrics`: the live counters.
    pub live: Option<Arc<Live>>,
}

impl Client {
    /// Runs one transaction and records it. `due` is when it should have started: its total
    /// latency is measured from there (in open loop, later than now if the client fell behind).
    pub async fn transaction(&mut self, due: Instant, stats: &RefCell<Stats>) {
        let mut end = End::default();
        self.thought = Duration::ZERO;
        let result = self.run(stats, &mut end).await;
        let now = Instant::now();
        let mut stats = stats.borrow_mut();
        stats.ended(now - self.start, result.is_ok());
        if let Err(f) = result {
            end.error = Some(f.class);
            stats.example(f.class, f.detail);
        } else {
            stats.latency(3, (now - due).saturating_sub(self.thought));
        }
        let settled = stats.finish(&end, self.requests());
        if let Some(live) = &self.live {
            if end.handshake_started {
                live.closed();
            }
            live.add(&Tally::of(&end, &settled), end.error);
        }
    }

    /// Requests in this transaction.
    fn requests(&self) -> u32 {
        self.script
            .as_ref()
            .map_or(self.cfg.requests_per_conn, |s| s.len() as u32)
    }

    /// The first request's bytes, written with the handshake.
    fn first_request(&self) -> &[u8] {
        match &self.script {
            Some(s) => &s[0].wire,
            None => &self.request,
        }
    }

    async fn run(&mut self, stats: &RefCell<Stats>, end: &mut End) -> Result<(), Failure> {
        let t = self.cfg.timeout();
        // phases are each their own service time; only `total` counts from `due`, so that in
        // open loop the time spent waiting behind a slow server shows there (as in wrk2)
        let started = Instant::now();
        end.began = Some(started.into_std());
        let tcp = match timeout(t, self.connect()).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(Failure::new(ErrorClass::Connect, &e)),
            Err(_) => return Err(Failure::new(ErrorClass::Timeout, &"TCP connect")),
        };
        let connected = Instant::now();
        if let Some(live) = &self.live {
            live.connected();
        }
        stats.borrow_mut().latency(0, connected - started);
        end.handshake_started = true;
        match &self.tls {
            ClientTls::Rustls {
                config,
                sessions,
                server_name,
            } => {
                let offered = sessions.has_session();
                end.tickets_before = Some(sessions.tickets_received());
                // HTTP/1.1: the first request is handed to rustls before the handshake; rustls
                // sends it the moment the handshake completes, with the client's Finished (TLS
                // 1.3, and TLS 1.2 resumption), so the server gets both in one segment, as from
                // a browser. rustls buffers at most its plaintext limit (64 KiB by default)
                // before the handshake: `pre` is how much it took, the rest follows once the
                // handshake is done.
                // With --early-data and a ticket that allows it, the request goes as early
                // data instead, in the ClientHello's flight (0-RTT); `early` is how much of it.
                let mut pre = 0;
                let mut early = 0;
                let connector = TlsConnector::from(config.clone());
                let connect = connector.connect_with(server_name.clone(), tcp, |conn| {
                    if self.cfg.alpn == "h2" {
                        return;
                    }
                    let request = self.first_request();
                    if self.cfg.early_data && conn.early_data().is_some() {
                        early = conn.early_data().map_or(0, |mut e| {
                            std::io::Write::write(&mut e, request).unwrap_or(0)
                        });
                    } else {
                        pre = std::io::Write::write(&mut conn.writer(), request).unwrap_or(0);
                    }
                });
                let tls = match timeout(t, connect).await {
                    Ok(Ok(s)) => s,
                    // whatever broke the handshake (an alert, a reset, the server hanging up),
                    // the handshake failed: `tls`, unless it was too slow
                    Ok(Err(e)) if class_of(&e) == ErrorClass::Timeout => {
                        return Err(Failure::new(ErrorClass::Timeout, &e))
                    }
                    Ok(Err(e)) => return Err(Failure::new(ErrorClass::Tls, &e)),
                    Err(_) => return Err(Failure::new(ErrorClass::Timeout, &"TLS handshake")),
                };
                let handshaken = Instant::now();
                stats.borrow_mut().latency(1, handshaken - connected);
                let conn = tls.get_ref().1;
                if let Some(kind) = conn.handshake_kind() {
                    end.handshake = Some(classify(offered, kind));
                }
                end.negotiated = Negotiated::of(conn);
                if early > 0 {
                    // refused: rustls dropped it, the request goes again after the handshake
                    let accepted = conn.is_early_data_accepted();
                    end.early = Some(accepted);
                    pre = if accepted { early } else { 0 };
                }
                let h2 = conn.alpn_protocol() == Some(b"h2");
                // (`pre` is 0 when h2 was asked for and the server chose HTTP/1.1)
                self.http(tls, h2, stats, handshaken, end, pre).await
            }
            ClientTls::Openssl(client) => {
                let tls = match timeout(t, client.connect(tcp)).await {
                    Ok(Ok((s, offered))) => {
                        let kind = if s.ssl().session_reused() {
                            HandshakeKind::Resumed
                        } else {
                            HandshakeKind::Full
                        };
                        end.handshake = Some(classify(offered, kind));
                        s
                    }
                    Ok(Err(e)) if class_of(&e) == ErrorClass::Timeout => {
                        return Err(Failure::new(ErrorClass::Timeout, &e))
                    }
                    Ok(Err(e)) => return Err(Failure::new(ErrorClass::Tls, &e)),
                    Err(_) => return Err(Failure::new(ErrorClass::Timeout, &"TLS handshake")),
                };
                let handshaken = Instant::now();
                stats.borrow_mut().latency(1, handshaken - connected);
                end.negotiated = crate::openssl_engine::negotiated(tls.ssl());
                let h2 = tls.ssl().selected_alpn_protocol() == Some(b"h2");
                self.http(tls, h2, stats, handshaken, end, 0).await
            }
        }
    }

    /// HTTP over the handshaken stream, whichever engine made it.
    async fn http<S: TlsIo>(
        &mut self,
        mut tls: S,
        h2: bool,
        stats: &RefCell<Stats>,
        handshaken: Instant,
        end: &mut End,
        pre: usize,
    ) -> Result<(), Failure> {
        if h2 {
            // the h2 path never pre-writes (the protocol is known only now)
            self.http2(tls, stats, handshaken, end).await
        } else {
            self.http1(&mut tls, stats, handshaken, end, pre).await
        }
    }

    async fn connect(&self) -> std::io::Result<TcpStream> {
        let socket = match self.addr {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        if let Some(ip) = self.source {
            bind_address_no_port(&socket);
            socket.bind(SocketAddr::new(ip, 0))?;
        }
        let s = socket.connect(self.addr).await?;
        s.set_nodelay(true)?;
        Ok(s)
    }

    async fn http1<S: TlsIo>(
        &mut self,
        tls: &mut S,
        stats: &RefCell<Stats>,
        started: Instant,
        end: &mut End,
        pre: usize,
    ) -> Result<(), Failure> {
        let t = self.cfg.timeout();
        let k = self.requests();
        let script = self.script.clone();
        let buf = &mut self.buf[..];
        let mut held = 0usize; // bytes in buf not yet consumed
        let think_time = self.cfg.think_time();
        for i in 0..k {
            let (request, head_request, think) = match &script {
                Some(s) => {
                    let step = &s[i as usize];
                    (&step.wire, step.method == "HEAD", step.think)
                }
                None => (&self.request, self.cfg.method == "HEAD", think_time),
            };
            if i > 0 && !think.is_zero() {
                let thought = idle(tls, buf, &mut held, think).await;
                self.thought += thought.slept;
                if let Some(detail) = thought.closed {
                    // an idle keep-alive connection the server closed: the client would send
                    // the rest on a new one; nothing it sent went unanswered
                    end.unsent = k - i;
                    return Err(Failure::new(
                        ErrorClass::Closed,
                        &format_args!("server closed the idle connection after {i} of {k} requests ({detail})"),
                    ));
                }
            }
            // when this request started: the first, with the transaction (connect and handshake
            // count; an open-loop schedule's lag does not: `total` has it); the next ones, now
            // (after the think)
            let begun = match (i, end.began) {
                (0, Some(d)) => Instant::from_std(d),
                _ => Instant::now(),
            };
            let unsent = if i == 0 {
                &request[pre..]
            } else {
                &request[..]
            };
            if !unsent.is_empty() {
                match timeout(t, tls.write_all(unsent)).await {
                    // the server had closed the kept-alive connection: this request never left
                    Ok(Err(e)) if i > 0 && broken(&e) => {
                        end.unsent = k - i;
                        return Err(Failure::new(
                            ErrorClass::Closed,
                            &format_args!(
                                "server closed the connection after {i} of {k} requests ({e})"
                            ),
                        ));
                    }
                    r => io(r)?,
                };
            }
            // the server closing the connection before any byte of a later request's response
            // has crossed that request (it closed while idle): `closed`, that request failed
            let closed_before_answer = |i: u32, detail: &dyn std::fmt::Display| {
                Failure {
                class: ErrorClass::Closed,
                detail: format!(
                    "server closed the connection after {i} of {k} requests, before answering the next ({detail})"
                ),
            }
            };
            let mut answered_bytes = held > 0;
            // head; interim responses (103 Early Hints, an unasked-for 100 Continue) are
            // skipped: the real one follows
            let head = loop {
                let head = loop {
                    if held > 0 {
                        if let Some(h) = parse_head(&buf[..held], head_request)
                            .map_err(|e| Failure::new(ErrorClass::Http, &e))?
                        {
                            break h;
                        }
                    }
                    if held == buf.len() {
                        return Err(Failure::new(ErrorClass::Http, &"response head too large"));
                    }
                    let n = match timeout(t, tls.read(&mut buf[held..])).await {
                        Ok(Ok(0)) if i > 0 && !answered_bytes => {
                            end.unsent = k - i - 1;
                            return Err(closed_before_answer(i, &"end of stream"));
                        }
                        Ok(Err(e)) if i > 0 && !answered_bytes && broken(&e) => {
                            end.unsent = k - i - 1;
                            return Err(closed_before_answer(i, &e));
                        }
                        r => io(r)?,
                    };
                    if n == 0 {
                        return Err(ErrorClass::Io.into());
                    }
                    answered_bytes = true;
                    if !end.first_byte {
                        end.first_byte = true;
                        stats.borrow_mut().latency(2, Instant::now() - started);
                        end.ttfb = end.began.map(|b| b.elapsed());
                    }
                    held += n;
                    stats.borrow_mut().bytes += n as u64;
                };
                buf.copy_within(head.len..held, 0);
                held -= head.len;
                if !head.interim() {
                    break head;
                }
            };
            answer(stats, end, head.status);
            // body, consumed without keeping it
            match head.framing {
                Framing::Length(mut left) => loop {
                    let take = (held as u64).min(left) as usize;
                    buf.copy_within(take..held, 0);
                    held -= take;
                    left -= take as u64;
                    if left == 0 {
                        break;
                    }
                    let n = io(timeout(t, tls.read(&mut buf[held..])).await)?;
                    if n == 0 {
                        return Err(ErrorClass::Io.into());
                    }
                    held += n;
                    stats.borrow_mut().bytes += n as u64;
                },
                Framing::Chunked => {
                    let mut chunked = Chunked::default();
                    loop {
                        let (used, done) = chunked
                            .push(&buf[..held])
                            .map_err(|e| Failure::new(ErrorClass::Http, &e))?;
                        buf.copy_within(used..held, 0);
                        held -= used;
                        if done {
                            break;
                        }
                        let n = io(timeout(t, tls.read(&mut buf[held..])).await)?;
                        if n == 0 {
                            return Err(ErrorClass::Io.into());
                        }
                        held += n;
                        stats.borrow_mut().bytes += n as u64;
                    }
                }
                Framing::Close => loop {
                    let n = match timeout(t, tls.read(buf)).await {
                        Ok(Ok(n)) => n,
                        // a server that closes without close_notify still delivered the body
                        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => 0,
                        Ok(Err(e)) => return Err(Failure::of(&e)),
                        Err(_) => return Err(Failure::new(ErrorClass::Timeout, &"response body")),
                    };
                    if n == 0 {
                        break;
                    }
                    stats.borrow_mut().bytes += n as u64;
                },
            }
            answered(
                self.live.as_deref(),
                self.start,
                stats,
                begun,
                Instant::now(),
            );
            if head.close && i + 1 < k {
                // the server ended keep-alive early: the remaining requests are not sent
                end.unsent = k - i - 1;
                return Err(Failure::new(
                    ErrorClass::Closed,
                    &format_args!("server closed after {} of {k} requests", i + 1),
                ));
            }
        }
        // A TLS 1.3 server sends its new tickets once it has the client's Finished: after a
        // 0-RTT response, which comes a round trip earlier. A client that closed at once would
        // never get them and would run out of tickets (a browser keeps the connection open
        // long enough); so wait for one, for at most the timeout (not counted in TTFB).
        if let (Some(true), Some(before), ClientTls::Rustls { sessions, .. }) =
            (end.early, end.tickets_before, &self.tls)
        {
            let give_up = Instant::now() + t;
            while sessions.tickets_received() == before && Instant::now() < give_up {
                match timeout(Duration::from_millis(2), tls.read(&mut buf[held..])).await {
                    Ok(Ok(0)) | Ok(Err(_)) => break,
                    Ok(Ok(_)) | Err(_) => {}
                }
            }
        }
        // close_notify, then `close` on drop sends the FIN; a server that already closed is fine
        let _ = timeout(t, tls.close_notify()).await;
        Ok(())
    }

    async fn http2<S: TlsIo>(
        &mut self,
        tls: S,
        stats: &RefCell<Stats>,
        started: Instant,
        end: &mut End,
    ) -> Result<(), Failure> {
        let t = self.cfg.timeout();
        let io_ = hyper_util::rt::TokioIo::new(tls);
        let (mut sender, conn) = match timeout(
            t,
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io_),
        )
        .await
        {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => return Err(Failure::of(&e)),
            Err(_) => return Err(Failure::new(ErrorClass::Timeout, &"HTTP/2 handshake")),
        };
        let driver = tokio::spawn(conn);
        let uri = |path: &str| -> Result<http::Uri, Failure> {
            format!("https://{}:{}{path}", self.cfg.host, self.cfg.port)
                .parse()
                .map_err(|e| Failure::new(ErrorClass::Http, &e))
        };
        let default_uri = uri(&self.cfg.path)?;
        let default_body = Bytes::from(self.cfg.body.clone().unwrap_or_default());
        let script = self.script.clone();
        let k = self.requests();
        if self.cfg.streams > 1 && script.is_none() {
            self.streams(&sender, stats, started, end, k, &default_uri, &default_body)
                .await?;
            drop(sender);
            let _ = timeout(t, driver).await;
            return Ok(());
        }
        for i in 0..k {
            let think = match &script {
                Some(s) => s[i as usize].think,
                None => self.cfg.think_time(),
            };
            if i > 0 && !think.is_zero() {
                tokio::time::sleep(think).await;
                self.thought += think;
                // a GOAWAY or a close while idle: the rest go on a new connection
                if sender.is_closed() || sender.ready().await.is_err() {
                    end.unsent = k - i;
                    return Err(Failure::new(
                        ErrorClass::Closed,
                        &format_args!(
                            "server closed the idle connection after {i} of {k} requests"
                        ),
                    ));
                }
            }
            let begun = match (i, end.began) {
                (0, Some(d)) => Instant::from_std(d),
                _ => Instant::now(),
            };
            let (mut req, headers, body) = match &script {
                Some(s) => {
                    let step = &s[i as usize];
                    let req = http::Request::builder()
                        .method(step.method.as_str())
                        .uri(uri(&step.path)?);
                    (req, &step.headers, step.body.clone())
                }
                None => (
                    http::Request::builder()
                        .method(self.cfg.method.as_str())
                        .uri(default_uri.clone()),
                    &self.cfg.headers,
                    default_body.clone(),
                ),
            };
            for (k, v) in headers {
                req = req.header(k, v);
            }
            let req = req
                .body(Full::new(body))
                .map_err(|e| Failure::new(ErrorClass::Http, &e))?;
            let resp = match timeout(t, sender.send_request(req)).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => return Err(Failure::of(&e)),
                Err(_) => return Err(Failure::new(ErrorClass::Timeout, &"response")),
            };
            if !end.first_byte {
                end.first_byte = true;
                stats.borrow_mut().latency(2, Instant::now() - started);
                end.ttfb = end.began.map(|b| b.elapsed());
            }
            answer(stats, end, resp.status().as_u16());
            let mut body = resp.into_body();
            loop {
                match timeout(t, body.frame()).await {
                    Ok(Some(Ok(f))) => {
                        stats.borrow_mut().bytes += f.data_ref().map_or(0, |d| d.len() as u64)
                    }
                    Ok(None) => break,
                    Ok(Some(Err(e))) => return Err(Failure::of(&e)),
                    Err(_) => return Err(Failure::new(ErrorClass::Timeout, &"response body")),
                }
            }
            answered(
                self.live.as_deref(),
                self.start,
                stats,
                begun,
                Instant::now(),
            );
        }
        // dropping the sender lets the connection task send GOAWAY and close_notify
        drop(sender);
        let _ = timeout(t, driver).await;
        Ok(())
    }
}

/// A response's status, counted in `stats` and in the transaction's `end`.
fn answer(stats: &RefCell<Stats>, end: &mut End, status: u16) {
    end.responses += 1;
    end.ok += u32::from(stats.borrow_mut().status(status));
}

/// One request answered at `done`; `begun` is when it started (the run at `start`).
fn answered(
    live: Option<&Live>,
    start: Instant,
    stats: &RefCell<Stats>,
    begun: Instant,
    done: Instant,
) {
    let latency = done - begun;
    if let Some(since) = begun.into_std().checked_duration_since(start.into_std()) {
        stats.borrow_mut().request_latency(since, latency);
    }
    if let Some(live) = live {
        live.request(latency);
    }
}

impl Client {
    /// `-m`: the connection's `k` requests, up to `--max-concurrent-streams` in flight at once
    /// (a stream that ends makes room for the next, as h2load does). The first request counts
    /// from the transaction's start, the others from when each was sent.
    #[allow(clippy::too_many_arguments)]
    async fn streams(
        &self,
        sender: &SendRequest<Full<Bytes>>,
        stats: &RefCell<Stats>,
        handshaken: Instant,
        end: &mut End,
        k: u32,
        uri: &http::Uri,
        body: &Bytes,
    ) -> Result<(), Failure> {
        let t = self.cfg.timeout();
        // dropped on an error: the streams still in flight are cancelled with it
        let mut flight = tokio::task::JoinSet::new();
        let mut sent = 0u32;
        loop {
            while sent < k && flight.len() < self.cfg.streams as usize {
                let mut req = http::Request::builder()
                    .method(self.cfg.method.as_str())
                    .uri(uri.clone());
                for (name, v) in &self.cfg.headers {
                    req = req.header(name, v);
                }
                let req = req
                    .body(Full::new(body.clone()))
                    .map_err(|e| Failure::new(ErrorClass::Http, &e))?;
                let begun = match (sent, end.began) {
                    (0, Some(d)) => Instant::from_std(d),
                    _ => Instant::now(),
                };
                let mut sender = sender.clone();
                flight.spawn(async move { stream(&mut sender, req, t).await.map(|a| (begun, a)) });
                sent += 1;
            }
            let (begun, a) = match flight.join_next().await {
                None => return Ok(()),
                Some(Ok(r)) => r?,
                Some(Err(e)) => return Err(Failure::new(ErrorClass::Io, &e)),
            };
            if !end.first_byte {
                end.first_byte = true;
                stats.borrow_mut().latency(2, a.head - handshaken);
                end.ttfb = end
                    .began
                    .map(|b| a.head.into_std().saturating_duration_since(b));
            }
            answer(stats, end, a.status);
            stats.borrow_mut().bytes += a.bytes;
            answered(self.live.as_deref(), self.start, stats, begun, a.done);
        }
    }
}

/// One HTTP/2 stream's answer.
struct Answer {
    status: u16,
    /// When its response head arrived.
    head: Instant,
    bytes: u64,
    /// When its last byte arrived.
    done: Instant,
}

/// Sends one request on its own stream and reads the whole response, each phase under `t`.
async fn stream(
    sender: &mut SendRequest<Full<Bytes>>,
    req: http::Request<Full<Bytes>>,
    t: Duration,
) -> Result<Answer, Failure> {
    let resp = match timeout(t, sender.send_request(req)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(Failure::of(&e)),
        Err(_) => return Err(Failure::new(ErrorClass::Timeout, &"response")),
    };
    let head = Instant::now();
    let status = resp.status().as_u16();
    let mut bytes = 0;
    let mut body = resp.into_body();
    loop {
        match timeout(t, body.frame()).await {
            Ok(Some(Ok(f))) => bytes += f.data_ref().map_or(0, |d| d.len() as u64),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(Failure::of(&e)),
            Err(_) => return Err(Failure::new(ErrorClass::Timeout, &"response body")),
        }
    }
    Ok(Answer {
        status,
        head,
        bytes,
        done: Instant::now(),
    })
}

/// How a think time on an idle keep-alive connection went.
struct Thought {
    /// How long the client actually waited (shorter when the server closed first).
    slept: Duration,
    /// The server closed the connection meanwhile: how.
    closed: Option<String>,
}

/// Waits `think` between two requests while watching the connection, as an HTTP/1.1 client
/// with a connection pool does: a server that closes an idle connection (an idle timeout, a
/// drain, a reload) is noticed before the next request is written, so that request is not
/// sent on a dead connection. Bytes the server sends meanwhile are kept in `buf` (they are
/// then read as the next response); TLS 1.3 tickets are consumed by the TLS library.
async fn idle<S: TlsIo>(tls: &mut S, buf: &mut [u8], held: &mut usize, think: Duration) -> Thought {
    let began = Instant::now();
    let until = began + think;
    loop {
        if *held == buf.len() {
            // nowhere to read into: the next request's response is already too large to parse
            tokio::time::sleep_until(until).await;
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(until) => break,
            // `read` is cancel-safe: nothing is lost when the sleep wins
            r = tls.read(&mut buf[*held..]) => match r {
                Ok(0) => return Thought { slept: began.elapsed(), closed: Some("close_notify or end of stream".into()) },
                Ok(n) => *held += n,
                Err(e) => return Thought { slept: began.elapsed(), closed: Some(e.to_string()) },
            },
        }
    }
    Thought {
        slept: began.elapsed(),
        closed: None,
    }
}

/// Whether an I/O error means the peer closed or reset the connection (rather than a TLS
/// error, a timeout, or a malformed response).
fn broken(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe | NotConnected
    ) && class_of(e) == ErrorClass::Io
}

/// Lets the kernel pick the source port at `connect`, per 4-tuple, rather than at `bind`
/// (where a port must be unique for the address alone): without it, many virtual clients
/// bound to the same `--source-ip` would run out of ports long before the server does.
fn bind_address_no_port(socket: &TcpSocket) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let one: libc::c_int = 1;
        // SAFETY: setsockopt reads `one` (a c_int, the size we pass) on a socket we own. A
        // failure only means the kernel keeps the default behaviour.
        #[allow(unsafe_code)]
        unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_BIND_ADDRESS_NO_PORT,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = socket;
}

/// Why a transaction failed: its class, and the first words of the cause (kept once per class
/// as an example, so a run that fails says why).
#[derive(Debug)]
pub struct Failure {
    pub class: ErrorClass,
    pub detail: String,
}

impl Failure {
    fn new(class: ErrorClass, cause: &dyn std::fmt::Display) -> Self {
        Self {
            class,
            detail: cause.to_string(),
        }
    }

    fn of(e: &(dyn std::error::Error + 'static)) -> Self {
        Self::new(class_of(e), &e)
    }
}

impl From<ErrorClass> for Failure {
    fn from(class: ErrorClass) -> Self {
        let detail = match class {
            ErrorClass::Io => "the server closed the connection mid-response",
            _ => "",
        };
        Self {
            class,
            detail: detail.into(),
        }
    }
}

fn io<T>(r: Result<std::io::Result<T>, tokio::time::error::Elapsed>) -> Result<T, Failure> {
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Failure::of(&e)),
        Err(_) => Err(Failure::new(ErrorClass::Timeout, &"read or write")),
    }
}

/// A failure's class from its cause: anything rustls raised (an alert from the server, a
/// certificate it did not accept, a bad record) is `tls`, whatever wraps it (tokio-rustls
/// wraps it in an `io::Error`, hyper in its own error); a timed-out socket is `timeout`; the
/// rest broke the connection: `io`.
pub fn class_of(e: &(dyn std::error::Error + 'static)) -> ErrorClass {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if e.is::<rustls::Error>() || e.is::<openssl::error::ErrorStack>() {
            return ErrorClass::Tls;
        }
        // OpenSSL: a protocol error or alert is `tls`, a broken socket what the socket says
        if let Some(ssl) = e.downcast_ref::<openssl::ssl::Error>() {
            return ssl.io_error().map_or(ErrorClass::Tls, |io| class_of(io));
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return ErrorClass::Timeout;
            }
            // io::Error's `source` skips the error it wraps: look at that one first
            if let Some(inner) = io.get_ref() {
                if class_of(inner) != ErrorClass::Io {
                    return class_of(inner);
                }
            }
        }
        cur = e.source();
    }
    ErrorClass::Io
}

/// The HTTP/1.1 request every transaction sends, built once.
pub fn request_bytes(cfg: &BenchConfig) -> Bytes {
    let mut r = format!(
        "{} {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: baton-bench\r\nAccept: */*\r\n",
        cfg.method, cfg.path, cfg.sni
    );
    for (k, v) in &cfg.headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(body) = &cfg.body {
        r.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    } else {
        r.push_str("\r\n");
    }
    Bytes::from(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_classified_by_cause() {
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired);
        // as tokio-rustls reports it
        let wrapped = std::io::Error::new(std::io::ErrorKind::InvalidData, alert);
        assert_eq!(class_of(&wrapped), ErrorClass::Tls);
        // wrapped once more, as a library above it might
        let twice = std::io::Error::other(wrapped);
        assert_eq!(class_of(&twice), ErrorClass::Tls);
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(class_of(&reset), ErrorClass::Io);
        let slow = std::io::Error::from(std::io::ErrorKind::TimedOut);
        assert_eq!(class_of(&slow), ErrorClass::Timeout);
    }
}
