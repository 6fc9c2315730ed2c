//! The recorder's certificate authority: generated on first use into a directory (`ca.pem`,
//! and `ca.key` readable by its owner only), read back on later runs, so a browser trusts it
//! once. Leaf certificates for the hosts the browser asks for are minted on the fly, one per
//! host, and kept (up to a bound) with their rustls server configurations.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::ServerConfig;
use zeroize::Zeroizing;

/// Hosts whose configuration is kept; beyond, the cache starts over (a browsing session
/// touches far fewer hosts; the bound only keeps a runaway client from growing it).
const MAX_HOSTS: usize = 1024;

pub struct Ca {
    cert_path: PathBuf,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    configs: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

/// `$XDG_DATA_HOME/baton/record-ca`, else `$HOME/.local/share/baton/record-ca`.
pub fn default_dir() -> anyhow::Result<PathBuf> {
    if let Some(d) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("baton/record-ca"));
    }
    let home = std::env::var_os("HOME")
        .filter(|d| !d.is_empty())
        .context("neither XDG_DATA_HOME nor HOME is set: give --ca-dir")?;
    Ok(PathBuf::from(home).join(".local/share/baton/record-ca"))
}

impl Ca {
    /// Reads the CA in `dir`, or creates it there (the directory 0700, the key 0600).
    /// Returns the CA and whether it was created now.
    pub fn load_or_create(dir: &Path) -> anyhow::Result<(Ca, bool)> {
        let (cert_path, key_path) = (dir.join("ca.pem"), dir.join("ca.key"));
        let created = match (cert_path.exists(), key_path.exists()) {
            (true, true) => false,
            (false, false) => {
                create(dir, &cert_path, &key_path)?;
                true
            }
            _ => bail!(
                "{}: one of ca.pem and ca.key is missing; remove the other to start a new CA",
                dir.display()
            ),
        };
        let key_pem = Zeroizing::new(
            std::fs::read_to_string(&key_path)
                .with_context(|| format!("reading {}", key_path.display()))?,
        );
        let key = KeyPair::from_pem(&key_pem)
            .with_context(|| format!("{}: not a private key", key_path.display()))?;
        let cert_pem = std::fs::read_to_string(&cert_path)
            .with_context(|| format!("reading {}", cert_path.display()))?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key)
            .with_context(|| format!("{}: not a CA certificate for ca.key", cert_path.display()))?;
        let cert_der = rustls::pki_types::pem::PemObject::from_pem_slice(cert_pem.as_bytes())
            .with_context(|| format!("{}: not a PEM certificate", cert_path.display()))?;
        Ok((
            Ca {
                cert_path,
                cert_der,
                issuer,
                configs: Mutex::new(HashMap::new()),
            },
            created,
        ))
    }

    /// The CA certificate's file: what the user trusts.
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// The TLS server configuration for `host` (a DNS name or an IP address), with a leaf
    /// certificate for it, minted on first use.
    pub fn server_config(&self, host: &str) -> anyhow::Result<Arc<ServerConfig>> {
        let host = host.to_ascii_lowercase();
        if let Some(c) = self.configs.lock().unwrap().get(&host) {
            return Ok(c.clone());
        }
        let config = Arc::new(self.mint(&host)?);
        let mut configs = self.configs.lock().unwrap();
        if configs.len() >= MAX_HOSTS {
            configs.clear();
        }
        configs.insert(host, config.clone());
        Ok(config)
    }

    fn mint(&self, host: &str) -> anyhow::Result<ServerConfig> {
        let (chain, key) = self.leaf(host)?;
        let mut config = ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }

    /// A certificate chain (leaf, CA) and key for `host`.
    fn leaf(
        &self,
        host: &str,
    ) -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        // rcgen makes an IP address an IP SAN and anything else a DNS SAN
        let mut p = CertificateParams::new(vec![host.to_string()])
            .with_context(|| format!("no certificate for `{host}`"))?;
        p.distinguished_name.push(DnType::CommonName, host);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        // short-lived: it only has to outlive the recording
        let now = time::OffsetDateTime::now_utc();
        p.not_before = now - time::Duration::days(1);
        p.not_after = now + time::Duration::days(30);
        let cert = p.signed_by(&key, &self.issuer)?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok((vec![cert.der().clone(), self.cert_der.clone()], key_der))
    }
}

fn create(dir: &Path, cert_path: &Path, key_path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    // a name of its own, so two users' (or two machines') recorder CAs are told apart
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    p.distinguished_name.push(
        DnType::CommonName,
        format!(
            "baton record CA {:08x}",
            (nanos as u32) ^ std::process::id()
        ),
    );
    p.distinguished_name
        .push(DnType::OrganizationName, "Baton (local recorder)");
    let cert = p.self_signed(&key)?;
    // the key first, created exclusively with its final mode: never readable by others
    let key_pem = Zeroizing::new(key.serialize_pem());
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(key_path)
        .with_context(|| format!("creating {}", key_path.display()))?;
    std::io::Write::write_all(&mut f, key_pem.as_bytes())?;
    f.sync_all()?;
    std::fs::write(cert_path, cert.pem())
        .with_context(|| format!("writing {}", cert_path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::{ServerName, UnixTime};

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("baton-ca-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// A leaf minted for `host` verifies against `ca` for the name `name`.
    fn verifies(ca: &Ca, minted_by: &Ca, host: &str, name: &str) -> bool {
        let (chain, _) = minted_by.leaf(host).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert_der.clone()).unwrap();
        let v = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots))
            .build()
            .unwrap();
        v.verify_server_cert(
            &chain[0],
            &chain[1..],
            &ServerName::try_from(name.to_string()).unwrap(),
            &[],
            UnixTime::now(),
        )
        .is_ok()
    }

    #[test]
    fn created_once_reused_after_and_the_key_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tmp("create");
        let (ca, created) = Ca::load_or_create(&dir).unwrap();
        assert!(created);
        let mode = std::fs::metadata(dir.join("ca.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let pem = std::fs::read(dir.join("ca.pem")).unwrap();
        let (again, created) = Ca::load_or_create(&dir).unwrap();
        assert!(!created);
        assert_eq!(again.cert_der, ca.cert_der);
        assert_eq!(std::fs::read(dir.join("ca.pem")).unwrap(), pem);
        // a leaf minted by the reloaded CA chains to the CA written the first time
        assert!(verifies(&ca, &again, "Shop.Example", "shop.example"));
        assert!(!verifies(&ca, &again, "shop.example", "other.example"));
        assert!(verifies(&ca, &again, "127.0.0.1", "127.0.0.1"));
        let c = again.server_config("Shop.Example").unwrap();
        assert!(Arc::ptr_eq(
            &c,
            &again.server_config("shop.example").unwrap()
        ));
        assert_eq!(c.alpn_protocols[0], b"h2");
        // another CA's leaf does not chain to this one
        let other = tmp("other");
        let (stranger, _) = Ca::load_or_create(&other).unwrap();
        assert!(!verifies(&ca, &stranger, "shop.example", "shop.example"));
        std::fs::remove_dir_all(&other).unwrap();

        std::fs::remove_file(dir.join("ca.pem")).unwrap();
        let e = Ca::load_or_create(&dir).err().unwrap().to_string();
        assert!(e.contains("missing"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
