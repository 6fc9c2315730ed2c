//! `baton bench --engine openssl` against `openssl s_server` speaking what rustls refuses: RSA
//! key exchange (AES128-SHA) and an anonymous suite (ADH-AES128-SHA at security level 0), TLS
//! 1.2; every request completes and full/resumed are exact.

mod common;

use std::process::{Child, Command, Output, Stdio};

use common::*;
use serde_json::Value;

struct SServer(Child, u16);

impl Drop for SServer {
    fn drop(&mut self) {
        // only the process this test started
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn s_server(args: &[&str]) -> SServer {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("openssl")
        .args(["s_server", "-accept", &format!("127.0.0.1:{port}")])
        .args(["-www", "-quiet", "-tls1_2"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl s_server");
    wait_for_port(port);
    SServer(child, port)
}

fn bench(server: &SServer, args: &[&str], dir: &TempDir, tag: &str) -> (Output, Value) {
    let json = dir.arg(&format!("{tag}.json"));
    let out = Command::new(BATON)
        .arg("bench")
        .arg(format!("https://127.0.0.1:{}/", server.1))
        .args(["--engine", "openssl", "--tls-version", "1.2", "-c", "4"])
        .args(args)
        .args(["--json", &json, "--quiet"])
        .output()
        .expect("run baton bench");
    let value = std::fs::read(&json)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    (out, value)
}

fn n(v: &Value, path: &str) -> u64 {
    path.split('.')
        .fold(v, |v, k| &v[k])
        .as_u64()
        .unwrap_or_else(|| panic!("{path} missing in {v}"))
}

/// (full, resumed, failed handshakes, requests ok, requests failed), after checking the run
/// succeeded and negotiated only `suite`.
fn counts(out: &Output, j: &Value, suite: &str) -> (u64, u64, u64, u64, u64) {
    assert!(
        out.status.success(),
        "{}\n{j}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(j["config"]["engine"], "openssl", "{j}");
    let negotiated = j["negotiated"].as_object().unwrap();
    assert!(
        negotiated
            .keys()
            .all(|k| k.starts_with("TLSv1_2 ") && k.contains(suite)),
        "{negotiated:?}"
    );
    let total: u64 = negotiated.values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(
        total,
        n(j, "handshakes.full") + n(j, "handshakes.resumed"),
        "{j}"
    );
    (
        n(j, "handshakes.full"),
        n(j, "handshakes.resumed"),
        n(j, "handshakes.failed"),
        n(j, "requests.ok"),
        n(j, "requests.failed"),
    )
}

#[test]
fn rsa_key_exchange_exact() {
    let pki = Pki::new();
    let dir = TempDir::new("bench-ossl-rsa");
    let server = s_server(&[
        "-cert",
        &pki.arg("rsa.pem"),
        "-key",
        &pki.arg("rsa.key"),
        "-cipher",
        "AES128-SHA",
    ]);
    let verify = ["--ca", &pki.arg("ca.pem"), "--sni", "localhost"];
    let suite = ["--suite", "AES128-SHA"];
    let suite_name = "TLS_RSA_WITH_AES_128_CBC_SHA";

    let (out, j) = bench(
        &server,
        &[&verify[..], &suite, &["-n", "200", "--resume", "none"]].concat(),
        &dir,
        "none",
    );
    assert_eq!(counts(&out, &j, suite_name), (200, 0, 0, 200, 0));

    // 1 full : 3 resumed, by session id and by ticket
    for resume in ["id", "ticket"] {
        let (out, j) = bench(
            &server,
            &[
                &verify[..],
                &suite,
                &["-n", "200", "--full-every", "4", "--resume", resume],
            ]
            .concat(),
            &dir,
            resume,
        );
        assert_eq!(
            counts(&out, &j, suite_name),
            (50, 150, 0, 200, 0),
            "--resume {resume}"
        );
        assert_eq!(n(&j, "handshakes.resume_refused"), 0);
    }

    // the server certificate is verified: a wrong name fails every handshake
    let (out, j) = bench(
        &server,
        &[
            "--ca",
            &pki.arg("ca.pem"),
            "--sni",
            "wrong.test",
            "--suite",
            "AES128-SHA",
            "-n",
            "4",
        ],
        &dir,
        "wrong-name",
    );
    assert!(!out.status.success());
    assert_eq!((n(&j, "handshakes.failed"), n(&j, "errors.tls")), (4, 4));

    // the rustls engine refuses this suite
    let out = Command::new(BATON)
        .args(["bench", &format!("https://127.0.0.1:{}/", server.1)])
        .args(["--suite", "AES128-SHA", "-n", "1", "--quiet"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn anonymous_suite_at_security_level_0_exact() {
    let dir = TempDir::new("bench-ossl-adh");
    let cipher = "ADH-AES128-SHA:@SECLEVEL=0";
    let server = s_server(&["-nocert", "-cipher", cipher]);
    let suite_name = "TLS_DH_anon_WITH_AES_128_CBC_SHA";

    let (out, j) = bench(
        &server,
        &[
            "--insecure",
            "--suite",
            cipher,
            "-n",
            "200",
            "--resume",
            "none",
        ],
        &dir,
        "none",
    );
    assert_eq!(counts(&out, &j, suite_name), (200, 0, 0, 200, 0));

    let (out, j) = bench(
        &server,
        &[
            "--insecure",
            "--suite",
            cipher,
            "-n",
            "200",
            "--full-every",
            "4",
        ],
        &dir,
        "mix",
    );
    assert_eq!(counts(&out, &j, suite_name), (50, 150, 0, 200, 0));
}

#[test]
fn client_certificate() {
    let pki = Pki::new();
    let dir = TempDir::new("bench-ossl-mtls");
    let server = s_server(&[
        "-cert",
        &pki.arg("rsa.pem"),
        "-key",
        &pki.arg("rsa.key"),
        "-cipher",
        "DHE-RSA-AES128-SHA",
        "-Verify",
        "1",
        "-CAfile",
        &pki.arg("client-ca.pem"),
    ]);
    let common = [
        "--ca",
        &pki.arg("ca.pem"),
        "--sni",
        "localhost",
        "--suite",
        "DHE-RSA-AES128-SHA",
        "-n",
        "20",
        "--resume",
        "none",
    ];
    let (out, j) = bench(
        &server,
        &[
            &common[..],
            &[
                "--cert",
                &pki.arg("client.pem"),
                "--key",
                &pki.arg("client.key"),
            ],
        ]
        .concat(),
        &dir,
        "with-cert",
    );
    assert_eq!(
        counts(&out, &j, "TLS_DHE_RSA_WITH_AES_128_CBC_SHA"),
        (20, 0, 0, 20, 0)
    );
    // without one the server refuses every handshake
    let (out, j) = bench(&server, &common, &dir, "without-cert");
    assert!(!out.status.success());
    assert_eq!(n(&j, "handshakes.failed"), 20, "{j}");
}
