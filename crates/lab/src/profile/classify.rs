//! Which kind of cryptography a sampled leaf symbol is (sans-IO).
//!
//! Without frame pointers (the release profile has none) perf sees only the function the CPU
//! was in, so a sample is classified by that leaf symbol alone. aws-lc is linked statically
//! into `baton`: its C functions carry a version prefix (`aws_lc_0_47_0_SHA256_Update`), its
//! assembly routines do not (`_aesni_ctr32_ghash_6x`, `ecp_nistz256_ord_sqr_montx`,
//! `Lcurve25519_x25519_scalarloop`, `KeccakF1600_ExtractBytes`), so names are matched by what
//! they compute. Rust symbols (`a::b::c`) are never matched by keyword ("shared" is not SHA):
//! only aws-lc-rs and rustls' aws-lc-rs provider glue count as crypto, unattributed.
//!
//! Ambiguities, and how they are settled (see `mod.rs` for what they cost):
//! - P-256 point arithmetic (`ecp_nistz256_*` but `_ord_`) serves both ECDSA signatures and
//!   P-256 ECDHE: [`Family::P256`], given to an op by [`Attribution`].
//! - ECDSA's scalar arithmetic mod the group order (`ecp_nistz256_ord_*`, `ec_scalar_*`,
//!   `ecdsa_*`) is signing (or verifying) only.
//! - Montgomery bignum code is RSA (private key: sign; public: verify).
//! - SHA-3/SHAKE (Keccak) is ML-KEM's, so key exchange.
//! - The DRBG (`RAND_bytes`, `CTR_DRBG`, `rdrand`) serves key generation, ECDSA nonces and
//!   rustls' randoms alike: [`Family::Rng`], crypto with no op.
//! - memcpy/malloc done for a crypto call (copying a record into place) are libc's: other.

use std::collections::BTreeMap;

use super::script::{self, Frame};

/// What a leaf symbol computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    /// AES-GCM, ChaCha20-Poly1305: records and tickets.
    Aead,
    /// SHA-1/2, HMAC, HKDF, the TLS PRF.
    Hash,
    /// X25519 and ML-KEM (with its Keccak).
    Kx,
    /// P-256 point and field arithmetic: ECDSA or ECDHE, see [`Attribution`].
    P256,
    /// Arithmetic mod the group order: ECDSA only.
    Ecdsa,
    /// Montgomery bignum arithmetic: RSA.
    Rsa,
    /// The random generator.
    Rng,
    /// Other aws-lc code and the Rust glue around it (EVP plumbing, encoding, zeroizing).
    Glue,
    /// Not cryptography: the kernel, libc, tokio, hyper, rustls' state machine, Baton.
    Other,
}

impl Family {
    pub const ALL: [Family; 9] = [
        Family::Aead,
        Family::Hash,
        Family::Kx,
        Family::P256,
        Family::Ecdsa,
        Family::Rsa,
        Family::Rng,
        Family::Glue,
        Family::Other,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Family::Aead => "aead",
            Family::Hash => "hash",
            Family::Kx => "kx",
            Family::P256 => "p256",
            Family::Ecdsa => "ecdsa",
            Family::Rsa => "rsa",
            Family::Rng => "rng",
            Family::Glue => "glue",
            Family::Other => "other",
        }
    }

    pub fn is_crypto(self) -> bool {
        self != Family::Other
    }
}

/// Classifies one sample's leaf.
pub fn classify(dso: &str, kernel: bool, symbol: &str) -> Family {
    if kernel || dso.starts_with("lib") || dso.starts_with('[') {
        // kernel, libc/libm/libgcc, [vdso], [unknown]: aws-lc is inside the baton binary
        return Family::Other;
    }
    if symbol.contains("::") {
        let glue = symbol.contains("aws_lc_rs::") || symbol.contains("aws_lc_sys::");
        return if glue { Family::Glue } else { Family::Other };
    }
    let lower = symbol.to_ascii_lowercase();
    let name = strip_version(&lower);
    let has = |keys: &[&str]| keys.iter().any(|k| name.contains(k));
    // order matters: the more specific names first
    if has(&["rand", "drbg", "entropy", "jitter"]) {
        Family::Rng
    } else if has(&[
        "x25519",
        "curve25519",
        "mlkem",
        "ml_kem",
        "kem_",
        "keccak",
        "shake",
        "sha3",
    ]) {
        Family::Kx
    } else if has(&["nistz256_ord", "ecdsa", "ec_scalar", "ec_simple_scalar"]) {
        Family::Ecdsa
    } else if has(&[
        "nistz256", "p256", "ec_gfp", "ec_point", "ec_group", "ec_felem",
    ]) || name.starts_with("ec_")
    {
        Family::P256
    } else if has(&[
        "bn_", "bignum", "rsaz", "rsa", "mont", "mul4x", "mulx4x", "sqr8x", "sqrx8x",
    ]) {
        Family::Rsa
    } else if has(&["aes", "gcm", "ghash", "chacha", "poly1305", "aead"]) {
        Family::Aead
    } else if has(&["sha", "md5", "hmac", "hkdf", "prf", "digest", "evp_md"]) {
        Family::Hash
    } else if lower.starts_with("aws_lc_") {
        Family::Glue
    } else {
        Family::Other
    }
}

