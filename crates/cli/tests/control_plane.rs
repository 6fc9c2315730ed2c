//! The control endpoints of real `baton dispatch` processes against strangers: the admin
//! endpoint obeys only the admin token, and no web page (a real headless Chromium) or rebound
//! DNS name can steer it; a flood of connections that never finish (or pipeline scrapes and
//! never read) can keep neither a scraper off the metrics endpoint nor an operator off the
//! admin endpoint.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rustls::version::TLS13;

struct Cluster {
    _agent: Agent,
    dispatcher: Child,
    addr: SocketAddr,
    admin: SocketAddr,
    metrics: SocketAddr,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.dispatcher.kill();
        let _ = self.dispatcher.wait();
    }
}

impl Endpoint for Cluster {
    fn tls_addr(&self) -> SocketAddr {
        self.addr
    }
}

fn cluster(pki: &Pki) -> Cluster {
    let agent = Agent::serving(pki, &[]);
    let (dispatcher, addrs) = spawn_ready(
        "dispatch",
        &["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"],
        &[
            "--agent",
            &agent.addr.to_string(),
            "--admin",
            "127.0.0.1:0",
            "--admin-token-file",
            admin_token_file(),
        ],
    );
    Cluster {
        _agent: agent,
        dispatcher,
        addr: addrs["dispatch"],
        admin: addrs["admin"],
        metrics: addrs["metrics"],
    }
}

