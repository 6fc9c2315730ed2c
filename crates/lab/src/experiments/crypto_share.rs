//! The crypto offload paper: what share of an HTTPS server's CPU is cryptography, and what moving the private
//! key out of the server saves. The paper (Apache + OpenSSL 0.9.8 on an UltraSPARC T2, DTrace,
//! 50 KB pages) found crypto at 77.20% of the server's time with RSA key exchange
//! (DES-CBC-SHA) and 48.76% with ephemeral DH (EDH-RSA-DES-CBC-SHA), and offloading all of it
//! to the chip's crypto unit took the total down to 37% and 41%.
//!
//! Here: one capped `baton agent`, 50 KB bodies, ECDHE-ECDSA P-256, ECDHE-RSA 2048/3072
//! (TLS 1.2) and TLS 1.3, full vs resumed handshakes. Per run: the agent's CPU per transaction
//! and its own crypto metering split by op (`baton_crypto_seconds_total` over the agent's CPU
//! from `/proc`), beside `perf`'s view of the same run (samples inside the metered calls, and
//! samples whose leaf is crypto code; see `crate::profile`). With `baton signer` holding the
//! key (`--key-signer`), full handshakes are run again: the change in the agent's CPU per
//! transaction is this project's "offload".

use std::path::{Path, PathBuf};

use anyhow::Context;
use baton_bench::BenchArgs;
use serde_json::json;

use crate::profile::{self, Attribution, Comparison, Recording, WAITING_OPS};
use crate::rig::{Counter, Lab, Run, Sut};
use crate::row;
use crate::table::{ratio, Chart, Table};
use baton_cluster::cluster::{spawn_ready, Proc};
use baton_cluster::pki::KeyKind;

const BODY: usize = 51_200;
/// The crypto offload paper, Table 2 and 3: crypto's share of the server's time without offload.
const PAPER_RSA_KX_SHARE: f64 = 77.20;
const PAPER_EDH_SHARE: f64 = 48.76;
/// Total processing time with offload over without (5355/14307 ms and 8810/21600 ms).
const PAPER_RSA_KX_OFFLOAD: f64 = 5355.0 / 14307.0;
const PAPER_EDH_OFFLOAD: f64 = 8810.0 / 21600.0;
/// perf's sampling rate: ~1,000 samples per agent CPU-second.
const PERF_HZ: u32 = 999;

struct Case {
    name: &'static str,
    key: KeyKind,
    version: &'static str,
    suite: Option<&'static str>,
    sigalg: Option<&'static str>,
    /// The closest row of the paper: EDH-RSA (ephemeral key exchange, RSA signature).
    paper_edh: bool,
}

fn cases(quick: bool) -> Vec<Case> {
    let mut v = vec![
        Case {
            name: "ECDHE-ECDSA P-256",
            key: KeyKind::EcdsaP256,
            version: "1.2",
            suite: Some("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"),
            sigalg: None,
            paper_edh: false,
        },
        Case {
            name: "ECDHE-RSA 2048",
            key: KeyKind::Rsa(2048),
            version: "1.2",
            suite: Some("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"),
            sigalg: None,
            paper_edh: true,
        },
    ];
    if !quick {
        v.push(Case {
            name: "ECDHE-RSA 3072",
            key: KeyKind::Rsa(3072),
            version: "1.2",
            suite: Some("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"),
            sigalg: None,
            paper_edh: true,
        });
    }
    v.push(Case {
        name: "TLS 1.3 ECDSA P-256",
        key: KeyKind::EcdsaP256,
        version: "1.3",
        suite: None,
        sigalg: None,
        paper_edh: false,
    });
    if !quick {
        v.push(Case {
            name: "TLS 1.3 RSA 2048",
            key: KeyKind::Rsa(2048),
            version: "1.3",
            suite: None,
            sigalg: Some("rsa_pss_rsae_sha256"),
            paper_edh: false,
        });
    }
    v
}

