//! Keys inside a PKCS#11 token (an HSM, or SoftHSM2 in tests), through the `cryptoki` crate.
//!
//! The private keys never leave the token: the signer finds each private key that can sign,
//! reads the public half (from the public key object with the same CKA_ID, or for RSA the
//! private object's modulus and exponent) to name it by its SPKI like a file key, and signs
//! with the token's raw mechanisms, hashing itself: CKM_ECDSA over the digest (the token's
//! r||s converted to the DER TLS carries), CKM_RSA_PKCS over a DigestInfo, CKM_RSA_PKCS_PSS
//! over the digest with MGF1 of the same hash and a salt of the hash's length (what TLS
//! requires). These three are the mechanisms nearly every token implements; the combined
//! hash-and-sign ones are not.
//!
//! A PKCS#11 session must not be used by two threads at once (cryptoki's `Session` is `Send`,
//! not `Sync`), so sessions are pooled: a signing thread takes one, or opens one when all are
//! busy (sessions of a logged-in application share its login), and returns it.

use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context};
use aws_lc_rs::digest;
use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
use cryptoki::mechanism::rsa::{PkcsMgfType, PkcsPssParams};
use cryptoki::mechanism::{Mechanism, MechanismType};
use cryptoki::object::{Attribute, AttributeType, KeyType, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::slot::Slot;
use cryptoki::types::AuthPin;
use rustls::{SignatureAlgorithm, SignatureScheme};
use zeroize::Zeroizing;

use crate::keys::{Backend, Key};

/// One logged-in token and a pool of its sessions.
struct Token {
    ctx: Pkcs11,
    slot: Slot,
    idle: Mutex<Vec<Session>>,
}

impl Token {
    fn with_session<T>(&self, f: impl FnOnce(&Session) -> T) -> Result<T, String> {
        let taken = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let session = match taken {
            Some(s) => s,
            None => self
                .ctx
                .open_ro_session(self.slot)
                .map_err(|e| format!("opening a PKCS#11 session: {e}"))?,
        };
        let out = f(&session);
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(session);
        Ok(out)
    }
}

/// Opens `module`, logs in to the token labelled `label` with the PIN in `pin_file`, and returns
/// every signing key on it.
pub fn load(module: &Path, label: &str, pin_file: &Path) -> anyhow::Result<Vec<Key>> {
    let pin = Zeroizing::new(
        std::fs::read_to_string(pin_file)
            .with_context(|| format!("reading PIN file {}", pin_file.display()))?,
    );
    let pin = AuthPin::from(pin.trim().to_string());
    let ctx = Pkcs11::new(module)
        .with_context(|| format!("loading PKCS#11 module {}", module.display()))?;
    ctx.initialize(CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK))
        .context("C_Initialize")?;
    let mut slot = None;
    for s in ctx.get_slots_with_token().context("listing slots")? {
        if ctx.get_token_info(s).map(|t| t.label().trim() == label)? {
            slot = Some(s);
            break;
        }
    }
    let slot = slot.ok_or_else(|| anyhow!("no PKCS#11 token labelled `{label}`"))?;
    let session = ctx.open_ro_session(slot).context("opening a session")?;
    session
        .login(UserType::User, Some(&pin))
        .with_context(|| format!("logging in to token `{label}`"))?;
    let privates = session
        .find_objects(&[
            Attribute::Class(ObjectClass::PRIVATE_KEY),
            Attribute::Sign(true),
        ])
        .context("finding private keys")?;
    let mut found = Vec::new();
    for handle in privates {
        if let Some(k) = describe(&session, handle)? {
            found.push(k);
        }
    }
    if found.is_empty() {
        bail!("token `{label}` has no RSA or P-256/P-384 ECDSA signing key");
    }
    let token = Arc::new(Token {
        ctx,
        slot,
        idle: Mutex::new(vec![session]),
    });
    found
        .into_iter()
        .map(|(spki, kind)| {
            let (algorithm, schemes) = kind.schemes();
            let backend = Box::new(TokenKey {
                token: token.clone(),
                handle: kind.handle(),
                kind,
            });
            Key::new(spki, algorithm, schemes, backend)
        })
        .collect()
}

