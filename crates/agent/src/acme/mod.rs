//! Certificates from an ACME CA (RFC 8555), ordered once for the cluster.
//!
//! Each agent runs [`run`]: it tells the others it is alive, reads the certificates they hold
//! and serves the newest (swapped into the resolver, no restart), and posts again what it holds
//! (see [`bulletin`]). The lowest live agent id orders what is due ([`plan`]): a name without
//! a certificate, or one whose renewal time came (picked in the CA's renewal window, else at
//! two thirds of its lifetime); an order in flight elsewhere is waited for, and with Redis the
//! store's lock is taken; failures back off (as long as the CA's Retry-After says), the old
//! certificate served meanwhile. Without a shared store each agent orders for itself.

mod ari;
mod bulletin;
mod http;
mod material;
pub mod metrics;
mod order;
pub mod plan;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use zeroize::Zeroizing;

use crate::challenges::Challenges;
pub use crate::config::AcmeConfig;
use crate::config::KeyKind;
use crate::context::Context;
use bulletin::Bulletin;
use metrics::{AcmeMetrics, Outcome};

/// An agent that just started waits this long before it may order: it has heard its peers'
/// heartbeats and read the certificates they post by then.
const SETTLING: Duration = Duration::from_secs(7);
/// The longest one attempt (account, order, validation, issuance) may take.
const ATTEMPT_DEADLINE: Duration = Duration::from_secs(240);
/// How long the order lock (Redis) lasts unless renewed; renewed every third of it while the
/// order runs, so an agent that dies mid-order frees the name within this.
const LOCK_TTL: Duration = Duration::from_secs(30);

fn kind_label(kind: KeyKind) -> &'static str {
    match kind {
        KeyKind::EcdsaP256 => "ecdsa-p256",
        KeyKind::EcdsaP384 => "ecdsa-p384",
        KeyKind::Rsa2048 => "rsa-2048",
        KeyKind::Rsa3072 => "rsa-3072",
        KeyKind::Rsa4096 => "rsa-4096",
        KeyKind::Ed25519 => "ed25519",
    }
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// One certificate: a name and a key kind.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Slot {
    name: String,
    kind: KeyKind,
}

impl Slot {
    fn topic(&self) -> String {
        format!("{CERT}{}/{}", kind_label(self.kind), self.name)
    }
}

#[derive(Default)]
struct SlotState {
    held: Option<material::Held>,
    /// What is posted for the others: the bundle (chain and key), secret.
    bundle: Option<Arc<Zeroizing<Vec<u8>>>>,
    failures: u32,
    retry_not_before: Option<SystemTime>,
    /// In [0, 1): how early in the last twentieth before two thirds, or where in the CA's
    /// renewal window, this certificate is renewed.
    jitter: f64,
    /// The time picked in the CA's renewal window for the certificate held.
    suggested: Option<SystemTime>,
    /// When to ask the CA's renewal information (again) for the certificate held.
    ask_window: Option<SystemTime>,
}

impl SlotState {
    /// A new certificate is held: its renewal is planned afresh.
    fn hold(&mut self, held: material::Held, bundle: Arc<Zeroizing<Vec<u8>>>) {
        self.held = Some(held);
        self.bundle = Some(bundle);
        self.failures = 0;
        self.retry_not_before = None;
        self.suggested = None;
        self.ask_window = None;
    }
}

/// What this agent posts in every period: heartbeat, held certificates, the account, and the
/// challenge answers of an order in progress.
#[derive(Default)]
struct Posts {
    items: Mutex<HashMap<String, Arc<Zeroizing<Vec<u8>>>>>,
}

impl Posts {
    fn set(&self, topic: String, value: Arc<Zeroizing<Vec<u8>>>) {
        if let Ok(mut m) = self.items.lock() {
            m.insert(topic, value);
        }
    }
    fn remove(&self, topic: &str) {
        if let Ok(mut m) = self.items.lock() {
            m.remove(topic);
        }
    }
    fn all(&self) -> Vec<(String, Arc<Zeroizing<Vec<u8>>>)> {
        self.items
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }
}

