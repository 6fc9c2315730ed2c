//! Choosing the certificate for a ClientHello: by SNI, then by what the client can verify
//! (ECDSA when its signature algorithms and suites allow it, else RSA).
//!
//! The choice itself ([`CertStore::choose`]) is a plain function of the hello's fields, tested
//! without handshakes; [`Resolver`] adapts it to rustls and swaps the store on reload.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{CipherSuite, SignatureAlgorithm, SignatureScheme, SupportedCipherSuite};

use crate::certs::CertEntry;

/// All certificates of an agent, indexed by name.
#[derive(Debug)]
pub struct CertStore {
    entries: Vec<CertEntry>,
    exact: HashMap<String, Vec<usize>>,
    /// `*.example.com` stored as `.example.com`.
    wildcard: HashMap<String, Vec<usize>>,
    default: Vec<usize>,
}

/// What the choice needs to know about a ClientHello.
pub struct Hello<'a> {
    pub server_name: Option<&'a str>,
    pub signature_schemes: &'a [SignatureScheme],
    pub cipher_suites: &'a [CipherSuite],
}

impl CertStore {
    /// Indexes `entries`. The default (for unknown or absent SNI) is every certificate sharing
    /// the first certificate's first name, so an RSA + ECDSA pair both serve as default.
    pub fn new(entries: Vec<CertEntry>) -> Self {
        let mut exact: HashMap<String, Vec<usize>> = HashMap::new();
        let mut wildcard: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, e) in entries.iter().enumerate() {
            for name in &e.names {
                match name.strip_prefix('*') {
                    Some(suffix) if suffix.starts_with('.') => {
                        wildcard.entry(suffix.to_string()).or_default().push(i)
                    }
                    _ => exact.entry(name.clone()).or_default().push(i),
                }
            }
        }
        let default = match entries.first().and_then(|e| e.names.first()) {
            Some(first) => (0..entries.len())
                .filter(|i| entries[*i].names.contains(first))
                .collect(),
            None => (0..entries.len().min(1)).collect(),
        };
        Self {
            entries,
            exact,
            wildcard,
            default,
        }
    }

    /// This store, with the OCSP staples `old` has for the same certificates where this one
    /// has none.
    pub fn with_staples_of(self, old: &CertStore) -> CertStore {
        let stapled: HashMap<&[u8], &Vec<u8>> = old
            .entries
            .iter()
            .filter_map(|e| {
                Some((
                    e.certified.cert.first()?.as_ref(),
                    e.certified.ocsp.as_ref()?,
                ))
            })
            .collect();
        if stapled.is_empty() {
            return self;
        }
        let entries = self
            .entries
            .into_iter()
            .map(|e| {
                let carried = e
                    .certified
                    .cert
                    .first()
                    .filter(|_| e.certified.ocsp.is_none())
                    .and_then(|leaf| stapled.get(leaf.as_ref()));
                match carried {
                    Some(ocsp) => CertEntry {
                        certified: Arc::new(CertifiedKey {
                            ocsp: Some((*ocsp).clone()),
                            ..(*e.certified).clone()
                        }),
                        ..e
                    },
                    None => e,
                }
            })
            .collect();
        CertStore::new(entries)
    }

    pub fn entries(&self) -> &[CertEntry] {
        &self.entries
    }

    /// The certificates that may answer `server_name`.
    fn candidates(&self, server_name: Option<&str>) -> &[usize] {
        let Some(name) = server_name.map(|n| n.trim_end_matches('.').to_ascii_lowercase()) else {
            return &self.default;
        };
        if let Some(found) = self.exact.get(&name) {
            return found;
        }
        // A wildcard covers exactly one label: `*.example.com` matches `a.example.com` only.
        if let Some(dot) = name.find('.') {
            if let Some(found) = self.wildcard.get(&name[dot..]) {
                return found;
            }
        }
        &self.default
    }

    /// The certificate for this hello: among those for its name, the first in
    /// ECDSA > Ed25519 > RSA order that the client can verify and negotiate a suite with,
    /// given the suites the agent enables. `None` only when the store is empty.
    pub fn choose(
        &self,
        hello: &Hello<'_>,
        enabled: &[SupportedCipherSuite],
    ) -> Option<&CertEntry> {
        let candidates = self.candidates(hello.server_name);
        let mut ranked: Vec<&CertEntry> = candidates.iter().map(|i| &self.entries[*i]).collect();
        ranked.sort_by_key(|e| rank(e.algorithm));
        ranked
            .iter()
            .copied()
            .find(|e| usable(e, hello, enabled))
            .or_else(|| ranked.first().copied())
    }
}