/// `aws_lc_0_47_0_sha256_update` -> `sha256_update`.
fn strip_version(name: &str) -> &str {
    let Some(rest) = name.strip_prefix("aws_lc_") else {
        return name;
    };
    let mut rest = rest;
    for _ in 0..3 {
        match rest.split_once('_') {
            Some((n, tail)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                rest = tail
            }
            _ => return name,
        }
    }
    rest
}

/// The agent's op whose metered call a sample is inside: the innermost metering wrapper on
/// its call chain (so a key exchange completed inside the key schedule is kx, as the metering
/// counts it). `None` outside any metered call.
pub fn metered_op(frames: &[Frame]) -> Option<&'static str> {
    frames.iter().find_map(|f| wrapper_op(&f.symbol))
}

/// `<baton_agent::metering::MeteredSigner as rustls::sign::Signer>::sign` -> `sign`.
fn wrapper_op(symbol: &str) -> Option<&'static str> {
    if let Some(rest) = symbol.split("baton_agent::metering::").nth(1) {
        let ty = rest.split([' ', ':', '<', '>']).next().unwrap_or("");
        return Some(match ty {
            "MeteredSigner" => "sign",
            "MeteredVerify" => "verify",
            "MeteredKxGroup" | "MeteredKx" => "kx",
            "MeteredEncrypter" => "bulk_encrypt",
            "MeteredDecrypter" => "bulk_decrypt",
            "MeteredHash" | "MeteredHashContext" | "MeteredHkdf" | "MeteredExpander"
            | "MeteredPrf" => "hash",
            // the signing key's scheme choice, the AEAD factories: not timed
            _ => return None,
        });
    }
    let ticket = symbol.contains("baton_agent::sessions::Ticketer as")
        && (symbol.ends_with(">::encrypt") || symbol.ends_with(">::decrypt"));
    ticket.then_some("ticket")
}

/// One recording of one process, both ways: by leaf symbol and by metered call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Profile {
    /// Samples by their leaf's family.
    pub samples: BTreeMap<Family, u64>,
    /// Samples inside a metered call, by the agent's op label.
    pub in_calls: BTreeMap<&'static str, u64>,
    /// Samples whose call chain reaches a thread's start (`clone3`, `start_thread`): those
    /// not unwound fully may be inside a metered call without showing it.
    pub unwound: u64,
    /// The leaf symbols behind each family with their samples, most first (for reports).
    pub symbols: BTreeMap<Family, Vec<(String, u64)>>,
}

impl Profile {
    /// From `perf script -F tid,ip,sym,dso --no-inline` text.
    pub fn from_script(text: &str) -> anyhow::Result<Profile> {
        let mut p = Profile::default();
        let mut symbols: BTreeMap<Family, BTreeMap<String, u64>> = BTreeMap::new();
        script::for_each_sample(text, |s| {
            let Some(leaf) = s.frames.first() else {
                return;
            };
            let f = classify(&leaf.dso, leaf.kernel(), &leaf.symbol);
            *p.samples.entry(f).or_default() += 1;
            *symbols
                .entry(f)
                .or_default()
                .entry(leaf.symbol.clone())
                .or_default() += 1;
            if let Some(op) = metered_op(&s.frames) {
                *p.in_calls.entry(op).or_default() += 1;
            }
            let root = s.frames.last().is_some_and(|f| {
                ["start_thread", "clone3", "__clone", "_start"]
                    .iter()
                    .any(|r| f.symbol.starts_with(r))
            });
            p.unwound += u64::from(root);
        })?;
        p.symbols = symbols
            .into_iter()
            .map(|(f, m)| {
                let mut v: Vec<_> = m.into_iter().collect();
                v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                (f, v)
            })
            .collect();
        Ok(p)
    }

    pub fn total(&self) -> u64 {
        self.samples.values().sum()
    }