/// curl against the admin endpoint with these extra arguments: the status.
fn curl(url: &str, extra: &[&str]) -> u16 {
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-m", "5", "-w", "%{http_code}"])
        .args(extra)
        .arg(url)
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

fn agent_state(admin: SocketAddr) -> String {
    let (status, body) = admin_request(admin, "GET", "/agents", None);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v[0]["state"].as_str().unwrap().to_string()
}

fn denied(c: &Cluster) -> f64 {
    series_value(
        &metrics_page(c.metrics),
        "baton_control_denied_total{endpoint=\"admin\"}",
    )
}

#[test]
fn admin_calls_need_the_token_and_no_web_page_can_make_one() {
    let pki = Pki::new();
    let c = cluster(&pki);
    let config = Arc::new(pki.client(&[&TLS13], None));
    let disable = format!("http://{}/agents/0/disable", c.admin);
    let bearer = format!("Authorization: Bearer {ADMIN_TOKEN}");

    // no token, a wrong one, a web page's Origin, a rebound name, a form body: all refused
    assert_eq!(curl(&disable, &["-X", "POST"]), 401);
    assert_eq!(
        curl(&format!("http://{}/agents", c.admin), &[]),
        401,
        "listing too"
    );
    let wrong = format!("Authorization: Bearer {}", "0".repeat(ADMIN_TOKEN.len()));
    assert_eq!(curl(&disable, &["-X", "POST", "-H", &wrong]), 401);
    let evil_origin = ["-H", "Origin: http://evil.example"];
    assert_eq!(
        curl(
            &disable,
            &["-X", "POST", "-H", &bearer, evil_origin[0], evil_origin[1]]
        ),
        403
    );
    let evil_host = format!("Host: evil.example:{}", c.admin.port());
    assert_eq!(
        curl(&disable, &["-X", "POST", "-H", &bearer, "-H", &evil_host]),
        403
    );
    let add = format!("http://{}/agents", c.admin);
    let form = [
        "-X",
        "POST",
        "-H",
        &bearer,
        "-H",
        "Content-Type: text/plain",
    ];
    let mut args = form.to_vec();
    args.extend(["--data", "{\"id\": 7, \"addr\": \"127.0.0.1:9\"}"]);
    assert_eq!(curl(&add, &args), 415);
    assert_eq!(agent_state(c.admin), "active");
    assert_eq!(denied(&c), 6.0);

    // a page of another origin, in a real browser, posting without a preflight
    if let Some(chromium) = chromium() {
        let site = TempDir::new("evil-site");
        std::fs::write(
            site.path("index.html"),
            format!(
                "<html><body><script>\
                 fetch('http://{a}/agents/0/disable', {{method: 'POST', mode: 'no-cors'}})\
                 .finally(() => {{ document.body.setAttribute('data-sent', 'yes'); }});\
                 fetch('http://localhost:{p}/agents/0/drain', {{method: 'POST', mode: 'no-cors', \
                 headers: {{'Authorization': 'Bearer guess'}}}});\
                 </script></body></html>",
                a = c.admin,
                p = c.admin.port()
            ),
        )
        .unwrap();
        let server = StaticServer::start(&site.0);
        // the page's scripts run, then the DOM is printed
        let out = headless(
            chromium,
            &[
                "--virtual-time-budget=10000",
                "--dump-dom",
                &format!("{}/index.html", server.url()),
            ],
        );
        let dom = String::from_utf8_lossy(&out.stdout);
        assert!(
            dom.contains("data-sent=\"yes\""),
            "the page did not run: {dom}\n{}",
            text_of(&out)
        );
        // the browser's calls reached the endpoint and were refused
        let start = Instant::now();
        while denied(&c) < 7.0 && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(denied(&c) >= 7.0, "the page's requests never arrived");
        assert_eq!(
            agent_state(c.admin),
            "active",
            "a web page steered the cluster"
        );
    }
    assert_eq!(fetch(&c, &config, "/").unwrap().status, 200);

    // the operator, with the token: obeyed
    let (status, body) = admin_request(c.admin, "POST", "/agents/0/disable", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(agent_state(c.admin), "disabled");
    let (status, body) = admin_request(c.admin, "POST", "/agents/0/enable", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(agent_state(c.admin), "active");
}

#[test]
fn an_admin_endpoint_without_a_private_token_does_not_start() {
    let dir = TempDir::new("admin-token");
    let run = |args: &[&str]| {
        let out = Command::new(BATON)
            .args([
                "dispatch",
                "--agent",
                "127.0.0.1:1",
                "--admin",
                "127.0.0.1:0",
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        text_of(&out)
    };
    let text = run(&[]);
    assert!(text.contains("--admin-token-file"), "{text}");
    let open = dir.arg("open-token");
    std::fs::write(&open, "x".repeat(64)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let text = run(&["--admin-token-file", &open]);
    assert!(text.contains("chmod 600"), "{text}");
}

/// One scrape on a fresh connection, bounded: the metrics, or what went wrong.
fn scrape(addr: SocketAddr) -> Result<(), String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: scraper\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    let read = s.take(8 << 20).read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    if text.starts_with("HTTP/1.1 200") && text.trim_end().ends_with("# EOF") {
        Ok(())
    } else {
        Err(format!(
            "{read:?}: {} bytes: {:?}",
            raw.len(),
            &text[..text.len().min(80)]
        ))
    }
}

#[test]
#[ignore = "slow tier: floods for 15 s"]
fn floods_keep_neither_scrapers_nor_operators_out() {
    let pki = Pki::new();
    let c = cluster(&pki);
    const SCRAPE: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    // as many pipelining scrapers that never read as the endpoint has slots, and more silent
    // connections than the admin endpoint has
    let scrapers = Flood::start(c.metrics, 64, SCRAPE, true);
    let silent = Flood::start(c.admin, 24, b"GET /agents HTTP/1.1\r\n", false);
    std::thread::sleep(Duration::from_secs(2));
    let (mut scraped, mut listed, rounds) = (0, 0, 10);
    let mut failures = Vec::new();
    let mut scrape_once = |when: &str| match scrape(c.metrics) {
        Ok(()) => 1,
        Err(e) => {
            failures.push(format!("{when}: {e}"));
            0
        }
    };
    for i in 0..rounds {
        scraped += scrape_once(&format!("round {i}"));
        let (status, _) = admin_request(c.admin, "GET", "/agents", None);
        listed += usize::from(status == 200);
        std::thread::sleep(Duration::from_millis(500));
    }
    // held past the write and head deadlines (5 s, 10 s): those end attackers too
    std::thread::sleep(Duration::from_secs(9));
    scraped += scrape_once("after the deadlines");
    listed += usize::from(admin_request(c.admin, "GET", "/agents", None).0 == 200);
    assert!(
        scrapers.stop() >= 64 && silent.stop() >= 24,
        "the flood ran"
    );
    assert_eq!(
        scraped,
        rounds + 1,
        "scrapes failed under the flood: {failures:?}"
    );
    assert_eq!(listed, rounds + 1, "admin calls failed under the flood");
    let page = metrics_page(c.metrics);
    let evicted = series_value(&page, "baton_control_evicted_total{endpoint=\"metrics\"}")
        + series_value(&page, "baton_control_evicted_total{endpoint=\"admin\"}");
    let timed_out = series_value(&page, "baton_control_timed_out_total{endpoint=\"metrics\"}")
        + series_value(&page, "baton_control_timed_out_total{endpoint=\"admin\"}");
    assert!(
        evicted + timed_out > 0.0,
        "nothing pushed out or cut:\n{page}"
    );
}

/// Admin calls on keep-alive connections (a new one when the endpoint closes one).
struct AdminClient {
    addr: SocketAddr,
    conn: Option<std::io::BufReader<TcpStream>>,
}

impl AdminClient {
    fn call(&mut self, method: &str, path: &str, body: &str) -> u16 {
        use std::io::BufRead;
        let addr = self.addr;
        let conn = self.conn.get_or_insert_with(|| {
            let s = TcpStream::connect(addr).unwrap();
            s.set_nodelay(true).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            std::io::BufReader::new(s)
        });
        // one write: pieces would wait for the server's delayed ACK
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        conn.get_mut().write_all(request.as_bytes()).unwrap();
        let mut line = String::new();
        conn.read_line(&mut line).unwrap();
        let status = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        let (mut length, mut close) = (0usize, false);
        loop {
            line.clear();
            conn.read_line(&mut line).unwrap();
            let l = line.trim().to_ascii_lowercase();
            if l.is_empty() {
                break;
            }
            if let Some(v) = l.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
            close |= l == "connection: close";
        }
        let mut body = vec![0u8; length];
        conn.read_exact(&mut body).unwrap();
        if close {
            self.conn = None;
        }
        status
    }
}

#[test]
#[ignore = "slow tier: 20,000 admin calls"]
fn ten_thousand_agents_added_and_removed_leave_the_router_as_it_was() {
    let pki = Pki::new();
    let c = cluster(&pki);
    let config = Arc::new(pki.client(&[&TLS13], None));
    let slots = || series_value(&metrics_page(c.metrics), "baton_dispatch_router_slots");
    assert_eq!(slots(), 1.0);
    let mut admin = AdminClient {
        addr: c.admin,
        conn: None,
    };
    for i in 0..10_000u32 {
        let id = 1 + i % 200;
        let spec = format!("{{\"id\": {id}, \"addr\": \"127.0.0.1:9\"}}");
        assert_eq!(admin.call("POST", "/agents", &spec), 201, "add {i}");
        assert_eq!(
            admin.call("DELETE", &format!("/agents/{id}"), ""),
            200,
            "delete {i}"
        );
    }
    assert_eq!(slots(), 2.0, "removed agents' slots were not reused");
    assert_eq!(agent_state(c.admin), "active");
    for _ in 0..5 {
        assert_eq!(fetch(&c, &config, "/").unwrap().status, 200);
    }
}