fn rank(alg: SignatureAlgorithm) -> u8 {
    match alg {
        SignatureAlgorithm::ECDSA => 0,
        SignatureAlgorithm::ED25519 => 1,
        SignatureAlgorithm::RSA => 2,
        _ => 3,
    }
}

/// Whether the client could complete a handshake with this certificate.
fn usable(e: &CertEntry, hello: &Hello<'_>, enabled: &[SupportedCipherSuite]) -> bool {
    let offered = |s: &SupportedCipherSuite| hello.cipher_suites.contains(&s.suite());
    let key = &e.certified.key;
    // TLS 1.3: any common suite works with any certificate; only the signature scheme matters.
    let tls13 = enabled
        .iter()
        .any(|s| matches!(s, SupportedCipherSuite::Tls13(_)) && offered(s));
    if tls13 && key.choose_scheme(hello.signature_schemes).is_some() {
        return true;
    }
    // TLS 1.2: the suite names the certificate's algorithm (ECDHE_ECDSA_* or ECDHE_RSA_*).
    enabled.iter().any(|s| match s {
        SupportedCipherSuite::Tls12(s12) if offered(s) => {
            let schemes: Vec<SignatureScheme> = hello
                .signature_schemes
                .iter()
                .filter(|sch| s12.sign.contains(sch))
                .copied()
                .collect();
            key.choose_scheme(&schemes).is_some()
        }
        _ => false,
    })
}

/// The ALPN protocol of TLS-ALPN-01 validation handshakes (RFC 8737).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// Whether a ClientHello is an ACME CA's TLS-ALPN-01 validation: it offers `acme-tls/1` and
/// nothing else (RFC 8737 section 3), and names the server.
pub fn is_acme_validation<'a>(mut alpn: impl Iterator<Item = &'a [u8]>) -> bool {
    alpn.next() == Some(ACME_TLS_ALPN) && alpn.next().is_none()
}

/// rustls' view of the store; the store is replaced whole on reload.
#[derive(Debug)]
pub struct Resolver {
    store: ArcSwap<CertStore>,
    enabled: Vec<SupportedCipherSuite>,
    /// TLS-ALPN-01 validation certificates, by name, while an order waits on them.
    challenges: Arc<crate::challenges::Challenges>,
}

impl Resolver {
    pub fn new(store: CertStore, enabled: Vec<SupportedCipherSuite>) -> Self {
        Self {
            store: ArcSwap::from_pointee(store),
            enabled,
            challenges: Default::default(),
        }
    }

    pub fn challenges(&self) -> &Arc<crate::challenges::Challenges> {
        &self.challenges
    }

    /// Swaps in `store`. A certificate also in the running store keeps its OCSP staple, so a
    /// reload or a renewal of other names never leaves a handshake without one (the stapler
    /// still drops it at its nextUpdate).
    pub fn replace(&self, store: CertStore) {
        let store = store.with_staples_of(&self.store.load());
        self.store.store(Arc::new(store));
    }

    /// Replaces the store only if it is still `current` (another writer, a reload or a
    /// renewal, wins a race); whether it did.
    pub fn replace_if(&self, current: &Arc<CertStore>, store: CertStore) -> bool {
        let previous = self.store.compare_and_swap(current, Arc::new(store));
        Arc::ptr_eq(&previous, current)
    }

    pub fn store(&self) -> Arc<CertStore> {
        self.store.load_full()
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // A CA validating a name: its validation certificate or nothing, never a real one.
        if client_hello.alpn().is_some_and(is_acme_validation) {
            let name = client_hello.server_name()?.to_ascii_lowercase();
            return self.challenges.tls_alpn01(&name);
        }
        let hello = Hello {
            server_name: client_hello.server_name(),
            signature_schemes: client_hello.signature_schemes(),
            cipher_suites: client_hello.cipher_suites(),
        };
        self.store
            .load()
            .choose(&hello, &self.enabled)
            .map(|e| e.certified.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::self_signed;
    use crate::config::KeyKind;
    use rustls::crypto::aws_lc_rs::ALL_CIPHER_SUITES;

    const ECDSA_SCHEMES: &[SignatureScheme] = &[SignatureScheme::ECDSA_NISTP256_SHA256];
    const BOTH_SCHEMES: &[SignatureScheme] = &[
        SignatureScheme::ECDSA_NISTP256_SHA256,
        SignatureScheme::RSA_PSS_SHA256,
        SignatureScheme::RSA_PKCS1_SHA256,
    ];
    const RSA_SCHEMES: &[SignatureScheme] = &[
        SignatureScheme::RSA_PSS_SHA256,
        SignatureScheme::RSA_PKCS1_SHA256,
    ];
    const TLS13: &[CipherSuite] = &[CipherSuite::TLS13_AES_128_GCM_SHA256];
    const TLS12_RSA_ONLY: &[CipherSuite] = &[CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256];

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    fn store() -> CertStore {
        let site = names(&["site.test", "www.site.test"]);
        let other = names(&["*.other.test"]);
        CertStore::new(vec![
            self_signed(KeyKind::Rsa2048, &site).unwrap().0,
            self_signed(KeyKind::EcdsaP256, &site).unwrap().0,
            self_signed(KeyKind::EcdsaP256, &other).unwrap().0,
        ])
    }

    fn pick<'a>(
        s: &'a CertStore,
        name: Option<&'a str>,
        schemes: &'a [SignatureScheme],
        suites: &'a [CipherSuite],
    ) -> &'a CertEntry {
        let hello = Hello {
            server_name: name,
            signature_schemes: schemes,
            cipher_suites: suites,
        };
        s.choose(&hello, ALL_CIPHER_SUITES).unwrap()
    }

