//! `--engine openssl`: the system libssl (rust-openssl), for what rustls refuses to speak: TLS
//! 1.0 and 1.1, RSA key exchange, DHE, CBC and 3DES suites, anonymous suites (`ADH-*`,
//! `AECDH-*`, with `@SECLEVEL=0` in the cipher string), to measure old servers and appliances:
//! whatever the system libssl was built with (Debian's has no 3DES, for one).
//!
//! `--suite` takes OpenSSL names: `TLS_*` names go to `SSL_CTX_set_ciphersuites` (TLS 1.3),
//! everything else, joined with `:`, to `SSL_CTX_set_cipher_list` (TLS 1.2 and older, so
//! `@SECLEVEL=0` and `!`/`+` syntax work). Giving only one kind limits the versions offered
//! to that kind, as the rustls engine does. The accounting is the rustls engine's: each virtual
//! client keeps its own sessions (the last TLS 1.2 session, its TLS 1.3 tickets, caught by the
//! context's new-session callback and routed to the client by the `Ssl`'s ex data), offers one
//! unless the schedule said "full", and `session_reused()` tells what the server did.
//!
//! Unlike the rustls engine the first request is written after the handshake, not with the
//! client's Finished.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{anyhow, Context};
use openssl::ex_data::Index;
use openssl::nid::Nid;
use openssl::pkey::{Id, PKey, Public};
use openssl::ssl::{
    Ssl, SslContext, SslFiletype, SslMethod, SslOptions, SslRef, SslSession, SslSessionCacheMode,
    SslVerifyMode, SslVersion,
};
use tokio::net::TcpStream;
use tokio_openssl::SslStream;

use crate::accounting::Negotiated;
use crate::config::{BenchConfig, Resume};

/// TLS 1.3 tickets a client keeps (servers send two per handshake by default).
const MAX_TICKETS: usize = 8;

/// One virtual client's sessions.
#[derive(Default)]
pub struct OsslSessions {
    inner: Mutex<Sessions>,
    /// false: `--resume none`, sessions are dropped on arrival.
    keep: bool,
}

#[derive(Default)]
struct Sessions {
    tls12: Option<SslSession>,
    tls13: VecDeque<SslSession>,
}

impl OsslSessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, Sessions> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn forget(&self) {
        let mut s = self.lock();
        s.tls12 = None;
        s.tls13.clear();
    }

    /// The session to offer: the newest TLS 1.3 ticket (used once), else the TLS 1.2 session
    /// (kept: a session id or ticket resumes again and again).
    fn take(&self) -> Option<SslSession> {
        let mut s = self.lock();
        s.tls13.pop_back().or_else(|| s.tls12.clone())
    }

    fn store(&self, session: SslSession) {
        if !self.keep {
            return;
        }
        let mut s = self.lock();
        if session.protocol_version() == SslVersion::TLS1_3 {
            if s.tls13.len() == MAX_TICKETS {
                s.tls13.pop_front();
            }
            s.tls13.push_back(session);
        } else {
            s.tls12 = Some(session);
        }
    }
}

/// Where an `Ssl` keeps its virtual client's sessions, for the new-session callback.
fn sessions_index() -> anyhow::Result<Index<Ssl, Arc<OsslSessions>>> {
    static INDEX: OnceLock<Index<Ssl, Arc<OsslSessions>>> = OnceLock::new();
    if let Some(i) = INDEX.get() {
        return Ok(*i);
    }
    let i = Ssl::new_ex_index().context("OpenSSL ex data index")?;
    Ok(*INDEX.get_or_init(|| i))
}

/// What every virtual client shares: one `SslContext`, built once.
pub struct OsslTls {
    ctx: SslContext,
    index: Index<Ssl, Arc<OsslSessions>>,
    sni: Arc<str>,
    verify: bool,
    keep: bool,
}

fn version(v: &str) -> anyhow::Result<SslVersion> {
    Ok(match v {
        "1.0" => SslVersion::TLS1,
        "1.1" => SslVersion::TLS1_1,
        "1.2" => SslVersion::TLS1_2,
        "1.3" => SslVersion::TLS1_3,
        other => return Err(anyhow!("--tls-version `{other}`: 1.0, 1.1, 1.2 or 1.3")),
    })
}

/// A TLS 1.3 suite name (`TLS_AES_128_GCM_SHA256`), as opposed to an OpenSSL cipher string.
fn is_tls13_suite(name: &str) -> bool {
    name.starts_with("TLS_") && !name.contains("_WITH_")
}

