//! `baton record`: the intercepting proxy records what real clients (rustls, curl, headless
//! Chromium) request from a real `baton agent`, and `baton bench --scenario` replays it.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::recorder::{replay, Recorder};
use common::*;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

/// (method, path) of each request of a scenario file.
fn requests(scenario: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(scenario).unwrap();
    let v: toml::Value = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    v["request"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r.get("method")
                    .and_then(|m| m.as_str())
                    .unwrap_or("GET")
                    .to_string(),
                r["path"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// `CONNECT localhost:PORT` through the proxy by hand, then HTTP/1.1 over rustls trusting only
/// the recorder's CA: the certificate the client checks is the recorder's, minted for the
/// name it asked for.
fn tunnel_get(rec: &Recorder, port: u16, path: &str) -> String {
    let mut tcp = TcpStream::connect(rec.addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        tcp,
        "CONNECT localhost:{port} HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(tcp.read(&mut byte).unwrap(), 1, "proxy closed");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&rec.ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let conn =
        rustls::ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap())
            .unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: localhost:{port}\r\nX-Scenario: by-hand\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    match tls.read_to_end(&mut raw) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
        Err(e) => panic!("{e}"),
    }
    String::from_utf8_lossy(&raw).into_owned()
}

#[test]
fn records_rustls_and_curl_through_the_proxy_then_replays() {
    let pki = Pki::new();
    let dir = TempDir::new("record");
    let agent = Agent::serving(&pki, &[]);
    let out = dir.arg("recorded.toml");
    let ca_dir = dir.path("ca");
    let mut rec = Recorder::start(
        &ca_dir,
        &out,
        &[
            "--upstream-ca",
            &pki.arg("ca.pem"),
            "--max-body",
            "1000",
            "--host",
            &format!("localhost:{}", agent.port()),
        ],
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(ca_dir.join("ca.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(rec.ca, ca_dir.join("ca.pem"));

    // the agent answers through the tunnel; the recorder speaks h2 to it when it can
    let page = tunnel_get(&rec, agent.port(), "/tls");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("h2"), "{page}");

    std::thread::sleep(Duration::from_millis(300));
    let ca = path_str(&rec.ca).to_string();
    let proxy = rec.proxy();
    let url = |path: &str| format!("https://localhost:{}{path}", agent.port());
    let proxied = |args: &[&str]| {
        let mut all = vec!["--proxy", &proxy, "--cacert", &ca];
        all.extend_from_slice(args);
        curl(&all)
    };
    let o = proxied(&[
        "--http2",
        "-d",
        "sku=42",
        "-H",
        "Content-Type: application/x-www-form-urlencoded",
        "-H",
        "Cookie: a=1",
        &url("/cart?x=1"),
    ]);
    assert!(o.status.success(), "{}", text_of(&o));
    // a body over --max-body: refused, not recorded
    let big = "x".repeat(5000);
    let o = proxied(&[
        "-w",
        "%{http_code}",
        "-o",
        "/dev/null",
        "-d",
        &big,
        &url("/big"),
    ]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "413", "{}", text_of(&o));
    // an origin that is not there: 502, reported, not recorded
    let closed = free_port();
    let o = proxied(&[
        "-w",
        "%{http_code}",
        "-o",
        "/dev/null",
        &format!("https://localhost:{closed}/gone"),
    ]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "502", "{}", text_of(&o));
    // plain http is refused with a reason
    let o = curl(&[
        "--proxy",
        &rec.proxy(),
        "-w",
        "\n%{http_code}",
        &format!("http://localhost:{}/", agent.port()),
    ]);
    let said = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        said.contains("HTTPS only") && said.ends_with("400"),
        "{said}"
    );
    // another host (the proxy itself answers no TLS... so use 127.0.0.1): dropped, reported
    let o = proxied(&[
        "-o",
        "/dev/null",
        &format!("https://127.0.0.1:{}/healthz", agent.port()),
    ]);
    assert!(o.status.success(), "{}", text_of(&o));

    let (status, said) = rec.interrupt();
    assert!(status.success(), "{said}");
    assert!(said.contains("recording ended: SIGINT"), "{said}");
    assert!(
        said.contains(&format!("2 requests to localhost:{}", agent.port())),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "dropped 1 request(s) to 127.0.0.1:{}",
            agent.port()
        )),
        "{said}"
    );
    assert!(
        said.contains("not recorded: POST") && said.contains("max-body"),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "not recorded: GET https://localhost:{closed}/gone"
        )),
        "{said}"
    );
    assert!(!said.contains("BEGIN"), "no key material in the log");

    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        requests(&out),
        vec![
            ("GET".to_string(), "/tls".to_string()),
            ("POST".into(), "/cart?x=1".into())
        ],
        "{text}"
    );
    assert!(text.contains("x-scenario: by-hand"), "{text}");
    // redacted (no --keep-credentials): same lengths, x's
    assert!(text.contains("body = \"xxxxxx\""), "{text}");
    assert!(text.contains("cookie: a=x"), "{text}");
    assert!(
        !text.contains("\"host:") && !text.contains("content-length"),
        "{text}"
    );
    // think time: the 300 ms pause between the two requests, at least
    let v: toml::Value = toml::from_str(&text).unwrap();
    let think = v["request"][1]["think-ms"].as_integer().unwrap();
    assert!(think >= 300, "{text}");
    assert!(std::fs::read_dir(dir.0.clone()).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .contains(".tmp-")));

    // the recording replays: 3 connections x 2 requests, every one served
    let (v, served) = replay(
        &agent,
        &pki.arg("ca.pem"),
        &out,
        3,
        &["--alpn", "http/1.1"],
        &dir,
    );
    assert_eq!(
        (n(&v, "requests.ok"), n(&v, "requests.failed")),
        (6, 0),
        "{v}"
    );
    assert_eq!(served, 6);

    // a later run reuses the CA; a recording with nothing in it writes nothing
    let pem = std::fs::read(ca_dir.join("ca.pem")).unwrap();
    let empty = dir.arg("empty.toml");
    let mut again = Recorder::start(&ca_dir, &empty, &["--duration", "300ms"]);
    let (status, said) = again.wait(Duration::from_secs(20));
    assert!(!status.success(), "{said}");
    assert!(
        said.contains("--duration elapsed") && said.contains("nothing written"),
        "{said}"
    );
    assert!(!Path::new(&empty).exists());
    assert_eq!(std::fs::read(ca_dir.join("ca.pem")).unwrap(), pem);

    // --max-requests ends the recording on its own
    let one = dir.arg("one.toml");
    let mut again = Recorder::start(
        &ca_dir,
        &one,
        &["--upstream-ca", &pki.arg("ca.pem"), "--max-requests", "1"],
    );
    let page = tunnel_get(&again, agent.port(), "/healthz");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    let (status, said) = again.wait(Duration::from_secs(20));
    assert!(status.success(), "{said}");
    assert!(said.contains("--max-requests reached"), "{said}");
    assert_eq!(requests(&one), vec![("GET".into(), "/healthz".into())]);
}

