//! The keys a signer holds, each named by the SHA-256 of its SubjectPublicKeyInfo (so an agent
//! finds the key for a certificate from the certificate alone), behind one signing seam with
//! two backends: PEM files loaded into rustls' own aws-lc-rs signing keys, and PKCS#11 tokens
//! (`pkcs11`).

use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;
use rustls::sign::SigningKey;
use rustls::{SignatureAlgorithm, SignatureScheme};

use crate::protocol::{ErrorCode, KeyId, KeyInfo, MAX_KEYS, MAX_SPKI};

/// Schemes probed, in the order rustls' own keys prefer them (PSS before PKCS#1, larger
/// hashes first), which is the order a remote key offers them in.
pub const SCHEMES: [SignatureScheme; 10] = [
    SignatureScheme::RSA_PSS_SHA512,
    SignatureScheme::RSA_PSS_SHA384,
    SignatureScheme::RSA_PSS_SHA256,
    SignatureScheme::RSA_PKCS1_SHA512,
    SignatureScheme::RSA_PKCS1_SHA384,
    SignatureScheme::RSA_PKCS1_SHA256,
    SignatureScheme::ECDSA_NISTP256_SHA256,
    SignatureScheme::ECDSA_NISTP384_SHA384,
    SignatureScheme::ECDSA_NISTP521_SHA512,
    SignatureScheme::ED25519,
];

/// SHA-256 of a DER SubjectPublicKeyInfo.
pub fn key_id(spki: &[u8]) -> KeyId {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, spki);
    let mut id = [0; 32];
    id.copy_from_slice(d.as_ref());
    id
}

