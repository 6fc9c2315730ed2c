//! The agent's rustls `ServerConfig`: policy, certificates, client authentication and the
//! session seams, built at start and rebuilt on SIGHUP.
//!
//! What must survive a reload is created once and shared by every generation of the config:
//! the session store (sessions stay resumable), the ticket sealer (its keys are replaced in
//! place) and the generated self-signed certificates (clients may have pinned them).

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use arc_swap::ArcSwap;
use baton_session::{SessionStore, TicketSealer};
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::ServerConfig;

use crate::certs::{self, CertEntry};
use crate::config::{AgentConfig, ClientAuth};
use crate::metrics::Metrics;
use crate::policy::{self, Policy};
use crate::resolver::{CertStore, Resolver};
use crate::sessions::{SessionCache, Ticketer};
use crate::store::read_ring;
use baton_migrate::SecretLog;

/// The TLS side of a running agent.
pub struct Tls {
    configs: ArcSwap<Configs>,
    parts: Parts,
}

/// One generation of the config, in its two forms.
struct Configs {
    /// Accepts early data, and its tickets allow it: each is stored (acknowledged by the
    /// store) before it is sent. The only form when early data is off.
    early: Arc<ServerConfig>,
    /// Neither: its tickets are stored without waiting (while the store is slow or lost).
    plain: Arc<ServerConfig>,
}

/// What every generation of the config shares.
struct Parts {
    /// Seals sessions shared with peers or Redis; replaced on reload.
    cluster_ring: Option<baton_session::SharedRing>,
    policy: Policy,
    resolver: Arc<Resolver>,
    self_signed: Vec<CertEntry>,
    /// The ACME certificates held ([`Tls::set_acme`]), served after the others.
    acme: std::sync::Mutex<Vec<CertEntry>>,
    /// The key signer (`--key-signer`), asked again on reload.
    signer: Option<crate::keysigner::Handle>,
    store: Option<Arc<dyn SessionStore>>,
    sealer: Option<Arc<TicketSealer>>,
    metrics: Arc<Metrics>,
    /// TLS 1.3 traffic secrets of connections that may park or migrate.
    secret_log: Arc<SecretLog>,
    /// `--early-data`: the bytes accepted, or why this configuration accepts none.
    early_data: Result<u32, &'static str>,
}

impl Tls {
    /// Loads everything `cfg` names and builds the first `ServerConfig`.
    /// Returns the PEM of generated self-signed certificates (public parts), if any.
    pub fn new(
        cfg: &AgentConfig,
        metrics: Arc<Metrics>,
        opened: crate::store::Opened,
    ) -> anyhow::Result<(Self, String)> {
        let policy = policy::build(&cfg.tls_versions, &cfg.suites, &cfg.groups)?;
        let mut self_signed = Vec::new();
        let mut pems = String::new();
        for kind in &cfg.self_signed {
            let (entry, pem) = certs::self_signed(*kind, &cfg.server_names)?;
            self_signed.push(entry);
            pems.push_str(&pem);
        }
        let signer = match &cfg.key_signer {
            Some(k) => Some(crate::keysigner::Handle::new(k)?),
            None => None,
        };
        let resolver = Arc::new(Resolver::new(
            cert_store(cfg, &self_signed, signer.as_ref())?,
            policy.provider.cipher_suites.clone(),
        ));
        let store = opened.store;
        if let Some(store) = &store {
            metrics.set_store(store.clone());
        }
        let sealer = if cfg.tickets {
            let now = Instant::now();
            Some(Arc::new(match &cfg.ticket_key_file {
                Some(path) => {
                    TicketSealer::external(cfg.agent_id, cfg.ticket_lifetime, read_ring(path)?)
                }
                None => TicketSealer::local(cfg.agent_id, cfg.ticket_lifetime, now)
                    .context("generating ticket key")?,
            }))
        } else {
            None
        };
        let early_data = crate::early::configuration(
            cfg.early_data,
            &cfg.store,
            cfg.tickets,
            cfg.session_cache_size,
            cfg.client_ca.is_some(),
        );
        match early_data {
            Ok(n) => tracing::info!(bytes = n, "TLS 1.3 early data (0-RTT) accepted"),
            Err(why) if cfg.early_data > 0 => {
                tracing::warn!("--early-data: early data will be refused: {why}")
            }
            Err(_) => {}
        }
        let parts = Parts {
            early_data,
            cluster_ring: opened.ring,
            policy,
            resolver,
            self_signed,
            acme: Default::default(),
            signer,
            store,
            sealer,
            metrics,
            secret_log: Arc::new(SecretLog::default()),
        };
        let configs = ArcSwap::from_pointee(parts.configs(cfg)?);
        Ok((Self { configs, parts }, pems))
    }