/// A page with a stylesheet, a script and two images.
const INDEX: &str = r#"<!doctype html>
<html><head><title>shop</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/style.css">
<script src="/app.js"></script>
</head><body><h1>shop</h1>
<img src="/a.gif" alt="a"><img src="/b.gif?v=2" alt="b">
</body></html>
"#;

/// What the backend serves: (path, content type, body).
const SITE: &[(&str, &str, &[u8])] = &[
    ("/", "text/html", INDEX.as_bytes()),
    ("/style.css", "text/css", b"h1 { color: #123456 }\n"),
    (
        "/app.js",
        "text/javascript",
        b"document.addEventListener('DOMContentLoaded', () => { document.body.dataset.js = 'ran'; });\n",
    ),
    ("/a.gif", "image/gif", GIF),
    ("/b.gif", "image/gif", GIF),
];

/// A 1x1 GIF.
const GIF: &[u8] = b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00\x00\x00\x00,\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;";

/// A plain-HTTP/1.1 keep-alive backend serving fixed files on 127.0.0.1 (a thread per
/// connection), the origin behind the agent; counts the requests it answered.
struct Backend {
    port: u16,
    served: Arc<std::sync::atomic::AtomicU64>,
}

impl Backend {
    fn start(files: &'static [(&'static str, &'static str, &'static [u8])]) -> Backend {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let served = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let count = served.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let count = count.clone();
                std::thread::spawn(move || {
                    let mut r = BufReader::new(conn.try_clone().unwrap());
                    let mut w = conn;
                    loop {
                        let mut line = String::new();
                        if r.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
                        // headers up to the blank line (the replayed requests are GETs)
                        loop {
                            let mut h = String::new();
                            if r.read_line(&mut h).unwrap_or(0) == 0 {
                                return;
                            }
                            if h == "\r\n" {
                                break;
                            }
                        }
                        let file = path.split('?').next().unwrap_or("/");
                        let (status, ctype, body) = match files.iter().find(|f| f.0 == file) {
                            Some((_, t, b)) => ("200 OK", *t, *b),
                            None => ("404 Not Found", "text/plain", &b"not found"[..]),
                        };
                        let head = format!(
                            "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\r\n",
                            body.len()
                        );
                        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if w.write_all(&[head.as_bytes(), body].concat()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Backend { port, served }
    }
}

/// Runs a command, killing it after `limit`.
fn run_bounded(cmd: &mut Command, limit: Duration) -> std::process::Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let watchdog = std::thread::spawn(move || {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            if !Path::new(&format!("/proc/{pid}")).exists() {
                return;
            }
        }
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    });
    let out = child.wait_with_output().unwrap();
    let _ = watchdog.join();
    out
}

#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn records_a_page_loaded_by_headless_chromium() {
    let Some(chromium) = chromium() else { return };
    let certutil = Command::new("certutil")
        .arg("-H")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !certutil {
        return require_or_skip("certutil (libnss3-tools)", "Chromium's certificate store");
    }
    let pki = Pki::new();
    let dir = TempDir::new("record-chromium");
    let backend = Backend::start(SITE);
    let upstream = format!("http://127.0.0.1:{}", backend.port);
    let mut args = pki.server_args();
    args.extend(["--upstream".to_string(), upstream]);
    let agent = Agent::start(&args.iter().map(String::as_str).collect::<Vec<_>>());

    let out = dir.arg("page.toml");
    let mut rec = Recorder::start(
        &dir.path("ca"),
        &out,
        &[
            "--upstream-ca",
            &pki.arg("ca.pem"),
            "--host",
            &format!("localhost:{}", agent.port()),
        ],
    );

    // Chromium trusts the recorder's CA for real: an NSS database in the HOME it runs with
    // (~/.pki/nssdb, which Chromium on Linux reads), the CA added as trusted for servers.
    let home = dir.path("home");
    let nssdb = home.join(".pki/nssdb");
    std::fs::create_dir_all(&nssdb).unwrap();
    let db = format!("sql:{}", nssdb.display());
    let o = Command::new("certutil")
        .args(["-d", &db, "-N", "--empty-password"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text_of(&o));
    let o = Command::new("certutil")
        .args(["-d", &db, "-A", "-t", "C,,", "-n", "baton record", "-i"])
        .arg(&rec.ca)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text_of(&o));

    let profile = dir.path("profile");
    let page = format!("https://localhost:{}/", agent.port());
    let o = run_bounded(
        Command::new(chromium).env("HOME", &home).args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            // Chromium sends loopback requests around a proxy unless told not to
            "--proxy-bypass-list=<-loopback>",
            &format!("--proxy-server={}", rec.proxy()),
            &format!("--user-data-dir={}", profile.display()),
            "--dump-dom",
            &page,
        ]),
        Duration::from_secs(90),
    );
    let dom = String::from_utf8_lossy(&o.stdout).into_owned();
    // the script came through the proxy and ran
    assert!(
        dom.contains("data-js=\"ran\""),
        "{dom}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );

    let (status, said) = rec.interrupt();
    assert!(status.success(), "{said}");
    let got = requests(&out);
    let text = std::fs::read_to_string(&out).unwrap();
    for want in ["/", "/style.css", "/app.js", "/a.gif", "/b.gif?v=2"] {
        assert!(
            got.iter().any(|(m, p)| m == "GET" && p == want),
            "{want} missing from\n{text}\n{said}"
        );
    }
    assert_eq!(got[0], ("GET".into(), "/".into()), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("user-agent: mozilla"),
        "{text}"
    );

    // the recording replays against the agent: every request of every connection served
    let per_conn = got.len() as u64;
    let backend_before = backend.served.load(std::sync::atomic::Ordering::Relaxed);
    // Over HTTP/2, as Chromium sent them, and over HTTP/1.1 keep-alive through the agent's
    // proxy (20 connections: this once caught the agent closing a parked keep-alive connection
    // between two requests, about 1 request in 60).
    let mut conns = 0;
    for (alpn, n_conns) in [("h2", 4), ("http/1.1", 20)] {
        let (v, served) = replay(
            &agent,
            &pki.arg("ca.pem"),
            &out,
            n_conns,
            &["--alpn", alpn],
            &dir,
        );
        assert_eq!(n(&v, "config.requests_per_conn"), per_conn, "{v}");
        assert_eq!(
            (n(&v, "requests.ok"), n(&v, "requests.failed")),
            (n_conns * per_conn, 0),
            "{alpn}: {v}\n{text}"
        );
        assert_eq!(served, n_conns * per_conn);
        conns += n_conns;
    }
    // and each reached the origin
    assert_eq!(
        backend.served.load(std::sync::atomic::Ordering::Relaxed) - backend_before,
        conns * per_conn
    );
}
