//! The agent as a reverse proxy with routes and upstream pools (a config file's `[pool.NAME]`
//! and `[[route]]`), against real peers: Python HTTP backends (`proxy_backend.py`), nginx as a
//! TLS upstream (HTTP/2 by ALPN, certificate verification, session resumption, a client
//! certificate), a real gRPC server and client (`grpc_echo.py`, Python's grpcio) through the
//! agent over HTTP/2, and active health checks taking a killed upstream out and bringing it
//! back.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const BACKEND: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/proxy_backend.py");
const GRPC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/grpc_echo.py");

/// A `proxy_backend.py` process, killed on drop.
struct Backend {
    child: Child,
    port: u16,
}

impl Backend {
    fn start(name: &str, port: u16) -> Backend {
        let child = Command::new("python3")
            .args([BACKEND, name, &port.to_string()])
            .stdout(Stdio::null())
            .spawn()
            .expect("python3 (scripts/test installs it)");
        assert!(wait_for_port(port), "backend {name} did not listen");
        Backend { child, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn authority(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An agent serving `pki`'s certificates with `config` as its config file.
fn agent_with_config(pki: &Pki, dir: &TempDir, config: &str) -> Agent {
    std::fs::write(dir.path("agent.toml"), config).unwrap();
    let path = dir.arg("agent.toml");
    Agent::serving(pki, &["--config", &path])
}

/// A response as curl saw it.
struct Got {
    status: u16,
    head: String,
    body: String,
}

/// `curl` to the agent with `Host: host` (SNI stays 127.0.0.1's: none) and `extra` options.
fn get(agent: &Agent, pki: &Pki, host: &str, path: &str, extra: &[&str]) -> Got {
    let url = agent.url(path);
    let host_header = format!("Host: {host}");
    let ca = pki.arg("ca.pem");
    let mut args = vec!["-i", "--cacert", &ca, "-H", &host_header];
    args.extend(extra);
    args.push(&url);
    let out = curl(&args);
    assert!(out.status.success(), "curl {path}: {}", text_of(&out));
    let text = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head}"));
    Got {
        status,
        head: head.to_ascii_lowercase(),
        body: body.to_string(),
    }
}

/// Waits (at most 20 s) until `f` holds.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn routes_by_host_and_path_with_header_changes_and_a_body_limit() {
    let a = Backend::start("A", free_port());
    let b = Backend::start("B", free_port());
    let pki = Pki::new();
    let dir = TempDir::new("routes");
    let agent = agent_with_config(
        &pki,
        &dir,
        &format!(
            r#"
            [pool.a]
            upstreams = ["{a}"]
            [pool.b]
            upstreams = ["{b}"]

            [[route]]
            name = "site"
            hosts = ["localhost"]
            pool = "a"
            max-body-bytes = 10
            request-headers = {{ set = {{ x-route = "site" }}, remove = ["x-debug"] }}
            response-headers = {{ remove = ["x-internal"], add = {{ x-served-by = "baton" }} }}

            [[route]]
            name = "api"
            hosts = ["localhost", "*.wild.test"]
            path-prefix = "/api"
            pool = "b"
            "#,
            a = a.url(),
            b = b.url()
        ),
    );

    let page = get(&agent, &pki, "localhost", "/page", &["-H", "x-debug: 1"]);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.starts_with("A GET /page 0\n"), "{}", page.body);
    assert!(page.body.contains("x-route: site"), "{}", page.body);
    assert!(!page.body.contains("x-debug"), "{}", page.body);
    assert!(page.head.contains("x-served-by: baton"), "{}", page.head);
    assert!(page.head.contains("x-backend: a"), "{}", page.head);
    assert!(!page.head.contains("x-internal"), "{}", page.head);

    // the longer prefix of the same host; a segment, not a string prefix
    let api = get(&agent, &pki, "LocalHost:443", "/api/v1?q=1", &[]);
    assert!(
        api.body.starts_with("B GET /api/v1?q=1 0\n"),
        "{}",
        api.body
    );
    assert!(!api.body.contains("x-route"), "{}", api.body);
    let apix = get(&agent, &pki, "localhost", "/apix", &[]);
    assert!(apix.body.starts_with("A GET /apix"), "{}", apix.body);

    // a wildcard host: its routes only; a host no route takes is misdirected
    let wild = get(&agent, &pki, "x.wild.test", "/api", &[]);
    assert!(wild.body.starts_with("B GET /api 0"), "{}", wild.body);
    assert_eq!(get(&agent, &pki, "x.wild.test", "/page", &[]).status, 404);
    assert_eq!(get(&agent, &pki, "wild.test", "/api", &[]).status, 421);
    assert_eq!(get(&agent, &pki, "nope.test", "/page", &[]).status, 421);

    // the body limit: by Content-Length before anything is sent, or counted as it streams
    let small = get(
        &agent,
        &pki,
        "localhost",
        "/form",
        &["--data-binary", "12345"],
    );
    assert!(small.body.starts_with("A POST /form 5"), "{}", small.body);
    let big = "x".repeat(20);
    // (HTTP/1.1: over HTTP/2 the stream is reset once the early 413 is sent, and curl may
    // report that reset, racing its upload, as an error of its own)
    let declared = get(
        &agent,
        &pki,
        "localhost",
        "/form",
        &["--data-binary", &big, "--http1.1"],
    );
    assert_eq!(declared.status, 413, "{}", declared.body);
    let streamed = get(
        &agent,
        &pki,
        "localhost",
        "/form",
        &[
            "--data-binary",
            &big,
            "--http1.1",
            "-H",
            "Transfer-Encoding: chunked",
        ],
    );
    assert_eq!(streamed.status, 413, "{}", streamed.body);

    let series = |backend: &Backend, pool: &str| {
        agent.metric(&format!(
            "baton_upstream_responses_total{{upstream=\"{}\",pool=\"{pool}\"}}",
            backend.authority()
        ))
    };
    assert_eq!(series(&a, "a"), 3.0);
    assert_eq!(series(&b, "b"), 2.0);
}

#[test]
fn health_checks_take_a_killed_upstream_out_and_bring_it_back() {
    let a = Backend::start("A", free_port());
    let b_port = free_port();
    let mut b = Some(Backend::start("B", b_port));
    let b_auth = format!("127.0.0.1:{b_port}");
    let pki = Pki::new();
    let dir = TempDir::new("health");
    let agent = agent_with_config(
        &pki,
        &dir,
        &format!(
            r#"
            [pool.web]
            upstreams = ["{a}", "http://{b_auth}"]
            health = {{ interval = "200ms", timeout = "1s", path = "/healthz", rise = 2, fall = 2 }}
            [[route]]
            pool = "web"
            "#,
            a = a.url(),
        ),
    );
    let up = |auth: &str| {
        agent.metric(&format!(
            "baton_upstream_up{{upstream=\"{auth}\",pool=\"web\"}}"
        ))
    };
    let metric = |name: &str, auth: &str, kind: &str| {
        agent.metric(&format!("{name}{{upstream=\"{auth}\",pool=\"web\"{kind}}}"))
    };
    eventually("both checked", || {
        metric(
            "baton_upstream_health_checks_total",
            &b_auth,
            ",kind=\"passed\"",
        ) >= 2.0
    });
    assert_eq!(up(&b_auth), 1.0);

    drop(b.take());
    eventually("B out", || up(&b_auth) == 0.0);
    assert!(
        metric(
            "baton_upstream_health_checks_total",
            &b_auth,
            ",kind=\"failed\""
        ) >= 2.0
    );
    let skipped = metric("baton_upstream_skipped_total", &b_auth, "");
    for _ in 0..6 {
        let r = get(&agent, &pki, "localhost", "/x", &[]);
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(r.body.starts_with("A "), "{}", r.body);
    }
    assert_eq!(
        metric("baton_upstream_skipped_total", &b_auth, ""),
        skipped + 6.0
    );
    assert_eq!(
        metric(
            "baton_upstream_failures_total",
            &b_auth,
            ",kind=\"connect\""
        ),
        0.0,
        "a request was sent to the upstream that was out"
    );

    b = Some(Backend::start("B", b_port));
    eventually("B back", || up(&b_auth) == 1.0);
    let names: Vec<String> = (0..4)
        .map(|_| get(&agent, &pki, "localhost", "/x", &[]).body[..1].to_string())
        .collect();
    assert_eq!(
        names.iter().filter(|n| *n == "B").count(),
        2,
        "round robin again: {names:?}"
    );

    // none up: 503 without trying
    let a_auth = a.authority();
    drop(b);
    drop(a);
    eventually("all out", || up(&b_auth) == 0.0 && up(&a_auth) == 0.0);
    let r = get(&agent, &pki, "localhost", "/x", &[]);
    assert_eq!(r.status, 503, "{}", r.body);
}

/// nginx serving HTTPS (h2 and http/1.1 by ALPN) with a certificate from its own test CA,
/// answering every request with its protocol, whether the TLS session was resumed, and SNI.
/// One process (no master): killing it leaves no worker behind.
/// A second server on `mtls_port` asks for a client certificate from `pki`'s client CA and
/// answers with its subject.
struct Nginx {
    child: Child,
    port: u16,
    mtls_port: u16,
    _dir: TempDir,
}

impl Nginx {
    fn start(pki: &Pki) -> Nginx {
        let dir = TempDir::new("nginx");
        let port = free_port();
        let mtls_port = free_port();
        let d = dir.0.display();
        std::fs::create_dir_all(dir.path("tmp")).unwrap();
        let conf = format!(
            r#"
daemon off;
master_process off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
worker_processes 1;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    server {{
        listen 127.0.0.1:{port} ssl http2;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_session_cache shared:tls:1m;
        location / {{
            return 200 "nginx $server_protocol reused=$ssl_session_reused sni=$ssl_server_name\n";
        }}
    }}
    server {{
        listen 127.0.0.1:{mtls_port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_client_certificate {client_ca};
        ssl_verify_client on;
        location / {{
            return 200 "client=$ssl_client_s_dn\n";
        }}
    }}
}}
"#,
            cert = pki.arg("ecdsa.pem"),
            key = pki.arg("ecdsa.key"),
            client_ca = pki.arg("client-ca.pem"),
        );
        std::fs::write(dir.path("nginx.conf"), conf).unwrap();
        let child = Command::new("/usr/sbin/nginx")
            .args(["-c", &dir.arg("nginx.conf"), "-p", &dir.arg("")])
            .stdout(Stdio::null())
            .spawn()
            .expect("nginx");
        assert!(
            wait_for_port(port),
            "nginx did not listen: {}",
            std::fs::read_to_string(dir.path("error.log")).unwrap_or_default()
        );
        Nginx {
            child,
            port,
            mtls_port,
            _dir: dir,
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn nginx_as_a_tls_upstream_verified_resumed_with_a_client_certificate_and_a_wrong_ca_refused() {
    if !std::path::Path::new("/usr/sbin/nginx").exists() {
        return require_or_skip("nginx", "the TLS upstream");
    }
    // the upstream's certificates come from a CA of its own, the agent's from another
    let upstream_pki = Pki::new();
    let nginx = Nginx::start(&upstream_pki);
    let pki = Pki::new();
    let dir = TempDir::new("tls-upstream");
    let target = format!("https://127.0.0.1:{}", nginx.port);
    let mtls = format!("https://127.0.0.1:{}", nginx.mtls_port);
    let agent = agent_with_config(
        &pki,
        &dir,
        &format!(
            r#"
            [pool.tls]
            upstreams = ["{target}"]
            ca = "{ca}"
            sni = "localhost"
            [pool.fresh]
            upstreams = ["{target}"]
            ca = "{ca}"
            sni = "localhost"
            protocol = "http1"
            max-idle = 0
            [pool.wrong]
            upstreams = ["{target}"]
            ca = "{wrong}"
            sni = "localhost"

            [pool.mtls]
            upstreams = ["{mtls}"]
            ca = "{ca}"
            sni = "localhost"
            client-cert = "{client_cert}"
            client-key = "{client_key}"
            [pool.anonymous]
            upstreams = ["{mtls}"]
            ca = "{ca}"
            sni = "localhost"

            [[route]]
            pool = "tls"
            [[route]]
            path-prefix = "/mtls"
            pool = "mtls"
            [[route]]
            path-prefix = "/anonymous"
            pool = "anonymous"
            [[route]]
            path-prefix = "/fresh"
            pool = "fresh"
            [[route]]
            path-prefix = "/wrong"
            pool = "wrong"
            "#,
            ca = upstream_pki.arg("ca.pem"),
            wrong = pki.arg("ca.pem"),
            client_cert = upstream_pki.arg("client.pem"),
            client_key = upstream_pki.arg("client.key"),
        ),
    );
    let h2 = get(&agent, &pki, "localhost", "/", &[]);
    assert_eq!(h2.status, 200, "{}", h2.body);
    assert!(
        h2.body.starts_with("nginx HTTP/2.0 ") && h2.body.contains("sni=localhost"),
        "{}",
        h2.body
    );

    // one connection per request (max-idle 0): the second resumes the first's session
    let first = get(&agent, &pki, "localhost", "/fresh", &[]);
    assert!(first.body.starts_with("nginx HTTP/1.1 "), "{}", first.body);
    let again = get(&agent, &pki, "localhost", "/fresh", &[]);
    assert!(again.body.contains("reused=r"), "{}", again.body);

    // an upstream that asks for a client certificate: the pool's is presented
    let mtls = get(&agent, &pki, "localhost", "/mtls", &[]);
    assert_eq!(mtls.status, 200, "{}", mtls.body);
    assert!(mtls.body.contains("CN=client-one"), "{}", mtls.body);
    let anonymous = get(&agent, &pki, "localhost", "/anonymous", &[]);
    assert_eq!(
        anonymous.status, 400,
        "nginx: no required certificate: {}",
        anonymous.body
    );

    let refused = get(&agent, &pki, "localhost", "/wrong", &[]);
    assert_eq!(refused.status, 502, "{}", refused.body);
    let auth = format!("127.0.0.1:{}", nginx.port);
    assert!(
        agent.metric(&format!(
            "baton_upstream_failures_total{{upstream=\"{auth}\",pool=\"wrong\",kind=\"connect\"}}"
        )) >= 1.0
    );
    assert_eq!(
        agent.metric(&format!(
            "baton_upstream_responses_total{{upstream=\"{auth}\",pool=\"wrong\"}}"
        )),
        0.0
    );
}

#[test]
fn grpc_through_the_agent_over_http2_with_trailers() {
    let have_grpc = Command::new("python3")
        .args(["-c", "import grpc"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have_grpc {
        return require_or_skip("python3 grpcio", "the gRPC server and client");
    }
    let port = free_port();
    let server = Killed(
        Command::new("python3")
            .args([GRPC, "server", &port.to_string()])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for_port(port), "the gRPC server did not listen");
    let pki = Pki::new();
    let dir = TempDir::new("grpc");
    let agent = agent_with_config(
        &pki,
        &dir,
        &format!(
            r#"
            [pool.grpc]
            upstreams = ["http://127.0.0.1:{port}"]
            protocol = "h2"
            [[route]]
            pool = "grpc"
            "#
        ),
    );
    let out = Command::new("python3")
        .args([GRPC, "client", &agent.connect(), &pki.arg("ca.pem")])
        .output()
        .unwrap();
    drop(server);
    let text = text_of(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("say echo: hello yes\n"), "{text}");
    assert!(text.contains("fail NOT_FOUND no such thing\n"), "{text}");
}

/// A child process killed on drop (a failed assertion included).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
