//! The recorder's certificate authority: generated on first use into a directory (`ca.pem`,
//! and `ca.key` readable by its owner only), read back on later runs, so a browser trusts it
//! once. Leaf certificates for the hosts the browser asks for are minted on the fly, one per
//! host, and kept (up to a bound) with their rustls server configurations.
//!
//! A browser that trusts this CA lets whoever holds `ca.key` impersonate any site, so the CA
//! lives `--ca-days` days (365 by default, at most [`MAX_DAYS`]), not rcgen's default of
//! until the year 4096. A stored CA is reused while it is valid; an expired one (or one with
//! less than an hour left) is replaced by a new one; one valid for longer than `--ca-days`
//! from now (made by an earlier baton, or with a larger `--ca-days`) is refused with the
//! steps to retire it: the recorder never deletes a CA a browser may still use.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::ServerConfig;
use time::OffsetDateTime;
use zeroize::Zeroizing;

/// How long a new CA is valid unless `--ca-days` says otherwise.
pub const DEFAULT_DAYS: u32 = 365;
/// The longest `--ca-days` allowed.
pub const MAX_DAYS: u32 = 3650;
/// A stored CA with less than this left is replaced: a recording must not outlive it.
const MIN_LEFT: time::Duration = time::Duration::HOUR;
/// How long a leaf minted for a host is valid (never past the CA's end).
const LEAF_DAYS: i64 = 30;

/// Hosts whose configuration is kept; beyond, the cache starts over (a browsing session
/// touches far fewer hosts; the bound only keeps a runaway client from growing it).
const MAX_HOSTS: usize = 1024;

pub struct Ca {
    cert_path: PathBuf,
    cert_der: CertificateDer<'static>,
    /// The CA's common name: the nickname to give it in a browser's certificate store.
    name: String,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    issuer: Issuer<'static, KeyPair>,
    configs: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

/// `$XDG_DATA_HOME/baton/record-ca`, else `$HOME/.local/share/baton/record-ca`.
pub fn default_dir() -> anyhow::Result<PathBuf> {
    if let Some(d) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("baton/record-ca"));
    }
    let home = std::env::var_os("HOME")
        .filter(|d| !d.is_empty())
        .context("neither XDG_DATA_HOME nor HOME is set: give --ca-dir")?;
    Ok(PathBuf::from(home).join(".local/share/baton/record-ca"))
}

/// Where the CA in use came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Made by an earlier run, still valid.
    Reused,
    /// Made now: there was none.
    Created,
    /// Made now in place of an expired (or expiring) one, `old` (its name), valid until `until`.
    Replaced { old: String, until: OffsetDateTime },
}

/// A stored CA certificate's name and validity, as read by OpenSSL.
struct Stored {
    name: String,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
}

fn read_stored(pem: &str) -> anyhow::Result<Stored> {
    let x = openssl::x509::X509::from_pem(pem.as_bytes())?;
    let name = x
        .subject_name()
        .entries_by_nid(openssl::nid::Nid::COMMONNAME)
        .next()
        .and_then(|e| e.data().to_string().ok())
        .unwrap_or_default();
    let epoch = openssl::asn1::Asn1Time::from_unix(0)?;
    let unix = |t: &openssl::asn1::Asn1TimeRef| -> anyhow::Result<OffsetDateTime> {
        let d = epoch.diff(t)?;
        Ok(OffsetDateTime::from_unix_timestamp(
            d.days as i64 * 86_400 + d.secs as i64,
        )?)
    };
    Ok(Stored {
        name,
        not_before: unix(x.not_before())?,
        not_after: unix(x.not_after())?,
    })
}

/// `2026-05-01 12:00 UTC`.
pub fn show_time(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{}-{:02}-{:02} {:02}:{:02} UTC",
        t.year(),
        t.month() as u8,
        t.day(),
        t.hour(),
        t.minute()
    )
}

/// How to take the CA named `name` out of the browsers that trust it: lines indented by two.
pub fn removal_steps(name: &str) -> String {
    format!(
        "\x20 Chromium/Chrome on Linux (NSS): certutil -d sql:$HOME/.pki/nssdb -D -n '{name}'\n\
         \x20 Firefox: Settings > Privacy & Security > Certificates > View Certificates > \
         Authorities >\n\
         \x20   Baton (local recorder) > {name} > Delete or Distrust"
    )
}