/// Answers challenges here, and (through the bulletin) on every agent of the cluster.
struct Responder {
    challenges: Arc<Challenges>,
    posts: Arc<Posts>,
    bulletin: Option<Bulletin>,
    /// What is set (name, token): cleared by the order, or after it when it was cut short.
    set: Mutex<Vec<(String, String)>>,
}

impl order::Responder for Responder {
    fn tls_alpn01(&self, name: &str, digest: &[u8]) -> anyhow::Result<()> {
        self.challenges
            .set_tls_alpn01(name.to_string(), material::alpn_validation(name, digest)?);
        self.posts.set(
            format!("alpn/{name}"),
            Arc::new(Zeroizing::new(digest.to_vec())),
        );
        if let Ok(mut set) = self.set.lock() {
            set.push((name.to_string(), String::new()));
        }
        self.post_now();
        Ok(())
    }

    fn http01(&self, token: &str, key_authorization: &str) {
        self.challenges
            .set_http01(token.to_string(), key_authorization.to_string());
        self.posts.set(
            format!("http01/{token}"),
            Arc::new(Zeroizing::new(key_authorization.as_bytes().to_vec())),
        );
        if let Ok(mut set) = self.set.lock() {
            set.push((String::new(), token.to_string()));
        }
        self.post_now();
    }

    fn clear(&self, name: &str, token: &str) {
        if !name.is_empty() {
            self.challenges.clear_tls_alpn01(name);
            self.posts.remove(&format!("alpn/{name}"));
        }
        if !token.is_empty() {
            self.challenges.clear_http01(token);
            self.posts.remove(&format!("http01/{token}"));
        }
    }

    fn settle(&self) -> Duration {
        match self.bulletin {
            // replication to peers, or the queued SET to Redis
            Some(_) => Duration::from_secs(1),
            None => Duration::ZERO,
        }
    }
}

impl Responder {
    /// Takes away what an order cut short (its deadline, a lost lock) left set.
    fn clear_left(&self) {
        let left = self
            .set
            .lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default();
        for (name, token) in left {
            order::Responder::clear(self, &name, &token);
        }
    }

    fn post_now(&self) {
        if let Some(b) = &self.bulletin {
            post_all(b, &self.posts, true);
        }
    }
}

/// The account's topic: kept without a bucket (it never changes once made).
const ACCOUNT: &str = "account/";
/// The certificates' topic.
const CERT: &str = "cert/";
/// An order in flight: the id of the agent ordering, under the certificate's topic.
const CLAIM: &str = "order/";

/// Posts the heartbeat, the orders in flight here and their challenge answers, and when this
/// agent orders (`orderer`) what it holds. An order outlives a change of orderer (an agent with
/// a lower id came back): its claim and its answers are posted until it ends.
fn post_all(b: &Bulletin, posts: &Posts, orderer: bool) {
    let now = SystemTime::now();
    b.post(&format!("alive/{}", b.me()), &unix(now).to_be_bytes(), now);
    for (topic, value) in posts.all() {
        if !orderer && (topic.starts_with(ACCOUNT) || topic.starts_with(CERT)) {
            continue;
        }
        // The account, and the latest certificates for an agent that starts when no agent
        // posts (the whole cluster restarted, with a store that outlived it: Redis).
        if topic.starts_with(ACCOUNT) || topic.starts_with(CERT) {
            b.keep(&topic, &value);
        }
        if !topic.starts_with(ACCOUNT) {
            b.post(&topic, &value, now);
        }
    }
}

/// The bulletin's lookups for challenges another agent of the cluster is answering.
fn shared_challenges(challenges: &Challenges, bulletin: Bulletin) {
    let b = bulletin.clone();
    challenges.set_shared_tls_alpn01(Box::new(move |name: &str| {
        // the current bucket first: the answer of the latest order
        let digest = b
            .read(&format!("alpn/{name}"), SystemTime::now())
            .into_iter()
            .next()?;
        material::alpn_validation(name, &digest).ok()
    }));
    challenges.set_shared_http01(Box::new(move |token: &str| {
        let ka = bulletin
            .read(&format!("http01/{token}"), SystemTime::now())
            .into_iter()
            .next()?;
        String::from_utf8(ka).ok()
    }));
}