    /// ACME challenge answers; the resolver gives TLS-ALPN-01 validations theirs.
    pub fn challenges(&self) -> &Arc<crate::challenges::Challenges> {
        self.parts.resolver.challenges()
    }

    /// Serves `entries` (the ACME certificates held) beside the files' and self-signed ones,
    /// in place of the ACME certificates served so far; kept across reloads.
    pub fn set_acme(&self, entries: Vec<CertEntry>) {
        let mut acme = self.parts.acme.lock().unwrap_or_else(|p| p.into_inner());
        let current = self.parts.resolver.store();
        let is_old = |e: &CertEntry| acme.iter().any(|a| Arc::ptr_eq(&a.certified, &e.certified));
        let mut all: Vec<CertEntry> = current
            .entries()
            .iter()
            .filter(|e| !is_old(e))
            .cloned()
            .collect();
        all.extend(entries.iter().cloned());
        self.parts.resolver.replace(CertStore::new(all));
        *acme = entries;
    }

    /// (origin, names) of each certificate served, for the start-up log.
    pub fn cert_summary(&self) -> Vec<(String, Vec<String>)> {
        let store = self.parts.resolver.store();
        store
            .entries()
            .iter()
            .map(|e| (e.origin.clone(), e.names.clone()))
            .collect()
    }

    /// The certificate store rustls resolves from (swapped whole on reload).
    pub fn resolver(&self) -> &Arc<Resolver> {
        &self.parts.resolver
    }

    /// The cluster key ring (sealing shared sessions and migrated session objects).
    pub fn cluster_ring(&self) -> Option<&baton_session::SharedRing> {
        self.parts.cluster_ring.as_ref()
    }

    /// Where TLS 1.3 traffic secrets of connections that may park or migrate are captured.
    pub fn secret_log(&self) -> &Arc<SecretLog> {
        &self.parts.secret_log
    }

    /// `--early-data`: the bytes accepted, or why none are.
    pub fn early_data(&self) -> Result<u32, &'static str> {
        self.parts.early_data
    }

    /// The session store behind the session cache, if any.
    pub fn store(&self) -> Option<&Arc<dyn SessionStore>> {
        self.parts.store.as_ref()
    }

    /// The config for the next connection: its tickets allow early data only while the
    /// store answers writes promptly, so that sending one need not wait long for the store.
    pub fn config(&self) -> Arc<ServerConfig> {
        let configs = self.configs.load();
        let prompt = self
            .parts
            .store
            .as_ref()
            .is_none_or(|s| s.acknowledges_promptly());
        match prompt {
            true => configs.early.clone(),
            false => configs.plain.clone(),
        }
    }

    /// The config for a connection whose early data is accepted (its tickets allow it too).
    pub fn early_config(&self) -> Arc<ServerConfig> {
        self.configs.load().early.clone()
    }

    /// Re-reads certificate files, the client CA and the ticket key file, and swaps in a new
    /// config for new connections. On any error the running config stays as it was.
    pub fn reload(&self, cfg: &AgentConfig) -> anyhow::Result<()> {
        let parts = &self.parts;
        let mut store = cert_store(cfg, &parts.self_signed, parts.signer.as_ref())?;
        {
            let acme = parts.acme.lock().unwrap_or_else(|p| p.into_inner());
            if !acme.is_empty() {
                let mut all = store.entries().to_vec();
                all.extend(acme.iter().cloned());
                store = CertStore::new(all);
            }
        }
        let ring = match (&cfg.ticket_key_file, &parts.sealer) {
            (Some(path), Some(_)) => Some(read_ring(path)?),
            _ => None,
        };
        let cluster = match (&cfg.cluster_key_file, &parts.cluster_ring) {
            (Some(path), Some(_)) => Some(read_ring(path)?),
            _ => None,
        };
        // Build first, then commit: a bad client CA must not leave new certificates half-applied.
        let old_store = parts.resolver.store();
        parts.resolver.replace(store);
        let configs = match parts.configs(cfg) {
            Ok(c) => c,
            Err(e) => {
                parts
                    .resolver
                    .replace(CertStore::new(old_store.entries().to_vec()));
                return Err(e);
            }
        };
        if let (Some(ring), Some(sealer)) = (ring, &parts.sealer) {
            sealer.replace_ring(ring);
        }
        if let (Some(new), Some(shared)) = (cluster, &parts.cluster_ring) {
            *shared.write().unwrap_or_else(|p| p.into_inner()) = new;
        }
        self.configs.store(Arc::new(configs));
        Ok(())
    }
}

