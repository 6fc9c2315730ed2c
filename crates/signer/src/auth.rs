//! The authenticated local channel between an agent and its signer.
//!
//! Two checks, both on every connection before any key is listed or used:
//!
//! 1. Kernel peer credentials (SO_PEERCRED): the signer serves only the uids it allows (by
//!    default its own), and with `--allow-own-group` the peers whose primary gid is its own.
//!    The socket file is also created mode 0600 (0660 with a group). This stops other local
//!    users.
//! 2. A mutual challenge-response over a shared key file (HMAC-SHA256, at least 32 bytes of
//!    key material, the file must not be readable by group or others): the signer sends a fresh
//!    nonce, the client answers with its own nonce and `HMAC(k, "client" | ns | nc)`, the
//!    signer answers `HMAC(k, "signer" | ns | nc)`. This stops a process running as an allowed
//!    uid that cannot read the key file (another service under the same account, a sandboxed
//!    or containerised process sharing the socket's directory) from having anything signed,
//!    stops replay of a recorded exchange (both nonces are fresh), and lets the agent refuse a
//!    process that took over the socket path and would answer with garbage or stall handshakes.
//!
//! Not covered: root, or a process that can read the key file or ptrace the agent or signer;
//! those own the machine's keys anyway. Frames after the exchange are not MACed: a connected
//! unix socket cannot be spliced into by another process, and nothing secret crosses it (the
//! private key never leaves the signer; the messages signed are public handshake data).

use std::path::Path;

use anyhow::{bail, Context};
use aws_lc_rs::hmac;
use zeroize::Zeroizing;

use crate::protocol::{Nonce, Proof};

const CLIENT_LABEL: &[u8] = b"baton-signer v1 client proof";
const SIGNER_LABEL: &[u8] = b"baton-signer v1 signer proof";
const MIN_KEY: usize = 32;

/// The shared key both sides prove they hold.
pub struct AuthKey(hmac::Key);

impl std::fmt::Debug for AuthKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthKey(..)")
    }
}

impl AuthKey {
    /// Reads a key file: its contents (surrounding whitespace trimmed, e.g. the output of
    /// `openssl rand -hex 32`) are the HMAC key. Refused when shorter than 32 bytes or when the
    /// file is accessible to group or others.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        let meta =
            std::fs::metadata(path).with_context(|| format!("auth key {}", path.display()))?;
        if meta.permissions().mode() & 0o077 != 0 {
            bail!(
                "auth key {}: readable by group or others (mode {:o}); chmod 600 it",
                path.display(),
                meta.permissions().mode() & 0o777
            );
        }
        let raw = Zeroizing::new(
            std::fs::read(path).with_context(|| format!("reading auth key {}", path.display()))?,
        );
        let text = raw.trim_ascii();
        if text.len() < MIN_KEY {
            bail!(
                "auth key {}: {} bytes, need at least {MIN_KEY} (e.g. `openssl rand -hex 32`)",
                path.display(),
                text.len()
            );
        }
        Ok(Self::from_bytes(text))
    }

    pub fn from_bytes(material: &[u8]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, material))
    }

    fn proof(&self, label: &[u8], server: &Nonce, client: &Nonce) -> Proof {
        let mut ctx = hmac::Context::with_key(&self.0);
        ctx.update(label);
        ctx.update(server);
        ctx.update(client);
        let mut out = [0; 32];
        out.copy_from_slice(ctx.sign().as_ref());
        out
    }

    pub fn client_proof(&self, server: &Nonce, client: &Nonce) -> Proof {
        self.proof(CLIENT_LABEL, server, client)
    }

    pub fn signer_proof(&self, server: &Nonce, client: &Nonce) -> Proof {
        self.proof(SIGNER_LABEL, server, client)
    }

    /// Constant-time check of a client's proof.
    pub fn check_client(&self, server: &Nonce, client: &Nonce, proof: &Proof) -> bool {
        verify(&self.0, CLIENT_LABEL, server, client, proof)
    }

    /// Constant-time check of the signer's proof.
    pub fn check_signer(&self, server: &Nonce, client: &Nonce, proof: &Proof) -> bool {
        verify(&self.0, SIGNER_LABEL, server, client, proof)
    }
}

fn verify(key: &hmac::Key, label: &[u8], server: &Nonce, client: &Nonce, proof: &Proof) -> bool {
    let mut data = Vec::with_capacity(label.len() + 64);
    data.extend_from_slice(label);
    data.extend_from_slice(server);
    data.extend_from_slice(client);
    hmac::verify(key, &data, proof).is_ok()
}

/// A fresh random nonce.
pub fn nonce() -> anyhow::Result<Nonce> {
    let mut n = [0; 32];
    aws_lc_rs::rand::fill(&mut n).map_err(|_| anyhow::anyhow!("no randomness"))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_bind_key_direction_and_nonces() {
        let k = AuthKey::from_bytes(&[7; 32]);
        let other = AuthKey::from_bytes(&[8; 32]);
        let (ns, nc) = ([1; 32], [2; 32]);
        let p = k.client_proof(&ns, &nc);
        assert!(k.check_client(&ns, &nc, &p));
        assert!(!other.check_client(&ns, &nc, &p), "another key");
        assert!(
            !k.check_signer(&ns, &nc, &p),
            "a client proof is no signer proof"
        );
        assert!(
            !k.check_client(&[3; 32], &nc, &p),
            "replayed against a new challenge"
        );
        assert!(!k.check_client(&ns, &[3; 32], &p));
        assert!(k.check_signer(&ns, &nc, &k.signer_proof(&ns, &nc)));
        assert_ne!(nonce().unwrap(), nonce().unwrap());
    }

    #[test]
    fn key_files_must_be_private_and_long_enough() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("baton-signer-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("k");
        std::fs::write(&path, "ab".repeat(32) + "\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = AuthKey::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        AuthKey::from_file(&path).unwrap();
        std::fs::write(&path, "short\n").unwrap();
        let e = AuthKey::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("at least 32"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