#[derive(Clone, Copy)]
enum Kind {
    Rsa(ObjectHandle),
    EcP256(ObjectHandle),
    EcP384(ObjectHandle),
}

impl Kind {
    fn handle(self) -> ObjectHandle {
        match self {
            Kind::Rsa(h) | Kind::EcP256(h) | Kind::EcP384(h) => h,
        }
    }

    fn schemes(self) -> (SignatureAlgorithm, Vec<SignatureScheme>) {
        match self {
            Kind::Rsa(_) => (SignatureAlgorithm::RSA, crate::keys::SCHEMES[..6].to_vec()),
            Kind::EcP256(_) => (
                SignatureAlgorithm::ECDSA,
                vec![SignatureScheme::ECDSA_NISTP256_SHA256],
            ),
            Kind::EcP384(_) => (
                SignatureAlgorithm::ECDSA,
                vec![SignatureScheme::ECDSA_NISTP384_SHA384],
            ),
        }
    }
}

/// DER of the namedCurve OIDs (as CKA_EC_PARAMS holds them).
const P256: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const P384: &[u8] = &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22];
/// AlgorithmIdentifier contents: rsaEncryption + NULL, id-ecPublicKey (curve follows).
const RSA_ALG: &[u8] = &[
    0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00,
];
const EC_ALG: &[u8] = &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];

/// The SPKI and kind of one private key, or `None` for key types TLS here cannot use.
fn describe(session: &Session, handle: ObjectHandle) -> anyhow::Result<Option<(Vec<u8>, Kind)>> {
    let attrs = session
        .get_attributes(handle, &[AttributeType::KeyType, AttributeType::Id])
        .context("reading key attributes")?;
    let mut key_type = None;
    let mut id = Vec::new();
    for a in attrs {
        match a {
            Attribute::KeyType(t) => key_type = Some(t),
            Attribute::Id(i) => id = i,
            _ => {}
        }
    }
    // The public half: the public key object with the same CKA_ID.
    let public = session
        .find_objects(&[
            Attribute::Class(ObjectClass::PUBLIC_KEY),
            Attribute::Id(id.clone()),
        ])
        .context("finding the public key")?
        .into_iter()
        .next();
    match key_type {
        Some(KeyType::RSA) => {
            // RSA private objects carry the modulus and exponent themselves.
            let from = public.unwrap_or(handle);
            let attrs = session
                .get_attributes(
                    from,
                    &[AttributeType::Modulus, AttributeType::PublicExponent],
                )
                .context("reading the RSA public key")?;
            let (mut n, mut e) = (None, None);
            for a in attrs {
                match a {
                    Attribute::Modulus(m) => n = Some(m),
                    Attribute::PublicExponent(x) => e = Some(x),
                    _ => {}
                }
            }
            let (n, e) = n.zip(e).ok_or_else(|| anyhow!("RSA key without modulus"))?;
            let rsa_public = der(0x30, &[der_uint(&n), der_uint(&e)].concat());
            Ok(Some((spki(RSA_ALG, &rsa_public), Kind::Rsa(handle))))
        }
        Some(KeyType::EC) => {
            let Some(public) = public else {
                tracing::warn!("EC private key without a public key object (same CKA_ID): skipped");
                return Ok(None);
            };
            let attrs = session
                .get_attributes(public, &[AttributeType::EcParams, AttributeType::EcPoint])
                .context("reading the EC public key")?;
            let (mut params, mut point) = (None, None);
            for a in attrs {
                match a {
                    Attribute::EcParams(p) => params = Some(p),
                    Attribute::EcPoint(p) => point = Some(p),
                    _ => {}
                }
            }
            let (params, point) = params
                .zip(point)
                .ok_or_else(|| anyhow!("EC public key without parameters or point"))?;
            let (kind, coords) = match params.as_slice() {
                P256 => (Kind::EcP256(handle), 32),
                P384 => (Kind::EcP384(handle), 48),
                _ => {
                    tracing::warn!("EC key on a curve other than P-256/P-384: skipped");
                    return Ok(None);
                }
            };
            let point = uncompressed_point(&point, coords)
                .ok_or_else(|| anyhow!("EC point is not an uncompressed point"))?;
            let alg = [EC_ALG, &params].concat();
            Ok(Some((spki(&alg, point), kind)))
        }
        _ => Ok(None),
    }
}

