//! Private-key offload: a real `baton signer` holding the keys, a real `baton agent
//! --key-signer` using it, real clients (rustls, `openssl s_client`); the signer killed,
//! stalled and restarted under the agent.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_signer::auth::AuthKey;
use baton_signer::client::{Client, ClientError};
use baton_signer::keys::key_id;
use baton_signer::protocol::ErrorCode;
use common::*;
use rustls::sign::SigningKey;
use rustls::SignatureScheme;

/// A running `baton signer`, killed on drop.
struct Signer {
    child: Child,
    socket: PathBuf,
}

impl Signer {
    fn start(socket: &std::path::Path, auth: &str, args: &[&str]) -> Signer {
        Self::start_with_env(socket, auth, args, &[])
    }

    /// Starts `baton signer` with extra environment (SOFTHSM2_CONF) and waits for `ready`.
    fn start_with_env(
        socket: &std::path::Path,
        auth: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Signer {
        use std::io::BufRead;
        let mut child = Command::new(BATON)
            .arg("signer")
            .args(["--listen", &format!("unix:{}", socket.display())])
            .args(["--auth-key-file", auth])
            .args(args)
            .envs(env.iter().copied())
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn baton signer");
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        loop {
            match lines.next() {
                Some(Ok(l)) if l == "ready" => break,
                Some(Ok(_)) => {}
                _ => panic!("baton signer exited before ready: {:?}", child.wait()),
            }
        }
        Signer {
            child,
            socket: socket.to_path_buf(),
        }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig}");
    }
}

impl Drop for Signer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TLS address for the helpers that take an endpoint.
struct Addr(std::net::SocketAddr);

impl Endpoint for Addr {
    fn tls_addr(&self) -> std::net::SocketAddr {
        self.0
    }
}

