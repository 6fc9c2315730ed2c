//! The certificates and keys of ACME: new keys and their signing requests, the issued chain
//! with its key as it travels (PEM text), and the RFC 8737 validation certificate.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use zeroize::Zeroizing;

use crate::certs::CertEntry;
use crate::config::KeyKind;
use crate::metering::metered_signing_key;

/// A new private key of `kind` (PKCS#8 PEM, wiped when dropped) and the CSR (DER) for `names`.
pub fn key_and_csr(
    kind: KeyKind,
    names: &[String],
) -> anyhow::Result<(Zeroizing<String>, Vec<u8>)> {
    let key = crate::certs::key_pair(kind).context("generating the certificate key")?;
    let mut params = rcgen::CertificateParams::new(names.to_vec()).context("certificate names")?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    let csr = params
        .serialize_request(&key)
        .context("certificate signing request")?;
    Ok((Zeroizing::new(key.serialize_pem()), csr.der().to_vec()))
}

/// The form a certificate travels in: the chain's PEM, then the key's (PKCS#8).
pub fn bundle(chain_pem: &str, key_pem: &str) -> Zeroizing<String> {
    let mut out = Zeroizing::new(String::with_capacity(chain_pem.len() + key_pem.len() + 1));
    out.push_str(chain_pem.trim_end());
    out.push('\n');
    out.push_str(key_pem);
    out
}

/// A certificate from its bundle, ready to serve, with its validity.
#[derive(Debug, Clone)]
pub struct Held {
    pub entry: CertEntry,
    /// The certificate itself (its ARI identifier: RFC 9773).
    pub leaf: CertificateDer<'static>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

pub fn open_bundle(bundle: &[u8], origin: String) -> anyhow::Result<Held> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(bundle)
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow!("{origin}: certificate PEM: {e}"))?;
    if chain.is_empty() {
        anyhow::bail!("{origin}: no certificate");
    }
    let mut der =
        PrivateKeyDer::from_pem_slice(bundle).map_err(|e| anyhow!("{origin}: key PEM: {e}"))?;
    let signing = rustls::crypto::aws_lc_rs::sign::any_supported_type(&der);
    zeroize::Zeroize::zeroize(&mut der);
    let signing = signing.map_err(|e| anyhow!("{origin}: key not supported: {e}"))?;
    let (not_before, not_after) = validity(&chain[0])?;
    let leaf = chain[0].clone();
    let entry = crate::certs::entry(chain, metered_signing_key(signing), origin)?;
    Ok(Held {
        entry,
        leaf,
        not_before,
        not_after,
    })
}

/// notBefore and notAfter of a certificate.
pub fn validity(cert: &CertificateDer<'_>) -> anyhow::Result<(SystemTime, SystemTime)> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| anyhow!("certificate does not parse: {e}"))?;
    let at = |t: x509_parser::time::ASN1Time| {
        let secs = t.timestamp();
        match u64::try_from(secs) {
            Ok(s) => SystemTime::UNIX_EPOCH + Duration::from_secs(s),
            Err(_) => SystemTime::UNIX_EPOCH,
        }
    };
    let v = parsed.validity();
    Ok((at(v.not_before), at(v.not_after)))
}

/// The RFC 8737 certificate that answers a TLS-ALPN-01 challenge for `name`: self-signed, for
/// that name alone, with the acmeIdentifier extension holding the key authorization's SHA-256.
pub fn alpn_validation(name: &str, digest: &[u8]) -> anyhow::Result<Arc<CertifiedKey>> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .context("generating the validation key")?;
    let mut params = rcgen::CertificateParams::new(vec![name.to_string()])
        .context("validation certificate name")?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
    let cert = params
        .self_signed(&key)
        .context("self-signing the validation certificate")?;
    let mut der = PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let signing = rustls::crypto::aws_lc_rs::sign::any_supported_type(&der);
    zeroize::Zeroize::zeroize(&mut der);
    let signing = signing.map_err(|e| anyhow!("validation key: {e}"))?;
    Ok(Arc::new(CertifiedKey::new(
        vec![cert.der().clone()],
        signing,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_opens_into_a_servable_certificate() {
        let names = vec!["a.test".to_string()];
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(names.clone())
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let b = bundle(&cert.pem(), &key.serialize_pem());
        let held = open_bundle(b.as_bytes(), "acme a.test".into()).unwrap();
        assert_eq!(held.entry.names, names);
        assert!(held.not_after > held.not_before);
        // a key that is not the certificate's is refused
        let other = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let b = bundle(&cert.pem(), &other.serialize_pem());
        assert!(open_bundle(b.as_bytes(), "x".into()).is_err());
        assert!(open_bundle(b"garbage", "x".into()).is_err());
    }

    #[test]
    fn keys_and_requests_of_each_kind() {
        for kind in [KeyKind::EcdsaP256, KeyKind::Rsa2048] {
            let (key, csr) = key_and_csr(kind, &["a.test".into()]).unwrap();
            assert!(!key.is_empty() && !csr.is_empty());
        }
    }

    #[test]
    fn the_validation_certificate_carries_the_acme_identifier() {
        let ck = alpn_validation("a.test", &[7u8; 32]).unwrap();
        let (_, parsed) = x509_parser::parse_x509_certificate(&ck.cert[0]).unwrap();
        let oid = x509_parser::der_parser::oid!(1.3.6 .1 .5 .5 .7 .1 .31);
        let ext = parsed
            .extensions()
            .iter()
            .find(|e| e.oid == oid)
            .expect("acmeIdentifier");
        assert!(ext.critical);
        assert!(ext.value.ends_with(&[7u8; 32]));
    }
}
