//! Certificates the agent watches over: a directory of pairs chosen by SNI and reloaded whole
//! on SIGHUP, the expiry metric read from what is served, and OCSP stapling against
//! `openssl ocsp` as the responder, checked with `openssl s_client -status`.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A self-signed certificate `STEM.crt` with its key `STEM.key` in `dir`: subject `CN=cn`,
/// for `names`, an ECDSA P-256 or RSA 2048 key, valid until `until` (year, month, day) or
/// rcgen's default.
fn pair(dir: &Path, stem: &str, cn: &str, names: &[&str], rsa: bool, until: Option<(i32, u8, u8)>) {
    let key = match rsa {
        true => rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048),
        false => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
    }
    .unwrap();
    let mut params =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    if let Some((y, m, d)) = until {
        params.not_after = rcgen::date_time_ymd(y, m, d);
    }
    let cert = params.self_signed(&key).unwrap();
    // written beside and renamed in, as an operator's deploy tool would
    let tmp = dir.join(format!(".{stem}.tmp"));
    std::fs::write(&tmp, key.serialize_pem()).unwrap();
    std::fs::rename(&tmp, dir.join(format!("{stem}.key"))).unwrap();
    std::fs::write(&tmp, cert.pem()).unwrap();
    std::fs::rename(&tmp, dir.join(format!("{stem}.crt"))).unwrap();
}

/// `openssl s_client` to the agent with SNI `name` and `args`; its whole output.
fn handshake(agent: &Agent, name: &str, args: &[&str]) -> String {
    let mut all = vec!["-servername", name];
    all.extend_from_slice(args);
    text_of(&s_client(agent, &all, Duration::from_millis(200)))
}

/// The subject CN of the certificate the agent presents for `name` with `args`.
fn served_cn(agent: &Agent, name: &str, args: &[&str]) -> String {
    let out = handshake(agent, name, args);
    let line = out
        .lines()
        .find(|l| l.starts_with("subject="))
        .unwrap_or_else(|| panic!("no certificate in\n{out}"));
    line.rsplit("CN = ").next().unwrap().trim().to_string()
}

/// Whether the `openssl` command is here (the client, and the OCSP responder); if not, the
/// test is skipped, or fails under `BATON_REQUIRE_SERVERS`.
fn openssl_or_skip() -> bool {
    let found = Command::new("openssl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        require_or_skip("openssl", "s_client as the client, ocsp as the responder");
    }
    found
}

const ECDSA_ONLY: &[&str] = &["-sigalgs", "ECDSA+SHA256"];
const RSA_ONLY: &[&str] = &["-sigalgs", "RSA-PSS+SHA256:RSA+SHA256"];