/// CKA_EC_POINT is specified as a DER OCTET STRING holding the point; some tokens store the
/// bare point. Either way, the uncompressed point of a curve with `coords`-byte coordinates.
fn uncompressed_point(raw: &[u8], coords: usize) -> Option<&[u8]> {
    let len = 1 + 2 * coords;
    let point = if raw.len() == len {
        raw
    } else {
        let (tag, rest) = raw.split_first()?;
        let (n, body) = der_len(rest)?;
        if *tag != 0x04 || n != body.len() {
            return None;
        }
        body
    };
    (point.len() == len && point[0] == 0x04).then_some(point)
}

fn der_len(b: &[u8]) -> Option<(usize, &[u8])> {
    let (first, rest) = b.split_first()?;
    match *first {
        n if n < 0x80 => Some((n as usize, rest)),
        0x81 => Some((*rest.first()? as usize, rest.get(1..)?)),
        0x82 => Some((
            u16::from_be_bytes([*rest.first()?, *rest.get(1)?]) as usize,
            rest.get(2..)?,
        )),
        _ => None,
    }
}

/// One DER TLV (lengths up to 64 KiB, plenty for keys and signatures).
fn der(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    match body.len() {
        n if n < 0x80 => out.push(n as u8),
        n if n < 0x100 => out.extend_from_slice(&[0x81, n as u8]),
        n => out.extend_from_slice(&[0x82, (n >> 8) as u8, n as u8]),
    }
    out.extend_from_slice(body);
    out
}

/// A DER INTEGER from big-endian unsigned bytes.
fn der_uint(bytes: &[u8]) -> Vec<u8> {
    let start = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
    let mut body = Vec::with_capacity(bytes.len() + 1);
    if bytes.get(start).is_none_or(|b| b & 0x80 != 0) {
        body.push(0);
    }
    body.extend_from_slice(&bytes[start..]);
    der(0x02, &body)
}

fn spki(alg: &[u8], public: &[u8]) -> Vec<u8> {
    let mut bits = vec![0];
    bits.extend_from_slice(public);
    der(0x30, &[der(0x30, alg), der(0x03, &bits)].concat())
}

/// DigestInfo prefixes (RFC 8017 section 9.2, note 1) for PKCS#1 v1.5 signatures.
const SHA256_INFO: &[u8] = &[
    0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05,
    0x00, 0x04, 0x20,
];
const SHA384_INFO: &[u8] = &[
    0x30, 0x41, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02, 0x05,
    0x00, 0x04, 0x30,
];
const SHA512_INFO: &[u8] = &[
    0x30, 0x51, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x03, 0x05,
    0x00, 0x04, 0x40,
];

struct TokenKey {
    token: Arc<Token>,
    handle: ObjectHandle,
    kind: Kind,
}

