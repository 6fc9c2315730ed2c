//! Crypto metering: how many CPU-seconds the agent spends in each kind of cryptography.
//!
//! This answers seed 002's question ("what share of the server's CPU is crypto?") from inside the
//! server. It wraps the parts of rustls' `CryptoProvider` seam (cipher suites' AEADs, key
//! exchange groups, signature verification) and the signing keys the agent loads, and times
//! each call. The calls are synchronous and CPU-bound, so their wall time on the calling thread
//! is their CPU time unless the thread is preempted; two clock reads per call cost ~50 ns,
//! negligible next to a signature (~20 us and up) or a 16 KB record (~5 us).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use rustls::crypto::cipher::{
    AeadKey, InboundOpaqueMessage, InboundPlainMessage, Iv, KeyBlockShape, MessageDecrypter,
    MessageEncrypter, OutboundOpaqueMessage, OutboundPlainMessage, Tls12AeadAlgorithm,
    Tls13AeadAlgorithm, UnsupportedOperationError,
};
use rustls::crypto::{
    ActiveKeyExchange, CompletedKeyExchange, CryptoProvider, SharedSecret, SupportedKxGroup,
    WebPkiSupportedAlgorithms,
};
use rustls::pki_types::{AlgorithmIdentifier, InvalidSignature, SignatureVerificationAlgorithm};
use rustls::sign::{Signer, SigningKey};
use rustls::{
    CipherSuiteCommon, ConnectionTrafficSecrets, Error, NamedGroup, SignatureAlgorithm,
    SignatureScheme, SupportedCipherSuite, Tls12CipherSuite, Tls13CipherSuite,
};

/// A kind of cryptographic work, as reported in `baton_crypto_seconds_total{op}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CryptoOp {
    /// Private-key signatures (the server's CertificateVerify / ServerKeyExchange).
    Sign,
    /// Key exchange: key generation and shared-secret computation (ECDHE, ML-KEM).
    Kx,
    /// Bulk AEAD encryption of records sent.
    BulkEncrypt,
    /// Bulk AEAD decryption of records received.
    BulkDecrypt,
    /// Signature verification (client certificates in mutual mode).
    Verify,
}

impl CryptoOp {
    pub const ALL: [CryptoOp; 5] = [
        CryptoOp::Sign,
        CryptoOp::Kx,
        CryptoOp::BulkEncrypt,
        CryptoOp::BulkDecrypt,
        CryptoOp::Verify,
    ];

    pub fn label(self) -> &'static str {
        match self {
            CryptoOp::Sign => "sign",
            CryptoOp::Kx => "kx",
            CryptoOp::BulkEncrypt => "bulk_encrypt",
            CryptoOp::BulkDecrypt => "bulk_decrypt",
            CryptoOp::Verify => "verify",
        }
    }
}

/// Process-wide totals (crypto work has no connection of its own to be counted against).
#[derive(Debug)]
pub struct CryptoMeter {
    nanos: [AtomicU64; 5],
    calls: [AtomicU64; 5],
}

pub static METER: CryptoMeter = CryptoMeter {
    nanos: [const { AtomicU64::new(0) }; 5],
    calls: [const { AtomicU64::new(0) }; 5],
};

impl CryptoMeter {
    /// Seconds spent in `op` since the process started.
    pub fn seconds(&self, op: CryptoOp) -> f64 {
        self.nanos[op as usize].load(Ordering::Relaxed) as f64 / 1e9
    }

    /// Calls of `op` since the process started.
    pub fn calls(&self, op: CryptoOp) -> u64 {
        self.calls[op as usize].load(Ordering::Relaxed)
    }

    fn time<T>(&self, op: CryptoOp, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        let nanos = start.elapsed().as_nanos() as u64;
        self.nanos[op as usize].fetch_add(nanos, Ordering::Relaxed);
        self.calls[op as usize].fetch_add(1, Ordering::Relaxed);
        out
    }
}

/// The aws-lc-rs provider with every suite, group and verification algorithm metered.
///
/// Built once per process: rustls wants `&'static` parts, so the wrappers are leaked exactly
/// once and shared by every configuration (policies narrow this provider, never rebuild it).
pub fn metered_provider() -> &'static CryptoProvider {
    static PROVIDER: OnceLock<CryptoProvider> = OnceLock::new();
    PROVIDER.get_or_init(|| {
        let base = rustls::crypto::aws_lc_rs::default_provider();
        CryptoProvider {
            cipher_suites: rustls::crypto::aws_lc_rs::ALL_CIPHER_SUITES
                .iter()
                .map(|s| meter_suite(*s))
                .collect(),
            kx_groups: rustls::crypto::aws_lc_rs::ALL_KX_GROUPS
                .iter()
                .map(|g| &*Box::leak(Box::new(MeteredKxGroup(*g))) as &'static dyn SupportedKxGroup)
                .collect(),
            signature_verification_algorithms: meter_verification(
                base.signature_verification_algorithms,
            ),
            ..base
        }
    })
}

