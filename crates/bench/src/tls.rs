//! Client TLS configuration: versions, suites, groups, signature schemes, verification, client
//! certificate, ALPN, and each virtual client's own session store.
//!
//! A virtual client is one browser: it remembers its last session and resumes it until the
//! schedule says "full handshake", when it forgets it ([`ClientSessions::forget`]). One
//! `ClientConfig` per virtual client, built once: nothing is rebuilt per connection.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, Context};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{
    ClientSessionStore, Resumption, Tls12ClientSessionValue, Tls12Resumption,
    Tls13ClientSessionValue,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, NamedGroup, SignatureScheme};

use crate::config::{BenchConfig, Resume};

/// TLS 1.3 tickets a client keeps (servers send two per handshake by default).
const MAX_TICKETS: usize = 8;

/// One virtual client's sessions: its last TLS 1.2 session and its TLS 1.3 tickets.
///
/// With `--resume none` it keeps no session at all, only the key exchange group the server
/// chose: like any rustls client, the next ClientHello then carries one key share of that group
/// instead of a hybrid post-quantum share the server would not use (which would cost the client
/// an ML-KEM key generation per handshake that h2load and browsers talking to a classical
/// server do not pay).
#[derive(Debug, Default)]
pub struct ClientSessions {
    inner: Mutex<Sessions>,
    /// false: `--resume none`, sessions and tickets are dropped on arrival.
    keep: bool,
    /// TLS 1.3 tickets received so far.
    received: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct Sessions {
    kx_hint: Option<NamedGroup>,
    tls12: Option<Tls12ClientSessionValue>,
    tls13: VecDeque<Tls13ClientSessionValue>,
}

impl ClientSessions {
    fn new(keep: bool) -> Self {
        Self {
            inner: Mutex::default(),
            keep,
            received: Default::default(),
        }
    }

    /// Drops every session, so the next connection is a full handshake. The key exchange
    /// hint stays: a browser that forgot a session still knows the server's preferred group.
    pub fn forget(&self) {
        let mut s = self.lock();
        s.tls12 = None;
        s.tls13.clear();
    }