    pub fn get(&self, f: Family) -> u64 {
        self.samples.get(&f).copied().unwrap_or(0)
    }

    /// Samples whose leaf is cryptography.
    pub fn crypto(&self) -> u64 {
        self.samples
            .iter()
            .filter(|(f, _)| f.is_crypto())
            .map(|(_, n)| n)
            .sum()
    }

    /// Samples inside any metered call.
    pub fn in_any_call(&self) -> u64 {
        self.in_calls.values().sum()
    }
}

/// Where the ambiguous families go when samples are folded into the agent's ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attribution {
    /// The key exchange group is P-256 (secp256r1): its point arithmetic is then kx, and
    /// ECDSA's share of it cannot be told apart. Otherwise P-256 points are ECDSA's.
    pub p256_kx: bool,
}

/// The comparable groups of the agent's metered ops, which perf can tell apart by leaf symbol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum OpGroup {
    /// `sign` + `verify`.
    PublicKey,
    /// `kx`.
    Kx,
    /// `bulk_encrypt` + `bulk_decrypt` + `ticket` (one AES-GCM whichever way).
    Aead,
    /// `hash`.
    Hash,
}

impl OpGroup {
    pub const ALL: [OpGroup; 4] = [
        OpGroup::PublicKey,
        OpGroup::Kx,
        OpGroup::Aead,
        OpGroup::Hash,
    ];

