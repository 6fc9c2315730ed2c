//! `--acme-*`, resolved: what the ACME loop (`super`) is given.

use std::path::PathBuf;

use anyhow::bail;

use crate::config::{AcmeChallenge, AgentArgs, KeyKind};

/// `--acme-*`, resolved.
#[derive(Debug, Clone)]
pub struct AcmeConfig {
    pub directory: String,
    pub domains: Vec<String>,
    pub directory_ca: Option<PathBuf>,
    pub email: Option<String>,
    pub challenge: AcmeChallenge,
    pub dns_hook: Option<PathBuf>,
    pub keys: Vec<KeyKind>,
}

impl AcmeConfig {
    pub fn resolve(args: &AgentArgs) -> anyhow::Result<Option<AcmeConfig>> {
        let Some(directory) = &args.acme_directory else {
            if !args.acme_domain.is_empty()
                || args.acme_directory_ca.is_some()
                || args.acme_email.is_some()
                || args.acme_challenge.is_some()
                || args.acme_dns_hook.is_some()
                || !args.acme_key.is_empty()
            {
                bail!("--acme-* settings need --acme-directory URL");
            }
            return Ok(None);
        };
        if !directory.starts_with("https://") {
            bail!("--acme-directory `{directory}`: must be an https:// URL");
        }
        if args.acme_domain.is_empty() {
            bail!("--acme-directory needs --acme-domain NAME (the names to order)");
        }
        let mut domains = Vec::new();
        for d in &args.acme_domain {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            let ok = !d.is_empty()
                && d.len() <= 253
                && d.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
            if !ok {
                bail!("--acme-domain `{d}`: not a DNS name (no wildcards: one name each)");
            }
            if !domains.contains(&d) {
                domains.push(d);
            }
        }
        let challenge = args.acme_challenge.unwrap_or(AcmeChallenge::TlsAlpn01);
        if challenge == AcmeChallenge::Dns01 && args.acme_dns_hook.is_none() {
            bail!("--acme-challenge dns-01 needs --acme-dns-hook CMD");
        }
        if challenge != AcmeChallenge::Dns01 && args.acme_dns_hook.is_some() {
            bail!("--acme-dns-hook only applies to --acme-challenge dns-01");
        }
        let mut keys = args.acme_key.clone();
        keys.dedup();
        if keys.is_empty() {
            keys.push(KeyKind::EcdsaP256);
        }
        Ok(Some(AcmeConfig {
            directory: directory.clone(),
            domains,
            directory_ca: args.acme_directory_ca.clone(),
            email: args.acme_email.clone(),
            challenge,
            dns_hook: args.acme_dns_hook.clone(),
            keys,
        }))
    }
}