/// Hex of the first 8 bytes of a key id, for logs and errors.
pub fn short_id(id: &KeyId) -> String {
    id[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Something that signs with one private key it never hands out.
pub trait Backend: Send + Sync {
    /// Signs `message` (the full message; hashing is the backend's job) with `scheme`, one of
    /// the schemes the key was listed with.
    fn sign(&self, scheme: SignatureScheme, message: &[u8]) -> Result<Vec<u8>, String>;
}

/// A key as rustls' aws-lc-rs provider loads it from PKCS#8, PKCS#1 or SEC1.
struct FileKey(Arc<dyn SigningKey>);

impl Backend for FileKey {
    fn sign(&self, scheme: SignatureScheme, message: &[u8]) -> Result<Vec<u8>, String> {
        let signer = self
            .0
            .choose_scheme(&[scheme])
            .ok_or_else(|| format!("{scheme:?} not supported"))?;
        signer.sign(message).map_err(|e| e.to_string())
    }
}

pub struct Key {
    pub info: KeyInfo,
    backend: Box<dyn Backend>,
}

impl Key {
    pub fn new(
        spki: Vec<u8>,
        algorithm: SignatureAlgorithm,
        schemes: Vec<SignatureScheme>,
        backend: Box<dyn Backend>,
    ) -> anyhow::Result<Self> {
        if spki.len() > MAX_SPKI {
            bail!("public key of {} bytes is over the limit", spki.len());
        }
        if schemes.is_empty() {
            bail!("key supports no TLS signature scheme");
        }
        Ok(Self {
            info: KeyInfo {
                key_id: key_id(&spki),
                algorithm: u8::from(algorithm),
                schemes: schemes.into_iter().map(u16::from).collect(),
                spki,
            },
            backend,
        })
    }

    /// Loads a PEM private key file. Only the path appears in errors, never key bytes.
    pub fn from_pem_file(path: &Path) -> anyhow::Result<Self> {
        let mut der = PrivateKeyDer::from_pem_file(path)
            .map_err(|e| anyhow!("{}: no usable private key: {e}", path.display()))?;
        let loaded = rustls::crypto::aws_lc_rs::sign::any_supported_type(&der);
        zeroize::Zeroize::zeroize(&mut der);
        let key = loaded.map_err(|e| anyhow!("{}: key not supported: {e}", path.display()))?;
        Self::from_signing_key(key).with_context(|| path.display().to_string())
    }

    pub fn from_signing_key(key: Arc<dyn SigningKey>) -> anyhow::Result<Self> {
        let spki = key
            .public_key()
            .ok_or_else(|| anyhow!("key has no public key"))?
            .to_vec();
        let schemes = schemes_of(key.as_ref());
        Self::new(spki, key.algorithm(), schemes, Box::new(FileKey(key)))
    }
}

/// The schemes `key` can sign with, in [`SCHEMES`] order.
pub fn schemes_of(key: &dyn SigningKey) -> Vec<SignatureScheme> {
    SCHEMES
        .iter()
        .copied()
        .filter(|s| key.choose_scheme(&[*s]).is_some())
        .collect()
}

/// Every key of one signer.
pub struct KeyStore {
    keys: Vec<Key>,
}

impl KeyStore {
    pub fn new(keys: Vec<Key>) -> anyhow::Result<Self> {
        if keys.is_empty() {
            bail!("no keys: give --key PEM or a PKCS#11 token");
        }
        if keys.len() > MAX_KEYS {
            bail!("{} keys, at most {MAX_KEYS}", keys.len());
        }
        for (i, k) in keys.iter().enumerate() {
            if keys[..i].iter().any(|o| o.info.key_id == k.info.key_id) {
                bail!("key {} given twice", short_id(&k.info.key_id));
            }
        }
        Ok(Self { keys })
    }

    pub fn infos(&self) -> Vec<KeyInfo> {
        self.keys.iter().map(|k| k.info.clone()).collect()
    }

    /// Signs with the key `id`, refusing schemes it was not listed with (so a client cannot
    /// make an RSA key sign PKCS#1 when only PSS was offered, or pick a scheme the backend
    /// would interpret differently).
    pub fn sign(
        &self,
        id: &KeyId,
        scheme: u16,
        message: &[u8],
    ) -> Result<Vec<u8>, (ErrorCode, String)> {
        let key = self
            .keys
            .iter()
            .find(|k| &k.info.key_id == id)
            .ok_or_else(|| (ErrorCode::UnknownKey, format!("no key {}", short_id(id))))?;
        if !key.info.schemes.contains(&scheme) {
            return Err((
                ErrorCode::UnsupportedScheme,
                format!("{:?}", SignatureScheme::from(scheme)),
            ));
        }
        key.backend
            .sign(SignatureScheme::from(scheme), message)
            .map_err(|e| (ErrorCode::SignFailed, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_for(alg: &'static rcgen::SignatureAlgorithm) -> (Key, rcgen::KeyPair) {
        let pair = if alg == &rcgen::PKCS_RSA_SHA256 {
            rcgen::KeyPair::generate_rsa_for(alg, rcgen::RsaKeySize::_2048).unwrap()
        } else {
            rcgen::KeyPair::generate_for(alg).unwrap()
        };
        let der = PrivateKeyDer::try_from(pair.serialize_der()).unwrap();
        let key = rustls::crypto::aws_lc_rs::sign::any_supported_type(&der).unwrap();
        (Key::from_signing_key(key).unwrap(), pair)
    }

    #[test]
    fn ids_schemes_and_refusals() {
        let (rsa, rsa_pair) = key_for(&rcgen::PKCS_RSA_SHA256);
        let (ec, ec_pair) = key_for(&rcgen::PKCS_ECDSA_P256_SHA256);
        assert_eq!(
            rsa.info.key_id,
            key_id(&rcgen::PublicKeyData::subject_public_key_info(&rsa_pair))
        );
        assert_eq!(
            ec.info.key_id,
            key_id(&rcgen::PublicKeyData::subject_public_key_info(&ec_pair))
        );
        assert_eq!(rsa.info.schemes.len(), 6);
        assert_eq!(
            ec.info.schemes,
            vec![u16::from(SignatureScheme::ECDSA_NISTP256_SHA256)]
        );
        let (rsa_id, ec_id) = (rsa.info.key_id, ec.info.key_id);
        let store = KeyStore::new(vec![rsa, ec]).unwrap();
        let pss = u16::from(SignatureScheme::RSA_PSS_SHA256);
        assert!(store.sign(&rsa_id, pss, b"hello").is_ok());
        assert_eq!(
            store.sign(&ec_id, pss, b"hello").unwrap_err().0,
            ErrorCode::UnsupportedScheme
        );
        assert_eq!(
            store.sign(&[0; 32], pss, b"hello").unwrap_err().0,
            ErrorCode::UnknownKey
        );
    }
}