    pub fn label(self) -> &'static str {
        match self {
            OpGroup::PublicKey => "sign+verify",
            OpGroup::Kx => "kx",
            OpGroup::Aead => "aead",
            OpGroup::Hash => "hash",
        }
    }

    /// The group of one of the agent's op labels (`baton_crypto_seconds_total{op}`).
    pub fn of_op(op: &str) -> Option<OpGroup> {
        Some(match op {
            "sign" | "verify" => OpGroup::PublicKey,
            "kx" => OpGroup::Kx,
            "bulk_encrypt" | "bulk_decrypt" | "ticket" => OpGroup::Aead,
            "hash" => OpGroup::Hash,
            _ => return None,
        })
    }

    /// The group a family's samples go to; `None` for the rng, glue and other.
    pub fn of_family(f: Family, a: Attribution) -> Option<OpGroup> {
        Some(match f {
            Family::Aead => OpGroup::Aead,
            Family::Hash => OpGroup::Hash,
            Family::Kx => OpGroup::Kx,
            Family::P256 if a.p256_kx => OpGroup::Kx,
            Family::P256 | Family::Ecdsa | Family::Rsa => OpGroup::PublicKey,
            Family::Rng | Family::Glue | Family::Other => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(sym: &str) -> Family {
        classify("baton", false, sym)
    }

    #[test]
    fn aws_lc_symbols_by_what_they_compute() {
        assert_eq!(
            c("aws_lc_0_47_0_sha512_block_data_order_nohw"),
            Family::Hash
        );
        assert_eq!(c("aws_lc_0_47_0_HMAC_Init_ex"), Family::Hash);
        assert_eq!(c("hmac_ctx_set_md_methods"), Family::Hash);
        assert_eq!(c("aws_lc_0_47_0_HKDF_expand"), Family::Hash);
        assert_eq!(c("_aesni_ctr32_ghash_6x"), Family::Aead);
        assert_eq!(c("aws_lc_0_47_0_aes_hw_set_encrypt_key"), Family::Aead);
        assert_eq!(c("aead_aes_gcm_open_gather_impl"), Family::Aead);
        assert_eq!(c("aws_lc_0_47_0_CRYPTO_gcm128_encrypt_ctr32"), Family::Aead);
        assert_eq!(c("aws_lc_0_47_0_chacha20_poly1305_seal"), Family::Aead);
        assert_eq!(c("Lcurve25519_x25519_scalarloop"), Family::Kx);
        assert_eq!(c("aws_lc_0_47_0_mlkem_reduce_avx2_asm"), Family::Kx);
        assert_eq!(c("aws_lc_0_47_0_sha3_keccak_f1600"), Family::Kx);
        assert_eq!(c("KeccakF1600_ExtractBytes"), Family::Kx);
        assert_eq!(c("aws_lc_0_47_0_KEM_KEY_set_raw_public_key"), Family::Kx);
        assert_eq!(c("ecp_nistz256_ord_sqr_montx"), Family::Ecdsa);
        assert_eq!(c("aws_lc_0_47_0_ec_scalar_is_zero"), Family::Ecdsa);
        assert_eq!(c("__ecp_nistz256_mul_montx"), Family::P256);
        assert_eq!(c("aws_lc_0_47_0_ecp_nistz256_avx2_select_w7"), Family::P256);
        assert_eq!(c("Lbignum_montinv_p256_midloop"), Family::P256);
        assert_eq!(c("aws_lc_0_47_0_ec_GFp_mont_felem_to_bytes"), Family::P256);
        assert_eq!(c("aws_lc_0_47_0_bn_mul_mont_nohw"), Family::Rsa);
        assert_eq!(c("aws_lc_0_47_0_rsaz_1024_sqr_avx2"), Family::Rsa);
        assert_eq!(c("bn_sqr8x_internal"), Family::Rsa);
        assert_eq!(c("mulx4x_internal"), Family::Rsa);
        assert_eq!(c("aws_lc_0_47_0_RAND_bytes"), Family::Rng);
        assert_eq!(c("aws_lc_0_47_0_CRYPTO_rdrand_multiple8"), Family::Rng);
        assert_eq!(c("aws_lc_0_47_0_CBB_flush"), Family::Glue);
        assert_eq!(c("aws_lc_0_47_0_OPENSSL_cleanse"), Family::Glue);
    }

    #[test]
    fn rust_symbols_are_never_matched_by_keyword() {
        assert_eq!(c("bytes::bytes::release_shared"), Family::Other);
        assert_eq!(c("<rustls::crypto::aws_lc_rs::hash::Context as rustls::crypto::hash::Context>::fork_finish"), Family::Glue);
        assert_eq!(c("aws_lc_rs::hkdf::Okm<L>::fill"), Family::Glue);
        assert_eq!(
            c("<baton_agent::metering::MeteredEncrypter as rustls::crypto::cipher::MessageEncrypter>::encrypt"),
            Family::Other
        );
        assert_eq!(c("rustls::server::tls13::client_hello::CompleteClientHelloHandling::handle_client_hello"), Family::Other);
    }

    #[test]
    fn kernel_libc_and_unknown_are_other() {
        assert_eq!(
            classify("[kernel.kallsyms]", true, "sha256_transform"),
            Family::Other
        );
        assert_eq!(
            classify("libc.so.6", false, "__memmove_avx_unaligned_erms"),
            Family::Other
        );
        assert_eq!(classify("libc.so.6", false, "random_r"), Family::Other);
        assert_eq!(
            classify("[vdso]", false, "__vdso_clock_gettime"),
            Family::Other
        );
        assert_eq!(
            classify("[unknown]", false, "0x00007f0000001234"),
            Family::Other
        );
        assert_eq!(c("0x000055d0c0ffee00"), Family::Other);
    }

    #[test]
    fn version_prefix_is_stripped_only_when_it_is_one() {
        assert_eq!(
            strip_version("aws_lc_0_47_0_sha256_update"),
            "sha256_update"
        );
        assert_eq!(
            strip_version("aws_lc_fips_0_13_0_x"),
            "aws_lc_fips_0_13_0_x"
        );
        assert_eq!(strip_version("memcpy"), "memcpy");
    }

    fn frames(symbols: &[&str]) -> Vec<Frame> {
        symbols
            .iter()
            .map(|s| Frame {
                symbol: s.to_string(),
                dso: "baton".into(),
            })
            .collect()
    }

    #[test]
    fn the_innermost_metering_wrapper_names_the_op() {
        let kx_in_hash = frames(&[
            "Lcurve25519_x25519_scalarloop",
            "<baton_agent::metering::MeteredKx as rustls::crypto::ActiveKeyExchange>::complete_for_tls_version",
            "<rustls::crypto::aws_lc_rs::tls13::AwsLcHkdf as rustls::crypto::tls13::Hkdf>::extract_from_kx_shared_secret",
            "<baton_agent::metering::MeteredHkdf as rustls::crypto::tls13::Hkdf>::extract_from_kx_shared_secret",
            "baton_agent::conn::serve::{{closure}}",
        ]);
        assert_eq!(metered_op(&kx_in_hash), Some("kx"));
        assert_eq!(metered_op(&kx_in_hash[2..]), Some("hash"));
        assert_eq!(metered_op(&kx_in_hash[4..]), None);
        let cases = [
            ("<baton_agent::metering::MeteredSigner as rustls::crypto::signer::Signer>::sign", Some("sign")),
            ("<baton_agent::metering::MeteredKxGroup as rustls::crypto::SupportedKxGroup>::start_and_complete", Some("kx")),
            ("<baton_agent::metering::MeteredEncrypter as rustls::crypto::cipher::MessageEncrypter>::encrypt", Some("bulk_encrypt")),
            ("<baton_agent::metering::MeteredDecrypter as rustls::crypto::cipher::MessageDecrypter>::decrypt", Some("bulk_decrypt")),
            ("<baton_agent::metering::MeteredVerify as rustls_pki_types::SignatureVerificationAlgorithm>::verify_signature", Some("verify")),
            ("<baton_agent::metering::MeteredHashContext as rustls::crypto::hash::Context>::update", Some("hash")),
            ("<baton_agent::metering::MeteredPrf as rustls::crypto::tls12::Prf>::for_secret", Some("hash")),
            ("<baton_agent::sessions::Ticketer as rustls::server::ProducesTickets>::decrypt", Some("ticket")),
            ("<baton_agent::sessions::Ticketer as rustls::server::ProducesTickets>::lifetime", None),
            ("<baton_agent::metering::MeteredSigningKey as rustls::crypto::signer::SigningKey>::choose_scheme", None),
        ];
        for (sym, op) in cases {
            assert_eq!(metered_op(&frames(&[sym])), op, "{sym}");
        }
    }

    #[test]
    fn p256_goes_where_the_attribution_says() {
        let sig = Attribution { p256_kx: false };
        let kx = Attribution { p256_kx: true };
        assert_eq!(
            OpGroup::of_family(Family::P256, sig),
            Some(OpGroup::PublicKey)
        );
        assert_eq!(OpGroup::of_family(Family::P256, kx), Some(OpGroup::Kx));
        assert_eq!(
            OpGroup::of_family(Family::Ecdsa, kx),
            Some(OpGroup::PublicKey)
        );
        assert_eq!(OpGroup::of_family(Family::Rng, kx), None);
        for op in [
            "sign",
            "kx",
            "bulk_encrypt",
            "bulk_decrypt",
            "verify",
            "hash",
            "ticket",
        ] {
            assert!(OpGroup::of_op(op).is_some(), "{op}");
        }
        assert_eq!(OpGroup::of_op("new_op"), None);
    }
}

/// Real `perf script` output of `baton agent` (release build) under `baton bench` with 50 KB
/// bodies, full handshakes, recorded at 49 Hz with `--call-graph dwarf` (as [`super::Recording`]
/// does, at a lower rate to keep the files small).
#[cfg(test)]
mod captured {
    use super::*;

    const ECDSA_TLS13: &str = include_str!("testdata/ecdsa-p256-tls13.perf-script.txt");
    const RSA_TLS12: &str = include_str!("testdata/rsa-2048-tls12.perf-script.txt");

    #[test]
    fn ecdsa_tls13_full_handshakes() {
        let p = Profile::from_script(ECDSA_TLS13).unwrap();
        assert_eq!(p.total(), 39);
        let in_calls: Vec<_> = p.in_calls.iter().map(|(op, n)| (*op, *n)).collect();
        assert_eq!(
            in_calls,
            [("bulk_encrypt", 4), ("hash", 3), ("kx", 4), ("sign", 6)]
        );
        assert_eq!(p.get(Family::P256), 3);
        assert_eq!(p.get(Family::Kx), 2);
        assert_eq!(p.get(Family::Aead), 2);
        assert_eq!(p.get(Family::Hash), 2);
        assert_eq!(p.crypto(), 12);
        assert_eq!(p.get(Family::Other), 27);
        // with X25519MLKEM768 as the group, P-256 points are the ECDSA signature's
        let a = Attribution { p256_kx: false };
        assert_eq!(
            OpGroup::of_family(Family::P256, a),
            Some(OpGroup::PublicKey)
        );
    }

    #[test]
    fn rsa_tls12_full_handshakes() {
        let p = Profile::from_script(RSA_TLS12).unwrap();
        assert_eq!(p.total(), 72);
        let in_calls: Vec<_> = p.in_calls.iter().map(|(op, n)| (*op, *n)).collect();
        assert_eq!(in_calls, [("kx", 5), ("sign", 49)]);
        // RSA's private-key operation is Montgomery bignum code, whatever its name
        // (`bn_sqrx8x_internal`, `mulx4x_internal`, `__bn_postx4x_internal`...)
        assert_eq!(p.get(Family::Rsa), 47);
        let rsa = &p.symbols[&Family::Rsa];
        assert_eq!(rsa[0], ("aws_lc_0_47_0_bn_sqrx8x_internal".to_string(), 30));
        assert_eq!(p.get(Family::Kx), 3);
    }
}
