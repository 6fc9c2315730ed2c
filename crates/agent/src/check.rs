//! `baton check agent FILE`: everything the agent would refuse at start, and what would soon
//! go wrong, found without starting anything: the keys and values of the file, the rules
//! between settings, every certificate with its key (they load, they match, their dates),
//! the CA file, and the modes of the files holding secrets.
//!
//! Paths are taken as the agent takes them: relative ones from the working directory.

use std::path::Path;
use std::time::{Duration, SystemTime};

use baton_ops::check::Report;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use crate::config::AgentArgs;

/// A certificate that expires within this is worth a warning (the alert rule's horizon too).
const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 86400);

/// Checks what `baton agent ARGS` would run with (`--config` and flags, flags winning).
pub fn check(args: AgentArgs) -> Report {
    let mut report = Report::new(
        args.config
            .as_ref()
            .map_or("agent flags".into(), |p| p.display().to_string()),
    );
    // A file that does not parse is the one problem worth reporting: the rest would be noise.
    if let Some(merged) = report.take(args.merged()) {
        check_args(&merged, &mut report, SystemTime::now());
    }
    report
}

fn check_args(args: &AgentArgs, report: &mut Report, now: SystemTime) {
    // The rules between settings and the values' ranges, exactly as `baton agent` applies them.
    report.take(args.clone().resolve());
    let signer = args.key_signer.is_some();
    for (i, cert) in args.cert.iter().enumerate() {
        let key = args.key.get(i);
        if let (Some(key), false) = (key, signer) {
            report.take(crate::certs::load_pair(cert, key));
        }
        if let Some(key) = key {
            report.secret_file("--key", key);
        }
        match chain_dates(cert) {
            Ok(dates) => check_dates(cert, dates, now, report),
            Err(e) => report.problem(e),
        }
    }
    if let Some(ca) = &args.client_ca {
        report.take(crate::certs::load_roots(ca));
    }
    // the access log is created at start, but its directory must be there
    if let Some(log) = args.access_log.as_deref().filter(|p| *p != Path::new("-")) {
        let dir = log
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if !dir.is_dir() {
            report.problem(format!(
                "--access-log {}: the directory {} does not exist",
                log.display(),
                dir.display()
            ));
        }
    }
    for (flag, file) in [
        ("--cluster-key-file", &args.cluster_key_file),
        ("--ticket-key-file", &args.ticket_key_file),
        ("--key-signer-auth-key-file", &args.key_signer_auth_key_file),
    ] {
        if let Some(file) = file {
            report.secret_file(flag, file);
        }
    }
    let relative = args
        .cert
        .iter()
        .chain(&args.key)
        .chain(&args.client_ca)
        .chain(&args.cluster_key_file)
        .chain(&args.ticket_key_file)
        .any(|p| p.is_relative());
    if relative {
        report.warning(
            "relative paths are taken from the directory the agent starts in, not the file's",
        );
    }
}

/// The leaf's notBefore and notAfter.
fn chain_dates(cert: &Path) -> anyhow::Result<(SystemTime, SystemTime)> {
    let leaf = CertificateDer::pem_file_iter(cert)
        .map_err(|e| anyhow::anyhow!("--cert {}: {e}", cert.display()))?
        .next()
        .ok_or_else(|| anyhow::anyhow!("--cert {}: no CERTIFICATE in it", cert.display()))?
        .map_err(|e| anyhow::anyhow!("--cert {}: {e}", cert.display()))?;
    let (_, parsed) = x509_parser::parse_x509_certificate(&leaf)
        .map_err(|e| anyhow::anyhow!("--cert {}: does not parse: {e}", cert.display()))?;
    let at = |t: x509_parser::time::ASN1Time| {
        let secs = t.timestamp();
        if secs >= 0 {
            SystemTime::UNIX_EPOCH + Duration::from_secs(secs as u64)
        } else {
            SystemTime::UNIX_EPOCH
        }
    };
    let validity = parsed.validity();
    Ok((at(validity.not_before), at(validity.not_after)))
}

fn check_dates(
    cert: &Path,
    (not_before, not_after): (SystemTime, SystemTime),
    now: SystemTime,
    report: &mut Report,
) {
    let date = |t: SystemTime| humantime::format_rfc3339_seconds(t).to_string();
    if not_after <= now {
        report.problem(format!(
            "--cert {}: expired on {}",
            cert.display(),
            date(not_after)
        ));
    } else if not_after.duration_since(now).unwrap_or_default() < EXPIRY_WARNING {
        report.warning(format!(
            "--cert {}: expires on {}, in under 14 days",
            cert.display(),
            date(not_after)
        ));
    }
    if not_before > now {
        report.warning(format!(
            "--cert {}: not valid before {}",
            cert.display(),
            date(not_before)
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(file: &Path) -> AgentArgs {
        AgentArgs {
            config: Some(file.into()),
            ..Default::default()
        }
    }

    const DAY: Duration = Duration::from_secs(86400);

    #[test]
    fn dates_give_a_problem_when_expired_and_a_warning_when_close() {
        let now = SystemTime::UNIX_EPOCH + 1000 * DAY;
        let p = Path::new("c.pem");
        let mut r = Report::new("t");
        check_dates(p, (now - 90 * DAY, now - DAY), now, &mut r);
        assert_eq!((r.problems().len(), r.warnings().len()), (1, 0));
        let mut r = Report::new("t");
        check_dates(p, (now - 90 * DAY, now + 13 * DAY), now, &mut r);
        assert_eq!((r.problems().len(), r.warnings().len()), (0, 1));
        let mut r = Report::new("t");
        check_dates(p, (now - 90 * DAY, now + 60 * DAY), now, &mut r);
        assert_eq!((r.problems().len(), r.warnings().len()), (0, 0));
        let mut r = Report::new("t");
        check_dates(p, (now + DAY, now + 60 * DAY), now, &mut r);
        assert_eq!((r.problems().len(), r.warnings().len()), (0, 1));
    }

    #[test]
    fn every_problem_of_a_file_is_listed() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let file = dir.path().join("agent.toml");
        std::fs::write(
            &file,
            format!(
                "cert = [{missing:?}]\nkey = [{missing:?}]\nworkers = 0\n\
                 cluster-key-file = {missing:?}\n"
            ),
        )
        .unwrap();
        let r = check(args(&file));
        // workers = 0, the pair that does not load, the key's file, the chain's dates, the
        // cluster key's file.
        assert_eq!(r.problems().len(), 5, "{:?}", r.problems());
        assert_eq!(r.exit_code(), 2);
        std::fs::write(&file, "lisen = []\n").unwrap();
        let r = check(args(&file));
        assert_eq!(r.problems().len(), 1);
        assert!(r.problems()[0].contains("lisen"), "{:?}", r.problems());
    }
}
