//! One transaction (seed 003's SSL TPS): TCP connect, TLS handshake, K HTTP requests and
//! responses, TLS close_notify, TCP close, each phase timed and under a timeout.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{timeout, Instant};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::accounting::classify;
use crate::config::BenchConfig;
use crate::http1::{parse_head, Chunked, Framing};
use crate::stats::{ErrorClass, Stats};
use crate::tls::ClientSessions;

/// What a virtual client needs for each of its transactions.
pub struct Client {
    pub cfg: Arc<BenchConfig>,
    pub config: Arc<ClientConfig>,
    pub sessions: Arc<ClientSessions>,
    pub server_name: ServerName<'static>,
    pub addr: SocketAddr,
    pub source: Option<IpAddr>,
    /// The request bytes (HTTP/1.1), built once.
    pub request: Bytes,
}

impl Client {
    /// Runs one transaction and records it. `due` is when it should have started: latency is
    /// measured from there (in open loop, later than now if the client fell behind).
    pub async fn transaction(&self, due: Instant, stats: &mut Stats) {
        stats.transactions += 1;
        let t = self.cfg.timeout();
        let offered = self.sessions.has_session();
        let tcp = match timeout(t, self.connect()).await {
            Ok(Ok(s)) => s,
            Ok(Err(_)) => return self.failed(stats, ErrorClass::Connect),
            Err(_) => return self.failed(stats, ErrorClass::Timeout),
        };
        let connected = Instant::now();
        stats.latency(0, connected - due);
        let connector = TlsConnector::from(self.config.clone());
        let mut tls = match timeout(t, connector.connect(self.server_name.clone(), tcp)).await {
            Ok(Ok(s)) => s,
            Ok(Err(_)) => return self.failed(stats, ErrorClass::Tls),
            Err(_) => return self.failed(stats, ErrorClass::Timeout),
        };
        let handshaken = Instant::now();
        stats.latency(1, handshaken - connected);
        if let Some(kind) = tls.get_ref().1.handshake_kind() {
            stats.handshake(classify(offered, kind));
        }
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let result = if h2 {
            self.http2(tls, stats, handshaken).await
        } else {
            self.http1(&mut tls, stats, handshaken).await
        };
        match result {
            Ok(()) => stats.latency(3, Instant::now() - due),
            Err(class) => stats.error(class),
        }
    }

    fn failed(&self, stats: &mut Stats, class: ErrorClass) {
        stats.error(class);
        if matches!(class, ErrorClass::Tls | ErrorClass::Timeout) {
            stats.handshake_failed += 1;
        }
        stats.requests_failed += self.cfg.requests_per_conn as u64;
    }

