//! Test support: a real `baton agent` process on 127.0.0.1, a small PKI written to a temporary
//! directory, and blocking TLS/HTTP clients (rustls, `openssl s_client`, `curl`).
#![allow(dead_code)]

pub mod recorder;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

pub const BATON: &str = env!("CARGO_BIN_EXE_baton");

/// A running `baton agent`, killed on drop.
pub struct Agent {
    pub child: Child,
    pub addr: SocketAddr,
    pub metrics: SocketAddr,
    /// The agent link's address (`--link-listen`), if it has one.
    pub link: Option<SocketAddr>,
}

impl Agent {
    /// Starts `baton agent --listen 127.0.0.1:0 --metrics 127.0.0.1:0 ARGS` and waits for
    /// `ready`.
    pub fn start(args: &[&str]) -> Agent {
        let (child, addrs) = spawn_ready(
            "agent",
            &["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"],
            args,
        );
        Agent {
            child,
            addr: addrs["tls"],
            metrics: addrs["metrics"],
            link: addrs.get("link").copied(),
        }
    }

    /// [`Agent::start`] serving `pki`'s ECDSA and RSA certificates, with `extra` flags.
    pub fn serving(pki: &Pki, extra: &[&str]) -> Agent {
        let mut args = pki.server_args();
        args.extend(extra.iter().map(|s| s.to_string()));
        Agent::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn connect(&self) -> String {
        format!("127.0.0.1:{}", self.port())
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port())
    }

    /// The metrics page.
    pub fn metrics_text(&self) -> String {
        let (status, body) = plain_get(self.metrics, "/metrics");
        assert_eq!(status, 200);
        body
    }

    /// The value of one metric line, `name{labels}` exactly as rendered.
    pub fn metric(&self, series: &str) -> f64 {
        let text = self.metrics_text();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no metric {series} in\n{text}"))
    }

    pub fn handshakes(&self, version: &str, kind: &str) -> u64 {
        self.metric(&format!(
            "baton_handshakes_total{{version=\"{version}\",kind=\"{kind}\"}}"
        )) as u64
    }

    pub fn failures(&self, reason: &str) -> u64 {
        self.metric(&format!(
            "baton_handshake_failures_total{{reason=\"{reason}\"}}"
        )) as u64
    }

