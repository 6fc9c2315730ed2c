//! Crypto metering: how many CPU-seconds the agent spends in each kind of cryptography.
//!
//! This answers the crypto offload paper's question ("what share of the server's CPU is crypto?") from inside the
//! server. It wraps the parts of rustls' `CryptoProvider` seam (cipher suites' AEADs, hashes,
//! TLS 1.3 HKDF and TLS 1.2 PRF, key exchange groups, signature verification), the signing keys
//! the agent loads and the session ticket sealer, and times every call. Two clocks, because
//! the calls come in two kinds:
//! - `sign`, `verify`, `kx`: a few per handshake, 15 us and up each. Timed on the thread's CPU
//!   clock (`CLOCK_THREAD_CPUTIME_ID`), so a thread preempted in the middle of a signature is
//!   not charged for the time another process ran (on a busy 2-core machine a wall clock
//!   overstated crypto by half). That clock is a system call (~0.7 us in a VM), affordable
//!   here; its calibrated cost is subtracted.
//! - `hash`, `bulk_encrypt`, `bulk_decrypt`, `ticket`: ~60 calls in a full TLS 1.3 handshake
//!   (transcript-hash updates of a few hundred bytes, HKDF expansions, records), ~20 in a
//!   resumed TLS 1.2 one, most under 2 us. A system call around each would cost more than the
//!   work, and timing only a sample of them does not work either: the timed call runs right
//!   after a kernel entry with cold caches, and its slowness is then multiplied by the calls
//!   it stands for (measured: hash counted 4x). So they are timed on the monotonic clock (vDSO,
//!   ~30 ns, no kernel entry), and a call longer than [`PREEMPTED_AFTER`] (none of them takes
//!   that long on the CPU: a 16 KB record is ~5 us) is taken as preempted and counted as that
//!   bound, so preemption adds at most that much per preemption.
//!
//! Cost per full TLS 1.3 handshake: ~130 monotonic reads (~4 us) and 4 thread-clock reads
//! (~3 us), next to several hundred microseconds of handshake CPU.
//!
//! Timing is exclusive: a metered call made inside another (the key exchange that
//! `Hkdf::extract_from_kx_shared_secret` and `Prf::for_key_exchange` complete) is counted under
//! its own op and subtracted from the caller's, so the ops add up to the metered total.
//!
//! What is not metered (an independent profile, `baton-lab`'s `profile`, sees it): the random
//! number generator for rustls' randoms and session ids, certificate parsing at load time, and
//! any crypto that rustls or aws-lc-rs does without going through these seams.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rustls::crypto::cipher::{
    AeadKey, InboundOpaqueMessage, InboundPlainMessage, Iv, KeyBlockShape, MessageDecrypter,
    MessageEncrypter, OutboundOpaqueMessage, OutboundPlainMessage, Tls12AeadAlgorithm,
    Tls13AeadAlgorithm, UnsupportedOperationError,
};
use rustls::crypto::hash::{self, Hash, HashAlgorithm};
use rustls::crypto::tls12::Prf;
use rustls::crypto::tls13::{Hkdf, HkdfExpander, OkmBlock, OutputLengthError};
use rustls::crypto::{
    hmac, ActiveKeyExchange, CompletedKeyExchange, CryptoProvider, SharedSecret, SupportedKxGroup,
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
    /// Hashing and key derivation: the handshake transcript hash, the TLS 1.3 key schedule
    /// (HKDF extract/expand, Finished HMACs) and the TLS 1.2 PRF (master secret, key block,
    /// Finished).
    Hash,
    /// Sealing and opening stateless session tickets (AES-256-GCM, `baton-session`).
    Ticket,
}

/// How many ops there are (the length of [`CryptoOp::ALL`]).
const OPS: usize = 7;

impl CryptoOp {
    /// Every op, in the order the metrics list them. Labels are stable: new ops are appended.
    pub const ALL: [CryptoOp; OPS] = [
        CryptoOp::Sign,
        CryptoOp::Kx,
        CryptoOp::BulkEncrypt,
        CryptoOp::BulkDecrypt,
        CryptoOp::Verify,
        CryptoOp::Hash,
        CryptoOp::Ticket,
    ];

    /// Whether calls are timed on the thread's CPU clock (few, long calls) or the monotonic
    /// clock (many, short ones).
    pub fn timed_on_cpu_clock(self) -> bool {
        matches!(self, CryptoOp::Sign | CryptoOp::Verify | CryptoOp::Kx)
    }