impl Backend for TokenKey {
    fn sign(&self, scheme: SignatureScheme, message: &[u8]) -> Result<Vec<u8>, String> {
        use SignatureScheme as S;
        let (hash, info, mech, mgf) = match scheme {
            S::RSA_PKCS1_SHA256 | S::RSA_PSS_SHA256 | S::ECDSA_NISTP256_SHA256 => (
                &digest::SHA256,
                SHA256_INFO,
                MechanismType::SHA256,
                PkcsMgfType::MGF1_SHA256,
            ),
            S::RSA_PKCS1_SHA384 | S::RSA_PSS_SHA384 | S::ECDSA_NISTP384_SHA384 => (
                &digest::SHA384,
                SHA384_INFO,
                MechanismType::SHA384,
                PkcsMgfType::MGF1_SHA384,
            ),
            S::RSA_PKCS1_SHA512 | S::RSA_PSS_SHA512 => (
                &digest::SHA512,
                SHA512_INFO,
                MechanismType::SHA512,
                PkcsMgfType::MGF1_SHA512,
            ),
            other => return Err(format!("{other:?} not supported by PKCS#11 keys")),
        };
        let hashed = digest::digest(hash, message);
        let hashed = hashed.as_ref();
        let pss = matches!(
            scheme,
            S::RSA_PSS_SHA256 | S::RSA_PSS_SHA384 | S::RSA_PSS_SHA512
        );
        let (mechanism, input) = match self.kind {
            Kind::Rsa(_) if pss => (
                Mechanism::RsaPkcsPss(PkcsPssParams {
                    hash_alg: mech,
                    mgf,
                    s_len: (hashed.len() as u64).into(),
                }),
                hashed.to_vec(),
            ),
            Kind::Rsa(_) => (Mechanism::RsaPkcs, [info, hashed].concat()),
            Kind::EcP256(_) | Kind::EcP384(_) => (Mechanism::Ecdsa, hashed.to_vec()),
        };
        let raw = self
            .token
            .with_session(|s| s.sign(&mechanism, self.handle, &input))?
            .map_err(|e| format!("C_Sign: {e}"))?;
        match self.kind {
            Kind::Rsa(_) => Ok(raw),
            Kind::EcP256(_) | Kind::EcP384(_) => ecdsa_der(&raw),
        }
    }
}

/// PKCS#11 ECDSA signatures are r || s, each the curve's size; TLS carries
/// `SEQUENCE { INTEGER r, INTEGER s }`.
fn ecdsa_der(raw: &[u8]) -> Result<Vec<u8>, String> {
    if raw.is_empty() || raw.len() & 1 != 0 {
        return Err(format!("ECDSA signature of {} bytes", raw.len()));
    }
    let (r, s) = raw.split_at(raw.len() / 2);
    Ok(der(0x30, &[der_uint(r), der_uint(s)].concat()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_helpers() {
        assert_eq!(der_uint(&[0, 0, 5]), vec![2, 1, 5]);
        assert_eq!(der_uint(&[0x80]), vec![2, 2, 0, 0x80]);
        assert_eq!(der_uint(&[0, 0]), vec![2, 1, 0]);
        assert_eq!(der(4, &[0; 200])[..3], [4, 0x81, 200]);
        assert_eq!(der(4, &[0; 300])[..4], [4, 0x82, 1, 44]);
        let sig = ecdsa_der(&[[0x01; 32], [0xff; 32]].concat()).unwrap();
        assert_eq!(&sig[..4], &[0x30, 0x45, 0x02, 0x20]);
        assert!(ecdsa_der(&[1, 2, 3]).is_err());
        let point = [[4u8].as_slice(), &[7; 64]].concat();
        assert_eq!(uncompressed_point(&point, 32), Some(point.as_slice()));
        let wrapped = der(0x04, &point);
        assert_eq!(uncompressed_point(&wrapped, 32), Some(point.as_slice()));
        assert_eq!(uncompressed_point(&wrapped[..60], 32), None);
    }

    #[test]
    fn spki_matches_aws_lc_for_an_rsa_key() {
        // The SPKI built from (n, e) must be byte-identical to the one rustls derives, or keys
        // would not be found by certificate.
        let pair =
            rcgen::KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048)
                .unwrap();
        let expected = rcgen::PublicKeyData::subject_public_key_info(&pair);
        // subjectPublicKey of the SPKI is RSAPublicKey { n, e }: read them back.
        let rsa_public = &expected[expected.len() - 270..];
        assert_eq!(&rsa_public[..4], &[0x30, 0x82, 0x01, 0x0a]);
        let n = &rsa_public[9..9 + 256];
        let e = &rsa_public[9 + 256 + 2..];
        let rebuilt = spki(RSA_ALG, &der(0x30, &[der_uint(n), der_uint(e)].concat()));
        assert_eq!(rebuilt, expected);
    }
}
