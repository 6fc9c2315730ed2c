//! The ACME client's HTTP: hyper with rustls (aws-lc-rs) trusting `--acme-directory-ca` or
//! the system's roots, wrapped so that the `Retry-After` of the CA's error responses is kept.
//! instant-acme hands an error's problem document on, not its headers; a rate-limited order
//! must wait what the CA asked for, so the wrapper notes it for the failed attempt to read.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::Request;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use instant_acme::{BodyWrapper, BytesResponse, HttpClient};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// The time the CA's last error response asked the client to wait until.
#[derive(Debug, Clone, Default)]
pub struct RetryAfter(Arc<Mutex<Option<SystemTime>>>);

impl RetryAfter {
    /// What the last error response since the previous `take` asked for, and forgets it.
    pub fn take(&self) -> Option<SystemTime> {
        self.0.lock().ok()?.take()
    }

    fn note(&self, at: SystemTime) {
        if let Ok(mut m) = self.0.lock() {
            *m = Some(at);
        }
    }
}

/// `inner`, noting in [`RetryAfter`] the `Retry-After` of every error response (4xx, 5xx).
/// Success responses are left alone: the CA's polling hints on them are instant-acme's.
pub struct Recording<C> {
    inner: C,
    retry_after: RetryAfter,
}

impl<C> Recording<C> {
    pub fn new(inner: C, retry_after: RetryAfter) -> Self {
        Recording { inner, retry_after }
    }
}

impl<C: HttpClient> HttpClient for Recording<C> {
    fn request(
        &self,
        req: Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>> {
        let response = self.inner.request(req);
        let note = self.retry_after.clone();
        Box::pin(async move {
            let rsp = response.await?;
            let status = rsp.parts.status;
            if status.is_client_error() || status.is_server_error() {
                let at = rsp
                    .parts
                    .headers
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| parse_retry_after(v, SystemTime::now()));
                if let Some(at) = at {
                    note.note(at);
                }
            }
            Ok(rsp)
        })
    }
}

/// A `Retry-After` value (RFC 9110: delay-seconds or an HTTP-date) as a point in time.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<SystemTime> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // more digits than a u64 holds: far away (capped by the caller)
        let secs = value.parse::<u64>().unwrap_or(u64::MAX);
        return now
            .checked_add(Duration::from_secs(secs))
            .or(Some(now + Duration::from_secs(u64::from(u32::MAX))));
    }
    httpdate::parse_http_date(value).ok()
}

/// The HTTPS client for the CA, wrapped in [`Recording`].
pub fn client(ca: Option<&Path>, retry_after: RetryAfter) -> anyhow::Result<Box<dyn HttpClient>> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .and_then(|i| i.collect::<Result<_, _>>())
                .map_err(|e| anyhow::anyhow!("{e}"))
                .with_context(|| format!("--acme-directory-ca {}", path.display()))?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                bail!("--acme-directory-ca {}: no certificate", path.display());
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                bail!("no system CA certificates to trust the ACME directory: give --acme-directory-ca");
            }
        }
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .enable_http2()
        .build();
    let hyper: Client<_, BodyWrapper<Bytes>> = Client::builder(TokioExecutor::new()).build(https);
    Ok(Box::new(Recording::new(hyper, retry_after)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use instant_acme::{Account, NewAccount};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn retry_after_in_seconds_or_as_a_date() {
        assert_eq!(parse_retry_after("120", t(1000)), Some(t(1120)));
        assert_eq!(parse_retry_after(" 0 ", t(1000)), Some(t(1000)));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", t(0)),
            Some(t(784_111_777))
        );
        assert!(parse_retry_after("99999999999999999999999", t(0)).unwrap() > t(1 << 31));
        assert_eq!(parse_retry_after("", t(0)), None);
        assert_eq!(parse_retry_after("-5", t(0)), None);
        assert_eq!(parse_retry_after("soon", t(0)), None);
    }

    /// A tiny ACME server on 127.0.0.1: a directory, a nonce, and a refusal of every new
    /// account with `status`, a problem of `kind` and `Retry-After: retry`.
    async fn refusing(status: u16, kind: &'static str, retry: &'static str) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let b = base.clone();
        tokio::spawn(async move {
            // bounded: the test makes a handful of requests
            for _ in 0..16 {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                // the head, then the body its Content-Length announces
                let head_end = loop {
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        break None;
                    }
                    req.extend_from_slice(&buf[..n]);
                    if let Some(i) = req.windows(4).position(|w| w == b"\r\n\r\n") {
                        break Some(i + 4);
                    }
                };
                let Some(head_end) = head_end else { continue };
                let head = String::from_utf8_lossy(&req[..head_end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while req.len() < head_end + len {
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    req.extend_from_slice(&buf[..n]);
                }
                let (status_line, headers, body) = if head.starts_with("get /dir") {
                    let dir = format!(
                        r#"{{"newNonce":"{b}/nonce","newAccount":"{b}/account","newOrder":"{b}/order"}}"#
                    );
                    (
                        "200 OK".to_string(),
                        "Content-Type: application/json\r\n".to_string(),
                        dir,
                    )
                } else if head.starts_with("head /nonce") {
                    (
                        "200 OK".into(),
                        "Replay-Nonce: n0nce\r\n".into(),
                        String::new(),
                    )
                } else {
                    (
                        format!("{status} Refused"),
                        format!(
                            "Content-Type: application/problem+json\r\nReplay-Nonce: n1\r\nRetry-After: {retry}\r\n"
                        ),
                        format!(r#"{{"type":"{kind}","detail":"too many","status":{status}}}"#),
                    )
                };
                let rsp = format!(
                    "HTTP/1.1 {status_line}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(rsp.as_bytes()).await;
                let _ = s.shutdown().await;
            }
        });
        base
    }

    async fn new_account(base: &str, retry_after: &RetryAfter) -> anyhow::Error {
        let hyper: Client<_, BodyWrapper<Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let http = Box::new(Recording::new(hyper, retry_after.clone()));
        let err = Account::builder_with_http(http)
            .create(
                &NewAccount {
                    contact: &[],
                    terms_of_service_agreed: true,
                    only_return_existing: false,
                },
                format!("{base}/dir"),
                None,
            )
            .await
            .err()
            .expect("refused");
        anyhow::Error::new(err)
    }

    #[tokio::test]
    async fn the_retry_after_of_a_refusal_reaches_the_caller() {
        let base = refusing(429, "urn:ietf:params:acme:error:rateLimited", "120").await;
        let retry_after = RetryAfter::default();
        let before = SystemTime::now();
        let err = new_account(&base, &retry_after).await;
        assert!(
            matches!(
                super::super::order::Failure::from(err),
                super::super::order::Failure::RateLimited(_)
            ),
            "a rateLimited problem"
        );
        let at = retry_after.take().expect("Retry-After noted");
        let wait = at.duration_since(before).unwrap();
        assert!(
            wait >= Duration::from_secs(119) && wait <= Duration::from_secs(180),
            "{wait:?}"
        );
        assert_eq!(retry_after.take(), None, "taken once");

        // any error with a Retry-After (here: the CA overloaded), in HTTP-date form
        let base = refusing(
            503,
            "urn:ietf:params:acme:error:serverInternal",
            "Fri, 01 Jan 2100 00:00:00 GMT",
        )
        .await;
        let err = new_account(&base, &retry_after).await;
        assert!(matches!(
            super::super::order::Failure::from(err),
            super::super::order::Failure::Other(_)
        ));
        assert_eq!(retry_after.take(), Some(t(4_102_444_800)));
    }
}