/// A fresh auth key file (mode 0600, as the signer and agent require).
fn auth_key(dir: &TempDir, name: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let out = Command::new("openssl")
        .args(["rand", "-hex", "32"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let path = dir.path(name);
    std::fs::write(&path, &out.stdout).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.to_str().unwrap().to_string()
}

fn local_key(pki: &Pki, name: &str) -> Arc<dyn SigningKey> {
    rustls::crypto::aws_lc_rs::sign::any_supported_type(&pki.key(name)).unwrap()
}

/// Checks `sig` over `message` with OpenSSL (an independent implementation) and the public
/// key's SPKI.
fn openssl_verifies(spki: &[u8], scheme: SignatureScheme, message: &[u8], sig: &[u8]) -> bool {
    use openssl::hash::MessageDigest;
    use openssl::rsa::Padding;
    use openssl::sign::{RsaPssSaltlen, Verifier};
    let key = openssl::pkey::PKey::public_key_from_der(spki).unwrap();
    let (md, pss) = match scheme {
        SignatureScheme::RSA_PSS_SHA256 => (MessageDigest::sha256(), true),
        SignatureScheme::RSA_PSS_SHA384 => (MessageDigest::sha384(), true),
        SignatureScheme::RSA_PSS_SHA512 => (MessageDigest::sha512(), true),
        SignatureScheme::RSA_PKCS1_SHA256 | SignatureScheme::ECDSA_NISTP256_SHA256 => {
            (MessageDigest::sha256(), false)
        }
        SignatureScheme::RSA_PKCS1_SHA384 | SignatureScheme::ECDSA_NISTP384_SHA384 => {
            (MessageDigest::sha384(), false)
        }
        SignatureScheme::RSA_PKCS1_SHA512 => (MessageDigest::sha512(), false),
        other => panic!("unexpected scheme {other:?}"),
    };
    let mut v = Verifier::new(md, &key).unwrap();
    if pss {
        v.set_rsa_padding(Padding::PKCS1_PSS).unwrap();
        v.set_rsa_pss_saltlen(RsaPssSaltlen::DIGEST_LENGTH).unwrap();
        v.set_rsa_mgf1_md(md).unwrap();
    }
    v.verify_oneshot(sig, message).unwrap_or(false)
}

/// Signs with every scheme of the signer's RSA and ECDSA keys (the test PKI's), checking each
/// signature with OpenSSL against the key's public key; the number of signatures.
fn round_trip(client: &Client, pki: &Pki) -> usize {
    let keys = client.list_keys().unwrap();
    let mut signed = 0;
    for (name, expected_schemes) in [("rsa.key", 6), ("ecdsa.key", 1)] {
        let local = local_key(pki, name);
        let spki = local.public_key().unwrap().to_vec();
        let info = keys
            .iter()
            .find(|k| k.key_id == key_id(&spki))
            .unwrap_or_else(|| panic!("{name} not listed"));
        assert_eq!(info.spki, spki);
        assert_eq!(info.schemes.len(), expected_schemes, "{name}");
        for scheme in &info.schemes {
            let scheme = SignatureScheme::from(*scheme);
            let message = format!("{name} {scheme:?} transcript").into_bytes();
            let sig = client.sign(&info.key_id, scheme, &message).unwrap();
            assert!(
                openssl_verifies(&spki, scheme, &message, &sig),
                "{name} {scheme:?}"
            );
            assert!(!openssl_verifies(&spki, scheme, b"another message", &sig));
            signed += 1;
        }
    }
    signed
}

#[test]
fn signer_round_trip_with_rsa_and_ecdsa_keys_and_refuses_a_wrong_auth_key() {
    let pki = Pki::new();
    let dir = TempDir::new("signer-rt");
    let auth = auth_key(&dir, "auth");
    let socket = dir.path("s.sock");
    let _signer = Signer::start(
        &socket,
        &auth,
        &["--key", &pki.arg("rsa.key"), "--key", &pki.arg("ecdsa.key")],
    );
    let client = Client::new(
        &socket,
        AuthKey::from_file(auth.as_ref()).unwrap(),
        Duration::from_secs(5),
    );
    let keys = client.list_keys().unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(round_trip(&client, &pki), 7);
    assert_eq!(
        client.metrics.outcome(baton_signer::metrics::Outcome::Ok),
        7
    );

    // A key the signer does not hold, a scheme the key does not sign with: refused, and the
    // connection stays usable.
    let ec = keys.iter().find(|k| k.schemes.len() == 1).unwrap();
    match client.sign(&[9; 32], SignatureScheme::ECDSA_NISTP256_SHA256, b"m") {
        Err(ClientError::Refused { code, .. }) => assert_eq!(code, ErrorCode::UnknownKey),
        other => panic!("unknown key: {other:?}"),
    }
    match client.sign(&ec.key_id, SignatureScheme::RSA_PSS_SHA256, b"m") {
        Err(ClientError::Refused { code, .. }) => assert_eq!(code, ErrorCode::UnsupportedScheme),
        other => panic!("wrong scheme: {other:?}"),
    }
    client
        .sign(&ec.key_id, SignatureScheme::ECDSA_NISTP256_SHA256, b"m")
        .unwrap();

    // A local process without the auth key gets nothing listed or signed.
    let wrong = Client::new(
        &socket,
        AuthKey::from_file(auth_key(&dir, "other").as_ref()).unwrap(),
        Duration::from_secs(5),
    );
    match wrong.list_keys() {
        Err(ClientError::Refused { code, .. }) => assert_eq!(code, ErrorCode::Unauthenticated),
        other => panic!("wrong auth key: {other:?}"),
    }
    match wrong.sign(&ec.key_id, SignatureScheme::ECDSA_NISTP256_SHA256, b"m") {
        Err(ClientError::Refused { code, .. }) => assert_eq!(code, ErrorCode::Unauthenticated),
        other => panic!("wrong auth key: {other:?}"),
    }
}

/// `--cert` for the ECDSA and RSA certificates, no keys, and the signer flags.
fn signer_agent_args(pki: &Pki, socket: &std::path::Path, auth: &str) -> Vec<String> {
    vec![
        "--cert".into(),
        pki.arg("ecdsa.pem"),
        "--cert".into(),
        pki.arg("rsa.pem"),
        "--key-signer".into(),
        format!("unix:{}", socket.display()),
        "--key-signer-auth-key-file".into(),
        auth.into(),
    ]
}

fn start_agent(args: &[String], extra: &[&str]) -> Agent {
    let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
    all.extend_from_slice(extra);
    Agent::start(&all)
}

fn signer_metric(agent: &Agent, result: &str) -> f64 {
    agent.metric(&format!(
        "baton_key_signer_requests_total{{result=\"{result}\"}}"
    ))
}

/// openssl s_client: each version with each key type and signature kind, checked by the
/// signature it saw and a verified chain.
fn serves_every_version_and_key_type(agent: &Agent, pki: &Pki) {
    let ca = pki.arg("ca.pem");
    for (version, sigalgs, kind) in [
        ("-tls1_3", "ECDSA+SHA256", "ECDSA"),
        ("-tls1_3", "RSA-PSS+SHA256", "RSA-PSS"),
        ("-tls1_2", "ECDSA+SHA256", "ECDSA"),
        ("-tls1_2", "RSA+SHA256", "RSA"),
        ("-tls1_2", "RSA-PSS+SHA256", "RSA-PSS"),
    ] {
        let out = s_client(
            agent,
            &[
                version,
                "-sigalgs",
                sigalgs,
                "-CAfile",
                &ca,
                "-servername",
                "localhost",
            ],
            Duration::from_millis(300),
        );
        let text = text_of(&out);
        let want = if version == "-tls1_3" {
            "TLSv1.3"
        } else {
            "TLSv1.2"
        };
        assert!(
            text.contains(&format!("Protocol  : {want}")) || text.contains(&format!("New, {want}")),
            "{version} {sigalgs}: {text}"
        );
        assert!(
            text.contains(&format!("Peer signature type: {kind}")),
            "{version} {sigalgs}: {text}"
        );
        assert!(
            text.contains("Verify return code: 0 (ok)"),
            "{version} {sigalgs}: {text}"
        );
    }
}

#[test]
fn agent_with_key_signer_serves_tls12_and_tls13_with_rsa_and_ecdsa() {
    let pki = Pki::new();
    let dir = TempDir::new("signer-agent");
    let auth = auth_key(&dir, "auth");
    let socket = dir.path("s.sock");
    let _signer = Signer::start(
        &socket,
        &auth,
        &["--key", &pki.arg("rsa.key"), "--key", &pki.arg("ecdsa.key")],
    );
    let agent = start_agent(&signer_agent_args(&pki, &socket, &auth), &[]);

    serves_every_version_and_key_type(&agent, &pki);

    // rustls, both versions (it verifies the chain and the signature).
    for v in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let config = full_handshakes(&pki, v);
        let got = fetch(&agent, &config, "/").unwrap();
        assert_eq!(got.status, 200);
    }

    // Every signature came from the signer; none was made in the agent.
    assert!(signer_metric(&agent, "ok") >= 7.0);
    assert_eq!(
        agent.metric("baton_crypto_operations_total{op=\"sign\"}"),
        0.0
    );
    assert!(agent.metric("baton_crypto_operations_total{op=\"sign_remote\"}") >= 7.0);
}

#[test]
fn signer_killed_or_stalled_fails_handshakes_cleanly_and_the_agent_recovers() {
    let pki = Pki::new();
    let dir = TempDir::new("signer-kill");
    let auth = auth_key(&dir, "auth");
    let socket = dir.path("s.sock");
    let keys = ["--key", &pki.arg("rsa.key"), "--key", &pki.arg("ecdsa.key")];
    let signer = Signer::start(&socket, &auth, &keys);
    // A long handshake timeout: a handshake that hung on the signer would show as one taking
    // that long, not as a quick failure.
    let agent = start_agent(
        &signer_agent_args(&pki, &socket, &auth),
        &["--key-signer-timeout", "1s", "--handshake-timeout", "60s"],
    );
    let config = full_handshakes(&pki, &rustls::version::TLS13);
    assert_eq!(fetch(&agent, &config, "/").unwrap().status, 200);

    // Killed mid-run, under load from four clients: handshakes in flight and after fail
    // (nothing listens) instead of hanging, and every client thread finishes.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (stop, config, agent_addr) = (stop.clone(), config.clone(), agent.addr);
            std::thread::spawn(move || {
                let target = Addr(agent_addr);
                let (mut ok, mut failed) = (0, 0);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match fetch(&target, &config, "/") {
                        Ok(_) => ok += 1,
                        Err(_) => failed += 1,
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    signer.signal("KILL");
    drop(signer);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let stopped = Instant::now();
    let (mut ok, mut failed) = (0, 0);
    for c in clients {
        let (o, f) = c.join().unwrap();
        ok += o;
        failed += f;
    }
    assert!(
        stopped.elapsed() < Duration::from_secs(20),
        "clients hung for {:?}",
        stopped.elapsed()
    );
    assert!(ok > 0 && failed > 0, "ok {ok} failed {failed}");
    for _ in 0..3 {
        let start = Instant::now();
        let err = fetch(&agent, &config, "/").err().expect("handshake fails");
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "a failed handshake took {:?}: {err}",
            start.elapsed()
        );
    }
    assert!(signer_metric(&agent, "unreachable") >= 3.0);
    let out = s_client(&agent, &["-tls1_2"], Duration::from_millis(100));
    let text = text_of(&out);
    assert!(
        !out.status.success() && text.contains("Cipher is (NONE)"),
        "{text}"
    );

    // Restarted on the same path: the agent's next handshake uses it (stale pooled
    // connections are dropped and replaced).
    let signer = Signer::start(&socket, &auth, &keys);
    assert_eq!(fetch(&agent, &config, "/").unwrap().status, 200);
    assert_eq!(fetch(&agent, &config, "/").unwrap().status, 200);

    // Stalled (SIGSTOP): the signer accepts nothing; each handshake gives up after the
    // --key-signer-timeout instead of waiting for the signer.
    signer.signal("STOP");
    let start = Instant::now();
    let err = fetch(&agent, &config, "/").err().expect("handshake fails");
    let took = start.elapsed();
    signer.signal("CONT");
    assert!(took < Duration::from_secs(20), "took {took:?}: {err}");
    assert!(signer_metric(&agent, "timeout") >= 1.0);
    // the agent counts these failed handshakes as the signer's (killed and stalled runs)
    assert!(agent.metric("baton_handshake_failures_total{reason=\"signer\"}") >= 4.0);
    assert_eq!(
        agent.metric("baton_handshake_failures_total{reason=\"other\"}"),
        0.0
    );
    // and recovers once it runs again
    assert_eq!(fetch(&agent, &config, "/").unwrap().status, 200);
    assert_eq!(socket, signer.socket);
}

#[test]
fn fallback_local_keeps_serving_while_the_signer_is_gone() {
    let pki = Pki::new();
    let dir = TempDir::new("signer-fallback");
    let auth = auth_key(&dir, "auth");
    let socket = dir.path("s.sock");
    let signer = Signer::start(&socket, &auth, &["--key", &pki.arg("ecdsa.key")]);
    let agent = Agent::start(&[
        "--cert",
        &pki.arg("ecdsa.pem"),
        "--key",
        &pki.arg("ecdsa.key"),
        "--key-signer",
        &format!("unix:{}", socket.display()),
        "--key-signer-auth-key-file",
        &auth,
        "--key-signer-fallback",
        "local",
    ]);
    let config = full_handshakes(&pki, &rustls::version::TLS13);
    assert_eq!(fetch(&agent, &config, "/").unwrap().status, 200);
    assert_eq!(agent.metric("baton_key_signer_fallbacks_total"), 0.0);
    assert_eq!(
        agent.metric("baton_crypto_operations_total{op=\"sign\"}"),
        0.0
    );
    drop(signer);
    for _ in 0..3 {
        assert_eq!(fetch(&agent, &config, "/").unwrap().status, 200);
    }
    assert_eq!(agent.metric("baton_key_signer_fallbacks_total"), 3.0);
    // the fallback signs in-process, and is metered as such
    assert_eq!(
        agent.metric("baton_crypto_operations_total{op=\"sign\"}"),
        3.0
    );
}

/// A client that never resumes: every connection is a full handshake, with a signature.
fn full_handshakes(
    pki: &Pki,
    v: &'static rustls::SupportedProtocolVersion,
) -> Arc<rustls::ClientConfig> {
    let mut config = pki.client(&[v], None);
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

/// Runs `baton agent ARGS` expecting it to refuse to start; its stderr.
fn agent_refuses(args: &[String]) -> String {
    let out = Command::new(BATON)
        .arg("agent")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .output()
        .unwrap();
    assert!(!out.status.success(), "agent started with {args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn agent_start_checks_the_signer_holds_the_key() {
    let pki = Pki::new();
    let dir = TempDir::new("signer-start");
    let auth = auth_key(&dir, "auth");
    let socket = dir.path("s.sock");
    let args = signer_agent_args(&pki, &socket, &auth);

    // No signer there (fail closed: no key to serve with).
    let e = agent_refuses(&args);
    assert!(e.contains("unreachable"), "{e}");

    // A signer without the RSA certificate's key.
    let _signer = Signer::start(&socket, &auth, &["--key", &pki.arg("ecdsa.key")]);
    let e = agent_refuses(&args);
    assert!(e.contains("holds no key") && e.contains("rsa.pem"), "{e}");

    // The wrong auth key.
    let mut wrong = signer_agent_args(&pki, &socket, &auth_key(&dir, "other"));
    wrong.drain(2..4);
    let e = agent_refuses(&wrong);
    assert!(e.contains("unauthenticated"), "{e}");
}

/// A SoftHSM2 token in a temporary directory holding the test PKI's RSA and ECDSA keys; the
/// environment to reach it. `None` (test skipped) when SoftHSM2 is not installed.
fn softhsm_token(pki: &Pki, dir: &TempDir) -> Option<(String, Vec<(&'static str, String)>)> {
    let module = [
        "/usr/lib/softhsm/libsofthsm2.so",
        "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
    ]
    .into_iter()
    .find(|m| std::path::Path::new(m).exists());
    let (Some(module), Ok(_)) = (
        module,
        Command::new("softhsm2-util").arg("--version").output(),
    ) else {
        require_or_skip("softhsm2", "a PKCS#11 token");
        return None;
    };
    std::fs::create_dir_all(dir.path("tokens")).unwrap();
    let conf = dir.path("softhsm2.conf");
    std::fs::write(
        &conf,
        format!(
            "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
            dir.arg("tokens")
        ),
    )
    .unwrap();
    let env = vec![("SOFTHSM2_CONF", conf.to_str().unwrap().to_string())];
    let util = |args: &[&str]| {
        let out = Command::new("softhsm2-util")
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "softhsm2-util {args:?}: {}",
            text_of(&out)
        );
    };
    util(&[
        "--init-token",
        "--free",
        "--label",
        "baton",
        "--so-pin",
        "5678",
        "--pin",
        "1234",
    ]);
    // rcgen writes PKCS#8 PEM, which is what --import reads.
    for (name, id) in [("rsa", "01"), ("ecdsa", "02")] {
        let key = pki.arg(&format!("{name}.key"));
        util(&[
            "--import", &key, "--token", "baton", "--label", name, "--id", id, "--pin", "1234",
        ]);
    }
    std::fs::write(dir.path("pin"), "1234\n").unwrap();
    Some((module.to_string(), env))
}

#[test]
fn pkcs11_token_keys_sign_and_serve_tls() {
    let pki = Pki::new();
    let dir = TempDir::new("signer-pkcs11");
    let Some((module, env)) = softhsm_token(&pki, &dir) else {
        return;
    };
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let auth = auth_key(&dir, "auth");
    let socket = dir.path("s.sock");
    let pin = dir.arg("pin");
    let _signer = Signer::start_with_env(
        &socket,
        &auth,
        &[
            "--pkcs11-module",
            &module,
            "--pkcs11-token",
            "baton",
            "--pkcs11-pin-file",
            &pin,
        ],
        &env,
    );
    // The token's keys are named by their public keys like file keys, and every scheme
    // (PKCS#1, PSS with each hash, ECDSA) verifies.
    let client = Client::new(
        &socket,
        AuthKey::from_file(auth.as_ref()).unwrap(),
        Duration::from_secs(5),
    );
    assert_eq!(client.list_keys().unwrap().len(), 2);
    assert_eq!(round_trip(&client, &pki), 7);

    let agent = start_agent(&signer_agent_args(&pki, &socket, &auth), &[]);
    serves_every_version_and_key_type(&agent, &pki);
    for v in [&rustls::version::TLS13, &rustls::version::TLS12] {
        assert_eq!(
            fetch(&agent, &full_handshakes(&pki, v), "/")
                .unwrap()
                .status,
            200
        );
    }
    assert_eq!(
        agent.metric("baton_crypto_operations_total{op=\"sign\"}"),
        0.0
    );
}