    #[test]
    fn ecdsa_when_the_client_allows_it_else_rsa() {
        let s = store();
        assert_eq!(
            pick(&s, Some("site.test"), BOTH_SCHEMES, TLS13).algorithm,
            SignatureAlgorithm::ECDSA
        );
        assert_eq!(
            pick(&s, Some("site.test"), RSA_SCHEMES, TLS13).algorithm,
            SignatureAlgorithm::RSA
        );
        // ECDSA signature schemes offered, but only an ECDHE_RSA suite in TLS 1.2
        assert_eq!(
            pick(&s, Some("site.test"), BOTH_SCHEMES, TLS12_RSA_ONLY).algorithm,
            SignatureAlgorithm::RSA
        );
    }

    #[test]
    fn a_replaced_store_keeps_the_staples_of_certificates_it_still_has() {
        let kept = self_signed(KeyKind::EcdsaP256, &names(&["kept.test"]))
            .unwrap()
            .0;
        let gone = self_signed(KeyKind::EcdsaP256, &names(&["gone.test"]))
            .unwrap()
            .0;
        let fresh = self_signed(KeyKind::EcdsaP256, &names(&["new.test"]))
            .unwrap()
            .0;
        let staple = |e: &CertEntry| CertEntry {
            certified: Arc::new(CertifiedKey {
                ocsp: Some(vec![7]),
                ..(*e.certified).clone()
            }),
            ..e.clone()
        };
        let resolver = Resolver::new(
            CertStore::new(vec![staple(&kept), staple(&gone)]),
            ALL_CIPHER_SUITES.to_vec(),
        );
        resolver.replace(CertStore::new(vec![kept.clone(), fresh]));
        let store = resolver.store();
        let ocsp: Vec<_> = store
            .entries()
            .iter()
            .map(|e| e.certified.ocsp.clone())
            .collect();
        assert_eq!(ocsp, vec![Some(vec![7]), None]);
    }

    #[test]
    fn only_a_hello_offering_acme_tls_alone_is_a_validation() {
        let v = |protos: &[&[u8]]| is_acme_validation(protos.iter().copied());
        assert!(v(&[b"acme-tls/1"]));
        assert!(!v(&[b"acme-tls/1", b"http/1.1"]));
        assert!(!v(&[b"h2", b"acme-tls/1"]));
        assert!(!v(&[]));
    }

    #[test]
    fn sni_selects_and_unknown_gets_default() {
        let s = store();
        assert_eq!(
            pick(&s, Some("a.other.test"), ECDSA_SCHEMES, TLS13).names,
            names(&["*.other.test"])
        );
        assert_eq!(
            pick(&s, Some("A.Other.Test."), ECDSA_SCHEMES, TLS13).names,
            names(&["*.other.test"])
        );
        // a wildcard covers one label only
        assert_eq!(
            pick(&s, Some("x.a.other.test"), ECDSA_SCHEMES, TLS13).names[0],
            "site.test"
        );
        assert_eq!(
            pick(&s, Some("unknown.test"), ECDSA_SCHEMES, TLS13).names[0],
            "site.test"
        );
        assert_eq!(
            pick(&s, None, RSA_SCHEMES, TLS13).algorithm,
            SignatureAlgorithm::RSA
        );
        assert_eq!(
            pick(&s, Some("www.site.test"), ECDSA_SCHEMES, TLS13).algorithm,
            SignatureAlgorithm::ECDSA
        );
    }
}