impl Ca {
    /// Reads the CA in `dir`, or creates it there (the directory 0700, the key 0600), valid
    /// from an hour before `now` for `days` days. A stored CA that is expired or expires
    /// within the hour is replaced; one valid for more than `days` days from `now` is refused.
    pub fn load_or_create(
        dir: &Path,
        days: u32,
        now: OffsetDateTime,
    ) -> anyhow::Result<(Ca, Origin)> {
        if !(1..=MAX_DAYS).contains(&days) {
            bail!("--ca-days {days}: give 1 to {MAX_DAYS}");
        }
        let (cert_path, key_path) = (dir.join("ca.pem"), dir.join("ca.key"));
        let origin = match (cert_path.exists(), key_path.exists()) {
            (true, true) => {
                let pem = std::fs::read_to_string(&cert_path)
                    .with_context(|| format!("reading {}", cert_path.display()))?;
                let old = read_stored(&pem)
                    .with_context(|| format!("{}: not a certificate", cert_path.display()))?;
                if old.not_after - now < MIN_LEFT {
                    // expired: no browser accepts what it signs, nothing is lost
                    std::fs::remove_file(&key_path)
                        .with_context(|| format!("removing {}", key_path.display()))?;
                    std::fs::remove_file(&cert_path)
                        .with_context(|| format!("removing {}", cert_path.display()))?;
                    create(dir, &cert_path, &key_path, days, now)?;
                    Origin::Replaced {
                        old: old.name,
                        until: old.not_after,
                    }
                } else if old.not_after - now > time::Duration::days(days as i64 + 1) {
                    bail!("{}", too_long(dir, &old, days, now));
                } else {
                    Origin::Reused
                }
            }
            (false, false) => {
                create(dir, &cert_path, &key_path, days, now)?;
                Origin::Created
            }
            _ => bail!(
                "{}: one of ca.pem and ca.key is missing; remove the other to start a new CA",
                dir.display()
            ),
        };
        let key_pem = Zeroizing::new(
            std::fs::read_to_string(&key_path)
                .with_context(|| format!("reading {}", key_path.display()))?,
        );
        let key = KeyPair::from_pem(&key_pem)
            .with_context(|| format!("{}: not a private key", key_path.display()))?;
        let cert_pem = std::fs::read_to_string(&cert_path)
            .with_context(|| format!("reading {}", cert_path.display()))?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key)
            .with_context(|| format!("{}: not a CA certificate for ca.key", cert_path.display()))?;
        let cert_der = rustls::pki_types::pem::PemObject::from_pem_slice(cert_pem.as_bytes())
            .with_context(|| format!("{}: not a PEM certificate", cert_path.display()))?;
        let stored = read_stored(&cert_pem)
            .with_context(|| format!("{}: not a certificate", cert_path.display()))?;
        Ok((
            Ca {
                cert_path,
                cert_der,
                name: stored.name,
                not_before: stored.not_before,
                not_after: stored.not_after,
                issuer,
                configs: Mutex::new(HashMap::new()),
            },
            origin,
        ))
    }

    /// The CA certificate's file: what the user trusts.
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// The CA's common name, the nickname to give it in a certificate store.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// When the CA stops being valid.
    pub fn not_after(&self) -> OffsetDateTime {
        self.not_after
    }

    /// The TLS server configuration for `host` (a DNS name or an IP address), with a leaf
    /// certificate for it, minted on first use.
    pub fn server_config(&self, host: &str) -> anyhow::Result<Arc<ServerConfig>> {
        let host = host.to_ascii_lowercase();
        if let Some(c) = self.configs.lock().unwrap().get(&host) {
            return Ok(c.clone());
        }
        let config = Arc::new(self.mint(&host)?);
        let mut configs = self.configs.lock().unwrap();
        if configs.len() >= MAX_HOSTS {
            configs.clear();
        }
        configs.insert(host, config.clone());
        Ok(config)
    }

    fn mint(&self, host: &str) -> anyhow::Result<ServerConfig> {
        let (chain, key) = self.leaf(host)?;
        let mut config = ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }

    /// A certificate chain (leaf, CA) and key for `host`.
    fn leaf(
        &self,
        host: &str,
    ) -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        // rcgen makes an IP address an IP SAN and anything else a DNS SAN
        let mut p = CertificateParams::new(vec![host.to_string()])
            .with_context(|| format!("no certificate for `{host}`"))?;
        p.distinguished_name.push(DnType::CommonName, host);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        // short-lived: it only has to outlive the recording, and never the CA
        let now = OffsetDateTime::now_utc();
        p.not_before = (now - time::Duration::days(1)).max(self.not_before);
        p.not_after = (now + time::Duration::days(LEAF_DAYS)).min(self.not_after);
        let cert = p.signed_by(&key, &self.issuer)?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok((vec![cert.der().clone(), self.cert_der.clone()], key_der))
    }
}