/// Runs until the agent drains: keeps the ACME certificates of `cfg` issued, current and
/// served.
pub async fn run(ctx: Arc<Context>, cfg: AcmeConfig, metrics: Arc<AcmeMetrics>) {
    let me = ctx.config.agent_id;
    let bulletin = match (ctx.tls.store(), ctx.tls.cluster_ring(), &ctx.config.store) {
        (Some(store), Some(ring), crate::config::StoreKind::Peers { .. })
        | (Some(store), Some(ring), crate::config::StoreKind::Redis { .. }) => {
            Some(Bulletin::new(store.clone(), ring.clone(), me))
        }
        _ => None,
    };
    match &bulletin {
        Some(_) => {
            tracing::info!(names = ?cfg.domains, "ACME: ordered once for the cluster, through the shared store")
        }
        None => {
            tracing::info!(names = ?cfg.domains, "ACME: no shared store, this agent orders for itself")
        }
    }
    if let Some(b) = &bulletin {
        shared_challenges(&ctx.challenges, b.clone());
    }
    let posts = Arc::new(Posts::default());
    let ordering = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if let Some(b) = bulletin.clone() {
        let (posts, ordering) = (posts.clone(), ordering.clone());
        let draining = ctx.draining.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(bulletin::PERIOD);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = draining.cancelled() => return,
                }
                let (b, posts) = (b.clone(), posts.clone());
                let orderer = ordering.load(std::sync::atomic::Ordering::Relaxed);
                let _ = tokio::task::spawn_blocking(move || post_all(&b, &posts, orderer)).await;
            }
        });
    }
    let responder = Responder {
        challenges: ctx.challenges.clone(),
        posts: posts.clone(),
        bulletin: bulletin.clone(),
        set: Mutex::default(),
    };
    let account_topic = format!("{ACCOUNT}{}", short_hash(&cfg.directory));
    let retry_after = http::RetryAfter::default();
    let mut account: Option<instant_acme::Account> = None;
    // until the CA's directory shows it has none
    let mut ari_offered = true;
    // this agent's run, in the store's order locks (random: a restarted agent is another)
    let lock_token: Arc<[u8]> = {
        let mut t = [0u8; 16];
        let _ = aws_lc_rs::rand::fill(&mut t);
        let hex: String = t.iter().map(|b| format!("{b:02x}")).collect();
        Arc::from(format!("{me}/{hex}").into_bytes())
    };
    let mut slots: Vec<(Slot, SlotState)> = cfg
        .domains
        .iter()
        .flat_map(|name| {
            cfg.keys.iter().map(|kind| {
                (
                    Slot {
                        name: name.clone(),
                        kind: *kind,
                    },
                    SlotState {
                        jitter: jitter(),
                        ..Default::default()
                    },
                )
            })
        })
        .collect();
    let started = Instant::now();
    let mut tick = tokio::time::interval(bulletin::PERIOD);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = ctx.draining.cancelled() => return,
        }
        let now = SystemTime::now();
        // What the others hold: adopt what is newer.
        let mut changed = false;
        if let Some(b) = &bulletin {
            for (slot, state) in &mut slots {
                let (b2, topic) = (b.clone(), slot.topic());
                // without a certificate yet, also the one kept (a store's local copy of a
                // kept key could be stale later, never before this agent has read it)
                let first = state.held.is_none();
                let found = tokio::task::spawn_blocking(move || {
                    let mut found = b2.read(&topic, now);
                    if first {
                        found.extend(b2.kept(&topic));
                    }
                    found
                })
                .await
                .unwrap_or_default();
                for blob in found {
                    let origin = format!("acme {} {}", slot.name, kind_label(slot.kind));
                    let Ok(held) = material::open_bundle(&blob, origin) else {
                        continue;
                    };
                    let mine = state.held.as_ref().map(|h| h.not_after);
                    if plan::adopt(mine, held.not_after, now)
                        && held.entry.names.contains(&slot.name)
                    {
                        tracing::info!(name = %slot.name, key = kind_label(slot.kind), "ACME: certificate from the cluster");
                        let blob = Arc::new(Zeroizing::new(blob));
                        posts.set(slot.topic(), blob.clone());
                        state.hold(held, blob);
                        metrics.renewed_elsewhere(&slot.name);
                        changed = true;
                    }
                }
            }
        }
        if changed {
            serve(&ctx, &slots);
        }
        // Whose turn it is to order.
        let mine = match &bulletin {
            None => true,
            Some(b) => {
                let b2 = b.clone();
                let beats = tokio::task::spawn_blocking(move || heartbeats_below(&b2, now))
                    .await
                    .unwrap_or_default();
                let mut alive = plan::alive(&beats, now);
                alive.push(me);
                plan::orders(me, &alive, started.elapsed(), SETTLING)
            }
        };
        ordering.store(mine, std::sync::atomic::Ordering::Relaxed);
        if !mine {
            continue;
        }
        for i in 0..slots.len() {
            let state = &slots[i].1;
            let asking =
                ari_offered && state.held.is_some() && state.ask_window.is_none_or(|at| at <= now);
            if asking {
                if account.is_none() {
                    match get_account(
                        &cfg,
                        bulletin.as_ref(),
                        &account_topic,
                        &posts,
                        &retry_after,
                    )
                    .await
                    {
                        Ok(a) => account = Some(a),
                        Err(e) => {
                            tracing::warn!(error = %format!("{e:#}"), "ACME: no account to ask the CA's renewal information with")
                        }
                    }
                }
                let (slot, state) = &mut slots[i];
                match &account {
                    Some(acct) => ask_window(acct, slot, state, &mut ari_offered, now).await,
                    None => state.ask_window = Some(now + plan::ARI_MIN_ASK),
                }
            }
            let (slot, state) = &slots[i];
            let validity = state.held.as_ref().map(|h| (h.not_before, h.not_after));
            let due = plan::due(
                validity,
                state.suggested,
                state.retry_not_before,
                state.jitter,
                now,
            );
            if validity.is_some() {
                let at = match due {
                    plan::Due::Now => now,
                    plan::Due::At(at) => at,
                };
                metrics.scheduled(&slot.name, kind_label(slot.kind), unix(at));
            }
            if due != plan::Due::Now {
                continue;
            }
            let replaces = match (&state.held, ari_offered) {
                (Some(h), true) => ari::identifier(&h.leaf).ok(),
                _ => None,
            };
            let slot = slot.clone();
            let claim = format!("{CLAIM}{}", slot.topic());
            if let Some(b) = bulletin.clone() {
                let (b2, topic) = (b.clone(), claim.clone());
                let elsewhere =
                    tokio::task::spawn_blocking(move || claimed_elsewhere(&b2, &topic, now))
                        .await
                        .ok()
                        .flatten();
                if let Some(other) = elsewhere {
                    tracing::info!(name = %slot.name, key = kind_label(slot.kind), agent = other, "ACME: another agent's order is in flight; waiting for it");
                    continue;
                }
                // the store's lock, where it has one (Redis): one order of a name at a time
                // whatever the agents believe of each other
                let (b2, topic, token) = (b.clone(), slot.topic(), lock_token.clone());
                let locked = tokio::task::spawn_blocking(move || b2.lock(&topic, &token, LOCK_TTL))
                    .await
                    .ok()
                    .flatten();
                if locked == Some(false) {
                    tracing::info!(name = %slot.name, key = kind_label(slot.kind), "ACME: another agent holds the order lock; waiting for it");
                    continue;
                }
                posts.set(
                    claim.clone(),
                    Arc::new(Zeroizing::new(me.to_be_bytes().to_vec())),
                );
                let (b, posts) = (b.clone(), posts.clone());
                let _ = tokio::task::spawn_blocking(move || post_all(&b, &posts, true)).await;
            }
            tracing::info!(name = %slot.name, key = kind_label(slot.kind), renewal = validity.is_some(), "ACME: ordering");
            // what an earlier attempt's refusal said is spent
            retry_after.take();
            let lock_lost = tokio_util::sync::CancellationToken::new();
            let renewing = bulletin.clone().map(|b| {
                let (topic, token, lost) = (slot.topic(), lock_token.clone(), lock_lost.clone());
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(LOCK_TTL / 3).await;
                        let (b, topic, token) = (b.clone(), topic.clone(), token.clone());
                        let held =
                            tokio::task::spawn_blocking(move || b.lock(&topic, &token, LOCK_TTL))
                                .await
                                .ok()
                                .flatten();
                        if held == Some(false) {
                            lost.cancel();
                            return;
                        }
                    }
                })
            });
            let attempt = tokio::time::timeout(ATTEMPT_DEADLINE, async {
                if account.is_none() {
                    account = Some(
                        get_account(
                            &cfg,
                            bulletin.as_ref(),
                            &account_topic,
                            &posts,
                            &retry_after,
                        )
                        .await?,
                    );
                }
                let acct = account.as_ref().expect("set above");
                tokio::select! {
                    r = order::order(acct, &cfg, &slot.name, slot.kind, replaces, &responder) => {
                        r.map_err(order::Failure::from)
                    }
                    _ = lock_lost.cancelled() => Err(order::Failure::Other(anyhow::anyhow!(
                        "the order lock passed to another agent"
                    ))),
                }
            })
            .await
            .unwrap_or_else(|_| {
                Err(order::Failure::Other(anyhow::anyhow!(
                    "no certificate within {}s",
                    ATTEMPT_DEADLINE.as_secs()
                )))
            });
            posts.remove(&claim);
            responder.clear_left();
            if let Some(task) = renewing {
                task.abort();
            }
            if let Some(b) = bulletin.clone() {
                let (topic, token) = (slot.topic(), lock_token.clone());
                let _ = tokio::task::spawn_blocking(move || b.unlock(&topic, &token)).await;
            }
            let at = SystemTime::now();
            let state = &mut slots[i].1;
            let origin = format!("acme {} {}", slot.name, kind_label(slot.kind));
            match attempt.and_then(|bundle| {
                let held = material::open_bundle(bundle.as_bytes(), origin)
                    .map_err(order::Failure::Other)?;
                Ok((bundle, held))
            }) {
                Ok((bundle, held)) => {
                    tracing::info!(name = %slot.name, key = kind_label(slot.kind), not_after = unix(held.not_after), "ACME: certificate issued");
                    metrics.attempt(&slot.name, Outcome::Ok, unix(at));
                    let blob = Arc::new(Zeroizing::new(bundle.as_bytes().to_vec()));
                    posts.set(slot.topic(), blob.clone());
                    state.hold(held, blob);
                    state.jitter = jitter();
                    if let Some(b) = bulletin.clone() {
                        let posts = posts.clone();
                        let _ =
                            tokio::task::spawn_blocking(move || post_all(&b, &posts, true)).await;
                    }
                    serve(&ctx, &slots);
                }
                Err(failure) => {
                    state.failures += 1;
                    let rate_limited = matches!(failure, order::Failure::RateLimited(_));
                    let outcome = match rate_limited {
                        true => Outcome::RateLimited,
                        false => Outcome::Failed,
                    };
                    let asked = retry_after
                        .take()
                        .map(|until| until.duration_since(at).unwrap_or(Duration::ZERO));
                    let wait = plan::retry_wait(state.failures, asked, rate_limited);
                    state.retry_not_before = Some(at + wait);
                    metrics.attempt(&slot.name, outcome, unix(at));
                    // an account the CA no longer knows is made again on the next attempt
                    account = None;
                    tracing::warn!(name = %slot.name, key = kind_label(slot.kind), failures = state.failures, retry_in = ?wait, retry_after = ?asked, error = %failure, "ACME: order failed; the certificate served (if any) stays");
                }
            }
        }
    }
}

