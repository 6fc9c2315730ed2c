//! OCSP stapling: a task that keeps a checked response (see [`crate::ocsp`]) on every
//! certificate served whose issuer names a responder, by swapping the certificate store.
//!
//! Each second it looks at the live store (so certificates from a reload or a renewal are
//! picked up within a second), fetches what is due, drops a staple once past its nextUpdate
//! (never a stale one, even while the responder is down), and swaps in a store whose
//! `CertifiedKey::ocsp` carry the current staples. The swap is a compare-and-swap: a store
//! replaced meanwhile (SIGHUP, renewal) wins, and is stapled on the next pass.
//!
//! A fetch is an HTTP POST (RFC 6960 appendix A) to the responder, at most
//! [`FETCH_TIMEOUT`] for the whole exchange and [`MAX_RESPONSE`] bytes. A good response is
//! fetched again half-way through its validity window; a failed fetch is retried with a
//! backoff from [`RETRY_MIN`] to [`RETRY_MAX`], the current staple kept while it is valid.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, bail, Context};
use baton_ops::metrics::counters;
use http_body_util::{BodyExt, Full, Limited};
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use rustls::sign::CertifiedKey;
use tokio::task::JoinSet;

use crate::certs::CertEntry;
use crate::config::OcspStapling;
use crate::ocsp::{self, Refused, Staple};
use crate::resolver::{CertStore, Resolver};

pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
pub const MAX_RESPONSE: usize = 64 * 1024;
pub const RETRY_MIN: i64 = 5;
pub const RETRY_MAX: i64 = 600;
/// A good response is not fetched again sooner than this, however short its window.
const REFRESH_FLOOR: i64 = 5;
const TICK: Duration = Duration::from_secs(1);
/// A staple is dropped this long before its nextUpdate, so that no handshake between two
/// passes sends it late.
const DROP_AHEAD: i64 = 2;

/// Fetch outcomes, for `baton_ocsp_fetches_total{outcome}`.
const OUTCOMES: [&str; 6] = [
    "ok",
    "fetch_failed",
    "responder_error",
    "invalid",
    "revoked",
    "unknown",
];
static FETCHES: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];