/// `baton signer` holding one key, stopped on drop.
struct SignerProc {
    proc: Proc,
    socket: PathBuf,
    auth: PathBuf,
}

impl SignerProc {
    fn start(lab: &Lab, name: &str, key: &Path) -> anyhow::Result<SignerProc> {
        let dir = lab.sut_dir(&format!("signer-{name}"))?;
        let socket = dir.join("signer.sock");
        let auth = dir.join("signer.auth");
        write_auth_key(&auth)?;
        let args: Vec<String> = vec![
            "signer".into(),
            "--listen".into(),
            format!("unix:{}", socket.display()),
            "--key".into(),
            key.display().to_string(),
            "--auth-key-file".into(),
            auth.display().to_string(),
        ];
        let proc = spawn_ready(&lab.baton, &args, &dir.join("signer.log"))?;
        Ok(SignerProc { proc, socket, auth })
    }

    /// The agent's flags; `--key-signer-fallback local` because the lab's agents are always
    /// started with `--key` (the run checks that the signer, not the local key, signed).
    fn agent_args(&self) -> Vec<String> {
        vec![
            "--key-signer".into(),
            format!("unix:{}", self.socket.display()),
            "--key-signer-auth-key-file".into(),
            self.auth.display().to_string(),
            "--key-signer-fallback".into(),
            "local".into(),
        ]
    }
}

impl Drop for SignerProc {
    fn drop(&mut self) {
        let _ = self.proc.child.kill();
        let _ = self.proc.child.wait();
    }
}

/// 32 random bytes as hex, mode 0600 (what `baton signer --auth-key-file` requires).
fn write_auth_key(path: &Path) -> anyhow::Result<()> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut secret = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut secret)?;
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    std::io::Write::write_all(&mut f, hex.as_bytes())?;
    Ok(())
}