/// Asks the CA when to renew the certificate `state` holds (RFC 9773), and plans the renewal
/// in that window; a CA without renewal information clears `ari_offered` (two thirds of the
/// lifetime from then on).
async fn ask_window(
    account: &instant_acme::Account,
    slot: &Slot,
    state: &mut SlotState,
    ari_offered: &mut bool,
    now: SystemTime,
) {
    let Some(held) = &state.held else { return };
    match ari::ask(account, &held.leaf).await {
        Ok(Some(w)) => {
            let at = plan::ari_renew_at(
                (w.start, w.end),
                (held.not_before, held.not_after),
                state.jitter,
                now,
            );
            let lifetime = held
                .not_after
                .duration_since(held.not_before)
                .unwrap_or(Duration::ZERO);
            let again = plan::ari_ask_again(w.retry_after, lifetime);
            if state.suggested != Some(at) {
                tracing::info!(name = %slot.name, key = kind_label(slot.kind), window_start = unix(w.start), window_end = unix(w.end), renew_at = unix(at), ask_again_in = ?again, "ACME: renewal planned in the CA's suggested window");
            }
            state.suggested = Some(at);
            state.ask_window = Some(now + again);
        }
        Ok(None) => {
            *ari_offered = false;
            tracing::info!("ACME: the CA publishes no renewal information: renewals at two thirds of the lifetime");
        }
        Err(e) => {
            state.ask_window = Some(now + plan::ARI_MIN_ASK);
            tracing::warn!(name = %slot.name, key = kind_label(slot.kind), error = %format!("{e:#}"), "ACME: renewal information unavailable; asked again in a minute");
        }
    }
}

