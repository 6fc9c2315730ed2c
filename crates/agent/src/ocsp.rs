//! OCSP (RFC 6960) for stapling, without I/O: where to ask, what to ask, and whether an answer
//! may be stapled.
//!
//! A response is stapled only when it is a successful basic response, signed by the
//! certificate's issuer or by a responder the issuer delegated to (id-kp-OCSPSigning), that says
//! `good` for exactly this certificate (its CertID, in whatever hash the responder used), with
//! a `thisUpdate` not in the future and a `nextUpdate` still ahead. A response without
//! `nextUpdate` is refused: nothing would say when it goes stale. Signatures: RSA PKCS#1 v1.5
//! with SHA-256/384/512, ECDSA P-256/P-384 with SHA-256/384, Ed25519; SHA-1 is refused.

use aws_lc_rs::digest;
use aws_lc_rs::signature::{self, UnparsedPublicKey};
use der::asn1::{ObjectIdentifier, OctetString};
use der::{Decode, Encode};
use x509_cert::ext::pkix::ExtendedKeyUsage;
use x509_cert::spki::{AlgorithmIdentifierOwned, SubjectPublicKeyInfoOwned};
use x509_cert::Certificate;
use x509_ocsp::{
    BasicOcspResponse, CertId, CertStatus, OcspRequest, OcspResponse, OcspResponseStatus, Request,
    TbsRequest,
};

/// Clock skew allowed on `thisUpdate`.
pub const SKEW_SECS: i64 = 300;

const SHA1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.14.3.2.26");
const SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.1");
const SHA384: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.2");
const SHA512: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.3");
const OCSP_BASIC: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.48.1.1");
const OCSP_SIGNING: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.9");
const EXT_KEY_USAGE: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.37");
const RSA_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.11");
const RSA_SHA384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.12");
const RSA_SHA512: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.13");
const ECDSA_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.2");
const ECDSA_SHA384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.3");
const ED25519: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.101.112");
const P256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");
const P384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.34");

/// Why a response is not stapled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("does not parse: {0}")]
    Malformed(String),
    #[error("responder answered {0:?}")]
    Status(OcspResponseStatus),
    #[error("not a basic OCSP response")]
    NotBasic,
    #[error("no answer for this certificate")]
    NotForThisCert,
    #[error("the certificate is revoked")]
    Revoked,
    #[error("the responder does not know the certificate")]
    Unknown,
    #[error("signature not by the issuer or a responder it delegated to")]
    BadSignature,
    #[error("thisUpdate is in the future")]
    NotYetValid,
    #[error("past its nextUpdate")]
    Expired,
    #[error("no nextUpdate")]
    NoNextUpdate,
}

impl Refused {
    /// The outcome label of the fetch metric.
    pub fn label(&self) -> &'static str {
        match self {
            Refused::Revoked => "revoked",
            Refused::Unknown => "unknown",
            Refused::Status(_) => "responder_error",
            _ => "invalid",
        }
    }
}

/// A response that may be stapled, and the window it is good for (Unix seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staple {
    pub der: Vec<u8>,
    pub this_update: i64,
    pub next_update: i64,
}

impl Staple {
    /// When to fetch a fresh one: half-way through its window, and not before `now + floor`.
    pub fn refresh_at(&self, now: i64, floor: i64) -> i64 {
        let half = self.this_update + (self.next_update - self.this_update) / 2;
        half.max(now + floor)
    }
}

/// The OCSP responder (`http://` URL) the certificate's AIA names, if any.
pub fn responder_url(leaf: &[u8]) -> Option<String> {
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    let (_, cert) = x509_parser::parse_x509_certificate(leaf).ok()?;
    cert.extensions()
        .iter()
        .find_map(|ext| match ext.parsed_extension() {
            ParsedExtension::AuthorityInfoAccess(aia) => {
                aia.accessdescs.iter().find_map(|d| {
                    match (&d.access_method.to_id_string()[..], &d.access_location) {
                        ("1.3.6.1.5.5.7.48.1", GeneralName::URI(uri)) => Some(uri.to_string()),
                        _ => None,
                    }
                })
            }
            _ => None,
        })
}

/// The DER OCSP request for `leaf` (a SHA-1 CertID, what every responder answers).
pub fn request(leaf: &[u8], issuer: &[u8]) -> Result<Vec<u8>, Refused> {
    let leaf = parse_cert(leaf)?;
    let issuer = parse_cert(issuer)?;
    let id = cert_id(&leaf, &issuer, SHA1)?;
    let req = OcspRequest {
        tbs_request: TbsRequest {
            request_list: vec![Request {
                req_cert: id,
                single_request_extensions: None,
            }],
            ..Default::default()
        },
        optional_signature: None,
    };
    req.to_der().map_err(malformed)
}

