//! ACME Renewal Information (RFC 9773): the window in which the CA suggests a certificate be
//! renewed, asked through instant-acme; and the identifier a renewal order names in
//! `replaces`.

use std::time::{Duration, SystemTime};

use anyhow::Context;
use instant_acme::{Account, CertificateIdentifier};
use rustls::pki_types::CertificateDer;

/// The longest one question may take.
const DEADLINE: Duration = Duration::from_secs(30);

/// A CA's suggested renewal window, and when to ask again (its Retry-After).
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub start: SystemTime,
    pub end: SystemTime,
    pub retry_after: Duration,
}

/// The certificate's RFC 9773 identifier (its issuer's key identifier and its serial).
pub fn identifier(leaf: &CertificateDer<'_>) -> anyhow::Result<CertificateIdentifier<'static>> {
    CertificateIdentifier::try_from(leaf)
        .map(CertificateIdentifier::into_owned)
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// The window the CA suggests for `leaf`; `None` when the CA publishes no renewal information.
pub async fn ask(account: &Account, leaf: &CertificateDer<'_>) -> anyhow::Result<Option<Window>> {
    let id = identifier(leaf)?;
    let asked = tokio::time::timeout(DEADLINE, account.renewal_info(&id))
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {}s", DEADLINE.as_secs()))?;
    match asked {
        Ok((info, retry_after)) => Ok(Some(Window {
            start: info.suggested_window.start.into(),
            end: info.suggested_window.end.into(),
            retry_after,
        })),
        Err(instant_acme::Error::Unsupported(_)) => Ok(None),
        Err(e) => Err(e).context("renewal information"),
    }
}
