//! A real rustls client and server, connected in memory: the first flights they produce must
//! parse, and resumption must show up where the dispatcher's session affinity looks for it
//! (TLS 1.3 PSK identity, TLS 1.2 session id echoed from the ServerHello).

use std::sync::Arc;

use baton_wire::{
    ClientHello, HelloReader, NamedGroup, Progress, ProtocolVersion, ServerHello, ServerHelloReader,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{aws_lc_rs, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    ClientConfig, ClientConnection, DigitallySignedStruct, ServerConfig, ServerConnection,
    SupportedProtocolVersion,
};

/// The test trusts whatever the in-memory server presents; only the hellos are under test.
#[derive(Debug)]
struct AcceptAnyCert(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn client(versions: &[&'static SupportedProtocolVersion]) -> Arc<ClientConfig> {
    let provider = Arc::new(aws_lc_rs::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config.enable_early_data = true;
    Arc::new(config)
}

fn server(provider: CryptoProvider) -> Arc<ServerConfig> {
    let cert =
        CertificateDer::from_pem_slice(include_bytes!("../testdata/rustls-cert.pem")).unwrap();
    let key = PrivateKeyDer::from_pem_slice(include_bytes!("../testdata/rustls-key.pem")).unwrap();
    let mut config = ServerConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    config.max_early_data_size = 1024;
    Arc::new(config)
}

fn drain(from: &mut impl FnMut(&mut Vec<u8>) -> bool) -> Vec<u8> {
    let mut out = Vec::new();
    while from(&mut out) {}
    out
}

/// Runs one connection to completion; returns the client's and the server's first flights.
fn connect(client: &Arc<ClientConfig>, server: &Arc<ServerConfig>) -> (Vec<u8>, Vec<u8>) {
    let mut c =
        ClientConnection::new(client.clone(), "rustls.example".try_into().unwrap()).unwrap();
    let mut s = ServerConnection::new(server.clone()).unwrap();
    let mut flights = Vec::new();
    for _ in 0..10 {
        let c2s = drain(&mut |out| c.wants_write() && c.write_tls(out).unwrap() > 0);
        let mut rd = &c2s[..];
        while !rd.is_empty() {
            s.read_tls(&mut rd).unwrap();
            s.process_new_packets().unwrap();
        }
        let s2c = drain(&mut |out| s.wants_write() && s.write_tls(out).unwrap() > 0);
        let mut rd = &s2c[..];
        while !rd.is_empty() {
            c.read_tls(&mut rd).unwrap();
            c.process_new_packets().unwrap();
        }
        if c2s.is_empty() && s2c.is_empty() {
            break;
        }
        flights.push((c2s, s2c));
    }
    assert!(!c.is_handshaking() && !s.is_handshaking());
    flights.into_iter().next().unwrap()
}

fn client_hello(wire: &[u8]) -> ClientHello {
    match HelloReader::new().push(wire) {
        Ok(Progress::Done(h, _)) => h,
        other => panic!("{other:?}"),
    }
}

fn server_hello(wire: &[u8]) -> ServerHello {
    match ServerHelloReader::new().push(wire) {
        Ok(Progress::Done(h, _)) => h,
        other => panic!("{other:?}"),
    }
}

#[test]
fn tls13_full_then_resumed_with_a_psk_identity() {
    let client = client(&[&rustls::version::TLS13]);
    let server = server(aws_lc_rs::default_provider());

    let (ch, sh) = connect(&client, &server);
    let hello = client_hello(&ch);
    assert_eq!(hello.server_name(), Some("rustls.example"));
    assert_eq!(
        hello.alpn_protocols(),
        Some(&[b"h2".to_vec(), b"http/1.1".to_vec()][..])
    );
    assert_eq!(hello.max_version(), ProtocolVersion::TLSV1_3);
    assert!(
        hello
            .key_share_groups()
            .any(|g| g == (NamedGroup::X25519_MLKEM768, 1216)),
        "post-quantum share first: {:?}",
        hello.key_share_groups().collect::<Vec<_>>()
    );
    assert!(hello.pre_shared_key().is_none());
    let sh = server_hello(&sh);
    assert!(sh.is_tls13() && !sh.is_hello_retry_request());
    assert_eq!(
        sh.session_id, hello.session_id,
        "TLS 1.3 echoes the legacy session id"
    );

    let (ch, _) = connect(&client, &server);
    let resumed = client_hello(&ch);
    let psk = resumed
        .pre_shared_key()
        .expect("second connection offers the ticket");
    assert!(!psk.identities[0].identity.is_empty());
    assert!(
        resumed.early_data(),
        "the ticket allows 0-RTT and the client enabled it"
    );
}

#[test]
fn tls12_resumption_sends_the_session_id_the_server_hello_gave() {
    let client = client(&[&rustls::version::TLS12]);
    let server = server(aws_lc_rs::default_provider());

    let (ch, sh) = connect(&client, &server);
    let hello = client_hello(&ch);
    assert!(!hello.offers_tls13());
    assert_eq!(hello.max_version(), ProtocolVersion::TLSV1_2);
    let sh = server_hello(&sh);
    assert_eq!(sh.version(), ProtocolVersion::TLSV1_2);
    let id = sh
        .tls12_session_id()
        .expect("the server caches the session")
        .to_vec();

    let (ch, sh) = connect(&client, &server);
    assert_eq!(
        client_hello(&ch).session_id,
        id,
        "the dispatcher routes on this"
    );
    assert_eq!(
        server_hello(&sh).tls12_session_id(),
        Some(&id[..]),
        "resumed"
    );
}

#[test]
fn hello_retry_request_is_recognised() {
    let client = client(&[&rustls::version::TLS13]);
    let mut provider = aws_lc_rs::default_provider();
    provider.kx_groups = vec![aws_lc_rs::kx_group::SECP384R1];
    let server = server(provider);
    let (ch, sh) = connect(&client, &server);
    assert!(client_hello(&ch)
        .supported_groups()
        .unwrap()
        .contains(&NamedGroup::SECP384R1));
    let sh = server_hello(&sh);
    assert!(sh.is_hello_retry_request());
    assert!(sh.is_tls13());
}
