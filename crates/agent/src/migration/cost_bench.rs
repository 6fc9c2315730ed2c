//! The CPU cost of a migration's own work — what `baton_migration_cpu_seconds_total` meters —
//! over many sessions, stage by stage, with the agent's real code and real rustls sessions in
//! memory. A measurement, not a test: it asserts only that every session moved intact, and it
//! is ignored by default. Run it on the release build:
//!
//! ```sh
//! cargo test --release -p baton-agent migration::cost_bench -- --ignored --nocapture
//! BATON_COST_SESSIONS=20000 cargo test --release -p baton-agent migration::cost_bench -- --ignored --nocapture
//! ```
//!
//! Each stage runs over every session in one batch between two thread-CPU reads, so the
//! clock's own cost (a system call of a few microseconds on a VM) does not weigh on any one
//! session; the last lines time the sections the way the agent meters them (two reads each) to
//! show what the reads add. The test binary uses the system allocator, the agent mimalloc.

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use baton_ops::process::thread_cpu;
use baton_session::migration::{ReplayGuard, SessionObject};
use rustls::{ClientConnection, ServerConnection};

use super::harness::{cluster_ring, pattern};
use super::into_layer_test::{established_with, flight};
use crate::conn_info::ConnInfo;
use baton_migrate::extract::{self, Extras};
use baton_migrate::secrets::{SecretLog, TrafficSecrets};

/// A session after its handshake, as the handshake agent holds it at the freeze: the tickets
/// sent, the client's first request (1 KiB, like bench-handoff's) not yet given to rustls.
struct Frozen {
    client: ClientConnection,
    server: ServerConnection,
    secrets: TrafficSecrets,
    request: Vec<u8>,
}

fn frozen(log: &Arc<SecretLog>, tls13: bool) -> Frozen {
    let (mut client, server, secrets) = established_with(log, tls13);
    client.writer().write_all(&pattern(0, 1024)).unwrap();
    let request = flight(&mut client);
    Frozen {
        client,
        server,
        secrets,
        request,
    }
}

fn per_op(d: Duration, n: usize) -> f64 {
    d.as_secs_f64() * 1e6 / n as f64
}

#[test]
#[ignore = "a measurement: run with --release --ignored --nocapture"]
fn export_and_import_cpu_per_session() {
    let n: usize = std::env::var("BATON_COST_SESSIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5000);
    for tls13 in [true, false] {
        let log = Arc::new(SecretLog::default());
        let ring = cluster_ring(3);
        let binding = [9u8; baton_migrate::BINDING_LEN];
        let info = ConnInfo {
            peer: "127.0.0.2:40000".parse().unwrap(),
            version: "TLSv1.3",
            suite: "TLS13_AES_128_GCM_SHA256".into(),
            alpn: Some("http/1.1".into()),
            sni: Some("localhost".into()),
            resumed: false,
            client_subject: None,
            early: None,
            log: None,
        };
        let mut sessions: Vec<Frozen> = (0..n).map(|_| frozen(&log, tls13)).collect();
        let mut stages: Vec<(&str, Duration)> = Vec::new();
        let mut stage = |name, f: &mut dyn FnMut()| {
            let t = thread_cpu();
            f();
            stages.push((name, thread_cpu().saturating_sub(t)));
        };

        let mut plains: Vec<Vec<u8>> = Vec::with_capacity(n);
        stage("decrypt", &mut || {
            for s in sessions.iter_mut() {
                let mut plain = Vec::new();
                extract::decrypt(&mut s.server, &s.request, &mut plain).unwrap();
                plains.push(plain);
            }
        });
        stage("extractable", &mut || {
            for s in sessions.iter_mut() {
                assert!(extract::extractable(&mut s.server));
            }
        });
        let mut clients = Vec::with_capacity(n);
        let mut objects = Vec::with_capacity(n);
        let mut taken: Vec<_> = sessions
            .drain(..)
            .zip(plains.drain(..))
            .map(|(s, p)| {
                clients.push(s.client);
                (s.server, s.secrets, p)
            })
            .collect();
        stage("extract", &mut || {
            for (server, secrets, plain) in taken.drain(..) {
                let extras = Extras {
                    home: 1,
                    secrets,
                    app: info.application(),
                    plaintext: plain,
                };
                objects.push(extract::extract(server, extras).unwrap());
            }
        });
        let mut sealed = Vec::with_capacity(n);
        stage("seal", &mut || {
            for o in objects.drain(..) {
                sealed.push(o.seal(&ring, 0, &binding).unwrap());
            }
        });
        let mut guard = ReplayGuard::new(1 << 20);
        let started = SystemTime::now() - Duration::from_secs(1);
        let mut opened = Vec::with_capacity(n);
        stage("open", &mut || {
            for s in &sealed {
                let obj = SessionObject::open(
                    s,
                    &ring,
                    1,
                    &binding,
                    SystemTime::now(),
                    started,
                    &mut guard,
                )
                .unwrap();
                opened.push(obj);
            }
        });
        let mut layers = Vec::with_capacity(n);
        stage("record layer", &mut || {
            for o in &opened {
                layers.push(baton_migrate::record_layer(o).unwrap());
            }
        });

        // Every session moved intact: the request's plaintext rode along, and the layer reads
        // the client's next record.
        for ((o, layer), client) in opened.iter().zip(layers.iter_mut()).zip(clients.iter_mut()) {
            assert_eq!(&o.plaintext[..], &pattern(0, 1024)[..]);
            client.writer().write_all(b"next").unwrap();
            let tls = flight(client);
            assert_eq!(layer.read_tls(&tls), tls.len());
            layer.process().unwrap();
            assert_eq!(layer.plaintext(), b"next");
        }

        // The sections as the agent meters them, two clock reads each (the stages again on
        // fresh sessions would be the honest way; the reads' cost is what is shown here).
        let reads = {
            let t = thread_cpu();
            for _ in 0..n {
                std::hint::black_box(thread_cpu());
            }
            thread_cpu().saturating_sub(t)
        };

        let version = if tls13 { "TLS 1.3" } else { "TLS 1.2" };
        println!("{version}, {n} sessions, thread CPU per session:");
        let mut export = Duration::ZERO;
        let mut import = Duration::ZERO;
        for (name, d) in &stages {
            println!("  {name:<14} {:>7.2} us", per_op(*d, n));
            match *name {
                "open" | "record layer" => import += *d,
                _ => export += *d,
            }
        }
        println!(
            "  export {:.2} us + import {:.2} us = {:.2} us; one thread-clock read {:.2} us (the agent makes 4 per migration)",
            per_op(export, n),
            per_op(import, n),
            per_op(export + import, n),
            per_op(reads, n),
        );
    }
}
