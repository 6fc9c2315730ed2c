//! Certificates for a local cluster: a throwaway CA and one server certificate (ECDSA P-256 by
//! default; P-384 or RSA 1024-4096 for the lab's key-size runs) for localhost and 127.0.0.1,
//! written to the cluster's directory. Clients trust `ca.pem`; the private keys are written 0600.
//! [`Ca`] issues them (and the integration tests' certificates).

use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::KeyPair;

/// Paths of the generated files.
#[derive(Debug, Clone)]
pub struct Pki {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The server key's algorithm and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum KeyKind {
    EcdsaP256,
    EcdsaP384,
    /// RSA with this many bits (1024 only for OpenSSL-based servers: rustls refuses it).
    Rsa(u32),
}

impl KeyKind {
    pub fn name(self) -> String {
        match self {
            KeyKind::EcdsaP256 => "ECDSA P-256".into(),
            KeyKind::EcdsaP384 => "ECDSA P-384".into(),
            KeyKind::Rsa(bits) => format!("RSA {bits}"),
        }
    }
}

impl std::str::FromStr for KeyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "p256" | "p-256" | "ecdsa" | "ecdsa-p256" => Ok(KeyKind::EcdsaP256),
            "p384" | "p-384" | "ecdsa-p384" => Ok(KeyKind::EcdsaP384),
            other => match other
                .strip_prefix("rsa")
                .map(|b| b.trim_start_matches(['-', ' ']))
            {
                Some("") => Ok(KeyKind::Rsa(2048)),
                Some(b) => match b.parse() {
                    Ok(bits @ (1024 | 2048 | 3072 | 4096)) => Ok(KeyKind::Rsa(bits)),
                    _ => Err(format!("`{s}`: RSA sizes are 1024, 2048, 3072, 4096")),
                },
                None => Err(format!(
                    "`{s}`: ecdsa-p256, ecdsa-p384, rsa-2048, rsa-3072, rsa-4096 or rsa-1024"
                )),
            },
        }
    }
}

pub fn generate(dir: &Path, rsa: bool) -> anyhow::Result<Pki> {
    generate_kind(
        dir,
        if rsa {
            KeyKind::Rsa(2048)
        } else {
            KeyKind::EcdsaP256
        },
    )
}

pub fn generate_kind(dir: &Path, kind: KeyKind) -> anyhow::Result<Pki> {
    let ca = Ca::new("Baton local cluster CA")?;
    let names = ["localhost", "127.0.0.1"];
    let pki = Pki {
        ca: dir.join("ca.pem"),
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
    };
    let (cert, key_pem) = match kind {
        // aws-lc-rs (behind rcgen) will not make or load a 1024-bit RSA key; OpenSSL still does,
        // and only the public half is needed to issue the certificate.
        KeyKind::Rsa(1024) => {
            let key_pem = openssl_rsa_1024()?;
            let public = public_pem_of(&key_pem)?;
            let spki = rcgen::SubjectPublicKeyInfo::from_pem(&public)?;
            (ca.issue(&names, "localhost", &spki)?, key_pem)
        }
        _ => {
            let key = key_pair(kind)?;
            (ca.issue(&names, "localhost", &key)?, key.serialize_pem())
        }
    };
    std::fs::write(&pki.ca, ca.pem())?;
    std::fs::write(&pki.cert, cert)?;
    write_private(&pki.key, key_pem.as_bytes())?;
    Ok(pki)
}

/// A throwaway certificate authority: its self-signed certificate and the key it issues with.
pub struct Ca {
    pem: String,
    issuer: rcgen::Issuer<'static, KeyPair>,
}

impl Ca {
    /// A new CA (ECDSA P-256) with subject `CN=cn`.
    pub fn new(cn: &str) -> anyhow::Result<Ca> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa};
        let key = KeyPair::generate().context("CA key")?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, cn);
        let pem = params.self_signed(&key)?.pem();
        Ok(Ca {
            pem,
            issuer: rcgen::Issuer::new(params, key),
        })
    }

    /// The CA certificate, PEM: what clients (or servers, for client certificates) trust.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A certificate (PEM) for `key`'s public half with subject `CN=cn`, valid for `names`
    /// (DNS names or IP addresses; none for a client certificate).
    pub fn issue(
        &self,
        names: &[&str],
        cn: &str,
        key: &impl rcgen::PublicKeyData,
    ) -> anyhow::Result<String> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        Ok(params.signed_by(key, &self.issuer)?.pem())
    }
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// A new key pair of `kind` (not RSA 1024, which aws-lc-rs refuses: [`generate_kind`] makes that
/// one with the openssl command).
pub fn key_pair(kind: KeyKind) -> anyhow::Result<KeyPair> {
    Ok(match kind {
        KeyKind::EcdsaP256 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?,
        KeyKind::EcdsaP384 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384)?,
        KeyKind::Rsa(bits) => {
            let size = match bits {
                2048 => rcgen::RsaKeySize::_2048,
                3072 => rcgen::RsaKeySize::_3072,
                4096 => rcgen::RsaKeySize::_4096,
                _ => anyhow::bail!("RSA {bits}: 1024, 2048, 3072 or 4096"),
            };
            KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, size)?
        }
    })
}

fn openssl_rsa_1024() -> anyhow::Result<String> {
    let out = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:1024",
        ])
        .output()
        .context("running openssl genpkey (RSA 1024 needs the openssl command)")?;
    anyhow::ensure!(out.status.success(), "openssl genpkey failed");
    Ok(String::from_utf8(out.stdout)?)
}

fn public_pem_of(key_pem: &str) -> anyhow::Result<String> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("openssl")
        .args(["pkey", "-pubout"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("running openssl pkey")?;
    child
        .stdin
        .take()
        .context("openssl stdin")?
        .write_all(key_pem.as_bytes())?;
    let out = child.wait_with_output()?;
    anyhow::ensure!(out.status.success(), "openssl pkey -pubout failed");
    Ok(String::from_utf8(out.stdout)?)
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

/// A client certificate (ECDSA P-256) and the CA servers must trust for it (`ca`), for mutual
/// authentication runs.
pub fn generate_client(dir: &Path) -> anyhow::Result<Pki> {
    std::fs::create_dir_all(dir)?;
    let ca = Ca::new("Baton lab client CA")?;
    let key = key_pair(KeyKind::EcdsaP256)?;
    let cert = ca.issue(&[], "baton lab client", &key)?;
    let pki = Pki {
        ca: dir.join("client-ca.pem"),
        cert: dir.join("client.pem"),
        key: dir.join("client.key"),
    };
    std::fs::write(&pki.ca, ca.pem())?;
    std::fs::write(&pki.cert, cert)?;
    write_private(&pki.key, key.serialize_pem().as_bytes())?;
    Ok(pki)
}
