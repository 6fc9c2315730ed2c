//! Clients of the servers under test: plain HTTP/1.0 GETs, one-request HTTPS connections with
//! rustls, `openssl s_client`, `curl`, and the browser-like virtual clients.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName};

/// Something clients connect to with TLS: an agent, or a dispatcher in front of agents.
pub trait Endpoint {
    fn tls_addr(&self) -> SocketAddr;
}

/// Plain HTTP/1.0 GET (for the metrics endpoint and test backends).
pub fn plain_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let (status, body) = parse_response(&raw);
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Status code and body of a complete HTTP/1.x response (Content-Length or close-delimited).
pub fn parse_response(raw: &[u8]) -> (u16, Vec<u8>) {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]);
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = raw[split + 4..].to_vec();
    if let Some(len) = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())?
    }) {
        assert_eq!(body.len(), len, "body length vs Content-Length");
    }
    (status, body)
}

/// The outcome of one HTTPS request made with rustls.
pub struct Fetched {
    pub status: u16,
    pub body: Vec<u8>,
    pub version: rustls::ProtocolVersion,
    pub kind: rustls::HandshakeKind,
    pub peer_cert: CertificateDer<'static>,
}

impl Fetched {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One connection, one `GET path` with `Connection: close`, read to the end.
pub fn fetch(
    agent: &impl Endpoint,
    config: &Arc<rustls::ClientConfig>,
    path: &str,
) -> Result<Fetched, String> {
    fetch_sni(agent, config, "localhost", path)
}

/// As [`fetch`], for server name `sni`.
pub fn fetch_sni(
    agent: &impl Endpoint,
    config: &Arc<rustls::ClientConfig>,
    sni: &str,
    path: &str,
) -> Result<Fetched, String> {
    let tcp = TcpStream::connect(agent.tls_addr()).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let name = ServerName::try_from(sni.to_string()).unwrap();
    let conn = rustls::ClientConnection::new(config.clone(), name).map_err(|e| e.to_string())?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    match tls.read_to_end(&mut raw) {
        Ok(_) => {}
        // Servers may close without close_notify after Connection: close; the length check in
        // parse_response still proves the body complete.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(e.to_string()),
    }
    let (status, body) = parse_response(&raw);
    Ok(Fetched {
        status,
        body,
        version: tls.conn.protocol_version().unwrap(),
        kind: tls.conn.handshake_kind().unwrap(),
        peer_cert: tls.conn.peer_certificates().unwrap()[0].clone(),
    })
}

/// Runs `openssl s_client -connect ADDR ARGS`, with stdin held open for `hold` so TLS 1.3
/// tickets arrive, and returns its output.
pub fn s_client(agent: &impl Endpoint, args: &[&str], hold: Duration) -> Output {
    let mut child = Command::new("openssl")
        .arg("s_client")
        .args(["-connect", &agent.tls_addr().to_string()])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl s_client");
    let mut stdin = child.stdin.take().unwrap();
    std::thread::sleep(hold);
    let _ = stdin.write_all(b"");
    drop(stdin);
    child.wait_with_output().unwrap()
}

pub fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args(["-sS", "--max-time", "20"])
        .args(args)
        .output()
        .expect("curl")
}

/// Handshake counts as a client saw them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Mix {
    pub full: u64,
    pub resumed: u64,
    pub failed: u64,
}

/// `clients` threads, each making `per_client` one-request connections to `addr`, every
/// `full_every`-th of them with a fresh session (full handshake) and the others resuming the
/// client's last session — the SSL benchmark tool paper's 1 full : K-1 resumed browser pattern.
pub fn virtual_clients(
    addr: SocketAddr,
    config: &rustls::ClientConfig,
    clients: usize,
    per_client: usize,
    full_every: usize,
) -> Mix {
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let base = config.clone();
            std::thread::spawn(move || {
                let mut mix = Mix::default();
                let mut config = Arc::new(base.clone());
                for i in 0..per_client {
                    if i % full_every == 0 {
                        // a fresh session store: this connection cannot resume
                        let mut c = base.clone();
                        c.resumption = rustls::client::Resumption::in_memory_sessions(4);
                        config = Arc::new(c);
                    }
                    match fetch_addr(addr, &config, "/") {
                        Ok(f) if f.status == 200 => match f.kind {
                            rustls::HandshakeKind::Resumed => mix.resumed += 1,
                            _ => mix.full += 1,
                        },
                        _ => mix.failed += 1,
                    }
                }
                mix
            })
        })
        .collect();
    handles.into_iter().fold(Mix::default(), |acc, h| {
        let m = h.join().unwrap();
        Mix {
            full: acc.full + m.full,
            resumed: acc.resumed + m.resumed,
            failed: acc.failed + m.failed,
        }
    })
}

pub struct Addr(pub SocketAddr);

impl Endpoint for Addr {
    fn tls_addr(&self) -> SocketAddr {
        self.0
    }
}

/// [`fetch`] to a bare address.
pub fn fetch_addr(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    path: &str,
) -> Result<Fetched, String> {
    fetch(&Addr(addr), config, path)
}

/// One HTTP/1.1 response with a Content-Length off a kept-alive stream: its head and body as
/// text, reading exactly that much (the next response stays in the stream).
pub fn read_http_response(s: &mut impl Read) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "connection closed early");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap();
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    head + &String::from_utf8_lossy(&body)
}

/// One request to an admin endpoint (plain HTTP) with curl: (status, body).
pub fn admin_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, String) {
    let url = format!("http://{addr}{path}");
    let auth = format!("authorization: Bearer {ADMIN_TOKEN}");
    let mut args = vec![
        "-s",
        "-m",
        "5",
        "-X",
        method,
        "-w",
        "\n%{http_code}",
        "-H",
        &auth,
    ];
    if let Some(b) = body {
        args.extend(["-H", "content-type: application/json", "--data", b]);
    }
    args.push(&url);
    let out = Command::new("curl").args(&args).output().expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// A keep-alive client on one TLS connection (through a dispatcher, or to an agent).
pub struct KeepAlive {
    pub tls: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
}

impl KeepAlive {
    pub fn open(to: SocketAddr, config: &Arc<rustls::ClientConfig>) -> KeepAlive {
        let tcp = TcpStream::connect(to).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let conn =
            rustls::ClientConnection::new(config.clone(), "localhost".try_into().unwrap()).unwrap();
        KeepAlive {
            tls: rustls::StreamOwned::new(conn, tcp),
        }
    }

    /// One request on the connection; the response's text.
    pub fn get(&mut self, path: &str) -> String {
        write!(self.tls, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
        self.tls.flush().unwrap();
        read_http_response(&mut self.tls)
    }

    /// The client's end of the TCP connection (the same one before and after a move).
    pub fn local(&self) -> SocketAddr {
        self.tls.sock.local_addr().unwrap()
    }
}

/// The admin token of every admin endpoint the tests start (`--admin-token-file
/// admin_token_file()`).
pub const ADMIN_TOKEN: &str = "test-admin-token-5f0c8a1e9b7d4c2a8e6f1b3d5a7c9e0f";

/// A file holding [`ADMIN_TOKEN`], readable by its owner only, made once per test process.
pub fn admin_token_file() -> &'static str {
    static FILE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("baton-test-admin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("admin-token");
        std::fs::write(&path, format!("{ADMIN_TOKEN}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path.display().to_string()
    })
}

/// [`ADMIN_TOKEN`] as the admin client of `baton-cluster` takes it.
pub fn admin_token() -> baton_ops::guard::Token {
    baton_ops::guard::Token::load(std::path::Path::new(admin_token_file())).unwrap()
}