impl OsslTls {
    pub fn new(cfg: &BenchConfig) -> anyhow::Result<Self> {
        let mut b = SslContext::builder(SslMethod::tls_client()).context("OpenSSL context")?;
        let (tls13, legacy): (Vec<&str>, Vec<&str>) = cfg
            .suites
            .iter()
            .map(String::as_str)
            .partition(|s| is_tls13_suite(s));
        let (mut min, mut max) = (None, None);
        if !legacy.is_empty() {
            let list = legacy.join(":");
            b.set_cipher_list(&list)
                .map_err(|e| anyhow!("--suite `{list}`: not an OpenSSL cipher string libssl accepts (e.g. AES128-SHA, DHE-RSA-AES256-SHA256, 'ADH-AES128-SHA:@SECLEVEL=0'; `openssl ciphers -v ALL:@SECLEVEL=0` lists them): {e}"))?;
            if tls13.is_empty() {
                max = Some(SslVersion::TLS1_2);
            }
        }
        if !tls13.is_empty() {
            let list = tls13.join(":");
            b.set_ciphersuites(&list)
                .map_err(|e| anyhow!("--suite `{list}`: not TLS 1.3 suites libssl knows (e.g. TLS_AES_128_GCM_SHA256): {e}"))?;
            if legacy.is_empty() {
                min = Some(SslVersion::TLS1_3);
            }
        }
        if let Some(v) = &cfg.tls_version {
            let v = version(v)?;
            (min, max) = (Some(v), Some(v));
        }
        b.set_min_proto_version(min)?;
        b.set_max_proto_version(max)?;
        if !cfg.groups.is_empty() {
            let list = cfg.groups.join(":");
            b.set_groups_list(&list).map_err(|e| {
                anyhow!("--group `{list}` (OpenSSL names, e.g. X25519, P-256): {e}")
            })?;
        }
        if !cfg.sigalgs.is_empty() {
            let list = cfg.sigalgs.join(":");
            b.set_sigalgs_list(&list).map_err(|e| {
                anyhow!("--sigalg `{list}` (e.g. rsa_pss_rsae_sha256, RSA+SHA256): {e}")
            })?;
        }
        let verify = !cfg.insecure;
        if verify {
            b.set_verify(SslVerifyMode::PEER);
            match &cfg.ca {
                Some(ca) => b
                    .set_ca_file(ca)
                    .with_context(|| format!("reading --ca {}", ca.display()))?,
                None => b.set_default_verify_paths()?,
            }
        } else {
            b.set_verify(SslVerifyMode::NONE);
        }
        if let (Some(cert), Some(key)) = (&cfg.cert, &cfg.key) {
            b.set_certificate_chain_file(cert)
                .with_context(|| format!("reading --cert {}", cert.display()))?;
            b.set_private_key_file(key, SslFiletype::PEM)
                .with_context(|| format!("reading --key {}", key.display()))?;
            b.check_private_key()
                .context("--key does not match --cert")?;
        }
        let mut alpn = vec![cfg.alpn.len() as u8];
        alpn.extend_from_slice(cfg.alpn.as_bytes());
        b.set_alpn_protos(&alpn)?;
        let keep = cfg.resume != Resume::None;
        // a server that closes without close_notify still delivered a close-delimited body
        let mut options = SslOptions::IGNORE_UNEXPECTED_EOF;
        if matches!(cfg.resume, Resume::None | Resume::Id) {
            // TLS 1.2: no session ticket extension (session ids only, or nothing)
            options |= SslOptions::NO_TICKET;
        }
        b.set_options(options);
        // sessions go to the callback only (a client never looks its cache up)
        b.set_session_cache_mode(
            SslSessionCacheMode::CLIENT | SslSessionCacheMode::NO_INTERNAL_STORE,
        );
        let index = sessions_index()?;
        b.set_new_session_callback(move |ssl, session| {
            if let Some(s) = ssl.ex_data(index) {
                s.store(session);
            }
        });
        Ok(Self {
            ctx: b.build(),
            index,
            sni: cfg.sni.as_str().into(),
            verify,
            keep,
        })
    }

    pub fn client(&self) -> OsslClient {
        OsslClient {
            ctx: self.ctx.clone(),
            index: self.index,
            sessions: Arc::new(OsslSessions {
                inner: Mutex::default(),
                keep: self.keep,
            }),
            sni: self.sni.clone(),
            verify: self.verify,
        }
    }
}

/// One virtual client.
pub struct OsslClient {
    ctx: SslContext,
    index: Index<Ssl, Arc<OsslSessions>>,
    sessions: Arc<OsslSessions>,
    sni: Arc<str>,
    verify: bool,
}