/// The heartbeats of agents with a lower id than this one's (the only ones that matter to
/// [`plan::orders`]).
fn heartbeats_below(b: &Bulletin, now: SystemTime) -> Vec<(u16, SystemTime)> {
    (0..b.me()).filter_map(|id| heartbeat(b, id, now)).collect()
}

/// Agent `id`'s latest heartbeat, if it sent one lately.
fn heartbeat(b: &Bulletin, id: u16, now: SystemTime) -> Option<(u16, SystemTime)> {
    let newest = b
        .read(&format!("alive/{id}"), now)
        .into_iter()
        .filter_map(|v| Some(u64::from_be_bytes(v.get(..8)?.try_into().ok()?)))
        .max()?;
    Some((id, SystemTime::UNIX_EPOCH + Duration::from_secs(newest)))
}

/// The agent whose order of the certificate under `claim` is in flight, when it is another
/// one and alive ([`plan::claimed_elsewhere`]).
fn claimed_elsewhere(b: &Bulletin, claim: &str, now: SystemTime) -> Option<u16> {
    let claimers: Vec<u16> = b
        .read(claim, now)
        .into_iter()
        .filter_map(|v| Some(u16::from_be_bytes(v.get(..2)?.try_into().ok()?)))
        .collect();
    let beats: Vec<_> = claimers
        .iter()
        .filter(|&&id| id != b.me())
        .filter_map(|&id| heartbeat(b, id, now))
        .collect();
    let alive = plan::alive(&beats, now);
    plan::claimed_elsewhere(b.me(), &claimers, &alive)
        .then(|| claimers.into_iter().find(|id| alive.contains(id)))
        .flatten()
}