/// Whether `baton signer` exists in this build.
fn signer_available(baton: &Path) -> bool {
    std::process::Command::new(baton)
        .args(["signer", "--help"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// One run as both accounts saw it.
struct Measured {
    run: Run,
    comparison: Comparison,
    /// perf's profile was taken (else only the metering).
    perf: bool,
}

fn measure(lab: &Lab, sut: &Sut, args: BenchArgs, perf: bool) -> anyhow::Result<Measured> {
    let server = sut.servers.first().context("no server")?;
    let Counter::Metrics(metrics) = server.counter else {
        anyhow::bail!("the agent has no metrics address");
    };
    let pid = server.pid;
    let rec = if perf {
        Some(Recording::start(
            pid,
            PERF_HZ,
            &lab.dir
                .join(format!("{}.perf.data", sut.name.replace(' ', "-"))),
        )?)
    } else {
        None
    };
    let before = profile::snapshot(pid, metrics)?;
    let run = lab.run(sut, args)?;
    let after = profile::snapshot(pid, metrics)?;
    let prof = match rec {
        Some(r) => r.stop()?,
        None => Default::default(),
    };
    let comparison = Comparison::new(&before, &after, prof, Attribution { p256_kx: false });
    Ok(Measured {
        run,
        comparison,
        perf,
    })
}

pub fn run(lab: &Lab) -> anyhow::Result<Table> {
    let duration = if lab.quick { "3s" } else { "10s" };
    let perf = match profile::check_perf(&lab.dir) {
        Ok(()) => None,
        Err(e) => Some(format!("{e:#}")),
    };
    let signer_ok = signer_available(&lab.baton);
    let mut t = Table::new(
        "crypto-share",
        format!("the crypto offload paper: crypto's share of one capped agent's CPU, {BODY}-byte bodies, key in the agent vs in baton signer"),
    )
    .column("suite", "suite")
    .column("handshakes", "handshakes")
    .column("key", "key")
    .column("tps", "TPS")
    .column("cpu_ms_per_tx", "agent CPU ms/tx")
    .column("vs_in_process", "agent x in-process")
    .column("signer_ms_per_tx", "signer CPU ms/tx")
    .column("system_vs_in_process", "agent+signer x in-process")
    .column("paper_offload", "paper x (total time)")
    .column("crypto", "crypto %")
    .column("sign", "sign %")
    .column("kx", "kx %")
    .column("aead", "aead %")
    .column("hash", "hash %")
    .column("other", "other %")
    .column("perf_in_calls", "perf in calls %")
    .column("perf_leaf", "perf leaf %")
    .column("paper_crypto", "paper crypto %")
    .column("vs_paper", "x paper");
    t.chart = Some(Chart::beside("crypto", Some("paper_crypto")));
    let mut runs: Vec<(String, Run)> = Vec::new();
    // the largest difference, and the bound for that run's sample count
    let mut worst: (f64, f64) = (0.0, 0.0);
    for case in cases(lab.quick) {
        let pki = lab.pki(case.key)?;
        let signer = if signer_ok {
            Some(SignerProc::start(lab, case.name, &pki.key)?)
        } else {
            None
        };
        let mut in_process_full = None;
        let modes: &[(&str, bool)] = &[("full", false), ("resumed", false), ("full", true)];
        for &(handshakes, remote) in modes {
            let extra = match (&signer, remote) {
                (Some(s), true) => s.agent_args(),
                (None, true) => continue,
                _ => Vec::new(),
            };
            let key = if remote { "signer" } else { "in-process" };
            let name = format!("{} {handshakes} {key}", case.name);
            println!("   {name}");
            let sut = Sut::baton_single(lab, &name, case.key, &extra)?;
            let args = BenchArgs {
                url: Some(format!("https://{{addr}}/bytes/{BODY}")),
                duration: Some(duration.into()),
                // enough clients to keep the capped agent busy across the added RTT
                clients: Some(if lab.rtt.is_some() { 64 } else { 8 }),
                tls_version: Some(case.version.into()),
                suite: case.suite.map(String::from).into_iter().collect(),
                sigalg: case.sigalg.map(String::from).into_iter().collect(),
                resume: Some(
                    if handshakes == "full" {
                        "none"
                    } else {
                        "ticket"
                    }
                    .into(),
                ),
                // every virtual client's first connection is full, the rest resume
                full_every: (handshakes == "resumed").then_some(1_000_000),
                timeout: Some("10s".into()),
                ..Default::default()
            };
            // the signer's CPU over the same run: the offload's whole cost, not only the agent's
            let signer_cpu = || {
                signer
                    .as_ref()
                    .filter(|_| remote)
                    .and_then(|s| baton_ops::process::cpu_seconds_of(s.proc.child.id()))
            };
            let signer_before = signer_cpu();
            let m = measure(lab, &sut, args, perf.is_none())?;
            let signer_s = signer_cpu().zip(signer_before).map(|(a, b)| a - b);
            let c = &m.comparison;
            let cpu_ms = m.run.server_cpu_per_tx_ms();
            if handshakes == "full" && !remote {
                in_process_full = cpu_ms;
            }
            let pct = |x: f64| (100.0 * x * 10.0).round() / 10.0;
            let group = |ops: &[&str]| pct(ops.iter().map(|op| c.metered_op_share(op)).sum());
            let mut r = row![
                ("suite", case.name),
                ("handshakes", handshakes),
                ("key", key),
                ("tps", m.run.report.tps),
                ("cpu_ms_per_tx", cpu_ms),
                ("crypto", pct(c.metered_share())),
                ("sign", group(&["sign", "verify"])),
                ("kx", group(&["kx"])),
                ("aead", group(&["bulk_encrypt", "bulk_decrypt", "ticket"])),
                ("hash", group(&["hash"])),
                ("other", pct(1.0 - c.metered_share())),
            ];
            if m.perf {
                r.insert("perf_in_calls".into(), json!(pct(c.perf_share())));
                r.insert("perf_leaf".into(), json!(pct(c.perf_leaf_share())));
                r.insert("perf_samples".into(), json!(c.profile.total()));
                r.insert("perf_margin".into(), json!(c.margin_points()));
                if c.difference_points().abs() > worst.0 {
                    worst = (c.difference_points().abs(), c.margin_points());
                }
            }
            if remote {
                let ratio_cpu = cpu_ms.zip(in_process_full).and_then(|(s, l)| ratio(s, l));
                r.insert("vs_in_process".into(), json!(ratio_cpu));
                let n = m.run.report.requests.ok;
                let signer_ms = signer_s.filter(|_| n > 0).map(|s| s * 1e3 / n as f64);
                r.insert("signer_ms_per_tx".into(), json!(signer_ms));
                let system = cpu_ms
                    .zip(signer_ms)
                    .zip(in_process_full)
                    .and_then(|((a, s), l)| ratio(a + s, l));
                r.insert("system_vs_in_process".into(), json!(system));
                if case.paper_edh {
                    r.insert("paper_offload".into(), json!(PAPER_EDH_OFFLOAD));
                }
                let waited: f64 = WAITING_OPS.iter().filter_map(|op| c.metered.get(*op)).sum();
                if waited == 0.0 || c.metered.get("sign").copied().unwrap_or(0.0) > 0.0 {
                    t.note(format!(
                        "{name}: the agent signed locally at least once (signer unreachable: fallback)"
                    ));
                }
            } else if case.paper_edh && handshakes == "full" {
                r.insert("paper_crypto".into(), json!(PAPER_EDH_SHARE));
                r.insert(
                    "vs_paper".into(),
                    json!(ratio(100.0 * c.metered_share(), PAPER_EDH_SHARE)),
                );
            }
            t.push(r);
            runs.push((name, m.run));
        }
    }
    super::run_notes(&mut t, lab, runs.iter().map(|(n, r)| (n, r)));
    t.note("crypto % and its split: the agent's own metering (baton_crypto_seconds_total over its CPU from /proc); sign includes verify, aead the records and session tickets; other = everything else (TCP, HTTP, rustls' state machine, the runtime)");
    match &perf {
        None => t.note(format!(
            "perf in calls %: perf's samples (cpu-clock, {PERF_HZ} Hz, DWARF call chains) inside the metered calls — the same thing measured independently; largest difference here {:.1} points (the bound for that run: {:.1} points, {} systematic plus 3 standard errors of its sampled share); perf leaf %: samples whose leaf symbol is crypto code (narrower: no buffer copies, allocation or glue)",
            worst.0,
            worst.1,
            profile::SYSTEMATIC_POINTS
        )),
        Some(why) => t.note(format!("perf columns empty: {why}")),
    }
    if signer_ok {
        t.note("key signer: baton signer on a Unix socket, uncapped (the paper's crypto unit was separate hardware); agent x in-process = the agent's CPU per transaction with the signer over without (what offload frees on the server); agent+signer x in-process = the agent's and the signer's CPU together over the agent's alone without it (what the whole system pays, the scope of the paper's total time); the signer's waiting time (sign_remote) is not agent CPU and is left out of crypto %");
    } else {
        t.note("signer not available in this build (baton signer): no offload rows");
    }
    t.note(format!(
        "paper (Apache + OpenSSL 0.9.8, UltraSPARC T2, DES-CBC-SHA 50 KB pages): crypto {PAPER_RSA_KX_SHARE}% with RSA key exchange (rustls refuses it: no forward secrecy, so no row here), {PAPER_EDH_SHARE}% with EDH-RSA, set beside ECDHE-RSA full handshakes; offloading all crypto to the chip took total time to x{PAPER_RSA_KX_OFFLOAD:.2} (RSA kx) and x{PAPER_EDH_OFFLOAD:.2} (EDH); the signer here moves only the private-key operation"
    ));
    Ok(t)
}