/// Wraps a loaded private key so that its signatures are metered.
pub fn metered_signing_key(key: Arc<dyn SigningKey>) -> Arc<dyn SigningKey> {
    Arc::new(MeteredSigningKey(key))
}

fn meter_suite(suite: SupportedCipherSuite) -> SupportedCipherSuite {
    let common = |c: &CipherSuiteCommon| CipherSuiteCommon {
        suite: c.suite,
        hash_provider: c.hash_provider,
        confidentiality_limit: c.confidentiality_limit,
    };
    match suite {
        SupportedCipherSuite::Tls13(s) => {
            SupportedCipherSuite::Tls13(Box::leak(Box::new(Tls13CipherSuite {
                common: common(&s.common),
                hkdf_provider: s.hkdf_provider,
                aead_alg: Box::leak(Box::new(MeteredTls13Aead(s.aead_alg))),
                quic: s.quic,
            })))
        }
        SupportedCipherSuite::Tls12(s) => {
            SupportedCipherSuite::Tls12(Box::leak(Box::new(Tls12CipherSuite {
                common: common(&s.common),
                prf_provider: s.prf_provider,
                kx: s.kx,
                sign: s.sign,
                aead_alg: Box::leak(Box::new(MeteredTls12Aead(s.aead_alg))),
            })))
        }
    }
}

fn meter_verification(base: WebPkiSupportedAlgorithms) -> WebPkiSupportedAlgorithms {
    // Each distinct algorithm gets one wrapper, found again by address for the mapping table.
    let wrap = |alg: &'static dyn SignatureVerificationAlgorithm| -> &'static dyn SignatureVerificationAlgorithm {
        Box::leak(Box::new(MeteredVerify(alg)))
    };
    let all: Vec<(
        &'static dyn SignatureVerificationAlgorithm,
        &'static dyn SignatureVerificationAlgorithm,
    )> = base.all.iter().map(|a| (*a, wrap(*a))).collect();
    let find = |alg: &'static dyn SignatureVerificationAlgorithm| {
        all.iter()
            .find(|(orig, _)| std::ptr::addr_eq(*orig, alg))
            .map(|(_, w)| *w)
            .unwrap_or_else(|| wrap(alg))
    };
    let mapping: Vec<(
        SignatureScheme,
        &'static [&'static dyn SignatureVerificationAlgorithm],
    )> = base
        .mapping
        .iter()
        .map(|(scheme, algs)| {
            let wrapped: Vec<_> = algs.iter().map(|a| find(*a)).collect();
            (*scheme, &*Box::leak(wrapped.into_boxed_slice()))
        })
        .collect();
    let all: Vec<_> = all.into_iter().map(|(_, w)| w).collect();
    WebPkiSupportedAlgorithms {
        all: Box::leak(all.into_boxed_slice()),
        mapping: Box::leak(mapping.into_boxed_slice()),
    }
}

struct MeteredTls13Aead(&'static dyn Tls13AeadAlgorithm);

impl Tls13AeadAlgorithm for MeteredTls13Aead {
    fn encrypter(&self, key: AeadKey, iv: Iv) -> Box<dyn MessageEncrypter> {
        Box::new(MeteredEncrypter(self.0.encrypter(key, iv)))
    }
    fn decrypter(&self, key: AeadKey, iv: Iv) -> Box<dyn MessageDecrypter> {
        Box::new(MeteredDecrypter(self.0.decrypter(key, iv)))
    }
    fn key_len(&self) -> usize {
        self.0.key_len()
    }
    fn extract_keys(
        &self,
        key: AeadKey,
        iv: Iv,
    ) -> Result<ConnectionTrafficSecrets, UnsupportedOperationError> {
        self.0.extract_keys(key, iv)
    }
    fn fips(&self) -> bool {
        self.0.fips()
    }
}

struct MeteredTls12Aead(&'static dyn Tls12AeadAlgorithm);

impl Tls12AeadAlgorithm for MeteredTls12Aead {
    fn encrypter(&self, key: AeadKey, iv: &[u8], extra: &[u8]) -> Box<dyn MessageEncrypter> {
        Box::new(MeteredEncrypter(self.0.encrypter(key, iv, extra)))
    }
    fn decrypter(&self, key: AeadKey, iv: &[u8]) -> Box<dyn MessageDecrypter> {
        Box::new(MeteredDecrypter(self.0.decrypter(key, iv)))
    }
    fn key_block_shape(&self) -> KeyBlockShape {
        self.0.key_block_shape()
    }
    fn extract_keys(
        &self,
        key: AeadKey,
        iv: &[u8],
        explicit: &[u8],
    ) -> Result<ConnectionTrafficSecrets, UnsupportedOperationError> {
        self.0.extract_keys(key, iv, explicit)
    }
    fn fips(&self) -> bool {
        self.0.fips()
    }
}

struct MeteredEncrypter(Box<dyn MessageEncrypter>);

impl MessageEncrypter for MeteredEncrypter {
    fn encrypt(
        &mut self,
        msg: OutboundPlainMessage<'_>,
        seq: u64,
    ) -> Result<OutboundOpaqueMessage, Error> {
        METER.time(CryptoOp::BulkEncrypt, || self.0.encrypt(msg, seq))
    }
    fn encrypted_payload_len(&self, payload_len: usize) -> usize {
        self.0.encrypted_payload_len(payload_len)
    }
}

struct MeteredDecrypter(Box<dyn MessageDecrypter>);

impl MessageDecrypter for MeteredDecrypter {
    fn decrypt<'a>(
        &mut self,
        msg: InboundOpaqueMessage<'a>,
        seq: u64,
    ) -> Result<InboundPlainMessage<'a>, Error> {
        METER.time(CryptoOp::BulkDecrypt, || self.0.decrypt(msg, seq))
    }
}

