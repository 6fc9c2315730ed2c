//! Loading certificates and keys (PEM files or generated self-signed ones) into rustls'
//! `CertifiedKey`s, with the names each is for.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::{CertifiedKey, SigningKey};
use rustls::SignatureAlgorithm;

use crate::config::KeyKind;
use crate::metering::metered_signing_key;

/// A certificate chain with its key, and the names (lower-case DNS names, `*.suffix` wildcards,
/// IP addresses) it may be presented for.
#[derive(Debug, Clone)]
pub struct CertEntry {
    pub certified: Arc<CertifiedKey>,
    pub algorithm: SignatureAlgorithm,
    pub names: Vec<String>,
    /// Where it came from, for logs ("file.pem" or "self-signed ecdsa-p256").
    pub origin: String,
}

/// Reads a chain and its key from PEM files and checks that they belong together.
pub fn load_pair(cert: &Path, key: &Path) -> anyhow::Result<CertEntry> {
    let chain = load_chain(cert)?;
    let origin = cert.display().to_string();
    entry(chain, metered_signing_key(load_key(key)?), origin)
}

/// Reads a chain whose key the signer holds (`--key-signer`); `key` is the local copy used
/// while the signer is unreachable (`--key-signer-fallback local`).
pub fn load_with_signer(
    cert: &Path,
    key: Option<&Path>,
    signer: &crate::keysigner::Handle,
) -> anyhow::Result<CertEntry> {
    let chain = load_chain(cert)?;
    let origin = cert.display().to_string();
    let local = key.map(load_key).transpose()?;
    let (_, parsed) = x509_parser::parse_x509_certificate(&chain[0])
        .map_err(|e| anyhow!("{origin}: certificate does not parse: {e}"))?;
    let spki = parsed.tbs_certificate.subject_pki.raw;
    let signing = signer.key_for(spki, local, &origin)?;
    entry(chain, signing, origin)
}

fn load_chain(cert: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading certificate {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing certificate {}", cert.display()))?;
    if chain.is_empty() {
        bail!("{}: no CERTIFICATE in PEM file", cert.display());
    }
    Ok(chain)
}

/// Loads a private key by reference so that our copy of its bytes can be wiped right after;
/// aws-lc keeps its own (and cleanses it when freed). The key's bytes are never logged; errors
/// name only the file.
fn load_key(key: &Path) -> anyhow::Result<Arc<dyn SigningKey>> {
    let mut der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| anyhow!("{}: no usable private key: {e}", key.display()))?;
    let signing = rustls::crypto::aws_lc_rs::sign::any_supported_type(&der);
    zeroize::Zeroize::zeroize(&mut der);
    signing.map_err(|e| anyhow!("{}: private key not supported: {e}", key.display()))
}

/// A new key pair of `kind`, for a self-signed certificate or an ACME order.
pub fn key_pair(kind: KeyKind) -> Result<rcgen::KeyPair, rcgen::Error> {
    use rcgen::{KeyPair, RsaKeySize};
    match kind {
        KeyKind::EcdsaP256 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
        KeyKind::EcdsaP384 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384),
        KeyKind::Ed25519 => KeyPair::generate_for(&rcgen::PKCS_ED25519),
        KeyKind::Rsa2048 => KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, RsaKeySize::_2048),
        KeyKind::Rsa3072 => KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, RsaKeySize::_3072),
        KeyKind::Rsa4096 => KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, RsaKeySize::_4096),
    }
}

/// Generates a self-signed certificate for `names` in memory.
pub fn self_signed(kind: KeyKind, names: &[String]) -> anyhow::Result<(CertEntry, String)> {
    let key_pair = key_pair(kind).context("generating key pair")?;
    let mut params = rcgen::CertificateParams::new(names.to_vec()).context("certificate names")?;
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        names.first().map_or("baton", |n| n),
    );
    let cert = params.self_signed(&key_pair).context("self-signing")?;
    let pem = cert.pem();
    let key_der = PrivateKeyDer::try_from(key_pair.serialize_der())
        .map_err(|e| anyhow!("generated key: {e}"))?;
    let origin = format!("self-signed {}", kind_name(kind));
    let mut key_der = key_der;
    let signing = rustls::crypto::aws_lc_rs::sign::any_supported_type(&key_der);
    zeroize::Zeroize::zeroize(&mut key_der);
    let signing = signing.map_err(|e| anyhow!("{origin}: private key not supported: {e}"))?;
    Ok((
        entry(
            vec![cert.der().clone()],
            metered_signing_key(signing),
            origin,
        )?,
        pem,
    ))
}