impl OsslClient {
    pub fn forget(&self) {
        self.sessions.forget();
    }

    /// The handshake over `tcp`; also whether a session was offered.
    pub async fn connect(
        &self,
        tcp: TcpStream,
    ) -> Result<(SslStream<TcpStream>, bool), openssl::ssl::Error> {
        let mut ssl = Ssl::new(&self.ctx)?;
        let ip = self.sni.parse::<IpAddr>().ok();
        if ip.is_none() {
            ssl.set_hostname(&self.sni)?;
        }
        if self.verify {
            match ip {
                Some(ip) => ssl.param_mut().set_ip(ip)?,
                None => ssl.param_mut().set_host(&self.sni)?,
            }
        }
        ssl.set_ex_data(self.index, self.sessions.clone());
        let offered = match self.sessions.take() {
            Some(session) => {
                // SAFETY: every session a client holds came from this same context (the
                // new-session callback of `self.ctx`).
                #[allow(unsafe_code)]
                unsafe {
                    ssl.set_session(&session)?
                };
                true
            }
            None => false,
        };
        let mut stream = SslStream::new(ssl, tcp)?;
        Pin::new(&mut stream).connect().await?;
        Ok((stream, offered))
    }
}

/// What a completed handshake agreed on, as wire code points (the group from the server's
/// ephemeral key; 0 without one, as in a TLS 1.2 resumption or RSA key exchange, and for
/// finite-field DHE).
pub fn negotiated(ssl: &SslRef) -> Option<Negotiated> {
    let v = ssl.version2()?;
    let version = [
        (SslVersion::SSL3, 0x0300),
        (SslVersion::TLS1, 0x0301),
        (SslVersion::TLS1_1, 0x0302),
        (SslVersion::TLS1_2, 0x0303),
        (SslVersion::TLS1_3, 0x0304),
    ]
    .iter()
    .find(|(known, _)| *known == v)?
    .1;
    let id = ssl.current_cipher()?.protocol_id();
    Some(Negotiated {
        version,
        suite: u16::from_be_bytes(id),
        group: ssl.peer_tmp_key().map_or(0, |k| group_of(&k)),
    })
}

fn group_of(key: &PKey<Public>) -> u16 {
    match key.id() {
        Id::X25519 => 0x001d,
        Id::X448 => 0x001e,
        Id::EC => match key.ec_key().ok().and_then(|k| k.group().curve_name()) {
            Some(Nid::X9_62_PRIME256V1) => 0x0017,
            Some(Nid::SECP384R1) => 0x0018,
            Some(Nid::SECP521R1) => 0x0019,
            _ => 0,
        },
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BenchArgs;

    fn cfg(suites: &[&str], version: Option<&str>) -> BenchConfig {
        BenchArgs {
            url: Some("https://localhost:1/".into()),
            engine: Some("openssl".into()),
            insecure: true,
            suite: suites.iter().map(|s| s.to_string()).collect(),
            tls_version: version.map(Into::into),
            ..Default::default()
        }
        .resolve()
        .unwrap()
    }

    #[test]
    fn legacy_and_anonymous_suites_are_accepted() {
        for (suites, v) in [
            (&["AES128-SHA"][..], Some("1.2")),
            (&["ADH-AES128-SHA:@SECLEVEL=0"], Some("1.2")),
            (&["ECDHE-RSA-AES128-SHA", "@SECLEVEL=0"], Some("1.0")),
            (&["TLS_AES_128_GCM_SHA256", "ECDHE-RSA-AES128-SHA"], None),
            (&[], None),
        ] {
            OsslTls::new(&cfg(suites, v)).unwrap_or_else(|e| panic!("{suites:?}: {e:#}"));
        }
        let e = OsslTls::new(&cfg(&["NOT-A-CIPHER"], None))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("--suite `NOT-A-CIPHER`"), "{e}");
        assert!(is_tls13_suite("TLS_CHACHA20_POLY1305_SHA256"));
        assert!(!is_tls13_suite("TLS_RSA_WITH_AES_128_CBC_SHA"));
        let n = Negotiated {
            version: 0x0303,
            suite: 0x002f,
            group: 0,
        };
        assert_eq!(n.name(), "TLSv1_2 TLS_RSA_WITH_AES_128_CBC_SHA -");
    }

    #[test]
    fn a_client_without_sessions_offers_none() {
        let s = OsslSessions {
            inner: Mutex::default(),
            keep: true,
        };
        assert!(s.take().is_none());
        s.forget();
        assert!(s.take().is_none());
    }
}