/// Why a stored CA valid for longer than `--ca-days` is not used, and how to retire it.
fn too_long(dir: &Path, old: &Stored, days: u32, now: OffsetDateTime) -> String {
    let left = (old.not_after - now).whole_days() + 1;
    let mut s = format!(
        "{}/ca.pem ({}) is valid until {}, longer than --ca-days {days} allows \
         (it was made by an earlier baton or with a larger --ca-days).",
        dir.display(),
        old.name,
        show_time(old.not_after)
    );
    if left <= MAX_DAYS as i64 {
        s.push_str(&format!(
            "\nTo keep using it, pass --ca-days {left}. Otherwise retire it:"
        ));
    } else {
        s.push_str("\nRetire it:");
    }
    s.push_str(&format!(
        "\n1. remove it from every browser that trusts it:\n{}\n\
         2. delete its directory: rm -r '{}'\n\
         The next run creates a CA valid for --ca-days days.",
        removal_steps(&old.name),
        dir.display()
    ));
    s
}

fn create(
    dir: &Path,
    cert_path: &Path,
    key_path: &Path,
    days: u32,
    now: OffsetDateTime,
) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    // a name of its own, so two users' (or two machines') recorder CAs are told apart
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    p.distinguished_name.push(
        DnType::CommonName,
        format!(
            "baton record CA {:08x}",
            (nanos as u32) ^ std::process::id()
        ),
    );
    p.distinguished_name
        .push(DnType::OrganizationName, "Baton (local recorder)");
    // rcgen's default runs from 1975 to 4096
    p.not_before = now - time::Duration::HOUR;
    p.not_after = now + time::Duration::days(days as i64);
    let cert = p.self_signed(&key)?;
    // the key first, created exclusively with its final mode: never readable by others
    let key_pem = Zeroizing::new(key.serialize_pem());
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(key_path)
        .with_context(|| format!("creating {}", key_path.display()))?;
    std::io::Write::write_all(&mut f, key_pem.as_bytes())?;
    f.sync_all()?;
    std::fs::write(cert_path, cert.pem())
        .with_context(|| format!("writing {}", cert_path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::{ServerName, UnixTime};

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("baton-ca-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// A leaf minted for `host` verifies against `ca` for the name `name`.
    fn verifies(ca: &Ca, minted_by: &Ca, host: &str, name: &str) -> bool {
        let (chain, _) = minted_by.leaf(host).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert_der.clone()).unwrap();
        let v = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots))
            .build()
            .unwrap();
        v.verify_server_cert(
            &chain[0],
            &chain[1..],
            &ServerName::try_from(name.to_string()).unwrap(),
            &[],
            UnixTime::now(),
        )
        .is_ok()
    }

    #[test]
    fn created_once_reused_after_and_the_key_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tmp("create");
        let (ca, origin) = Ca::load_or_create(&dir, DEFAULT_DAYS, now()).unwrap();
        assert_eq!(origin, Origin::Created);
        let mode = std::fs::metadata(dir.join("ca.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let pem = std::fs::read(dir.join("ca.pem")).unwrap();
        let (again, origin) = Ca::load_or_create(&dir, DEFAULT_DAYS, now()).unwrap();
        assert_eq!(origin, Origin::Reused);
        assert_eq!(again.cert_der, ca.cert_der);
        assert_eq!(std::fs::read(dir.join("ca.pem")).unwrap(), pem);
        // a leaf minted by the reloaded CA chains to the CA written the first time
        assert!(verifies(&ca, &again, "Shop.Example", "shop.example"));
        assert!(!verifies(&ca, &again, "shop.example", "other.example"));
        assert!(verifies(&ca, &again, "127.0.0.1", "127.0.0.1"));
        let c = again.server_config("Shop.Example").unwrap();
        assert!(Arc::ptr_eq(
            &c,
            &again.server_config("shop.example").unwrap()
        ));
        assert_eq!(c.alpn_protocols[0], b"h2");
        // another CA's leaf does not chain to this one
        let other = tmp("other");
        let (stranger, _) = Ca::load_or_create(&other, DEFAULT_DAYS, now()).unwrap();
        assert!(!verifies(&ca, &stranger, "shop.example", "shop.example"));
        std::fs::remove_dir_all(&other).unwrap();

        std::fs::remove_file(dir.join("ca.pem")).unwrap();
        let e = Ca::load_or_create(&dir, DEFAULT_DAYS, now())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("missing"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn now() -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }

    /// (not before, not after) of a PEM certificate, as OpenSSL reads it.
    fn validity(pem: &str) -> (OffsetDateTime, OffsetDateTime) {
        let s = read_stored(pem).unwrap();
        (s.not_before, s.not_after)
    }

    #[test]
    fn a_new_ca_lives_ca_days_and_its_leaves_no_longer() {
        let dir = tmp("days");
        let t = now();
        let (ca, _) = Ca::load_or_create(&dir, DEFAULT_DAYS, t).unwrap();
        let (from, until) = validity(&std::fs::read_to_string(dir.join("ca.pem")).unwrap());
        // the certificate's times have whole seconds
        let near = |a: OffsetDateTime, b: OffsetDateTime| (a - b).abs() < time::Duration::SECOND;
        assert!(near(from, t - time::Duration::HOUR), "{from}");
        assert!(near(until, t + time::Duration::days(365)), "{until}");
        assert_eq!(ca.not_after(), until);
        assert!(ca.name().starts_with("baton record CA "), "{}", ca.name());
        std::fs::remove_dir_all(&dir).unwrap();

        // a one-day CA mints leaves that end with it
        let (ca, _) = Ca::load_or_create(&dir, 1, t).unwrap();
        let (chain, _) = ca.leaf("shop.example").unwrap();
        let leaf = openssl::x509::X509::from_der(&chain[0]).unwrap();
        let (_, leaf_until) = validity(std::str::from_utf8(&leaf.to_pem().unwrap()).unwrap());
        assert_eq!(leaf_until, ca.not_after());
        assert!(near(leaf_until, t + time::Duration::days(1)));
        std::fs::remove_dir_all(&dir).unwrap();

        for bad in [0, MAX_DAYS + 1] {
            let e = Ca::load_or_create(&dir, bad, t).err().unwrap().to_string();
            assert!(e.contains("--ca-days") && e.contains("1 to 3650"), "{e}");
            assert!(!dir.exists());
        }
    }

    #[test]
    fn an_expired_ca_is_replaced_a_too_long_one_refused() {
        let dir = tmp("expired");
        let t = now();
        // made 366 days ago for 365 days: expired yesterday
        let (old, _) = Ca::load_or_create(&dir, 365, t - time::Duration::days(366)).unwrap();
        let (new, origin) = Ca::load_or_create(&dir, 365, t).unwrap();
        assert_eq!(
            origin,
            Origin::Replaced {
                old: old.name().to_string(),
                until: old.not_after()
            }
        );
        assert_ne!(new.cert_der, old.cert_der);
        assert!(new.not_after() > t + time::Duration::days(364));
        // ... and the new one is kept
        let (_, origin) = Ca::load_or_create(&dir, 365, t).unwrap();
        assert_eq!(origin, Origin::Reused);
        std::fs::remove_dir_all(&dir).unwrap();

        // a CA made with --ca-days 3650 is refused by a run with --ca-days 365, with a way out
        let (long, _) = Ca::load_or_create(&dir, 3650, t).unwrap();
        let pem = std::fs::read(dir.join("ca.pem")).unwrap();
        let e = Ca::load_or_create(&dir, 365, t).err().unwrap().to_string();
        assert!(e.contains("longer than --ca-days 365"), "{e}");
        assert!(e.contains("pass --ca-days 3650"), "{e}");
        assert!(
            e.contains(&format!(
                "certutil -d sql:$HOME/.pki/nssdb -D -n '{}'",
                long.name()
            )),
            "{e}"
        );
        assert_eq!(
            std::fs::read(dir.join("ca.pem")).unwrap(),
            pem,
            "left alone"
        );
        assert!(Ca::load_or_create(&dir, 3650, t).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();

        // a CA as earlier batons made it (rcgen's default validity, until 4096): retire it
        std::fs::create_dir_all(&dir).unwrap();
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        p.distinguished_name
            .push(DnType::CommonName, "baton record CA 0ld");
        std::fs::write(dir.join("ca.pem"), p.self_signed(&key).unwrap().pem()).unwrap();
        std::fs::write(dir.join("ca.key"), key.serialize_pem()).unwrap();
        let e = Ca::load_or_create(&dir, DEFAULT_DAYS, t)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("valid until 4096-01-01"), "{e}");
        assert!(
            e.contains("Retire it") && !e.contains("To keep using it"),
            "{e}"
        );
        assert!(e.contains("-D -n 'baton record CA 0ld'"), "{e}");
        assert!(e.contains(&format!("rm -r '{}'", dir.display())), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