fn count(outcome: &str) {
    if let Some(i) = OUTCOMES.iter().position(|o| *o == outcome) {
        FETCHES[i].fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Debug, Clone, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

pub fn encode(e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    counters(
        e,
        "baton_ocsp_fetches",
        "OCSP responses fetched for stapling, by outcome.",
        OUTCOMES
            .iter()
            .zip(&FETCHES)
            .map(|(outcome, n)| (OutcomeLabel { outcome }, n.load(Ordering::Relaxed))),
    )
}

/// What stapling one certificate needs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    url: String,
    issuer: Vec<u8>,
    name: String,
}

/// One certificate's stapling state, keyed by its DER.
#[derive(Debug)]
struct State {
    target: Target,
    staple: Option<Staple>,
    next_fetch: i64,
    failures: u32,
    /// A fetch for it is running.
    in_flight: bool,
}

/// Whether and where `entry` is stapled: it names an `http://` responder, its issuer is in
/// its chain, and `settings` allow it for its names.
fn target(entry: &CertEntry, settings: &OcspStapling) -> Option<Target> {
    let chain = &entry.certified.cert;
    if chain.len() < 2 || !settings.applies_to(&entry.names) {
        return None;
    }
    let url = ocsp::responder_url(&chain[0])?;
    url.starts_with("http://").then(|| Target {
        url,
        issuer: chain[1].to_vec(),
        name: entry.names.first().cloned().unwrap_or_default(),
    })
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Runs for the life of the agent. Fetches run as their own tasks, so a slow responder
/// never holds up dropping another (or its own) staple at its nextUpdate.
pub async fn run(resolver: Arc<Resolver>, settings: OcspStapling) {
    let mut states: HashMap<Vec<u8>, State> = HashMap::new();
    let mut fetches: JoinSet<(Vec<u8>, Result<Staple, Failure>)> = JoinSet::new();
    loop {
        while let Some(done) = fetches.try_join_next() {
            let Ok((leaf, result)) = done else { continue };
            if let Some(state) = states.get_mut(&leaf) {
                state.in_flight = false;
                settle(state, result, unix_now());
            }
        }
        let store = resolver.store();
        let mut live = HashSet::new();
        for entry in store.entries() {
            let leaf = &entry.certified.cert[0];
            if states.contains_key(leaf.as_ref()) {
                live.insert(leaf.to_vec());
            } else if let Some(target) = target(entry, &settings) {
                states.insert(
                    leaf.to_vec(),
                    State {
                        target,
                        staple: None,
                        next_fetch: 0,
                        failures: 0,
                        in_flight: false,
                    },
                );
                live.insert(leaf.to_vec());
            }
        }
        states.retain(|leaf, _| live.contains(leaf));
        let now = unix_now();
        for (leaf, state) in states.iter_mut() {
            if !state.in_flight && state.next_fetch <= now {
                state.in_flight = true;
                let (leaf, target) = (leaf.clone(), state.target.clone());
                fetches.spawn(async move {
                    let result = fetch_and_check(&leaf, &target).await;
                    (leaf, result)
                });
            }
            if state
                .staple
                .as_ref()
                .is_some_and(|s| s.next_update <= now + DROP_AHEAD)
            {
                tracing::warn!(name = %state.target.name, "OCSP staple past its nextUpdate: dropped");
                state.staple = None;
            }
        }
        if let Some(stapled) = restapled(&store, &states) {
            resolver.replace_if(&store, stapled);
        }
        tokio::time::sleep(TICK).await;
    }
}

/// A copy of `store` with each certificate's staple as `states` has it, or `None` when every
/// certificate already carries its own.
fn restapled(store: &CertStore, states: &HashMap<Vec<u8>, State>) -> Option<CertStore> {
    let mut changed = false;
    let entries = store
        .entries()
        .iter()
        .map(|e| {
            let want = e
                .certified
                .cert
                .first()
                .and_then(|leaf| states.get(leaf.as_ref()))
                .and_then(|s| s.staple.as_ref())
                .map(|s| s.der.clone());
            if e.certified.ocsp == want {
                return e.clone();
            }
            changed = true;
            let certified = CertifiedKey {
                ocsp: want,
                ..(*e.certified).clone()
            };
            CertEntry {
                certified: Arc::new(certified),
                ..e.clone()
            }
        })
        .collect();
    changed.then(|| CertStore::new(entries))
}

async fn fetch_and_check(leaf: &[u8], target: &Target) -> Result<Staple, Failure> {
    let body = fetch(leaf, target).await.map_err(Failure::Fetch)?;
    ocsp::check(&body, leaf, &target.issuer, unix_now()).map_err(Failure::Refused)
}

/// Records a fetch's result: the new staple and when to refresh it, or when to retry.
fn settle(state: &mut State, result: Result<Staple, Failure>, now: i64) {
    let name = &state.target.name;
    match result {
        Ok(staple) => {
            count("ok");
            state.failures = 0;
            state.next_fetch = staple.refresh_at(now, REFRESH_FLOOR);
            tracing::info!(%name, next_update = staple.next_update, "OCSP staple fetched");
            state.staple = Some(staple);
        }
        Err(failure) => {
            let label = match &failure {
                Failure::Fetch(_) => "fetch_failed",
                Failure::Refused(r) => r.label(),
            };
            count(label);
            let backoff = (RETRY_MIN << state.failures.min(10)).min(RETRY_MAX);
            state.failures = state.failures.saturating_add(1);
            state.next_fetch = now + backoff;
            match failure {
                Failure::Refused(Refused::Revoked) => tracing::error!(
                    %name,
                    "OCSP: the responder says this certificate is revoked; no staple"
                ),
                failure => tracing::warn!(
                    %name,
                    url = %state.target.url,
                    error = %failure,
                    retry_in_secs = backoff,
                    "OCSP fetch failed; keeping the current staple while it is valid"
                ),
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("{0:#}")]
    Fetch(anyhow::Error),
    #[error("response refused: {0}")]
    Refused(Refused),
}

/// POSTs the request for `leaf` to its responder; the response body.
async fn fetch(leaf: &[u8], target: &Target) -> anyhow::Result<Vec<u8>> {
    let request = ocsp::request(leaf, &target.issuer).map_err(|e| anyhow!("request: {e}"))?;
    tokio::time::timeout(FETCH_TIMEOUT, post(&target.url, request))
        .await
        .map_err(|_| anyhow!("no answer within {FETCH_TIMEOUT:?}"))?
}

async fn post(url: &str, body: Vec<u8>) -> anyhow::Result<Vec<u8>> {
    let uri: http::Uri = url
        .parse()
        .with_context(|| format!("responder URL {url}"))?;
    let host = uri.host().context("responder URL without a host")?;
    let port = uri.port_u16().unwrap_or(80);
    let authority = uri
        .authority()
        .context("responder URL without a host")?
        .clone();
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let tcp = tokio::net::TcpStream::connect((host, port))
        .await
        .with_context(|| format!("connecting to {authority}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
    let conn = tokio::spawn(conn);
    let req = http::Request::post(path)
        .header(http::header::HOST, authority.as_str())
        .header(http::header::CONTENT_TYPE, "application/ocsp-request")
        .header(http::header::ACCEPT, "application/ocsp-response")
        .body(Full::new(bytes::Bytes::from(body)))?;
    let resp = sender.send_request(req).await?;
    if resp.status() != http::StatusCode::OK {
        conn.abort();
        bail!("responder answered HTTP {}", resp.status());
    }
    let body = Limited::new(resp.into_body(), MAX_RESPONSE)
        .collect()
        .await
        .map_err(|e| anyhow!("response body: {e}"))?
        .to_bytes();
    conn.abort();
    Ok(body.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::self_signed;
    use crate::config::KeyKind;

    fn state(staple: Option<Staple>) -> State {
        State {
            target: Target {
                url: "http://127.0.0.1:9/".into(),
                issuer: vec![],
                name: "a.test".into(),
            },
            staple,
            next_fetch: 0,
            failures: 0,
            in_flight: false,
        }
    }

    #[test]
    fn a_self_signed_certificate_has_no_responder_to_ask() {
        let (e, _) = self_signed(KeyKind::EcdsaP256, &["a.test".to_string()]).unwrap();
        assert_eq!(
            target(
                &e,
                &OcspStapling {
                    on: true,
                    except: vec![]
                }
            ),
            None
        );
    }

    #[test]
    fn the_store_is_restapled_only_when_a_staple_changes() {
        let (a, _) = self_signed(KeyKind::EcdsaP256, &["a.test".to_string()]).unwrap();
        let (b, _) = self_signed(KeyKind::EcdsaP256, &["b.test".to_string()]).unwrap();
        let store = CertStore::new(vec![a.clone(), b.clone()]);
        let leaf = a.certified.cert[0].to_vec();
        let mut states = HashMap::new();
        states.insert(leaf.clone(), state(None));
        assert!(restapled(&store, &states).is_none());

        let staple = Staple {
            der: vec![1, 2, 3],
            this_update: 0,
            next_update: 10,
        };
        states.insert(leaf.clone(), state(Some(staple)));
        let stapled = restapled(&store, &states).expect("a new staple");
        assert_eq!(stapled.entries()[0].certified.ocsp, Some(vec![1, 2, 3]));
        assert_eq!(stapled.entries()[1].certified.ocsp, None);
        assert!(restapled(&stapled, &states).is_none());

        // dropped: the next store carries none
        states.insert(leaf, state(None));
        let unstapled = restapled(&stapled, &states).expect("the staple dropped");
        assert_eq!(unstapled.entries()[0].certified.ocsp, None);
    }

    #[test]
    fn failures_back_off_and_a_good_answer_is_refreshed_half_way() {
        let mut s = state(None);
        let now = 1_000;
        for expect in [RETRY_MIN, RETRY_MIN * 2, RETRY_MIN * 4] {
            settle(&mut s, Err(Failure::Fetch(anyhow!("down"))), now);
            assert_eq!(s.next_fetch, now + expect);
        }
        for _ in 0..20 {
            settle(&mut s, Err(Failure::Refused(Refused::NotForThisCert)), now);
        }
        assert_eq!(s.next_fetch, now + RETRY_MAX);
        let staple = Staple {
            der: vec![1],
            this_update: now - 100,
            next_update: now + 3500,
        };
        settle(&mut s, Ok(staple), now);
        assert_eq!((s.failures, s.next_fetch), (0, now + 1700));
        assert!(s.staple.is_some());
    }
}
