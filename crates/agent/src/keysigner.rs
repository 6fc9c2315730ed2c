//! `--key-signer`: the agent's certificates sign through `baton signer` (crate
//! `baton-signer`), which holds the private keys.
//!
//! At start (and on SIGHUP) the signer is asked for its keys and each certificate must find its
//! public key among them, so a wrong socket or a missing key is an error then, not a failed
//! handshake later. Time spent waiting on the signer is reported as crypto op `sign_remote`,
//! not `sign`: it is another process's CPU (the signer's), and counting it as ours would make
//! the in-process vs offloaded CPU comparison meaningless. A local fallback key, when used, is
//! metered as `sign` like any in-process key.

use std::sync::{Arc, OnceLock};

use anyhow::{anyhow, bail};
use baton_signer::auth::AuthKey;
use baton_signer::client::{Client, RemoteKey};
use baton_signer::keys::{key_id, schemes_of, short_id};
use baton_signer::metrics::ClientMetrics;
use baton_signer::protocol::KeyInfo;
use rustls::sign::SigningKey;

use crate::config::KeySigner;
use crate::metering::metered_signing_key;

/// The agent's signer metrics, for `Metrics::encode` (one signer per agent).
static METRICS: OnceLock<Arc<ClientMetrics>> = OnceLock::new();

/// A connection pool to the signer, shared by every certificate.
pub struct Handle {
    client: Arc<Client>,
}

impl Handle {
    pub fn new(cfg: &KeySigner) -> anyhow::Result<Self> {
        let auth = AuthKey::from_file(&cfg.auth_key_file)?;
        let client = Arc::new(Client::new(&cfg.path, auth, cfg.timeout));
        let _ = METRICS.set(client.metrics.clone());
        Ok(Self { client })
    }

    /// The signing key for a certificate whose SubjectPublicKeyInfo is `spki`: the signer's
    /// key with that public key, falling back to `local` (a local copy, `--key-signer-fallback
    /// local`) while the signer is unreachable. `origin` names the certificate in errors.
    pub fn key_for(
        &self,
        spki: &[u8],
        local: Option<Arc<dyn SigningKey>>,
        origin: &str,
    ) -> anyhow::Result<Arc<dyn SigningKey>> {
        if let Some(l) = &local {
            if l.public_key().as_ref().map(|p| p.as_ref()) != Some(spki) {
                bail!("{origin}: the local --key does not match the certificate");
            }
        }
        let id = key_id(spki);
        let path = self.client.path().display();
        let info = match self.client.list_keys() {
            Ok(keys) => keys.into_iter().find(|k| k.key_id == id).ok_or_else(|| {
                anyhow!(
                    "{origin}: the key signer at {path} holds no key for this certificate's \
                     public key (sha256 {}..)",
                    short_id(&id)
                )
            })?,
            Err(e) if e.is_unreachable() && local.is_some() => {
                let key = local.as_ref().expect("checked");
                tracing::warn!(certificate = origin, signer = %path, error = %e,
                    "key signer unreachable at start; signing locally until it is back");
                KeyInfo {
                    key_id: id,
                    algorithm: u8::from(key.algorithm()),
                    schemes: schemes_of(key.as_ref())
                        .into_iter()
                        .map(u16::from)
                        .collect(),
                    spki: spki.to_vec(),
                }
            }
            Err(e) => bail!("{origin}: key signer at {path}: {e}"),
        };
        if info.spki != spki {
            bail!("{origin}: the key signer listed another public key under this key's id");
        }
        let fallback = local.map(metered_signing_key);
        Ok(Arc::new(RemoteKey::new(
            self.client.clone(),
            &info,
            fallback,
        )))
    }
}

/// Seconds spent waiting on the signer and requests made, for crypto op `sign_remote` in
/// `baton_crypto_seconds_total` and `baton_crypto_operations_total` (nothing without a signer).
pub fn remote_wait() -> Option<(f64, u64)> {
    METRICS.get().map(|m| m.wait())
}

/// The `baton_key_signer_*` families (nothing without a signer).
pub fn encode(e: &mut prometheus_client::encoding::DescriptorEncoder) -> std::fmt::Result {
    match METRICS.get() {
        Some(m) => m.encode(e),
        None => Ok(()),
    }
}
