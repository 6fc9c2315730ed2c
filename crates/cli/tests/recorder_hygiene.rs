//! `baton record`'s hygiene (issue 15, finding 8), with the real binary, curl and a real
//! `baton agent` as the origin: the scenario file is 0600 and has no cookie, authorization,
//! API key, token or body unless `--keep-credentials` (and a redacted one still replays); the
//! CA lives `--ca-days` days (365 by default, not until 4096), an out-of-bounds `--ca-days` is
//! refused, a stored CA that lives too long is refused with the steps to retire it, and the
//! start-up output says where the CA is, until when, and how to remove it from a browser.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::recorder::{replay, Recorder};
use common::*;

/// `baton record ...` that is expected to stop before it listens: its output.
fn record_fails(args: &[&str]) -> String {
    let o = Command::new(BATON)
        .arg("record")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", text_of(&o));
    text_of(&o)
}

/// Whether `openssl x509 -checkend` says the certificate is still valid `days` from now.
fn valid_in(pem: &Path, days: u64) -> bool {
    let o = Command::new("openssl")
        .args([
            "x509",
            "-noout",
            "-checkend",
            &(days * 86_400).to_string(),
            "-in",
        ])
        .arg(pem)
        .output()
        .unwrap();
    let said = text_of(&o);
    assert!(said.contains("will") || said.contains("expire"), "{said}");
    o.status.success()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// What curl sends through the recorder, each secret unique so it can be looked for.
const SECRETS: &[&str] = &[
    "C00KIE-SECRET",
    "BEARER-SECRET",
    "APIKEY-SECRET",
    "QUERY-SECRET",
    "BODY-SECRET",
];

#[test]
fn scenario_files_are_private_and_credentials_redacted_unless_kept() {
    let pki = Pki::new();
    let dir = TempDir::new("recorder");
    let agent = Agent::serving(&pki, &[]);
    let ca_dir = dir.path("ca");
    let upstream = pki.arg("ca.pem");
    for keep in [false, true] {
        let out = dir.arg(&format!("keep-{keep}.toml"));
        // an existing, world-readable file: replaced by a private one
        std::fs::write(&out, "old").unwrap();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o644)).unwrap();
        let port = agent.port().to_string();
        let host = format!("localhost:{port}");
        let mut args = vec![
            "--upstream-ca",
            &upstream,
            "--host",
            &host,
            "--max-requests",
            "2",
        ];
        if keep {
            args.push("--keep-credentials");
        }
        let mut rec = Recorder::start(&ca_dir, &out, &args);
        let ca = ca_dir.join("ca.pem");
        let url = |path: &str| format!("https://localhost:{port}{path}");
        let proxy = rec.proxy();
        let via = |extra: &[&str]| {
            let mut all = vec![
                "--proxy",
                &proxy,
                "--cacert",
                path_str(&ca),
                "-o",
                "/dev/null",
            ];
            all.extend_from_slice(extra);
            let o = curl(&all);
            assert!(o.status.success(), "{}", text_of(&o));
        };
        via(&[
            "-H",
            "Cookie: sid=C00KIE-SECRET; theme=dark",
            "-H",
            "Authorization: Bearer BEARER-SECRET",
            "-H",
            "X-Api-Key: APIKEY-SECRET",
            "-H",
            "X-Scenario: kept",
            &url("/tls?access_token=QUERY-SECRET&page=2"),
        ]);
        via(&["-d", "user=me&password=BODY-SECRET", &url("/login")]);
        let (status, said) = rec.wait(Duration::from_secs(20));
        assert!(status.success(), "{said}");
        assert!(said.contains("--max-requests reached"), "{said}");

        let text = std::fs::read_to_string(&out).unwrap();
        assert_eq!(mode(Path::new(&out)), 0o600, "{out}");
        assert_eq!(mode(&ca_dir.join("ca.key")), 0o600);
        assert!(text.contains("x-scenario: kept"), "{text}");
        let v: toml::Value = toml::from_str(&text).unwrap();
        let body = v["request"][1]["body"].as_str().unwrap();
        assert_eq!(body.len(), "user=me&password=BODY-SECRET".len(), "{text}");
        if keep {
            for s in SECRETS {
                assert!(
                    text.contains(s),
                    "{s} missing with --keep-credentials:\n{text}"
                );
            }
            assert!(text.contains("credentials kept"), "{text}");
        } else {
            for s in SECRETS {
                assert!(!text.contains(s), "{s} in the scenario:\n{text}");
                assert!(!said.contains(s), "{s} in the recorder's output:\n{said}");
            }
            // same shapes and lengths: names, the scheme, the other query parameters stay
            assert!(
                text.contains("cookie: sid=xxxxxxxxxxxxx; theme=xxxx"),
                "{text}"
            );
            assert!(
                text.contains("authorization: Bearer xxxxxxxxxxxxx"),
                "{text}"
            );
            assert!(text.contains("x-api-key: xxxxxxxxxxxxx"), "{text}");
            assert!(
                text.contains("/tls?access_token=xxxxxxxxxxxx&page=2"),
                "{text}"
            );
            assert_eq!(body, "x".repeat(body.len()));
            assert!(
                text.starts_with("# baton scenario") && text.contains("# redacted"),
                "{text}"
            );
            assert!(said.contains("redacted: header values 3"), "{said}");

            // a redacted scenario replays: every request sent and answered
            let (v, served) = replay(&agent, &pki.arg("ca.pem"), &out, 2, &[], &dir);
            assert_eq!(
                (n(&v, "requests.ok"), n(&v, "requests.failed")),
                (4, 0),
                "{v}\n{text}"
            );
            assert_eq!(served, 4);
        }
    }
}