/// Whether `response` may be stapled to `leaf` (issued by `issuer`) at `now` (Unix seconds).
pub fn check(response: &[u8], leaf: &[u8], issuer: &[u8], now: i64) -> Result<Staple, Refused> {
    let parsed = OcspResponse::from_der(response).map_err(malformed)?;
    if parsed.response_status != OcspResponseStatus::Successful {
        return Err(Refused::Status(parsed.response_status));
    }
    let bytes = parsed.response_bytes.ok_or(Refused::NotBasic)?;
    if bytes.response_type != OCSP_BASIC {
        return Err(Refused::NotBasic);
    }
    let basic = BasicOcspResponse::from_der(bytes.response.as_bytes()).map_err(malformed)?;
    let leaf = parse_cert(leaf)?;
    let issuer = parse_cert(issuer)?;
    let tbs = basic.tbs_response_data.to_der().map_err(malformed)?;
    let sig = basic.signature.as_bytes().ok_or(Refused::BadSignature)?;
    if !signed_by_issuer_or_delegate(&basic, &issuer, &tbs, sig, now) {
        return Err(Refused::BadSignature);
    }
    let single = basic
        .tbs_response_data
        .responses
        .iter()
        .find(|r| {
            cert_id(&leaf, &issuer, r.cert_id.hash_algorithm.oid).is_ok_and(|id| {
                id.issuer_name_hash == r.cert_id.issuer_name_hash
                    && id.issuer_key_hash == r.cert_id.issuer_key_hash
                    && id.serial_number == r.cert_id.serial_number
            })
        })
        .ok_or(Refused::NotForThisCert)?;
    match single.cert_status {
        CertStatus::Good(_) => {}
        CertStatus::Revoked(_) => return Err(Refused::Revoked),
        CertStatus::Unknown(_) => return Err(Refused::Unknown),
    }
    let this_update = unix(&single.this_update.0);
    let next_update = unix(&single.next_update.as_ref().ok_or(Refused::NoNextUpdate)?.0);
    if this_update > now + SKEW_SECS {
        return Err(Refused::NotYetValid);
    }
    if next_update <= now || next_update < this_update {
        return Err(Refused::Expired);
    }
    Ok(Staple {
        der: response.to_vec(),
        this_update,
        next_update,
    })
}

fn malformed(e: der::Error) -> Refused {
    Refused::Malformed(e.to_string())
}

fn parse_cert(der: &[u8]) -> Result<Certificate, Refused> {
    Certificate::from_der(der).map_err(malformed)
}

fn unix(t: &der::asn1::GeneralizedTime) -> i64 {
    i64::try_from(t.to_unix_duration().as_secs()).unwrap_or(i64::MAX)
}

/// The CertID of `leaf` with the hash `alg`.
fn cert_id(
    leaf: &Certificate,
    issuer: &Certificate,
    alg: ObjectIdentifier,
) -> Result<CertId, Refused> {
    let hash = match alg {
        a if a == SHA1 => &digest::SHA1_FOR_LEGACY_USE_ONLY,
        a if a == SHA256 => &digest::SHA256,
        a if a == SHA384 => &digest::SHA384,
        a if a == SHA512 => &digest::SHA512,
        _ => return Err(Refused::NotForThisCert),
    };
    let name = leaf.tbs_certificate.issuer.to_der().map_err(malformed)?;
    let key = issuer
        .tbs_certificate
        .subject_public_key_info
        .subject_public_key
        .raw_bytes();
    Ok(CertId {
        hash_algorithm: AlgorithmIdentifierOwned {
            oid: alg,
            parameters: Some(der::asn1::Null.into()),
        },
        issuer_name_hash: OctetString::new(digest::digest(hash, &name).as_ref())
            .map_err(malformed)?,
        issuer_key_hash: OctetString::new(digest::digest(hash, key).as_ref()).map_err(malformed)?,
        serial_number: leaf.tbs_certificate.serial_number.clone(),
    })
}

