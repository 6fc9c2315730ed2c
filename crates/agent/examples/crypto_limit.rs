//! The crypto limit of a full TLS 1.3 handshake on this machine (`scripts/bench-agent`): how
//! long the server's unavoidable public-key work takes through the same rustls + aws-lc-rs
//! calls the agent makes — one ECDSA P-256 signature (CertificateVerify) and one X25519 key
//! pair plus agreement — and so how many full handshakes per CPU-second that work alone allows.
//! An RSA-2048 signature is timed too, for the RSA handshake's limit.
//!
//! Timed on the thread's CPU clock (a preempted run is not charged for other processes), the
//! median of several rounds of many calls each.
//!
//! Usage: cargo run --release -p baton-agent --example crypto_limit [ROUNDS]
//! Prints `name microseconds` lines, then `limit_ecdsa_x25519 HANDSHAKES_PER_CPU_S` and
//! `limit_rsa2048_x25519 HANDSHAKES_PER_CPU_S`.

use std::time::Duration;

use rustls::crypto::aws_lc_rs::{kx_group, sign};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::SigningKey;
use rustls::SignatureScheme;

/// Calls per round: long enough that the clock reads around a round do not matter.
const CALLS: u32 = 400;

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(7);
    // What a handshake signs: the 64 spaces, context string and transcript hash of RFC 8446
    // section 4.4.3 (the content does not change the cost; its length barely does).
    let message = [0x20u8; 130];

    let ecdsa = signing_key(&rcgen::PKCS_ECDSA_P256_SHA256, None);
    let ecdsa = ecdsa
        .choose_scheme(&[SignatureScheme::ECDSA_NISTP256_SHA256])
        .expect("P-256 signs with ECDSA_NISTP256_SHA256");
    let sign_p256 = median_us(rounds, || {
        ecdsa.sign(&message).expect("signing");
    });

    let rsa = signing_key(&rcgen::PKCS_RSA_SHA256, Some(rcgen::RsaKeySize::_2048));
    let rsa = rsa
        .choose_scheme(&[SignatureScheme::RSA_PSS_SHA256])
        .expect("RSA signs with RSA_PSS_SHA256");
    let sign_rsa = median_us(rounds, || {
        rsa.sign(&message).expect("signing");
    });

    // The client's share, made once: the server's work is its own key pair and the agreement.
    let peer = kx_group::X25519.start().expect("X25519 key pair");
    let peer_public = peer.pub_key().to_vec();
    let x25519 = median_us(rounds, || {
        let ours = kx_group::X25519.start().expect("X25519 key pair");
        ours.complete(&peer_public).expect("X25519 agreement");
    });

    println!("sign_ecdsa_p256 {sign_p256:.1}");
    println!("sign_rsa2048 {sign_rsa:.1}");
    println!("x25519_keygen_agree {x25519:.1}");
    println!("limit_ecdsa_x25519 {:.0}", 1e6 / (sign_p256 + x25519));
    println!("limit_rsa2048_x25519 {:.0}", 1e6 / (sign_rsa + x25519));
}

/// A fresh key of this kind as rustls' aws-lc-rs signing key (what the agent loads).
fn signing_key(
    alg: &'static rcgen::SignatureAlgorithm,
    rsa: Option<rcgen::RsaKeySize>,
) -> std::sync::Arc<dyn SigningKey> {
    let pair = match rsa {
        Some(size) => rcgen::KeyPair::generate_rsa_for(alg, size),
        None => rcgen::KeyPair::generate_for(alg),
    }
    .expect("key generation");
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pair.serialize_der()));
    sign::any_supported_type(&der).expect("aws-lc-rs loads the key")
}

/// Microseconds per call of `f`: the median over `rounds` rounds of [`CALLS`] calls.
fn median_us(rounds: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..CALLS / 4 {
        f(); // warm caches and lazily initialised tables
    }
    let mut per_call: Vec<f64> = (0..rounds.max(1))
        .map(|_| {
            let start = baton_ops::process::thread_cpu();
            for _ in 0..CALLS {
                f();
            }
            let spent: Duration = baton_ops::process::thread_cpu() - start;
            spent.as_secs_f64() * 1e6 / f64::from(CALLS)
        })
        .collect();
    per_call.sort_by(f64::total_cmp);
    per_call[per_call.len() / 2]
}