    /// TLS 1.3 tickets received so far.
    pub fn tickets_received(&self) -> u64 {
        self.received.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the next connection will offer a session to resume.
    pub fn has_session(&self) -> bool {
        let s = self.lock();
        s.tls12.is_some() || !s.tls13.is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sessions> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ClientSessionStore for ClientSessions {
    fn set_kx_hint(&self, _: ServerName<'static>, group: NamedGroup) {
        self.lock().kx_hint = Some(group);
    }
    fn kx_hint(&self, _: &ServerName<'_>) -> Option<NamedGroup> {
        self.lock().kx_hint
    }
    fn set_tls12_session(&self, _: ServerName<'static>, value: Tls12ClientSessionValue) {
        if self.keep {
            self.lock().tls12 = Some(value);
        }
    }
    fn tls12_session(&self, _: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.lock().tls12.clone()
    }
    fn remove_tls12_session(&self, _: &ServerName<'static>) {
        self.lock().tls12 = None;
    }
    fn insert_tls13_ticket(&self, _: ServerName<'static>, value: Tls13ClientSessionValue) {
        if !self.keep {
            return;
        }
        self.received
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut s = self.lock();
        if s.tls13.len() == MAX_TICKETS {
            s.tls13.pop_front();
        }
        s.tls13.push_back(value);
    }
    fn take_tls13_ticket(&self, _: &ServerName<'static>) -> Option<Tls13ClientSessionValue> {
        // The newest ticket first: the freshest the server issued.
        self.lock().tls13.pop_back()
    }
}

/// What every virtual client shares; [`Tls::client`] makes each one's config.
pub struct Tls {
    base: ClientConfig,
    pub server_name: ServerName<'static>,
    resume: Resume,
}

impl Tls {
    pub fn new(cfg: &BenchConfig) -> anyhow::Result<Self> {
        let provider = Arc::new(provider(cfg)?);
        let versions: Vec<&'static rustls::SupportedProtocolVersion> =
            match cfg.tls_version.as_deref() {
                Some("1.2") => vec![&rustls::version::TLS12],
                Some("1.3") => vec![&rustls::version::TLS13],
                _ => vec![&rustls::version::TLS13, &rustls::version::TLS12],
            };
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .context("TLS versions and suites")?;
        let sigalgs = parse_sigalgs(&cfg.sigalgs)?;
        let verifier: Arc<dyn ServerCertVerifier> = if cfg.insecure {
            Arc::new(Verifier {
                inner: None,
                provider: provider.clone(),
                schemes: sigalgs,
            })
        } else {
            let mut roots = rustls::RootCertStore::empty();
            match &cfg.ca {
                Some(path) => {
                    for c in CertificateDer::pem_file_iter(path)
                        .with_context(|| format!("reading --ca {}", path.display()))?
                    {
                        roots
                            .add(c.with_context(|| format!("parsing --ca {}", path.display()))?)?;
                    }
                }
                None => {
                    let system = "/etc/ssl/certs/ca-certificates.crt";
                    for c in CertificateDer::pem_file_iter(system)
                        .with_context(|| format!("no --ca and no {system}"))?
                        .flatten()
                    {
                        let _ = roots.add(c);
                    }
                }
            }
            let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots),
                provider.clone(),
            )
            .build()
            .context("server verifier")?;
            Arc::new(Verifier {
                inner: Some(webpki),
                provider: provider.clone(),
                schemes: sigalgs,
            })
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut base = match (&cfg.cert, &cfg.key) {
            (Some(cert), Some(key)) => {
                let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                    .with_context(|| format!("reading --cert {}", cert.display()))?
                    .collect::<Result<_, _>>()?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| anyhow!("--key {}: {e}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .context("client certificate")?
            }
            _ => builder.with_no_client_auth(),
        };
        base.alpn_protocols = vec![cfg.alpn.as_bytes().to_vec()];
        base.enable_early_data = cfg.early_data;
        let server_name = ServerName::try_from(cfg.sni.clone())
            .map_err(|e| anyhow!("--sni `{}`: {e}", cfg.sni))?;
        Ok(Self {
            base,
            server_name,
            resume: cfg.resume,
        })
    }

    /// One virtual client's config and its session store.
    pub fn client(&self) -> (Arc<ClientConfig>, Arc<ClientSessions>) {
        let sessions = Arc::new(ClientSessions::new(self.resume != Resume::None));
        let mut config = self.base.clone();
        config.resumption = match self.resume {
            Resume::None => {
                Resumption::store(sessions.clone()).tls12_resumption(Tls12Resumption::Disabled)
            }
            Resume::Id => {
                Resumption::store(sessions.clone()).tls12_resumption(Tls12Resumption::SessionIdOnly)
            }
            Resume::Ticket | Resume::Auto => Resumption::store(sessions.clone())
                .tls12_resumption(Tls12Resumption::SessionIdOrTickets),
        };
        (Arc::new(config), sessions)
    }
}

fn provider(cfg: &BenchConfig) -> anyhow::Result<CryptoProvider> {
    let mut p = rustls::crypto::aws_lc_rs::default_provider();
    if !cfg.suites.is_empty() {
        let all = rustls::crypto::aws_lc_rs::ALL_CIPHER_SUITES;
        p.cipher_suites = cfg
            .suites
            .iter()
            .map(|name| {
                let want = baton_wire::names::rustls_suite_name(name);
                all.iter()
                    .find(|s| format!("{:?}", s.suite()).eq_ignore_ascii_case(want))
                    .copied()
                    .ok_or_else(|| anyhow!("--suite `{name}`: not a suite this engine speaks (IANA or OpenSSL names, e.g. TLS_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, ECDHE-ECDSA-CHACHA20-POLY1305)"))
            })
            .collect::<anyhow::Result<_>>()?;
    }
    if !cfg.groups.is_empty() {
        let all = rustls::crypto::aws_lc_rs::ALL_KX_GROUPS;
        p.kx_groups = cfg
            .groups
            .iter()
            .map(|name| {
                all.iter()
                    .find(|g| format!("{:?}", g.name()).eq_ignore_ascii_case(name))
                    .copied()
                    .ok_or_else(|| {
                        anyhow!("--group `{name}`: x25519, secp256r1, secp384r1, x25519mlkem768")
                    })
            })
            .collect::<anyhow::Result<_>>()?;
    }
    Ok(p)
}

fn parse_sigalgs(names: &[String]) -> anyhow::Result<Option<Vec<SignatureScheme>>> {
    if names.is_empty() {
        return Ok(None);
    }
    const KNOWN: &[SignatureScheme] = &[
        SignatureScheme::ECDSA_NISTP256_SHA256,
        SignatureScheme::ECDSA_NISTP384_SHA384,
        SignatureScheme::ECDSA_NISTP521_SHA512,
        SignatureScheme::ED25519,
        SignatureScheme::RSA_PSS_SHA256,
        SignatureScheme::RSA_PSS_SHA384,
        SignatureScheme::RSA_PSS_SHA512,
        SignatureScheme::RSA_PKCS1_SHA256,
        SignatureScheme::RSA_PKCS1_SHA384,
        SignatureScheme::RSA_PKCS1_SHA512,
    ];
    let alias = |n: &str| match n.to_ascii_lowercase().as_str() {
        "ecdsa_secp256r1_sha256" => "ecdsa_nistp256_sha256".to_string(),
        "ecdsa_secp384r1_sha384" => "ecdsa_nistp384_sha384".to_string(),
        "rsa_pss_rsae_sha256" => "rsa_pss_sha256".to_string(),
        "rsa_pss_rsae_sha384" => "rsa_pss_sha384".to_string(),
        other => other.to_string(),
    };
    names
        .iter()
        .map(|n| {
            let want = alias(n);
            KNOWN
                .iter()
                .find(|s| format!("{s:?}").eq_ignore_ascii_case(&want))
                .copied()
                .ok_or_else(|| anyhow!("--sigalg `{n}`: e.g. ecdsa_secp256r1_sha256, rsa_pss_rsae_sha256, rsa_pkcs1_sha256, ed25519"))
        })
        .collect::<anyhow::Result<Vec<_>>>()
        .map(Some)
}

/// `--insecure`'s verifier: any certificate, its handshake signature checked.
pub fn any_certificate(provider: Arc<CryptoProvider>) -> Arc<dyn ServerCertVerifier> {
    Arc::new(Verifier {
        inner: None,
        provider,
        schemes: None,
    })
}

/// Verifies as WebPKI does (or accepts any certificate with `--insecure`), always checks the
/// handshake signature for real (its cost is part of what is measured), and offers only the
/// `--sigalg` schemes when given.
#[derive(Debug)]
struct Verifier {
    inner: Option<Arc<rustls::client::WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
    schemes: Option<Vec<SignatureScheme>>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match &self.inner {
            Some(v) => v.verify_server_cert(end_entity, intermediates, server_name, ocsp, now),
            None => Ok(ServerCertVerified::assertion()),
        }
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
            &self.provider.signature_verification_algorithms,
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
            &self.provider.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        match &self.schemes {
            Some(s) => s.clone(),
            None => self
                .provider
                .signature_verification_algorithms
                .supported_schemes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BenchArgs;

    fn cfg(suites: &[&str]) -> BenchConfig {
        BenchArgs {
            url: Some("https://localhost:1/".into()),
            insecure: true,
            suite: suites.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
        .resolve()
        .unwrap()
    }

    #[test]
    fn suites_by_iana_openssl_or_rustls_name() {
        for names in [
            ["TLS_AES_128_GCM_SHA256", "ECDHE-ECDSA-CHACHA20-POLY1305"],
            [
                "tls13_aes_128_gcm_sha256",
                "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
            ],
        ] {
            let p = provider(&cfg(&names)).unwrap();
            let got: Vec<String> = p
                .cipher_suites
                .iter()
                .map(|s| format!("{:?}", s.suite()))
                .collect();
            assert_eq!(
                got,
                [
                    "TLS13_AES_128_GCM_SHA256",
                    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"
                ]
            );
        }
        let e = provider(&cfg(&["RC4-MD5"])).unwrap_err().to_string();
        assert!(e.contains("--suite `RC4-MD5`"), "{e}");
    }

    #[test]
    fn resume_none_keeps_only_the_group() {
        let store = ClientSessions::new(false);
        let name = ServerName::try_from("localhost").unwrap();
        store.set_kx_hint(name.clone(), NamedGroup::X25519);
        assert_eq!(store.kx_hint(&name), Some(NamedGroup::X25519));
        assert!(!store.has_session());
    }
}