    async fn connect(&self) -> std::io::Result<TcpStream> {
        let socket = match self.addr {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        if let Some(ip) = self.source {
            socket.bind(SocketAddr::new(ip, 0))?;
        }
        let s = socket.connect(self.addr).await?;
        s.set_nodelay(true)?;
        Ok(s)
    }

    async fn http1(
        &self,
        tls: &mut TlsStream<TcpStream>,
        stats: &mut Stats,
        started: Instant,
    ) -> Result<(), ErrorClass> {
        let t = self.cfg.timeout();
        let mut buf = vec![0u8; 16 * 1024];
        let mut held = 0usize; // bytes in buf not yet consumed
        let mut server_closes = false;
        for i in 0..self.cfg.requests_per_conn {
            io(timeout(t, tls.write_all(&self.request)).await)?;
            // head
            let head = loop {
                if held > 0 {
                    if let Some(h) = parse_head(&buf[..held], self.cfg.method == "HEAD")
                        .map_err(|_| ErrorClass::Http)?
                    {
                        break h;
                    }
                }
                if held == buf.len() {
                    return Err(ErrorClass::Http);
                }
                let n = io(timeout(t, tls.read(&mut buf[held..])).await)?;
                if n == 0 {
                    return Err(ErrorClass::Io);
                }
                if i == 0 && held == 0 {
                    stats.latency(2, Instant::now() - started);
                }
                held += n;
                stats.bytes += n as u64;
            };
            stats.status(head.status);
            server_closes |= head.close;
            buf.copy_within(head.len..held, 0);
            held -= head.len;
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
                        return Err(ErrorClass::Io);
                    }
                    held += n;
                    stats.bytes += n as u64;
                },
                Framing::Chunked => {
                    let mut chunked = Chunked::default();
                    loop {
                        let (used, done) =
                            chunked.push(&buf[..held]).map_err(|_| ErrorClass::Http)?;
                        buf.copy_within(used..held, 0);
                        held -= used;
                        if done {
                            break;
                        }
                        let n = io(timeout(t, tls.read(&mut buf[held..])).await)?;
                        if n == 0 {
                            return Err(ErrorClass::Io);
                        }
                        held += n;
                        stats.bytes += n as u64;
                    }
                }
                Framing::Close => loop {
                    let n = match timeout(t, tls.read(&mut buf)).await {
                        Ok(Ok(n)) => n,
                        // a server that closes without close_notify still delivered the body
                        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => 0,
                        Ok(Err(_)) => return Err(ErrorClass::Io),
                        Err(_) => return Err(ErrorClass::Timeout),
                    };
                    if n == 0 {
                        break;
                    }
                    stats.bytes += n as u64;
                },
            }
            if server_closes && i + 1 < self.cfg.requests_per_conn {
                // the server ended keep-alive early: the remaining requests were not served
                stats.requests_failed += (self.cfg.requests_per_conn - i - 1) as u64;
                break;
            }
        }
        // close_notify, then TCP FIN; a server that already closed is fine
        let _ = timeout(t, tls.shutdown()).await;
        Ok(())
    }

    async fn http2(
        &self,
        tls: TlsStream<TcpStream>,
        stats: &mut Stats,
        started: Instant,
    ) -> Result<(), ErrorClass> {
        let t = self.cfg.timeout();
        let io_ = hyper_util::rt::TokioIo::new(tls);
        let (mut sender, conn) = io(timeout(
            t,
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io_),
        )
        .await
        .map(|r| r.map_err(|_| std::io::Error::other("h2 handshake"))))?;
        let driver = tokio::spawn(conn);
        let uri: http::Uri = format!(
            "https://{}:{}{}",
            self.cfg.host, self.cfg.port, self.cfg.path
        )
        .parse()
        .map_err(|_| ErrorClass::Http)?;
        for i in 0..self.cfg.requests_per_conn {
            let mut req = http::Request::builder()
                .method(self.cfg.method.as_str())
                .uri(uri.clone());
            for (k, v) in &self.cfg.headers {
                req = req.header(k, v);
            }
            let body = Full::new(Bytes::from(self.cfg.body.clone().unwrap_or_default()));
            let req = req.body(body).map_err(|_| ErrorClass::Http)?;
            let resp = match timeout(t, sender.send_request(req)).await {
                Ok(Ok(r)) => r,
                Ok(Err(_)) => return Err(ErrorClass::Io),
                Err(_) => return Err(ErrorClass::Timeout),
            };
            if i == 0 {
                stats.latency(2, Instant::now() - started);
            }
            stats.status(resp.status().as_u16());
            let mut body = resp.into_body();
            loop {
                match timeout(t, body.frame()).await {
                    Ok(Some(Ok(f))) => stats.bytes += f.data_ref().map_or(0, |d| d.len() as u64),
                    Ok(None) => break,
                    Ok(Some(Err(_))) => return Err(ErrorClass::Io),
                    Err(_) => return Err(ErrorClass::Timeout),
                }
            }
        }
        drop(sender);
        let _ = timeout(t, driver).await;
        Ok(())
    }
}

fn io<T>(r: Result<std::io::Result<T>, tokio::time::error::Elapsed>) -> Result<T, ErrorClass> {
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(_)) => Err(ErrorClass::Io),
        Err(_) => Err(ErrorClass::Timeout),
    }
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
