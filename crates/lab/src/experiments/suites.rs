//! The ATS cipher-suite post: what ECDHE costs. New TLS 1.2 connections per server CPU-second for ECDHE-ECDSA,
//! ECDHE-RSA and (nginx only, with the OpenSSL engine: rustls refuses it) plain RSA key exchange,
//! with X25519 and P-256, plus TLS 1.3. The blog measured, on 2016 Windows/IIS, 445.65 req/s with
//! RSA key exchange and 276.14 with ECDHE-RSA (P-256): ECDHE 38% slower. A 689-byte page.

use baton_bench::BenchArgs;
use serde_json::json;

use super::ssl_tps;
use crate::rig::{Lab, Run};
use crate::row;
use crate::table::{ratio, Chart, Table};
use baton_cluster::pki::KeyKind;

const BODY: usize = 689;
const PAPER_RSA_KX: f64 = 445.65;
const PAPER_ECDHE_RSA: f64 = 276.14;

struct Case {
    server: &'static str,
    kx: &'static str,
    key: KeyKind,
    version: &'static str,
    /// rustls suite (IANA) or, with the OpenSSL engine, an OpenSSL cipher string
    suite: Option<&'static str>,
    group: Option<&'static str>,
    openssl: bool,
}

fn cases(quick: bool) -> Vec<Case> {
    let c = |server, kx, key, version, suite, group, openssl| Case {
        server,
        kx,
        key,
        version,
        suite,
        group,
        openssl,
    };
    let rsa = KeyKind::Rsa(2048);
    let ec = KeyKind::EcdsaP256;
    let mut v = vec![c(
        "nginx",
        "RSA",
        rsa,
        "1.2",
        Some("AES128-GCM-SHA256"),
        None,
        true,
    )];
    let groups: &[&str] = if quick {
        &["x25519"]
    } else {
        &["x25519", "secp256r1"]
    };
    for server in ["nginx", "baton"] {
        for &g in groups {
            v.push(c(
                server,
                "ECDHE-RSA",
                rsa,
                "1.2",
                Some("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"),
                Some(g),
                false,
            ));
            v.push(c(
                server,
                "ECDHE-ECDSA",
                ec,
                "1.2",
                Some("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"),
                Some(g),
                false,
            ));
        }
        if !quick {
            v.push(c(
                server,
                "TLS 1.3 (RSA cert)",
                rsa,
                "1.3",
                None,
                Some("x25519"),
                false,
            ));
            v.push(c(
                server,
                "TLS 1.3 (ECDSA cert)",
                ec,
                "1.3",
                None,
                Some("x25519"),
                false,
            ));
        }
    }
    v
}

/// The groups the client offers. In TLS 1.2 an ECDSA certificate's curve must be among the
/// client's groups (RFC 8422 §5.1; OpenSSL enforces it), so an X25519 run with a P-256
/// certificate offers P-256 second; the server still picks X25519.
fn groups_offered(case: &Case) -> Vec<String> {
    match case.group {
        Some("x25519") if case.key == KeyKind::EcdsaP256 && case.version == "1.2" => {
            vec!["x25519".into(), "secp256r1".into()]
        }
        Some(g) => vec![g.into()],
        None => Vec::new(),
    }
}

pub fn run(lab: &Lab) -> anyhow::Result<Table> {
    let n = if lab.quick { 150 } else { 800 };
    let www = lab.dir.join("www");
    crate::rig::nginx::write_bodies(&www, &[BODY])?;
    let mut t = Table::new(
        "suites",
        format!("the ATS cipher-suite post: new connections per server CPU-second by key exchange, {BODY}-byte page, one capped server"),
    )
    .column("server", "server")
    .column("kx", "key exchange")
    .column("group", "group")
    .column("version", "TLS")
    .column("tps", "TPS")
    .column("failed", "failed")
    .column("per_cpu_second", "conn per srv CPU-s")
    .column("vs_rsa_kx", "x RSA kx")
    .column("paper_vs_rsa_kx", "paper x RSA kx");
    t.chart = Some(Chart::beside("vs_rsa_kx", Some("paper_vs_rsa_kx")));
    let mut runs: Vec<(String, Run)> = Vec::new();
    let mut rsa_kx = None;
    for case in cases(lab.quick) {
        if case.server == "nginx" && !ssl_tps::nginx_ok() {
            continue;
        }
        let name = format!(
            "{}-{}-{}-{}",
            case.server,
            case.kx,
            case.group.unwrap_or("-"),
            case.version
        );
        println!("   {name}");
        let sut = ssl_tps::single(lab, case.server, &name, case.key, &www, None)?;
        let args = BenchArgs {
            engine: case.openssl.then(|| "openssl".into()),
            suite: case.suite.map(String::from).into_iter().collect(),
            group: groups_offered(&case),
            ..ssl_tps::new_connections(BODY, n, case.version)
        };
        let run = lab.run(&sut, args)?;
        let per = ssl_tps::per_cpu_second(&run);
        if case.kx == "RSA" {
            rsa_kx = per;
        }
        let mut r = row![
            ("server", case.server),
            ("kx", case.kx),
            ("group", case.group),
            ("version", case.version),
            ("tps", run.report.tps),
            ("failed", run.failed()),
            ("per_cpu_second", per),
        ];
        r.insert(
            "vs_rsa_kx".into(),
            json!(per.zip(rsa_kx).and_then(|(p, b)| ratio(p, b))),
        );
        if case.kx == "ECDHE-RSA" && case.group == Some("secp256r1") || case.kx == "RSA" {
            r.insert(
                "paper_vs_rsa_kx".into(),
                json!(if case.kx == "RSA" {
                    1.0
                } else {
                    PAPER_ECDHE_RSA / PAPER_RSA_KX
                }),
            );
        }
        t.push(r);
        runs.push((name, run));
    }
    super::run_notes(&mut t, lab, runs.iter().map(|(n, r)| (n, r)));
    t.note("RSA key exchange: nginx only, driven by the bench's OpenSSL engine (rustls and Baton refuse it: no forward secrecy)");
    t.note("x RSA kx: connections per server CPU-second over nginx's with RSA key exchange (paper: ECDHE-RSA P-256 at 0.62, i.e. 38% slower)");
    Ok(t)
}
