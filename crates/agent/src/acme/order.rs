//! One ACME order (RFC 8555) through `instant-acme`: the account (restored from the store or
//! created), the order for one name, its authorization answered by the configured challenge,
//! the CSR for a new key, and the issued chain.

use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, CertificateIdentifier, ChallengeType,
    Identifier, NewAccount, NewOrder, OrderStatus, RetryPolicy,
};
use zeroize::Zeroizing;

use super::http::{self, RetryAfter};
use super::material;
use super::AcmeConfig;
use crate::config::{AcmeChallenge, KeyKind};

/// How long the CA has to validate and to issue, each.
const POLL: RetryPolicy = RetryPolicy::new()
    .initial_delay(Duration::from_millis(250))
    .backoff(1.5)
    .timeout(Duration::from_secs(90));
/// The longest a dns-01 hook may run.
const HOOK_DEADLINE: Duration = Duration::from_secs(120);

/// Why an attempt failed.
#[derive(Debug)]
pub enum Failure {
    /// The CA said `urn:ietf:params:acme:error:rateLimited`.
    RateLimited(String),
    Other(anyhow::Error),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::RateLimited(d) => write!(f, "rate limited by the CA: {d}"),
            Failure::Other(e) => write!(f, "{e:#}"),
        }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        match e.downcast_ref::<instant_acme::Error>() {
            Some(instant_acme::Error::Api(p))
                if p.r#type.as_deref() == Some("urn:ietf:params:acme:error:rateLimited") =>
            {
                Failure::RateLimited(p.detail.clone().unwrap_or_default())
            }
            _ => Failure::Other(e),
        }
    }
}

/// The account's client, noting the Retry-After of the CA's refusals in `retry_after`.
fn builder(
    cfg: &AcmeConfig,
    retry_after: &RetryAfter,
) -> anyhow::Result<instant_acme::AccountBuilder> {
    let client = http::client(cfg.directory_ca.as_deref(), retry_after.clone())?;
    Ok(Account::builder_with_http(client))
}

/// The account from its stored credentials (JSON).
pub async fn restore(
    cfg: &AcmeConfig,
    credentials: &[u8],
    retry_after: &RetryAfter,
) -> anyhow::Result<Account> {
    let creds: AccountCredentials =
        serde_json::from_slice(credentials).context("stored ACME account")?;
    builder(cfg, retry_after)?
        .from_credentials(creds)
        .await
        .context("restoring the ACME account")
}