impl Parts {
    fn configs(&self, cfg: &AgentConfig) -> anyhow::Result<Configs> {
        let early = Arc::new(self.server_config(cfg, true)?);
        let plain = match self.early_data {
            Ok(_) => Arc::new(self.server_config(cfg, false)?),
            Err(_) => early.clone(),
        };
        Ok(Configs { early, plain })
    }

    /// `early`: the form that accepts early data and puts it in its tickets (when this
    /// configuration can accept any).
    fn server_config(&self, cfg: &AgentConfig, early: bool) -> anyhow::Result<ServerConfig> {
        let early_data = match early {
            true => self.early_data.unwrap_or(0),
            false => 0,
        };
        let provider = self.policy.provider.clone();
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&self.policy.versions)
            .context("TLS versions")?;
        let builder = match &cfg.client_ca {
            Some(path) => {
                let roots = Arc::new(certs::load_roots(path)?);
                let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider);
                let verifier = match cfg.client_auth {
                    ClientAuth::Required => verifier,
                    ClientAuth::Optional => verifier.allow_unauthenticated(),
                };
                builder.with_client_cert_verifier(verifier.build().context("client CA")?)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(self.resolver.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        // Chosen only by a client that offers nothing else: a CA's TLS-ALPN-01 validation,
        // answered with its validation certificate and closed after the handshake.
        if cfg
            .acme
            .as_ref()
            .is_some_and(|a| a.challenge == crate::config::AcmeChallenge::TlsAlpn01)
        {
            config
                .alpn_protocols
                .push(crate::resolver::ACME_TLS_ALPN.to_vec());
        }
        // With an explicit --suites list the operator's order wins, as nginx's
        // ssl_prefer_server_ciphers; otherwise the client's (it knows if it has AES hardware).
        config.ignore_client_order = !cfg.suites.is_empty();
        config.session_storage = match &self.store {
            Some(store) => Arc::new(SessionCache {
                store: store.clone(),
                acknowledged: early_data > 0,
            }),
            None => Arc::new(NoServerSessionStorage {}),
        };
        if let Some(sealer) = &self.sealer {
            config.ticketer = Arc::new(Ticketer {
                sealer: sealer.clone(),
                metrics: self.metrics.clone(),
            });
        }
        // Parking an idle HTTP/1.1 connection (`crate::conn::park`) and migration both take key, IV
        // and sequence numbers out of rustls (its extraction) and the TLS 1.3 traffic secrets
        // (the key log, in memory only, and only for connections that asked for them).
        config.enable_secret_extraction = true;
        config.key_log = self.secret_log.clone();
        // Advertised in the tickets (clients send early data only where a ticket says so);
        // each connection is then accepted or refused by `early_tls`. Such a ticket is sent
        // only once the store has it (`SessionCache::acknowledged`).
        config.max_early_data_size = early_data;
        config.send_tls13_tickets = if self.sealer.is_some() || self.store.is_some() {
            cfg.tls13_tickets
        } else {
            0
        };
        Ok(config)
    }
}

fn cert_store(
    cfg: &AgentConfig,
    self_signed: &[CertEntry],
    signer: Option<&crate::keysigner::Handle>,
) -> anyhow::Result<CertStore> {
    let mut entries = Vec::new();
    for (cert, key) in &cfg.certs {
        entries.push(match (signer, key) {
            (Some(signer), key) => certs::load_with_signer(cert, key.as_deref(), signer)?,
            (None, Some(key)) => certs::load_pair(cert, key)?,
            (None, None) => anyhow::bail!("{}: no key and no --key-signer", cert.display()),
        });
    }
    if let Some(dir) = &cfg.cert_dir {
        entries.extend(crate::certdir::load(dir)?);
    }
    entries.extend(self_signed.iter().cloned());
    Ok(CertStore::new(entries))
}