fn kind_name(kind: KeyKind) -> &'static str {
    match kind {
        KeyKind::EcdsaP256 => "ecdsa-p256",
        KeyKind::EcdsaP384 => "ecdsa-p384",
        KeyKind::Rsa2048 => "rsa-2048",
        KeyKind::Rsa3072 => "rsa-3072",
        KeyKind::Rsa4096 => "rsa-4096",
        KeyKind::Ed25519 => "ed25519",
    }
}

pub(crate) fn entry(
    chain: Vec<CertificateDer<'static>>,
    signing: Arc<dyn SigningKey>,
    origin: String,
) -> anyhow::Result<CertEntry> {
    let algorithm = signing.algorithm();
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|e| anyhow!("{origin}: key does not match certificate: {e}"))?;
    let names = names_of(&certified.cert[0]).with_context(|| origin.clone())?;
    Ok(CertEntry {
        certified: Arc::new(certified),
        algorithm,
        names,
        origin,
    })
}

/// The names an end-entity certificate is valid for: its subjectAltName DNS names and IP
/// addresses, or its common name when it has no subjectAltName.
fn names_of(cert: &CertificateDer<'_>) -> anyhow::Result<Vec<String>> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| anyhow!("certificate does not parse: {e}"))?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = parsed.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(d) => {
                    names.push(d.to_ascii_lowercase())
                }
                x509_parser::extensions::GeneralName::IPAddress(ip) => {
                    let ip = match ip.len() {
                        4 => <[u8; 4]>::try_from(*ip).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(*ip).ok().map(IpAddr::from),
                        _ => None,
                    };
                    names.extend(ip.map(|ip| ip.to_string()));
                }
                _ => {}
            }
        }
    }
    if names.is_empty() {
        names.extend(
            parsed
                .subject()
                .iter_common_name()
                .filter_map(|cn| cn.as_str().ok())
                .map(|cn| cn.to_ascii_lowercase()),
        );
    }
    Ok(names)
}

/// The subject of a client certificate (RFC 4514 string), for the HTTP layer.
pub fn subject_of(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert).ok()?;
    Some(parsed.subject().to_string())
}

/// Reads CA certificates for client authentication.
pub fn load_roots(path: &Path) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading client CA {}", path.display()))?
    {
        let cert = cert.with_context(|| format!("parsing client CA {}", path.display()))?;
        roots
            .add(cert)
            .with_context(|| format!("client CA {}", path.display()))?;
    }
    if roots.is_empty() {
        bail!("{}: no CA certificate found", path.display());
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_kinds_and_names() {
        let names = vec!["example.test".to_string(), "127.0.0.1".to_string()];
        for kind in [
            KeyKind::EcdsaP256,
            KeyKind::EcdsaP384,
            KeyKind::Ed25519,
            KeyKind::Rsa2048,
        ] {
            let (e, pem) = self_signed(kind, &names).unwrap();
            assert_eq!(e.names, names, "{kind:?}");
            assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"));
        }
        let (e, _) = self_signed(KeyKind::EcdsaP256, &names).unwrap();
        assert_eq!(e.algorithm, SignatureAlgorithm::ECDSA);
    }

    #[test]
    fn mismatched_key_is_refused() {
        let dir = std::env::temp_dir().join(format!("baton-certs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = rcgen::generate_simple_self_signed(vec!["a.test".into()]).unwrap();
        let b = rcgen::generate_simple_self_signed(vec!["b.test".into()]).unwrap();
        std::fs::write(dir.join("a.pem"), a.cert.pem()).unwrap();
        std::fs::write(dir.join("b.key"), b.signing_key.serialize_pem()).unwrap();
        std::fs::write(dir.join("a.key"), a.signing_key.serialize_pem()).unwrap();
        let err = load_pair(&dir.join("a.pem"), &dir.join("b.key")).unwrap_err();
        assert!(format!("{err:#}").contains("does not match"), "{err:#}");
        let ok = load_pair(&dir.join("a.pem"), &dir.join("a.key")).unwrap();
        assert_eq!(ok.names, vec!["a.test"]);
        let missing = load_pair(&dir.join("nope.pem"), &dir.join("a.key")).unwrap_err();
        assert!(format!("{missing:#}").contains("nope.pem"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