/// A new account (its key: ECDSA P-256, made by instant-acme), and its credentials (JSON,
/// with the private key: stored sealed, never logged).
pub async fn create(
    cfg: &AcmeConfig,
    retry_after: &RetryAfter,
) -> anyhow::Result<(Account, Zeroizing<Vec<u8>>)> {
    let contact = cfg.email.as_ref().map(|e| format!("mailto:{e}"));
    let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
    let (account, creds) = builder(cfg, retry_after)?
        .create(
            &NewAccount {
                contact: &contacts,
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            cfg.directory.clone(),
            None,
        )
        .await
        .context("creating the ACME account")?;
    let json = Zeroizing::new(serde_json::to_vec(&creds).context("ACME account")?);
    Ok((account, json))
}

/// Where the answer to a challenge goes while the CA checks it, and is taken away after.
pub trait Responder: Send + Sync {
    fn tls_alpn01(&self, name: &str, digest: &[u8]) -> anyhow::Result<()>;
    fn http01(&self, token: &str, key_authorization: &str);
    /// Called once the CA has looked (or the order failed), for everything set.
    fn clear(&self, name: &str, token: &str);
    /// Lets what was set reach the other agents before the CA is told to look.
    fn settle(&self) -> Duration;
}

/// Orders a certificate of `kind` for `name`, as the replacement of the certificate
/// `replaces` identifies (RFC 9773) when there is one; returns its bundle (chain, then key).
pub async fn order(
    account: &Account,
    cfg: &AcmeConfig,
    name: &str,
    kind: KeyKind,
    replaces: Option<CertificateIdentifier<'static>>,
    responder: &dyn Responder,
) -> anyhow::Result<Zeroizing<String>> {
    let identifiers = [Identifier::Dns(name.to_string())];
    let replacement = match replaces {
        Some(id) => match account
            .new_order(&NewOrder::new(&identifiers).replaces(id))
            .await
        {
            Ok(order) => Some(order),
            // a rate limit applies to the order whatever it replaces
            Err(instant_acme::Error::Api(p))
                if p.r#type.as_deref() == Some("urn:ietf:params:acme:error:rateLimited") =>
            {
                return Err(instant_acme::Error::Api(p)).context("new order");
            }
            // replaced already (an order of this cluster's that was cut short), or by another
            // account: ordered afresh
            Err(e) => {
                tracing::info!(name, error = %e, "ACME: the CA takes no replacement order; ordering afresh");
                None
            }
        },
        None => None,
    };
    let mut order = match replacement {
        Some(order) => order,
        None => account
            .new_order(&NewOrder::new(&identifiers))
            .await
            .context("new order")?,
    };
    let mut set: Vec<(String, String)> = Vec::new();
    let mut dns: Vec<(String, String)> = Vec::new();
    let outcome = async {
        let mut authorizations = order.authorizations();
        let mut any_pending = false;
        while let Some(authz) = authorizations.next().await {
            let mut authz = authz.context("authorization")?;
            match authz.status {
                AuthorizationStatus::Pending => {}
                AuthorizationStatus::Valid => continue,
                other => bail!("authorization is {other:?}"),
            }
            let kind = match cfg.challenge {
                AcmeChallenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
                AcmeChallenge::Http01 => ChallengeType::Http01,
                AcmeChallenge::Dns01 => ChallengeType::Dns01,
            };
            let mut challenge = authz
                .challenge(kind.clone())
                .ok_or_else(|| anyhow!("the CA offers no {kind:?} challenge for {name}"))?;
            let ident = challenge.identifier().to_string();
            let ka = challenge.key_authorization();
            match cfg.challenge {
                AcmeChallenge::TlsAlpn01 => {
                    responder.tls_alpn01(&ident, ka.digest().as_ref())?;
                    set.push((ident.clone(), String::new()));
                }
                AcmeChallenge::Http01 => {
                    responder.http01(&challenge.token, ka.as_str());
                    set.push((String::new(), challenge.token.clone()));
                }
                AcmeChallenge::Dns01 => {
                    let record = format!("_acme-challenge.{}", ident.trim_start_matches("*."));
                    let value = ka.dns_value();
                    dns_hook(cfg, "present", &record, &value).await?;
                    dns.push((record, value));
                }
            }
            tokio::time::sleep(responder.settle()).await;
            challenge.set_ready().await.context("challenge ready")?;
            any_pending = true;
        }
        let _ = any_pending;
        let status = order.poll_ready(&POLL).await.context("validation")?;
        if status != OrderStatus::Ready {
            bail!("order is {status:?} after validation");
        }
        Ok(())
    }
    .await;
    for (name, token) in &set {
        responder.clear(name, token);
    }
    for (record, value) in &dns {
        if let Err(e) = dns_hook(cfg, "cleanup", record, value).await {
            tracing::warn!(error = %format!("{e:#}"), "--acme-dns-hook cleanup failed");
        }
    }
    outcome?;
    let (key_pem, csr) = material::key_and_csr(kind, &[name.to_string()])?;
    order.finalize_csr(&csr).await.context("finalize")?;
    let chain = order.poll_certificate(&POLL).await.context("certificate")?;
    Ok(material::bundle(&chain, &key_pem))
}

/// Runs `--acme-dns-hook ACTION RECORD VALUE` within [`HOOK_DEADLINE`].
async fn dns_hook(cfg: &AcmeConfig, action: &str, record: &str, value: &str) -> anyhow::Result<()> {
    let hook = cfg
        .dns_hook
        .as_ref()
        .ok_or_else(|| anyhow!("dns-01 needs --acme-dns-hook"))?;
    let mut child = tokio::process::Command::new(hook)
        .args([action, record, value])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("running --acme-dns-hook {}", hook.display()))?;
    match tokio::time::timeout(HOOK_DEADLINE, child.wait()).await {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => bail!("--acme-dns-hook {action} {record}: {status}"),
        Ok(Err(e)) => Err(e).context("--acme-dns-hook"),
        Err(_) => bail!(
            "--acme-dns-hook {action} {record}: no exit within {}s",
            HOOK_DEADLINE.as_secs()
        ),
    }
}