/// Sends SIGHUP and waits until `baton_reloads_total{result}` reaches `n`.
fn reload(agent: &Agent, result: &str, n: f64) {
    agent.signal("HUP");
    let series = format!("baton_reloads_total{{result=\"{result}\"}}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while agent.metric(&series) < n {
        assert!(Instant::now() < deadline, "no {result} reload");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_cert_dir_is_chosen_by_sni_and_reloaded_whole() {
    if !openssl_or_skip() {
        return;
    }
    let dir = TempDir::new("cert-dir");
    let certs = dir.path("certs");
    std::fs::create_dir(&certs).unwrap();
    pair(
        &certs,
        "site-ecdsa",
        "site-ecdsa",
        &["site.test"],
        false,
        None,
    );
    pair(&certs, "site-rsa", "site-rsa", &["site.test"], true, None);
    pair(
        &certs,
        "other",
        "other-1",
        &["other.test", "*.other.test"],
        false,
        None,
    );
    let agent = Agent::start(&["--cert-dir", path_str(&certs)]);

    // one name, two keys: the client's capabilities choose; another name, its own
    assert_eq!(served_cn(&agent, "site.test", ECDSA_ONLY), "site-ecdsa");
    assert_eq!(served_cn(&agent, "site.test", RSA_ONLY), "site-rsa");
    assert_eq!(served_cn(&agent, "other.test", &[]), "other-1");
    assert_eq!(served_cn(&agent, "a.other.test", &[]), "other-1");

    // a file replaced: served after SIGHUP
    pair(&certs, "other", "other-2", &["other.test"], false, None);
    reload(&agent, "ok", 1.0);
    assert_eq!(served_cn(&agent, "other.test", &[]), "other-2");

    // a broken certificate, and a key without its certificate: the old set stays whole
    pair(&certs, "third", "third", &["third.test"], false, None);
    std::fs::write(certs.join("broken.crt"), "not a certificate").unwrap();
    std::fs::write(certs.join("broken.key"), "not a key").unwrap();
    reload(&agent, "failed", 1.0);
    assert_eq!(served_cn(&agent, "other.test", &[]), "other-2");
    assert_eq!(served_cn(&agent, "site.test", RSA_ONLY), "site-rsa");
    assert_ne!(served_cn(&agent, "third.test", &[]), "third");
    std::fs::remove_file(certs.join("broken.crt")).unwrap();
    reload(&agent, "failed", 2.0);
    assert_ne!(served_cn(&agent, "third.test", &[]), "third");
    std::fs::remove_file(certs.join("broken.key")).unwrap();
    reload(&agent, "ok", 2.0);
    assert_eq!(served_cn(&agent, "third.test", &[]), "third");
    assert_eq!(served_cn(&agent, "site.test", ECDSA_ONLY), "site-ecdsa");
}

/// notAfter of the first certificate in a PEM file, in Unix seconds.
fn not_after(pem: &Path) -> i64 {
    let cert = openssl::x509::X509::from_pem(&std::fs::read(pem).unwrap()).unwrap();
    let epoch = openssl::asn1::Asn1Time::from_unix(0).unwrap();
    let d = epoch.diff(cert.not_after()).unwrap();
    i64::from(d.days) * 86400 + i64::from(d.secs)
}

fn expiry(agent: &Agent, name: &str, key: &str) -> i64 {
    agent.metric(&format!(
        "baton_certificate_expiry_timestamp_seconds{{name=\"{name}\",key=\"{key}\"}}"
    )) as i64
}

#[test]
fn the_expiry_metric_is_each_served_certificates_not_after() {
    if !openssl_or_skip() {
        return;
    }
    let dir = TempDir::new("cert-expiry");
    let certs = dir.path("certs");
    std::fs::create_dir(&certs).unwrap();
    pair(
        dir.0.as_path(),
        "file",
        "file",
        &["file.test"],
        true,
        Some((2031, 5, 6)),
    );
    pair(
        &certs,
        "dir",
        "dir",
        &["dir.test", "www.dir.test"],
        false,
        Some((2030, 1, 2)),
    );
    let self_signed = dir.arg("self-signed.pem");
    let agent = Agent::start(&[
        "--cert",
        &dir.arg("file.crt"),
        "--key",
        &dir.arg("file.key"),
        "--cert-dir",
        path_str(&certs),
        "--self-signed",
        "ed25519",
        "--server-name",
        "self.test",
        "--self-signed-out",
        &self_signed,
    ]);
    let file = not_after(&dir.path("file.crt"));
    assert_eq!(expiry(&agent, "file.test", "rsa"), file);
    assert_eq!(
        expiry(&agent, "dir.test", "ecdsa"),
        not_after(&certs.join("dir.crt"))
    );
    assert_eq!(
        expiry(&agent, "self.test", "ed25519"),
        not_after(Path::new(&self_signed))
    );
    // one series per certificate, named by its first name
    let page = agent.metrics_text();
    assert_eq!(
        page.lines()
            .filter(|l| l.starts_with("baton_certificate_expiry_timestamp_seconds{"))
            .count(),
        3,
        "{page}"
    );

    // renewed on disk: the next scrape after the reload shows the new date
    pair(
        &certs,
        "dir",
        "dir",
        &["dir.test"],
        false,
        Some((2032, 7, 8)),
    );
    reload(&agent, "ok", 1.0);
    let renewed = not_after(&certs.join("dir.crt"));
    assert!(renewed > file);
    assert_eq!(expiry(&agent, "dir.test", "ecdsa"), renewed);
}

/// `openssl ocsp` answering for the certificates in `index`, killed on drop.
struct Responder(Child);

impl Responder {
    fn start(dir: &TempDir, port: u16) -> Responder {
        let child = Command::new("openssl")
            .args(["ocsp", "-index", &dir.arg("index.txt")])
            .args(["-port", &port.to_string()])
            .args(["-rsigner", &dir.arg("ca.pem"), "-rkey", &dir.arg("ca.key")])
            .args(["-CA", &dir.arg("ca.pem")])
            // responses valid for one minute: the shortest nextUpdate openssl offers
            .args(["-nmin", "1", "-ignore_err"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path("responder.log")).unwrap())
            .spawn()
            .expect("openssl ocsp");
        // Not a probe connection: one closed without a request wedges `openssl ocsp`.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(dir.path("responder.log"))
            .unwrap_or_default()
            .contains("waiting for OCSP client connections")
        {
            assert!(Instant::now() < deadline, "openssl ocsp does not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Responder(child)
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn openssl(dir: &TempDir, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(&dir.0)
        .output()
        .expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", text_of(&out));
}

/// A CA, and a certificate for `ocsp.test` it issued whose AIA names a responder on `port`;
/// `chain.pem` (leaf and CA), `leaf.key`, and the responder's `index.txt` saying it is good.
fn ocsp_pki(dir: &TempDir, port: u16) {
    openssl(
        dir,
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            "ca.key",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-subj",
            "/CN=Baton OCSP Test CA",
        ]
        .into_iter()
        .chain(["-days", "30", "-out", "ca.pem"])
        .collect::<Vec<_>>(),
    );
    openssl(
        dir,
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            "leaf.key",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-key",
            "leaf.key",
            "-subj",
            "/CN=ocsp.test",
            "-out",
            "leaf.csr",
        ],
    );
    std::fs::write(
        dir.path("ext.cnf"),
        format!(
            "subjectAltName=DNS:ocsp.test\nauthorityInfoAccess=OCSP;URI:http://127.0.0.1:{port}/\n"
        ),
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        ]
        .into_iter()
        .chain([
            "-set_serial",
            "0x1001",
            "-days",
            "30",
            "-extfile",
            "ext.cnf",
        ])
        .chain(["-out", "leaf.pem"])
        .collect::<Vec<_>>(),
    );
    let chain = std::fs::read_to_string(dir.path("leaf.pem")).unwrap()
        + &std::fs::read_to_string(dir.path("ca.pem")).unwrap();
    std::fs::write(dir.path("chain.pem"), chain).unwrap();
    // status, expiry (not checked by the responder), revocation, serial, file, subject
    std::fs::write(
        dir.path("index.txt"),
        "V\t361231235959Z\t\t1001\tunknown\t/CN=ocsp.test\n",
    )
    .unwrap();
}

fn fetches(agent: &Agent, outcome: &str) -> f64 {
    agent.metric(&format!(
        "baton_ocsp_fetches_total{{outcome=\"{outcome}\"}}"
    ))
}

/// What `openssl s_client -status` says of the staple: `None` when none was sent, else its
/// "Cert Status" and "Next Update" lines.
fn staple(agent: &Agent) -> Option<(String, String)> {
    let out = handshake(agent, "ocsp.test", &["-status"]);
    if out.contains("OCSP response: no response sent") {
        return None;
    }
    let field = |name: &str| {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(name).map(|v| v.trim().to_string()))
            .unwrap_or_else(|| panic!("no {name} in\n{out}"))
    };
    assert!(out.contains("OCSP Response Status: successful"), "{out}");
    Some((field("Cert Status:"), field("Next Update:")))
}

fn openssl_time(text: &str) -> i64 {
    // "Nov 28 22:29:02 2026 GMT", as s_client prints it
    let parsed = Command::new("date")
        .args(["-u", "-d", text, "+%s"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&parsed.stdout)
        .trim()
        .parse()
        .unwrap()
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[test]
fn ocsp_staples_are_fetched_checked_and_never_served_stale() {
    if !openssl_or_skip() {
        return;
    }
    let dir = TempDir::new("ocsp");
    let port = free_port();
    ocsp_pki(&dir, port);
    let responder = Responder::start(&dir, port);
    let chain = dir.arg("chain.pem");
    let key = dir.arg("leaf.key");
    let agent = Agent::start(&["--cert", &chain, "--key", &key]);
    let off = Agent::start(&["--cert", &chain, "--key", &key, "--ocsp-stapling", "off"]);
    let excepted = Agent::start(&[
        "--cert",
        &chain,
        "--key",
        &key,
        "--ocsp-stapling-except",
        "ocsp.test",
    ]);

    let deadline = Instant::now() + Duration::from_secs(20);
    let (status, next_update) = loop {
        if let Some(s) = staple(&agent) {
            break s;
        }
        assert!(Instant::now() < deadline, "no staple within 20 s");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(status, "good");
    assert!(fetches(&agent, "ok") >= 1.0);
    assert!(openssl_time(&next_update) > unix_now());
    assert_eq!(staple(&off), None);
    assert_eq!(staple(&excepted), None);
    assert_eq!(fetches(&off, "ok") + fetches(&excepted, "ok"), 0.0);

    // the responder goes away: the staple stays while valid, then goes, and none past its
    // nextUpdate is ever sent
    drop(responder);
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        let seen = staple(&agent);
        let now = unix_now();
        match seen {
            None => break,
            Some((status, next)) => {
                assert_eq!(status, "good");
                assert!(
                    openssl_time(&next) > now,
                    "a stale staple: next update {next}, now {now}"
                );
            }
        }
        assert!(Instant::now() < deadline, "the staple was never dropped");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(fetches(&agent, "fetch_failed") >= 1.0);
    // and it does not come back while the responder is down
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(staple(&agent), None);
}