/// The issuer signed the response, or signed a certificate in it that may sign OCSP
/// responses, is valid now, and signed the response.
fn signed_by_issuer_or_delegate(
    basic: &BasicOcspResponse,
    issuer: &Certificate,
    tbs: &[u8],
    sig: &[u8],
    now: i64,
) -> bool {
    let issuer_key = &issuer.tbs_certificate.subject_public_key_info;
    if verify(issuer_key, &basic.signature_algorithm, tbs, sig) {
        return true;
    }
    basic.certs.iter().flatten().any(|delegate| {
        let Ok(delegate_tbs) = delegate.tbs_certificate.to_der() else {
            return false;
        };
        let Some(delegate_sig) = delegate.signature.as_bytes() else {
            return false;
        };
        let validity = &delegate.tbs_certificate.validity;
        let valid_now = (validity.not_before.to_unix_duration().as_secs() as i64) <= now
            && now < validity.not_after.to_unix_duration().as_secs() as i64;
        valid_now
            && delegate.tbs_certificate.issuer == issuer.tbs_certificate.subject
            && may_sign_ocsp(delegate)
            && verify(
                issuer_key,
                &delegate.signature_algorithm,
                &delegate_tbs,
                delegate_sig,
            )
            && verify(
                &delegate.tbs_certificate.subject_public_key_info,
                &basic.signature_algorithm,
                tbs,
                sig,
            )
    })
}

fn may_sign_ocsp(cert: &Certificate) -> bool {
    cert.tbs_certificate
        .extensions
        .iter()
        .flatten()
        .filter(|e| e.extn_id == EXT_KEY_USAGE)
        .any(|e| {
            ExtendedKeyUsage::from_der(e.extn_value.as_bytes())
                .is_ok_and(|eku| eku.0.contains(&OCSP_SIGNING))
        })
}

fn verify(
    key: &SubjectPublicKeyInfoOwned,
    alg: &AlgorithmIdentifierOwned,
    msg: &[u8],
    sig: &[u8],
) -> bool {
    let Some(public) = key.subject_public_key.as_bytes() else {
        return false;
    };
    let curve = key
        .algorithm
        .parameters
        .as_ref()
        .and_then(|p| p.decode_as::<ObjectIdentifier>().ok());
    let verification: &'static dyn signature::VerificationAlgorithm = match (alg.oid, curve) {
        (a, _) if a == RSA_SHA256 => &signature::RSA_PKCS1_2048_8192_SHA256,
        (a, _) if a == RSA_SHA384 => &signature::RSA_PKCS1_2048_8192_SHA384,
        (a, _) if a == RSA_SHA512 => &signature::RSA_PKCS1_2048_8192_SHA512,
        (a, Some(c)) if a == ECDSA_SHA256 && c == P256 => &signature::ECDSA_P256_SHA256_ASN1,
        (a, Some(c)) if a == ECDSA_SHA256 && c == P384 => &signature::ECDSA_P384_SHA256_ASN1,
        (a, Some(c)) if a == ECDSA_SHA384 && c == P256 => &signature::ECDSA_P256_SHA384_ASN1,
        (a, Some(c)) if a == ECDSA_SHA384 && c == P384 => &signature::ECDSA_P384_SHA384_ASN1,
        (a, _) if a == ED25519 => &signature::ED25519,
        _ => return false,
    };
    UnparsedPublicKey::new(verification, public)
        .verify(msg, sig)
        .is_ok()
}

