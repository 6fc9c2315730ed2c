//! Certificates for a local cluster: a throwaway CA and one server certificate (ECDSA P-256 or
//! RSA-2048) for localhost and 127.0.0.1, written to the cluster's directory. Clients trust
//! `ca.pem`; the private keys are written 0600.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// Paths of the generated files.
#[derive(Debug, Clone)]
pub struct Pki {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub fn generate(dir: &Path, rsa: bool) -> anyhow::Result<Pki> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().context("CA key")?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "Baton local cluster CA");
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = if rsa {
        KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)?
    } else {
        KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?
    };
    let mut params =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])?;
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let cert = params.signed_by(&key, &issuer)?;
    let pki = Pki {
        ca: dir.join("ca.pem"),
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
    };
    std::fs::write(&pki.ca, ca_cert.pem())?;
    std::fs::write(&pki.cert, cert.pem())?;
    write_private(&pki.key, key.serialize_pem().as_bytes())?;
    Ok(pki)
}

/// Writes a secret file readable by its owner only.
pub fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(bytes)?;
    Ok(())
}