#[test]
fn the_ca_lives_ca_days_and_says_how_to_remove_it() {
    let dir = TempDir::new("recorder-ca");
    let out = dir.arg("s.toml");

    // the default: one year, and the start-up output says where, until when, and how to remove
    let ca_dir = dir.path("default");
    let mut rec = Recorder::start(&ca_dir, &out, &["--duration", "200ms"]);
    let ca = ca_dir.join("ca.pem");
    assert!(valid_in(&ca, 364) && !valid_in(&ca, 366));
    let line = rec
        .stdout
        .lines()
        .find(|l| l.starts_with("ca certificate "))
        .unwrap_or_else(|| panic!("{}", rec.stdout))
        .to_string();
    // the date printed is the certificate's: `notAfter=Jun  1 12:00:00 2027 GMT`
    let o = Command::new("openssl")
        .args(["x509", "-noout", "-enddate", "-in"])
        .arg(&ca)
        .output()
        .unwrap();
    let end = String::from_utf8_lossy(&o.stdout).into_owned();
    let year = end.split_whitespace().rev().nth(1).unwrap();
    let clock = end.split_whitespace().rev().nth(2).unwrap();
    assert!(
        line.starts_with(&format!(
            "ca certificate {} (baton record CA ",
            ca.display()
        )) && line.contains(&format!("valid until {year}-"))
            && line.contains(&format!(" {} UTC)", &clock[..5])),
        "{line}\n{end}"
    );
    let name = line
        .split_once(" (")
        .and_then(|(_, r)| r.split_once(", valid"))
        .unwrap()
        .0
        .to_string();
    let (_, said) = rec.wait(Duration::from_secs(20));
    assert!(said.contains("baton installs its CA nowhere"), "{said}");
    assert!(
        said.contains(&format!("certutil -d sql:$HOME/.pki/nssdb -D -n '{name}'")),
        "{said}"
    );
    assert!(
        said.contains("Firefox: Settings > Privacy & Security > Certificates"),
        "{said}"
    );
    assert!(said.contains("Delete or Distrust"), "{said}");

    // --ca-days: bounded, and what a new CA gets
    for bad in ["0", "3651", "x"] {
        let e = record_fails(&["--out", &out, "--ca-days", bad]);
        assert!(e.contains("--ca-days"), "{e}");
    }
    let week = dir.path("week");
    let mut rec = Recorder::start(&week, &out, &["--duration", "200ms", "--ca-days", "7"]);
    rec.wait(Duration::from_secs(20));
    assert!(valid_in(&week.join("ca.pem"), 6) && !valid_in(&week.join("ca.pem"), 8));

    // a run with a shorter --ca-days than the stored CA has left: refused, left alone,
    // with the way to keep it and the way to retire it
    let pem = std::fs::read(week.join("ca.pem")).unwrap();
    let e = record_fails(&["--out", &out, "--ca-dir", path_str(&week), "--ca-days", "2"]);
    assert!(e.contains("longer than --ca-days 2"), "{e}");
    assert!(e.contains("pass --ca-days 7"), "{e}");
    assert!(e.contains(&format!("rm -r '{}'", week.display())), "{e}");
    assert_eq!(std::fs::read(week.join("ca.pem")).unwrap(), pem);

    // a CA as baton made it before (valid until 4096): refused with the steps to retire it
    let old = dir.path("old");
    std::fs::create_dir_all(&old).unwrap();
    let o = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            "/O=Baton (local recorder)/CN=baton record CA 01d",
            "-days",
            "700000",
            "-keyout",
        ])
        .arg(old.join("ca.key"))
        .arg("-out")
        .arg(old.join("ca.pem"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text_of(&o));
    let e = record_fails(&["--out", &out, "--ca-dir", path_str(&old)]);
    assert!(e.contains("longer than --ca-days 365"), "{e}");
    assert!(
        e.contains("Retire it") && !e.contains("To keep using it"),
        "{e}"
    );
    assert!(
        e.contains("certutil -d sql:$HOME/.pki/nssdb -D -n 'baton record CA 01d'"),
        "{e}"
    );
    assert!(old.join("ca.key").exists(), "not deleted by baton");
    assert!(!Path::new(&out).exists());
}