async fn get_account(
    cfg: &AcmeConfig,
    bulletin: Option<&Bulletin>,
    topic: &str,
    posts: &Posts,
    retry_after: &http::RetryAfter,
) -> anyhow::Result<instant_acme::Account> {
    if let Some(b) = bulletin {
        let (b, t) = (b.clone(), topic.to_string());
        let stored = tokio::task::spawn_blocking(move || b.kept(&t))
            .await
            .unwrap_or_default();
        if let Some(creds) = stored {
            match order::restore(cfg, &creds, retry_after).await {
                Ok(account) => {
                    posts.set(topic.to_string(), Arc::new(Zeroizing::new(creds)));
                    return Ok(account);
                }
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "ACME: stored account unusable")
                }
            }
        }
    }
    let (account, creds) = order::create(cfg, retry_after).await?;
    tracing::info!(id = account.id(), "ACME: account created");
    let creds = Arc::new(creds);
    posts.set(topic.to_string(), creds.clone());
    // kept at once: an agent that takes over after this one stops uses it, and makes no other
    if let Some(b) = bulletin.cloned() {
        let topic = topic.to_string();
        let _ = tokio::task::spawn_blocking(move || b.keep(&topic, &creds)).await;
    }
    Ok(account)
}

/// Serves the certificates held, beside the files'.
fn serve(ctx: &Context, slots: &[(Slot, SlotState)]) {
    let entries = slots
        .iter()
        .filter_map(|(_, s)| s.held.as_ref().map(|h| h.entry.clone()))
        .collect();
    ctx.tls.set_acme(entries);
}

