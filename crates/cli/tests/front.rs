//! The agent as a site's front: the forwarding headers a real backend sees (a trusted proxy's
//! kept and appended to, anyone else's replaced), the plain-HTTP listener's redirect to https
//! and its ACME challenge path, and the probes on the metrics port (`/ready`, `/live`).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::*;

/// A plain HTTP backend that answers each request with the request head it received.
fn echo_backend() -> SocketAddr {
    let backend = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = backend.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in backend.incoming().take(16) {
            let Ok(mut s) = stream else { continue };
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut byte).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    head.len()
                );
                let _ = s.write_all(&head);
            });
        }
    });
    addr
}

/// The request head the backend saw (lowercased), for a curl request with spoofed headers.
fn seen_by_backend(agent: &Agent, pki: &Pki, http2: bool) -> String {
    let out = curl(&[
        "--cacert",
        &pki.arg("ca.pem"),
        if http2 { "--http2" } else { "--http1.1" },
        "-H",
        "X-Forwarded-For: 6.6.6.6",
        "-H",
        "X-Forwarded-Host: evil.example",
        "-H",
        "Forwarded: for=6.6.6.6",
        &agent.url("/app?q=1"),
    ]);
    String::from_utf8_lossy(&out.stdout).to_lowercase()
}

fn header<'a>(head: &'a str, name: &str) -> Vec<&'a str> {
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| k.trim() == name)
        .map(|(_, v)| v.trim())
        .collect()
}

#[test]
fn an_untrusted_clients_forwarding_headers_are_replaced() {
    let pki = Pki::new();
    let upstream = format!("http://{}", echo_backend());
    let agent = Agent::serving(&pki, &["--upstream", &upstream]);
    let host = format!("127.0.0.1:{}", agent.port());
    let head = seen_by_backend(&agent, &pki, false);
    assert!(head.starts_with("get /app?q=1 http/1.1"), "{head}");
    assert_eq!(header(&head, "x-forwarded-for"), ["127.0.0.1"], "{head}");
    assert_eq!(header(&head, "x-forwarded-proto"), ["https"], "{head}");
    assert_eq!(header(&head, "x-forwarded-host"), [host.as_str()], "{head}");
    assert_eq!(
        header(&head, "forwarded"),
        [format!("for=127.0.0.1;proto=https;host=\"{host}\"").as_str()],
        "{head}"
    );
    assert!(
        !head.contains("6.6.6.6") && !head.contains("evil"),
        "{head}"
    );
    assert!(header(&head, "via").is_empty(), "{head}");
}

#[test]
fn a_trusted_proxys_forwarding_headers_are_appended_to() {
    let pki = Pki::new();
    let upstream = format!("http://{}", echo_backend());
    let agent = Agent::serving(
        &pki,
        &[
            "--upstream",
            &upstream,
            "--proxy-protocol-from",
            "127.0.0.0/8",
            "--via",
            "true",
        ],
    );
    let host = format!("127.0.0.1:{}", agent.port());
    for (http2, via) in [(false, "1.1 baton"), (true, "2 baton")] {
        let head = seen_by_backend(&agent, &pki, http2);
        assert_eq!(
            header(&head, "x-forwarded-for"),
            ["6.6.6.6, 127.0.0.1"],
            "{head}"
        );
        assert_eq!(
            header(&head, "x-forwarded-host"),
            ["evil.example"],
            "{head}"
        );
        assert_eq!(
            header(&head, "forwarded"),
            [format!("for=6.6.6.6, for=127.0.0.1;proto=https;host=\"{host}\"").as_str()],
            "{head}"
        );
        assert_eq!(header(&head, "via"), [via], "{head}");
    }
}

/// One raw HTTP/1.1 request on plain TCP; the response head and body.
fn plain_request(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    read_http_response(&mut s)
}

#[test]
fn the_plain_http_listener_redirects_to_https_except_acme_challenges() {
    let pki = Pki::new();
    let mut args = pki.server_args();
    args.extend(["--http-listen".into(), "127.0.0.1:0".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (mut child, addrs) = spawn_ready(
        "agent",
        &["--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"],
        &args,
    );
    let (http, tls) = (addrs["http"], addrs["tls"]);
    let r = plain_request(
        http,
        "POST /a/b?c=1 HTTP/1.1\r\nHost: www.example.com\r\nContent-Length: 0\r\n\r\n",
    );
    assert!(r.starts_with("HTTP/1.1 308 "), "{r}");
    let location = format!("location: https://www.example.com:{}/a/b?c=1", tls.port());
    assert!(r.to_lowercase().contains(&location), "{r}");
    // no Host: nothing to redirect to
    let r = plain_request(http, "GET / HTTP/1.1\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 400 "), "{r}");
    // ACME HTTP-01: answered here (no order pending: no such token), never redirected
    let r = plain_request(
        http,
        "GET /.well-known/acme-challenge/abc_DEF-1 HTTP/1.1\r\nHost: a.example\r\n\r\n",
    );
    assert!(r.starts_with("HTTP/1.1 404 "), "{r}");
    // a redirect followed by a real client ends on the TLS port
    let out = curl(&[
        "-L",
        "--cacert",
        &pki.arg("ca.pem"),
        "--resolve",
        &format!("localhost:{}:127.0.0.1", http.port()),
        "--resolve",
        &format!("localhost:{}:127.0.0.1", tls.port()),
        "-w",
        "\n%{http_code} %{url_effective}",
        &format!("http://localhost:{}/tls", http.port()),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    let expected = format!("200 https://localhost:{}/tls", tls.port());
    assert!(text.trim_end().ends_with(&expected), "{text}");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn ready_turns_503_when_the_agent_drains_and_live_stays_200() {
    // a backend that takes requests and never answers: the request in flight holds the drain
    let stall = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = format!("http://{}", stall.local_addr().unwrap());
    let (arrived, arrival) = std::sync::mpsc::channel();
    let held = std::thread::spawn(move || {
        let (s, _) = stall.accept().unwrap();
        arrived.send(()).unwrap();
        std::thread::sleep(Duration::from_secs(8));
        drop(s);
    });
    let pki = Pki::new();
    let mut agent = Agent::serving(&pki, &["--upstream", &upstream, "--drain-timeout", "20s"]);
    assert_eq!(plain_get(agent.metrics, "/ready"), (200, "ready\n".into()));
    assert_eq!(plain_get(agent.metrics, "/live"), (200, "live\n".into()));
    let url = agent.url("/slow");
    let ca = pki.arg("ca.pem");
    let client = std::thread::spawn(move || curl(&["--cacert", &ca, &url]));
    // the request reaches the backend before the drain
    arrival.recv_timeout(Duration::from_secs(10)).unwrap();
    agent.signal("TERM");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut ready = plain_get(agent.metrics, "/ready");
    while ready.0 != 503 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        ready = plain_get(agent.metrics, "/ready");
    }
    assert_eq!(ready, (503, "draining\n".into()));
    assert_eq!(plain_get(agent.metrics, "/live").0, 200);
    held.join().unwrap();
    let _ = client.join();
    assert!(agent.wait_exit(Duration::from_secs(20)).is_some());
}
