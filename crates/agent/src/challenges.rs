//! ACME challenge answers the agent serves while a certificate is being ordered: HTTP-01 key
//! authorizations by token (served by the plain-HTTP listener under
//! `/.well-known/acme-challenge/`), and TLS-ALPN-01 certificates by name (chosen by the
//! resolver for a ClientHello that offers only `acme-tls/1`). Filled by whoever orders.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use rustls::sign::CertifiedKey;

/// Where to look for an answer another agent of the cluster set (the one that orders).
pub type Lookup<T> = Box<dyn Fn(&str) -> Option<T> + Send + Sync>;
type Shared<T> = OnceLock<Lookup<T>>;

#[derive(Default)]
pub struct Challenges {
    http01: RwLock<HashMap<String, String>>,
    tls_alpn01: RwLock<HashMap<String, Arc<CertifiedKey>>>,
    shared_http01: Shared<String>,
    shared_tls_alpn01: Shared<Arc<CertifiedKey>>,
}

impl std::fmt::Debug for Challenges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Challenges").finish_non_exhaustive()
    }
}

impl Challenges {
    /// The key authorization to answer `GET /.well-known/acme-challenge/{token}` with.
    pub fn http01(&self, token: &str) -> Option<String> {
        let local = self.http01.read().ok()?.get(token).cloned();
        local.or_else(|| self.shared_http01.get().and_then(|f| f(token)))
    }

    /// Answers set by another agent (the cluster's store), asked when none is set here.
    pub fn set_shared_http01(&self, lookup: Lookup<String>) {
        let _ = self.shared_http01.set(lookup);
    }

    pub fn set_shared_tls_alpn01(&self, lookup: Lookup<Arc<CertifiedKey>>) {
        let _ = self.shared_tls_alpn01.set(lookup);
    }

    pub fn set_http01(&self, token: String, key_authorization: String) {
        if let Ok(mut m) = self.http01.write() {
            m.insert(token, key_authorization);
        }
    }

    pub fn clear_http01(&self, token: &str) {
        if let Ok(mut m) = self.http01.write() {
            m.remove(token);
        }
    }

    /// The RFC 8737 validation certificate for `name`, if an order is waiting on it.
    pub fn tls_alpn01(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        let local = self.tls_alpn01.read().ok()?.get(name).cloned();
        local.or_else(|| self.shared_tls_alpn01.get().and_then(|f| f(name)))
    }

    pub fn set_tls_alpn01(&self, name: String, cert: Arc<CertifiedKey>) {
        if let Ok(mut m) = self.tls_alpn01.write() {
            m.insert(name, cert);
        }
    }

    pub fn clear_tls_alpn01(&self, name: &str) {
        if let Ok(mut m) = self.tls_alpn01.write() {
            m.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http01_tokens_are_set_read_and_cleared() {
        let c = Challenges::default();
        assert_eq!(c.http01("t"), None);
        c.set_http01("t".into(), "t.thumb".into());
        assert_eq!(c.http01("t").as_deref(), Some("t.thumb"));
        c.clear_http01("t");
        assert_eq!(c.http01("t"), None);
    }
}