    /// Responses the agent has sent so far (all status classes).
    pub fn served(&self) -> u64 {
        self.metrics_text()
            .lines()
            .filter(|l| l.starts_with("baton_http_requests_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig}");
    }

    /// Waits for the process to exit (after SIGTERM), at most `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    pub fn rss_bytes(&self) -> u64 {
        let statm = std::fs::read_to_string(format!("/proc/{}/statm", self.child.id())).unwrap();
        let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * 4096
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `baton SUBCOMMAND FIXED ARGS`, waits for `ready` on stdout and returns the
/// addresses announced as `listening KIND ADDR`.
pub fn spawn_ready(
    subcommand: &str,
    fixed: &[&str],
    args: &[&str],
) -> (Child, std::collections::HashMap<String, SocketAddr>) {
    spawn_ready_with(BATON, subcommand, fixed, args)
}

/// [`spawn_ready`] with another `baton` binary (the release build, for balance bounds).
pub fn spawn_ready_with(
    bin: &str,
    subcommand: &str,
    fixed: &[&str],
    args: &[&str],
) -> (Child, std::collections::HashMap<String, SocketAddr>) {
    let mut child = Command::new(bin)
        .arg(subcommand)
        .args(fixed)
        .args(args)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn baton {subcommand}: {e}"));
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut addrs = std::collections::HashMap::new();
    loop {
        let Some(Ok(line)) = lines.next() else {
            panic!("baton {subcommand} exited before ready: {:?}", child.wait());
        };
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["listening", kind, a] => {
                addrs.insert(kind.to_string(), a.parse().unwrap());
            }
            ["ready"] => break,
            _ => {}
        }
    }
    // Keep draining stdout so the process never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, addrs)
}

/// Something clients connect to with TLS: an agent, or a dispatcher in front of agents.
pub trait Endpoint {
    fn tls_addr(&self) -> SocketAddr;
}

impl Endpoint for Agent {
    fn tls_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Endpoint for Dispatcher {
    fn tls_addr(&self) -> SocketAddr {
        self.addr
    }
}

/// A running `baton dispatch`, killed on drop.
pub struct Dispatcher {
    pub child: Child,
    pub addr: SocketAddr,
    pub metrics: SocketAddr,
}

impl Dispatcher {
    /// `baton dispatch --listen 127.0.0.1:0 --metrics 127.0.0.1:0 --agent ... ARGS`.
    pub fn start(agents: &[&Agent], args: &[&str]) -> Dispatcher {
        // Agents with a link are reached over it (the caller gives --cluster-key-file).
        let mut all: Vec<String> = agents
            .iter()
            .flat_map(|a| {
                let link = a.link.map(|l| ["--agent-link".to_string(), l.to_string()]);
                ["--agent".to_string(), a.addr.to_string()]
                    .into_iter()
                    .chain(link.into_iter().flatten())
            })
            .collect();
        all.extend(args.iter().map(|s| s.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let (child, addrs) = spawn_ready(
            "dispatch",
            &["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"],
            &all,
        );
        Dispatcher {
            child,
            addr: addrs["dispatch"],
            metrics: addrs["metrics"],
        }
    }

    pub fn metric(&self, series: &str) -> f64 {
        let (_, text) = plain_get(self.metrics, "/metrics");
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no metric {series} in\n{text}"))
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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

/// A throwaway directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("baton-test-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub fn arg(&self, name: &str) -> String {
        self.path(name).to_str().unwrap().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits up to 5 s for something to accept on 127.0.0.1:`port` (a server just spawned);
/// whether it did.
pub fn wait_for_port(port: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A plain HTTP/1.1 keep-alive backend serving `dir` (`python3 -m http.server`), killed on drop.
pub struct StaticServer {
    child: Child,
    pub port: u16,
}

impl StaticServer {
    pub fn start(dir: &Path) -> StaticServer {
        let port = free_port();
        let child = Command::new("python3")
            .args(["-m", "http.server", "--protocol", "HTTP/1.1"])
            .args(["--bind", "127.0.0.1", &port.to_string()])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 (scripts/test installs it)");
        wait_for_port(port);
        StaticServer { child, port }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for StaticServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A CA, an ECDSA and an RSA server certificate for `localhost`/127.0.0.1 signed by it, a
/// client CA and a client certificate, as PEM files:
/// `ca.pem`, `ecdsa.pem`/`ecdsa.key`, `rsa.pem`/`rsa.key`, `client-ca.pem`,
/// `client.pem`/`client.key`, `other-client.pem`/`other-client.key` (signed by an unrelated CA),
/// `other.pem`/`other.key` (ECDSA, for `other.test` and `*.wild.test`).
pub struct Pki {
    pub dir: TempDir,
}

impl Pki {
    pub fn new() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let dir = TempDir::new("pki");
        let write = |name: &str, text: &str| std::fs::write(dir.path(name), text).unwrap();

        let ca = |cn: &str| {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.distinguished_name.push(DnType::CommonName, cn);
            let cert = p.self_signed(&key).unwrap();
            (cert, rcgen::Issuer::new(p, key))
        };
        let (ca_cert, issuer) = ca("Baton Test CA");
        write("ca.pem", &ca_cert.pem());
        let leaf =
            |names: Vec<String>, key: &KeyPair, issuer: &rcgen::Issuer<'_, KeyPair>, cn: &str| {
                let mut p = CertificateParams::new(names).unwrap();
                p.distinguished_name.push(DnType::CommonName, cn);
                p.distinguished_name
                    .push(DnType::OrganizationName, "Baton Tests");
                p.signed_by(key, issuer).unwrap()
            };
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let ecdsa_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        write(
            "ecdsa.pem",
            &leaf(names.clone(), &ecdsa_key, &issuer, "localhost").pem(),
        );
        write("ecdsa.key", &ecdsa_key.serialize_pem());
        let rsa_key =
            KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048).unwrap();
        write(
            "rsa.pem",
            &leaf(names.clone(), &rsa_key, &issuer, "localhost").pem(),
        );
        write("rsa.key", &rsa_key.serialize_pem());

        // a second site, for SNI
        let other_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        write(
            "other.pem",
            &leaf(
                vec!["other.test".into(), "*.wild.test".into()],
                &other_key,
                &issuer,
                "other.test",
            )
            .pem(),
        );
        write("other.key", &other_key.serialize_pem());

        let (cca_cert, client_issuer) = ca("Baton Client CA");
        write("client-ca.pem", &cca_cert.pem());
        let client_key = KeyPair::generate().unwrap();
        write(
            "client.pem",
            &leaf(vec![], &client_key, &client_issuer, "client-one").pem(),
        );
        write("client.key", &client_key.serialize_pem());

        let (_, other_issuer) = ca("Unrelated CA");
        let other_key = KeyPair::generate().unwrap();
        write(
            "other-client.pem",
            &leaf(vec![], &other_key, &other_issuer, "intruder").pem(),
        );
        write("other-client.key", &other_key.serialize_pem());
        Pki { dir }
    }

    pub fn arg(&self, name: &str) -> String {
        self.dir.arg(name)
    }

    pub fn certs(&self, name: &str) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_file_iter(self.dir.path(name))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    pub fn key(&self, name: &str) -> PrivateKeyDer<'static> {
        PrivateKeyDer::from_pem_file(self.dir.path(name)).unwrap()
    }

    /// The `--cert/--key` flags for the ECDSA and RSA server certificates.
    pub fn server_args(&self) -> Vec<String> {
        ["ecdsa", "rsa"]
            .iter()
            .flat_map(|k| {
                [
                    "--cert".to_string(),
                    self.arg(&format!("{k}.pem")),
                    "--key".to_string(),
                    self.arg(&format!("{k}.key")),
                ]
            })
            .collect()
    }

    /// A rustls client config trusting the test CA, for the given versions, with an optional
    /// client certificate (`client` / `other-client`).
    pub fn client(
        &self,
        versions: &[&'static rustls::SupportedProtocolVersion],
        client_cert: Option<&str>,
    ) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        for c in self.certs("ca.pem") {
            roots.add(c).unwrap();
        }
        let b = rustls::ClientConfig::builder_with_protocol_versions(versions)
            .with_root_certificates(roots);
        match client_cert {
            Some(name) => b
                .with_client_auth_cert(
                    self.certs(&format!("{name}.pem")),
                    self.key(&format!("{name}.key")),
                )
                .unwrap(),
            None => b.with_no_client_auth(),
        }
    }
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

pub fn text_of(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args(["-sS", "--max-time", "20"])
        .args(args)
        .output()
        .expect("curl")
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
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

struct Addr(SocketAddr);

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

/// A free TCP port on 127.0.0.1 (for addresses that must be known before a process starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A new key file (`baton ticket-key`) in `dir`; its path.
pub fn key_file(dir: &TempDir, name: &str) -> String {
    let path = dir.arg(name);
    assert!(Command::new(BATON)
        .args(["ticket-key", "--out", &path])
        .status()
        .unwrap()
        .success());
    path
}

/// `--store peers` flags for agent `i` of agents replicating on `ports`.
pub fn peer_args(ports: &[u16], i: usize) -> Vec<String> {
    let mut a = vec![
        "--store".to_string(),
        "peers".into(),
        "--peer-listen".into(),
        format!("127.0.0.1:{}", ports[i]),
    ];
    for (j, p) in ports.iter().enumerate() {
        if j != i {
            a.extend(["--peer".to_string(), format!("127.0.0.1:{p}")]);
        }
    }
    a
}

/// A real `redis-server` on a free port, killed on drop. `None` (the test skips) when it is
/// not installed, unless `BATON_REQUIRE_SERVERS` is set (`scripts/test` sets it).
pub struct Redis {
    child: Option<Child>,
    pub port: u16,
}

impl Redis {
    pub fn start() -> Option<Redis> {
        let port = free_port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn();
        let Ok(child) = child else {
            assert!(
                std::env::var_os("BATON_REQUIRE_SERVERS").is_none(),
                "redis-server required"
            );
            eprintln!("redis-server not installed: skipping");
            return None;
        };
        let r = Redis {
            child: Some(child),
            port,
        };
        assert!(wait_for_port(port), "redis-server did not start");
        Some(r)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Stops the server now (an outage).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `baton up` with a state file; SIGTERM on drop stops it and its children.
pub struct Up {
    child: Child,
    pub state: serde_json::Value,
    _dir: TempDir,
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

impl Up {
    pub fn start(args: &[&str]) -> Up {
        Self::start_with(BATON, args)
    }

    /// `baton up` from binary `bin` (its agents and dispatcher are the same binary).
    pub fn start_with(bin: &str, args: &[&str]) -> Up {
        let dir = TempDir::new("up");
        let state = dir.path("state.json");
        let (child, _) = spawn_ready_with(
            bin,
            "up",
            &[
                "--listen",
                "127.0.0.1:0",
                "--state",
                state.to_str().unwrap(),
                "--dir",
                &dir.arg("cluster"),
            ],
            args,
        );
        let state = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
        Up {
            child,
            state,
            _dir: dir,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.state["dispatcher"].as_str().unwrap().parse().unwrap()
    }

    pub fn ca(&self) -> &str {
        self.state["ca"].as_str().unwrap()
    }

    pub fn agent_pid(&self, i: usize) -> u64 {
        self.state["agents"][i]["pid"].as_u64().unwrap()
    }

    /// A rustls client config trusting the cluster's CA.
    pub fn client(&self, v: &'static rustls::SupportedProtocolVersion) -> rustls::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(self.ca()).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        rustls::ClientConfig::builder_with_protocol_versions(&[v])
            .with_root_certificates(roots)
            .with_no_client_auth()
    }

    /// Sum of agent `i`'s metric lines starting with `prefix` and containing `filter`.
    pub fn agent_sum(&self, i: usize, prefix: &str, filter: &str) -> f64 {
        let a = &self.state["agents"][i];
        let (_, text) = plain_get(a["metrics"].as_str().unwrap().parse().unwrap(), "/metrics");
        text.lines()
            .filter(|l| l.starts_with(prefix) && l.contains(filter))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Sum over the agents of the metric lines starting with `prefix` and containing `filter`.
    pub fn agents_sum(&self, prefix: &str, filter: &str) -> f64 {
        self.state["agents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let (_, text) =
                    plain_get(a["metrics"].as_str().unwrap().parse().unwrap(), "/metrics");
                text.lines()
                    .filter(|l| l.starts_with(prefix) && l.contains(filter))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum::<f64>()
            })
            .sum()
    }
}

/// Headless Chromium (Debian package `chromium`), when installed. `None` (the test skips) when
/// it is not, unless `BATON_REQUIRE_SERVERS` is set.
pub fn chromium() -> Option<&'static str> {
    let found = ["chromium", "chromium-browser"].into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("BATON_REQUIRE_SERVERS").is_none(),
            "chromium required"
        );
        eprintln!("chromium not installed: skipping");
    }
    found
}

/// Renders a local HTML file with headless Chromium into a PNG screenshot (nothing but the
/// file is loaded: no network, a throwaway profile).
pub fn screenshot(chromium: &str, html: &Path, png: &Path, width: u32, height: u32) {
    let profile = TempDir::new("chromium");
    let out = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            &format!("--user-data-dir={}", profile.0.display()),
            &format!("--screenshot={}", png.display()),
            &format!("--window-size={width},{height}"),
            &format!("file://{}", html.display()),
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run chromium");
    assert!(
        png.exists(),
        "no screenshot: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Decodes a PNG (8-bit RGB/RGBA, not interlaced: what Chromium writes) with python3's zlib
/// and returns (width, height, distinct pixel colours).
pub fn png_colours(png: &Path) -> (u64, u64, u64) {
    const DECODE: &str = r#"
import struct, sys, zlib
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n', 'not a PNG'
pos, idat, ihdr = 8, b'', None
while pos < len(data):
    n, kind = struct.unpack('>I4s', data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    pos += 12 + n
    if kind == b'IHDR': ihdr = struct.unpack('>IIBBBBB', body)
    elif kind == b'IDAT': idat += body
w, h, depth, ctype, _, _, interlace = ihdr
assert depth == 8 and ctype in (2, 6) and interlace == 0, ihdr
bpp = 3 if ctype == 2 else 4
raw, stride = zlib.decompress(idat), w * bpp
prev, colours, i = bytearray(stride), set(), 0
for y in range(h):
    f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride]); i += 1 + stride
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b = prev[x]
        c = prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    colours.update(bytes(line[j:j + bpp]) for j in range(0, stride, bpp))
    prev = line
print(w, h, len(colours))
"#;
    let out = Command::new("python3")
        .args(["-c", DECODE])
        .arg(png)
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", text_of(&out));
    let v: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    (v[0], v[1], v[2])
}

/// A CPU cap on a process (cgroup v1 `cpu` controller, as root): `percent` of one core.
/// `None` where cgroups cannot be written (the test then runs uncapped).
pub struct CpuCap(PathBuf);

impl CpuCap {
    pub fn apply(pid: u32, percent: u32) -> Option<CpuCap> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = PathBuf::from(format!(
            "/sys/fs/cgroup/cpu/baton-test-{}-{n}",
            std::process::id()
        ));
        std::fs::create_dir(&dir).ok()?;
        let cap = CpuCap(dir);
        let write = |f: &str, v: String| std::fs::write(cap.0.join(f), v).ok();
        write("cpu.cfs_period_us", "100000".into())?;
        write("cpu.cfs_quota_us", (percent * 1000).to_string())?;
        write("cgroup.procs", pid.to_string())?;
        Some(cap)
    }
}

impl Drop for CpuCap {
    fn drop(&mut self) {
        // a group goes only once empty: whatever still runs in it moves back to the root
        if let Ok(procs) = std::fs::read_to_string(self.0.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write("/sys/fs/cgroup/cpu/cgroup.procs", pid);
            }
        }
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The count at a dotted path of a JSON report (`"requests.ok"`).
pub fn n(v: &serde_json::Value, path: &str) -> u64 {
    path.split('.')
        .fold(v, |v, k| &v[k])
        .as_u64()
        .unwrap_or_else(|| panic!("{path} missing in {v}"))
}