/// A stable short name for the directory URL (the store's keys are bounded).
fn short_hash(s: &str) -> String {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, s.as_bytes());
    d.as_ref()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A number in [0, 1) for the renewal jitter.
fn jitter() -> f64 {
    let mut b = [0u8; 4];
    let _ = aws_lc_rs::rand::fill(&mut b);
    f64::from(u32::from_be_bytes(b)) / (f64::from(u32::MAX) + 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AcmeChallenge, AgentArgs};
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: AgentArgs,
    }

    fn resolve(flags: &[&str]) -> anyhow::Result<Option<AcmeConfig>> {
        let args = Cli::try_parse_from(std::iter::once("agent").chain(flags.iter().copied()))?.args;
        AcmeConfig::resolve(&args)
    }

    const DIR: &str = "--acme-directory=https://ca.test/dir";

    #[test]
    fn defaults_and_checks() {
        assert!(resolve(&[]).unwrap().is_none());
        let c = resolve(&[DIR, "--acme-domain", "A.Test.", "--acme-domain", "a.test"])
            .unwrap()
            .unwrap();
        assert_eq!(c.domains, vec!["a.test"]);
        assert_eq!(c.challenge, AcmeChallenge::TlsAlpn01);
        assert_eq!(c.keys, vec![KeyKind::EcdsaP256]);
        let c = resolve(&[
            DIR,
            "--acme-domain=a.test",
            "--acme-key=ecdsa-p256",
            "--acme-key=rsa-2048",
            "--acme-challenge=dns-01",
            "--acme-dns-hook=/bin/true",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.keys, vec![KeyKind::EcdsaP256, KeyKind::Rsa2048]);
        for bad in [
            &["--acme-domain=a.test"][..],
            &[DIR],
            &[
                "--acme-directory=http://ca.test/dir",
                "--acme-domain=a.test",
            ],
            &[DIR, "--acme-domain=*.a.test"],
            &[DIR, "--acme-domain=a..test"],
            &[DIR, "--acme-domain=a.test", "--acme-challenge=dns-01"],
            &[DIR, "--acme-domain=a.test", "--acme-dns-hook=/bin/true"],
        ] {
            assert!(resolve(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_toml_keys_are_the_flags() {
        let args: AgentArgs = toml::from_str(
            "acme-directory = \"https://ca.test/dir\"\nacme-domain = [\"a.test\"]\n\
             acme-challenge = \"http-01\"\nacme-key = [\"rsa-2048\"]\nacme-email = \"o@a.test\"",
        )
        .unwrap();
        let c = AcmeConfig::resolve(&args).unwrap().unwrap();
        assert_eq!(c.challenge, AcmeChallenge::Http01);
        assert_eq!(c.keys, vec![KeyKind::Rsa2048]);
        assert_eq!(c.email.as_deref(), Some("o@a.test"));
    }
}