/// For the fuzz target: [`check`] and [`responder_url`] on arbitrary bytes, against a fixed
/// certificate and issuer. Never panics.
pub fn fuzz(data: &[u8]) {
    use std::sync::OnceLock;
    static PAIR: OnceLock<(Vec<u8>, Vec<u8>)> = OnceLock::new();
    let (leaf, issuer) = PAIR.get_or_init(|| {
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).expect("CA");
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let leaf_key = rcgen::KeyPair::generate().expect("key");
        let leaf = rcgen::CertificateParams::new(vec!["fuzz.test".to_string()])
            .expect("params")
            .signed_by(&leaf_key, &issuer)
            .expect("leaf");
        (leaf.der().to_vec(), ca_cert.der().to_vec())
    });
    let _ = check(data, leaf, issuer, 1_800_000_000);
    let _ = responder_url(data);
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lc_rs::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
    use der::asn1::{BitString, GeneralizedTime};
    use x509_ocsp::{
        OcspGeneralizedTime, ResponderId, ResponseBytes, ResponseData, SingleResponse,
    };

    const NOW: i64 = 1_800_000_000;

    /// A CA, a leaf it issued (with an AIA OCSP URL), and the CA's key (PKCS#8).
    struct Pki {
        ca: Vec<u8>,
        ca_key: Vec<u8>,
        leaf: Vec<u8>,
        issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    }

    fn aia(url: &str) -> rcgen::CustomExtension {
        // AuthorityInfoAccessSyntax ::= SEQUENCE OF SEQUENCE { id-ad-ocsp, [6] IA5String }
        let oid = [0x06, 0x08, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x30, 0x01];
        let mut loc = vec![0x86, url.len() as u8];
        loc.extend_from_slice(url.as_bytes());
        let mut desc = vec![0x30, (oid.len() + loc.len()) as u8];
        desc.extend_from_slice(&oid);
        desc.extend_from_slice(&loc);
        let mut seq = vec![0x30, desc.len() as u8];
        seq.extend_from_slice(&desc);
        rcgen::CustomExtension::from_oid_content(&[1, 3, 6, 1, 5, 5, 7, 1, 1], seq)
    }

    fn pki() -> Pki {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let pkcs8 = ca_key.serialize_der();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "Test CA");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["site.test".to_string()]).unwrap();
        params
            .custom_extensions
            .push(aia("http://127.0.0.1:9/ocsp"));
        let leaf = params.signed_by(&leaf_key, &issuer).unwrap();
        Pki {
            ca: ca_cert.der().to_vec(),
            ca_key: pkcs8,
            leaf: leaf.der().to_vec(),
            issuer,
        }
    }

    fn time(t: i64) -> OcspGeneralizedTime {
        OcspGeneralizedTime(
            GeneralizedTime::from_unix_duration(std::time::Duration::from_secs(t as u64)).unwrap(),
        )
    }

    struct Answer {
        status: CertStatus,
        this_update: i64,
        next_update: Option<i64>,
        hash: ObjectIdentifier,
        certs: Option<Vec<Certificate>>,
    }

    fn good() -> Answer {
        Answer {
            status: CertStatus::good(),
            this_update: NOW - 60,
            next_update: Some(NOW + 3600),
            hash: SHA1,
            certs: None,
        }
    }

    /// A response about `leaf` (issued by `issuer`), signed with `key` (PKCS#8 ECDSA P-256).
    fn respond(leaf: &[u8], issuer: &[u8], key: &[u8], a: Answer) -> Vec<u8> {
        let id = cert_id(
            &Certificate::from_der(leaf).unwrap(),
            &Certificate::from_der(issuer).unwrap(),
            a.hash,
        )
        .unwrap();
        let tbs = ResponseData {
            version: Default::default(),
            responder_id: ResponderId::ByKey(OctetString::new(vec![0; 20]).unwrap()),
            produced_at: time(a.this_update),
            responses: vec![SingleResponse {
                cert_id: id,
                cert_status: a.status,
                this_update: time(a.this_update),
                next_update: a.next_update.map(time),
                single_extensions: None,
            }],
            response_extensions: None,
        };
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, key).unwrap();
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let sig = pair.sign(&rng, &tbs.to_der().unwrap()).unwrap();
        let basic = BasicOcspResponse {
            tbs_response_data: tbs,
            signature_algorithm: AlgorithmIdentifierOwned {
                oid: ECDSA_SHA256,
                parameters: None,
            },
            signature: BitString::from_bytes(sig.as_ref()).unwrap(),
            certs: a.certs,
        };
        OcspResponse {
            response_status: OcspResponseStatus::Successful,
            response_bytes: Some(ResponseBytes {
                response_type: OCSP_BASIC,
                response: OctetString::new(basic.to_der().unwrap()).unwrap(),
            }),
        }
        .to_der()
        .unwrap()
    }

    #[test]
    fn responder_url_and_request() {
        let p = pki();
        assert_eq!(
            responder_url(&p.leaf).as_deref(),
            Some("http://127.0.0.1:9/ocsp")
        );
        assert_eq!(responder_url(&p.ca), None);
        let req = OcspRequest::from_der(&request(&p.leaf, &p.ca).unwrap()).unwrap();
        let id = &req.tbs_request.request_list[0].req_cert;
        assert_eq!(id.hash_algorithm.oid, SHA1);
        let leaf = Certificate::from_der(&p.leaf).unwrap();
        assert_eq!(id.serial_number, leaf.tbs_certificate.serial_number);
    }

    #[test]
    fn a_good_answer_signed_by_the_issuer_is_stapled() {
        let p = pki();
        for hash in [SHA1, SHA256] {
            let der = respond(&p.leaf, &p.ca, &p.ca_key, Answer { hash, ..good() });
            let staple = check(&der, &p.leaf, &p.ca, NOW).unwrap();
            assert_eq!(staple.der, der);
            assert_eq!(staple.next_update, NOW + 3600);
            assert_eq!(staple.refresh_at(NOW, 5), NOW - 60 + (3660 / 2));
        }
    }

    #[test]
    fn refused_answers() {
        let p = pki();
        let check_now =
            |a: Answer| check(&respond(&p.leaf, &p.ca, &p.ca_key, a), &p.leaf, &p.ca, NOW);
        let revoked = CertStatus::Revoked(x509_ocsp::RevokedInfo {
            revocation_time: time(NOW - 10),
            revocation_reason: None,
        });
        assert_eq!(
            check_now(Answer {
                status: revoked,
                ..good()
            }),
            Err(Refused::Revoked)
        );
        assert_eq!(
            check_now(Answer {
                status: CertStatus::unknown(),
                ..good()
            }),
            Err(Refused::Unknown)
        );
        assert_eq!(
            check_now(Answer {
                next_update: Some(NOW),
                ..good()
            }),
            Err(Refused::Expired)
        );
        assert_eq!(
            check_now(Answer {
                next_update: None,
                ..good()
            }),
            Err(Refused::NoNextUpdate)
        );
        assert_eq!(
            check_now(Answer {
                this_update: NOW + SKEW_SECS + 1,
                ..good()
            }),
            Err(Refused::NotYetValid)
        );
        // still good now, stale an hour later: never stapled past nextUpdate
        let der = respond(&p.leaf, &p.ca, &p.ca_key, good());
        assert!(check(&der, &p.leaf, &p.ca, NOW).is_ok());
        assert_eq!(
            check(&der, &p.leaf, &p.ca, NOW + 3600),
            Err(Refused::Expired)
        );
    }

    #[test]
    fn wrong_signer_or_certificate_is_refused() {
        let p = pki();
        let other = pki();
        // signed by another CA's key
        let der = respond(&p.leaf, &p.ca, &other.ca_key, good());
        assert_eq!(check(&der, &p.leaf, &p.ca, NOW), Err(Refused::BadSignature));
        // a genuine answer, but about another certificate
        let der = respond(&other.leaf, &other.ca, &other.ca_key, good());
        assert_eq!(
            check(&der, &p.leaf, &other.ca, NOW),
            Err(Refused::NotForThisCert)
        );
        // a bit flipped in the signed part
        let mut der = respond(&p.leaf, &p.ca, &p.ca_key, good());
        let at = der.len() / 2;
        der[at] ^= 1;
        assert!(check(&der, &p.leaf, &p.ca, NOW).is_err());
        // an error status, and garbage
        let err = OcspResponse::try_later().to_der().unwrap();
        assert_eq!(
            check(&err, &p.leaf, &p.ca, NOW),
            Err(Refused::Status(OcspResponseStatus::TryLater))
        );
        assert!(matches!(
            check(b"\x30\x03\x0a\x01", &p.leaf, &p.ca, NOW),
            Err(Refused::Malformed(_))
        ));
    }

    #[test]
    fn a_delegated_responder_needs_the_ocsp_signing_purpose() {
        let p = pki();
        let delegate = |purpose: bool| {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, "OCSP responder");
            if purpose {
                params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::OcspSigning];
            }
            let cert = params.signed_by(&key, &p.issuer).unwrap();
            (
                Certificate::from_der(cert.der()).unwrap(),
                key.serialize_der(),
            )
        };
        let (cert, key) = delegate(true);
        let der = respond(
            &p.leaf,
            &p.ca,
            &key,
            Answer {
                certs: Some(vec![cert]),
                ..good()
            },
        );
        assert!(check(&der, &p.leaf, &p.ca, NOW).is_ok());
        let (cert, key) = delegate(false);
        let der = respond(
            &p.leaf,
            &p.ca,
            &key,
            Answer {
                certs: Some(vec![cert]),
                ..good()
            },
        );
        assert_eq!(check(&der, &p.leaf, &p.ca, NOW), Err(Refused::BadSignature));
    }

    #[test]
    fn fuzz_entry_survives_junk() {
        let p = pki();
        let der = respond(&p.leaf, &p.ca, &p.ca_key, good());
        for cut in [0, 1, 10, der.len() / 3, der.len() - 1] {
            fuzz(&der[..cut]);
        }
        fuzz(&der);
    }
}