#[derive(Debug)]
struct MeteredKxGroup(&'static dyn SupportedKxGroup);

impl SupportedKxGroup for MeteredKxGroup {
    fn start(&self) -> Result<Box<dyn ActiveKeyExchange>, Error> {
        let active = METER.time(CryptoOp::Kx, || self.0.start())?;
        Ok(Box::new(MeteredKx(active)))
    }
    fn start_and_complete(&self, peer_pub_key: &[u8]) -> Result<CompletedKeyExchange, Error> {
        METER.time(CryptoOp::Kx, || self.0.start_and_complete(peer_pub_key))
    }
    fn ffdhe_group(&self) -> Option<rustls::ffdhe_groups::FfdheGroup<'static>> {
        self.0.ffdhe_group()
    }
    fn name(&self) -> NamedGroup {
        self.0.name()
    }
    fn fips(&self) -> bool {
        self.0.fips()
    }
    fn usable_for_version(&self, version: rustls::ProtocolVersion) -> bool {
        self.0.usable_for_version(version)
    }
}

struct MeteredKx(Box<dyn ActiveKeyExchange>);

impl ActiveKeyExchange for MeteredKx {
    fn complete(self: Box<Self>, peer_pub_key: &[u8]) -> Result<SharedSecret, Error> {
        METER.time(CryptoOp::Kx, || self.0.complete(peer_pub_key))
    }
    fn complete_for_tls_version(
        self: Box<Self>,
        peer_pub_key: &[u8],
        tls_version: &rustls::SupportedProtocolVersion,
    ) -> Result<SharedSecret, Error> {
        METER.time(CryptoOp::Kx, || {
            self.0.complete_for_tls_version(peer_pub_key, tls_version)
        })
    }
    fn hybrid_component(&self) -> Option<(NamedGroup, &[u8])> {
        self.0.hybrid_component()
    }
    fn complete_hybrid_component(
        self: Box<Self>,
        peer_pub_key: &[u8],
    ) -> Result<SharedSecret, Error> {
        METER.time(CryptoOp::Kx, || {
            self.0.complete_hybrid_component(peer_pub_key)
        })
    }
    fn pub_key(&self) -> &[u8] {
        self.0.pub_key()
    }
    fn ffdhe_group(&self) -> Option<rustls::ffdhe_groups::FfdheGroup<'static>> {
        self.0.ffdhe_group()
    }
    fn group(&self) -> NamedGroup {
        self.0.group()
    }
}

#[derive(Debug)]
struct MeteredSigningKey(Arc<dyn SigningKey>);

impl SigningKey for MeteredSigningKey {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
        self.0
            .choose_scheme(offered)
            .map(|s| Box::new(MeteredSigner(s)) as Box<dyn Signer>)
    }
    fn public_key(&self) -> Option<rustls::pki_types::SubjectPublicKeyInfoDer<'_>> {
        self.0.public_key()
    }
    fn algorithm(&self) -> SignatureAlgorithm {
        self.0.algorithm()
    }
}

#[derive(Debug)]
struct MeteredSigner(Box<dyn Signer>);

impl Signer for MeteredSigner {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, Error> {
        METER.time(CryptoOp::Sign, || self.0.sign(message))
    }
    fn scheme(&self) -> SignatureScheme {
        self.0.scheme()
    }
}

#[derive(Debug)]
struct MeteredVerify(&'static dyn SignatureVerificationAlgorithm);

impl SignatureVerificationAlgorithm for MeteredVerify {
    fn verify_signature(
        &self,
        public_key: &[u8],
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), InvalidSignature> {
        METER.time(CryptoOp::Verify, || {
            self.0.verify_signature(public_key, message, signature)
        })
    }
    fn public_key_alg_id(&self) -> AlgorithmIdentifier {
        self.0.public_key_alg_id()
    }
    fn signature_alg_id(&self) -> AlgorithmIdentifier {
        self.0.signature_alg_id()
    }
    fn fips(&self) -> bool {
        self.0.fips()
    }
}