    pub fn label(self) -> &'static str {
        match self {
            CryptoOp::Sign => "sign",
            CryptoOp::Kx => "kx",
            CryptoOp::BulkEncrypt => "bulk_encrypt",
            CryptoOp::BulkDecrypt => "bulk_decrypt",
            CryptoOp::Verify => "verify",
            CryptoOp::Hash => "hash",
            CryptoOp::Ticket => "ticket",
        }
    }
}

/// Process-wide totals (crypto work has no connection of its own to be counted against).
#[derive(Debug)]
pub struct CryptoMeter {
    nanos: [AtomicU64; OPS],
    calls: [AtomicU64; OPS],
}

pub static METER: CryptoMeter = CryptoMeter {
    nanos: [const { AtomicU64::new(0) }; OPS],
    calls: [const { AtomicU64::new(0) }; OPS],
};

/// A short op's call that took longer than this on the wall clock was preempted (see the
/// module doc); it is counted as this long.
pub const PREEMPTED_AFTER: Duration = Duration::from_micros(50);

thread_local! {
    /// Nanoseconds spent in timed calls nested inside the timed call now running on this
    /// thread (`None` outside any), for exclusive timing.
    static NESTED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// This thread's CPU time, in nanoseconds.
fn thread_cpu_nanos() -> u64 {
    baton_ops::process::thread_cpu().as_nanos() as u64
}

/// What two back-to-back reads of the thread CPU clock measure: the part of a read's own cost
/// that falls inside a timed interval. Measured once (median of a few dozen pairs).
fn read_cost() -> u64 {
    static COST: OnceLock<u64> = OnceLock::new();
    *COST.get_or_init(|| {
        let mut d: Vec<u64> = (0..63)
            .map(|_| {
                let a = thread_cpu_nanos();
                thread_cpu_nanos().saturating_sub(a)
            })
            .collect();
        d.sort_unstable();
        d[d.len() / 2]
    })
}

impl CryptoMeter {
    /// Seconds spent in `op` since the process started.
    pub fn seconds(&self, op: CryptoOp) -> f64 {
        self.nanos[op as usize].load(Ordering::Relaxed) as f64 / 1e9
    }

    /// Calls of `op` since the process started.
    pub fn calls(&self, op: CryptoOp) -> u64 {
        self.calls[op as usize].load(Ordering::Relaxed)
    }

    /// Runs `f` and counts it under `op`, less the time of the metered calls it made (see
    /// the module doc for the clocks).
    pub fn time<T>(&self, op: CryptoOp, f: impl FnOnce() -> T) -> T {
        let outer = NESTED.replace(Some(0));
        let (out, spent) = if op.timed_on_cpu_clock() {
            let cost = read_cost();
            let start = thread_cpu_nanos();
            let out = f();
            let spent = thread_cpu_nanos().saturating_sub(start);
            (out, spent.saturating_sub(cost))
        } else {
            let start = Instant::now();
            let out = f();
            (out, start.elapsed().as_nanos() as u64)
        };
        let nested = NESTED
            .replace(outer.map(|o| o.saturating_add(spent)))
            .unwrap_or(0);
        let mut own = spent.saturating_sub(nested);
        if !op.timed_on_cpu_clock() {
            // the bound applies to the call's own time: the key exchange the key schedule
            // completes inside it is long, and counted (and subtracted) as kx
            own = own.min(PREEMPTED_AFTER.as_nanos() as u64);
        }
        self.nanos[op as usize].fetch_add(own, Ordering::Relaxed);
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
        hash_provider: Box::leak(Box::new(MeteredHash(c.hash_provider))),
        confidentiality_limit: c.confidentiality_limit,
    };
    match suite {
        SupportedCipherSuite::Tls13(s) => {
            SupportedCipherSuite::Tls13(Box::leak(Box::new(Tls13CipherSuite {
                common: common(&s.common),
                hkdf_provider: Box::leak(Box::new(MeteredHkdf(s.hkdf_provider))),
                aead_alg: Box::leak(Box::new(MeteredTls13Aead(s.aead_alg))),
                quic: s.quic,
            })))
        }
        SupportedCipherSuite::Tls12(s) => {
            SupportedCipherSuite::Tls12(Box::leak(Box::new(Tls12CipherSuite {
                common: common(&s.common),
                prf_provider: Box::leak(Box::new(MeteredPrf(s.prf_provider))),
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

/// The suite's hash: the handshake transcript (`start` and the context's methods) and one-shot
/// hashes of the key schedule.
struct MeteredHash(&'static dyn Hash);

impl Hash for MeteredHash {
    fn start(&self) -> Box<dyn hash::Context> {
        let ctx = METER.time(CryptoOp::Hash, || self.0.start());
        Box::new(MeteredHashContext(ctx))
    }
    fn hash(&self, data: &[u8]) -> hash::Output {
        METER.time(CryptoOp::Hash, || self.0.hash(data))
    }
    fn output_len(&self) -> usize {
        self.0.output_len()
    }
    fn algorithm(&self) -> HashAlgorithm {
        self.0.algorithm()
    }
    fn fips(&self) -> bool {
        self.0.fips()
    }
}

struct MeteredHashContext(Box<dyn hash::Context>);

impl hash::Context for MeteredHashContext {
    fn fork_finish(&self) -> hash::Output {
        METER.time(CryptoOp::Hash, || self.0.fork_finish())
    }
    fn fork(&self) -> Box<dyn hash::Context> {
        Box::new(MeteredHashContext(
            METER.time(CryptoOp::Hash, || self.0.fork()),
        ))
    }
    fn finish(self: Box<Self>) -> hash::Output {
        METER.time(CryptoOp::Hash, || self.0.finish())
    }
    fn update(&mut self, data: &[u8]) {
        METER.time(CryptoOp::Hash, || self.0.update(data))
    }
}

/// TLS 1.3's key schedule: every extraction and expansion of a secret.
struct MeteredHkdf(&'static dyn Hkdf);

impl Hkdf for MeteredHkdf {
    fn extract_from_zero_ikm(&self, salt: Option<&[u8]>) -> Box<dyn HkdfExpander> {
        let e = METER.time(CryptoOp::Hash, || self.0.extract_from_zero_ikm(salt));
        Box::new(MeteredExpander(e))
    }
    fn extract_from_secret(&self, salt: Option<&[u8]>, secret: &[u8]) -> Box<dyn HkdfExpander> {
        let e = METER.time(CryptoOp::Hash, || self.0.extract_from_secret(salt, secret));
        Box::new(MeteredExpander(e))
    }
    fn extract_from_kx_shared_secret(
        &self,
        salt: Option<&[u8]>,
        kx: Box<dyn ActiveKeyExchange>,
        peer_pub_key: &[u8],
    ) -> Result<Box<dyn HkdfExpander>, Error> {
        // `kx` is a `MeteredKx`: its completion counts as kx and is subtracted from this.
        let e = METER.time(CryptoOp::Hash, || {
            self.0.extract_from_kx_shared_secret(salt, kx, peer_pub_key)
        })?;
        Ok(Box::new(MeteredExpander(e)))
    }
    fn expander_for_okm(&self, okm: &OkmBlock) -> Box<dyn HkdfExpander> {
        let e = METER.time(CryptoOp::Hash, || self.0.expander_for_okm(okm));
        Box::new(MeteredExpander(e))
    }
    fn hmac_sign(&self, key: &OkmBlock, message: &[u8]) -> hmac::Tag {
        METER.time(CryptoOp::Hash, || self.0.hmac_sign(key, message))
    }
    fn fips(&self) -> bool {
        self.0.fips()
    }
}

struct MeteredExpander(Box<dyn HkdfExpander>);

impl HkdfExpander for MeteredExpander {
    fn expand_slice(&self, info: &[&[u8]], output: &mut [u8]) -> Result<(), OutputLengthError> {
        METER.time(CryptoOp::Hash, || self.0.expand_slice(info, output))
    }
    fn expand_block(&self, info: &[&[u8]]) -> OkmBlock {
        METER.time(CryptoOp::Hash, || self.0.expand_block(info))
    }
    fn hash_len(&self) -> usize {
        self.0.hash_len()
    }
}

/// TLS 1.2's PRF: master secret (from the key exchange), key block, Finished.
struct MeteredPrf(&'static dyn Prf);

impl Prf for MeteredPrf {
    fn for_key_exchange(
        &self,
        output: &mut [u8; 48],
        kx: Box<dyn ActiveKeyExchange>,
        peer_pub_key: &[u8],
        label: &[u8],
        seed: &[u8],
    ) -> Result<(), Error> {
        // As with HKDF: the nested kx completion is counted as kx, not here.
        METER.time(CryptoOp::Hash, || {
            self.0
                .for_key_exchange(output, kx, peer_pub_key, label, seed)
        })
    }
    fn for_secret(&self, output: &mut [u8], secret: &[u8], label: &[u8], seed: &[u8]) {
        METER.time(CryptoOp::Hash, || {
            self.0.for_secret(output, secret, label, seed)
        })
    }
    fn fips(&self) -> bool {
        self.0.fips()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A private meter, so that tests running in parallel in this process (whose handshakes
    /// use `METER`) do not disturb the counts.
    fn meter() -> CryptoMeter {
        CryptoMeter {
            nanos: [const { AtomicU64::new(0) }; OPS],
            calls: [const { AtomicU64::new(0) }; OPS],
        }
    }

    /// Burns `d` of this thread's CPU time (not wall time: the test may be preempted).
    fn spin(d: std::time::Duration) {
        let start = baton_ops::process::thread_cpu();
        while baton_ops::process::thread_cpu() - start < d {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn nested_calls_are_counted_once_under_their_own_op() {
        let m = meter();
        let us = std::time::Duration::from_micros(1);
        let total = baton_ops::process::thread_cpu();
        m.time(CryptoOp::Hash, || {
            spin(10 * us);
            m.time(CryptoOp::Kx, || spin(3000 * us));
            spin(10 * us);
        });
        let total = (baton_ops::process::thread_cpu() - total).as_secs_f64();
        let (hash, kx) = (m.seconds(CryptoOp::Hash), m.seconds(CryptoOp::Kx));
        assert!(kx >= 0.003 && kx <= total, "kx {kx} of {total}");
        // exclusive: the hash call's own ~20 us, not the 3 ms of kx inside it (and at most
        // the preemption bound, which applies to its own time)
        assert!(hash >= 0.000_02, "hash {hash}");
        assert!(hash <= PREEMPTED_AFTER.as_secs_f64(), "hash {hash}");
        assert_eq!((m.calls(CryptoOp::Hash), m.calls(CryptoOp::Kx)), (1, 1));
        // the thread-local nesting state is back to "outside any call"
        assert_eq!(NESTED.get(), None);
    }

    /// A short op's call that sleeps (as a preempted one waits) counts at most the bound.
    #[test]
    fn a_long_wait_in_a_short_op_counts_as_the_bound() {
        let m = meter();
        m.time(CryptoOp::BulkEncrypt, || {
            std::thread::sleep(std::time::Duration::from_millis(5))
        });
        assert_eq!(
            m.seconds(CryptoOp::BulkEncrypt),
            PREEMPTED_AFTER.as_secs_f64()
        );
        // the CPU clock does not advance while the thread sleeps
        m.time(CryptoOp::Sign, || {
            std::thread::sleep(std::time::Duration::from_millis(5))
        });
        assert!(
            m.seconds(CryptoOp::Sign) < 0.001,
            "{}",
            m.seconds(CryptoOp::Sign)
        );
        assert_eq!(m.calls(CryptoOp::Sign), 1);
    }

    #[test]
    fn labels_are_distinct_and_indexed_in_order() {
        for (i, op) in CryptoOp::ALL.iter().enumerate() {
            assert_eq!(*op as usize, i);
        }
        let mut labels: Vec<_> = CryptoOp::ALL.iter().map(|o| o.label()).collect();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), OPS);
    }

    /// A TLS 1.3 and a TLS 1.2 handshake through the metered provider, in memory: hash (the
    /// transcript, HKDF, PRF), kx, sign and the AEADs are all reached through the seam.
    #[test]
    fn handshakes_reach_every_handshake_op() {
        use rustls::pki_types::PrivateKeyDer;
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
            let before: Vec<u64> = CryptoOp::ALL.iter().map(|o| METER.calls(*o)).collect();
            let provider = Arc::new(metered_provider().clone());
            let server = rustls::ServerConfig::builder_with_provider(provider.clone())
                .with_protocol_versions(&[version])
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(
                    vec![cert.der().clone()],
                    PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
                )
                .unwrap();
            let mut roots = rustls::RootCertStore::empty();
            roots.add(cert.der().clone()).unwrap();
            let client = rustls::ClientConfig::builder_with_provider(provider)
                .with_protocol_versions(&[version])
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
            let mut c =
                rustls::ClientConnection::new(Arc::new(client), "localhost".try_into().unwrap())
                    .unwrap();
            let mut s = rustls::ServerConnection::new(Arc::new(server)).unwrap();
            let mut buf = Vec::new();
            while c.is_handshaking() || s.is_handshaking() {
                buf.clear();
                c.write_tls(&mut buf).unwrap();
                s.read_tls(&mut &buf[..]).unwrap();
                s.process_new_packets().unwrap();
                buf.clear();
                s.write_tls(&mut buf).unwrap();
                c.read_tls(&mut &buf[..]).unwrap();
                c.process_new_packets().unwrap();
            }
            for op in [
                CryptoOp::Hash,
                CryptoOp::Kx,
                CryptoOp::Verify,
                CryptoOp::BulkEncrypt,
            ] {
                assert!(
                    METER.calls(op) > before[op as usize],
                    "{version:?}: no {} call",
                    op.label()
                );
            }
        }
    }
}
