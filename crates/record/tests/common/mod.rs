//! A real rustls handshake in memory (no sockets), then the migration step: the server's
//! secrets are extracted (`dangerous_extract_secrets`) and, for TLS 1.3, the traffic secrets
//! taken from a key log that keeps them in memory, and turned into [`SessionKeys`]. The
//! rustls client goes on talking to whatever holds those keys. The agent's handoff code
//! follows the same steps; copy this pattern.

#![allow(dead_code)] // each test binary uses a different part

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};

use baton_record::{DirectionSecrets, SessionKeys, Suite, Version};
use rustls::crypto::aws_lc_rs::{self as provider, cipher_suite};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{
    ClientConfig, ClientConnection, ConnectionTrafficSecrets, KeyLog, RootCertStore, ServerConfig,
    ServerConnection, SupportedCipherSuite,
};
use zeroize::Zeroizing;

/// A `KeyLog` that keeps the secrets it is given in memory, keyed by client random, for the
/// migration to pick up. Nothing is written anywhere.
#[derive(Default, Debug)]
pub struct MemoryKeyLog {
    entries: Mutex<Vec<LogEntry>>,
}

/// Label, client random, secret.
type LogEntry = (String, Vec<u8>, Zeroizing<Vec<u8>>);

impl KeyLog for MemoryKeyLog {
    fn log(&self, label: &str, client_random: &[u8], secret: &[u8]) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.push((
                label.to_owned(),
                client_random.to_vec(),
                Zeroizing::new(secret.to_vec()),
            ));
        }
    }

    fn will_log(&self, label: &str) -> bool {
        matches!(label, "CLIENT_TRAFFIC_SECRET_0" | "SERVER_TRAFFIC_SECRET_0")
    }
}

impl MemoryKeyLog {
    /// The secret logged under `label` for the connection with this client random (the
    /// caller knows it from the ClientHello; the tests have one connection per log, so
    /// `None` takes the only one).
    pub fn take(&self, label: &str, client_random: Option<&[u8]>) -> Option<Zeroizing<Vec<u8>>> {
        let mut entries = self.entries.lock().ok()?;
        let at = entries
            .iter()
            .position(|(l, r, _)| l == label && client_random.is_none_or(|c| c == r))?;
        Some(entries.remove(at).2)
    }
}

/// The rustls suite for a (version, AEAD) pair, with an ECDSA certificate for TLS 1.2.
pub fn rustls_suite(version: Version, suite: Suite) -> SupportedCipherSuite {
    match (version, suite) {
        (Version::Tls12, Suite::Aes128Gcm) => cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        (Version::Tls12, Suite::Aes256Gcm) => cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        (Version::Tls12, Suite::Chacha20Poly1305) => {
            cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        }
        (Version::Tls13, Suite::Aes128Gcm) => cipher_suite::TLS13_AES_128_GCM_SHA256,
        (Version::Tls13, Suite::Aes256Gcm) => cipher_suite::TLS13_AES_256_GCM_SHA384,
        (Version::Tls13, Suite::Chacha20Poly1305) => cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    }
}

/// A rustls client and the migrated server session's keys, right after the handshake: the
/// server's tickets (TLS 1.3) were delivered to the client, nothing else is in flight.
pub struct Migrated {
    /// The client, still talking.
    pub client: ClientConnection,
    /// What the home agent needs.
    pub keys: SessionKeys,
}

/// Runs a full handshake for `version` and `suite` and migrates the server side.
pub fn handshake(version: Version, suite: Suite) -> Migrated {
    let mut provider = provider::default_provider();
    provider.cipher_suites = vec![rustls_suite(version, suite)];
    let provider = Arc::new(provider);
    let versions: &[&rustls::SupportedProtocolVersion] = match version {
        Version::Tls12 => &[&rustls::version::TLS12],
        Version::Tls13 => &[&rustls::version::TLS13],
    };

    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = CertificateDer::from(certified.cert.der().to_vec());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        certified.signing_key.serialize_der(),
    ));

    let key_log = Arc::new(MemoryKeyLog::default());
    let mut server_config = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .unwrap();
    server_config.enable_secret_extraction = true;
    server_config.key_log = key_log.clone();

    let mut roots = RootCertStore::empty();
    roots.add(cert).unwrap();
    let client_config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();

    let mut client = ClientConnection::new(
        Arc::new(client_config),
        ServerName::try_from("localhost").unwrap(),
    )
    .unwrap();
    let mut server = ServerConnection::new(Arc::new(server_config)).unwrap();

    // Until both are done and the server's tickets have reached the client.
    for _ in 0..20 {
        move_tls_to_server(&mut client, &mut server);
        move_tls_to_client(&mut server, &mut client);
        if !client.is_handshaking()
            && !server.is_handshaking()
            && !server.wants_write()
            && !client.wants_write()
        {
            break;
        }
    }
    assert!(!client.is_handshaking() && !server.is_handshaking());
    let negotiated = server.negotiated_cipher_suite().unwrap();
    assert_eq!(negotiated.suite(), rustls_suite(version, suite).suite());

    let secrets = server.dangerous_extract_secrets().unwrap();
    let traffic_secret = |label| match version {
        Version::Tls12 => None,
        Version::Tls13 => Some(key_log.take(label, None).expect("key log has the secret")),
    };
    let keys = SessionKeys {
        version,
        suite,
        tx: direction(secrets.tx, traffic_secret("SERVER_TRAFFIC_SECRET_0")),
        rx: direction(secrets.rx, traffic_secret("CLIENT_TRAFFIC_SECRET_0")),
    };
    Migrated { client, keys }
}

/// rustls' extracted (sequence, secrets) of one direction as [`DirectionSecrets`].
pub fn direction(
    (seq, secrets): (u64, ConnectionTrafficSecrets),
    traffic_secret: Option<Zeroizing<Vec<u8>>>,
) -> DirectionSecrets {
    let (key, iv) = match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv }
        | ConnectionTrafficSecrets::Aes256Gcm { key, iv }
        | ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (key, iv),
        _ => panic!("a suite Baton does not migrate"),
    };
    DirectionSecrets {
        seq,
        key: Zeroizing::new(key.as_ref().to_vec()),
        iv: iv.as_ref().try_into().unwrap(),
        traffic_secret,
    }
}

fn move_tls_to_server(client: &mut ClientConnection, server: &mut ServerConnection) {
    let mut buf = Vec::new();
    while client.wants_write() {
        client.write_tls(&mut buf).unwrap();
    }
    let mut rest = &buf[..];
    while !rest.is_empty() {
        server.read_tls(&mut rest).unwrap();
        server.process_new_packets().unwrap();
    }
}

fn move_tls_to_client(server: &mut ServerConnection, client: &mut ClientConnection) {
    let mut buf = Vec::new();
    while server.wants_write() {
        server.write_tls(&mut buf).unwrap();
    }
    let mut rest = &buf[..];
    while !rest.is_empty() {
        client.read_tls(&mut rest).unwrap();
        client.process_new_packets().unwrap();
    }
}

/// Everything the client wants to send, as bytes.
pub fn client_output(client: &mut ClientConnection) -> Vec<u8> {
    let mut buf = Vec::new();
    while client.wants_write() {
        client.write_tls(&mut buf).unwrap();
    }
    buf
}

/// Feeds `bytes` to the client and returns the plaintext it reads (and whether it saw a
/// clean close). Drains as it goes, so rustls' plaintext limit never fills up.
pub fn client_input(client: &mut ClientConnection, bytes: &[u8]) -> (Vec<u8>, bool) {
    let mut plaintext = Vec::new();
    let mut rest = bytes;
    let mut closed = false;
    loop {
        if !rest.is_empty() {
            client.read_tls(&mut rest).unwrap();
        }
        let state = client.process_new_packets().unwrap();
        let mut buf = vec![0u8; state.plaintext_bytes_to_read()];
        client.reader().read_exact(&mut buf).unwrap();
        plaintext.extend(buf);
        closed |= state.peer_has_closed();
        if rest.is_empty() {
            return (plaintext, closed);
        }
    }
}

/// Writes all of `data` through the client (its writer takes a bounded amount at a time)
/// and returns the ciphertext.
pub fn client_send(client: &mut ClientConnection, data: &[u8]) -> Vec<u8> {
    let mut wire = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let n = client.writer().write(rest).unwrap();
        rest = &rest[n..];
        wire.extend(client_output(client));
    }
    wire
}

/// A deterministic stream of chunk sizes in 1..=max (xorshift), for splitting a byte stream
/// at arbitrary points.
pub struct Chunks(u64);

impl Chunks {
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    pub fn next(&mut self, max: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        1 + (self.0 % max as u64) as usize
    }
}
