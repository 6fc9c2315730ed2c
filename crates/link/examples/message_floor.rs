//! What a message on the agent link costs, at least: the floor under a session migration's
//! price (issue 14). Two threads in one process, each a current-thread runtime (the cheapest
//! shape: no wake-ups across threads), one the dispatcher's end of a real link (`LinkPool`),
//! the other an agent's (`LinkListener`), over 127.0.0.1. CPU time is read from schedstat
//! (nanoseconds on the CPU) around the timed part: the dispatcher thread's own, and the whole
//! process's minus it for the agent's end, so the figure is CPU per operation at each end, not
//! wall time.
//!
//! Two workloads, `concurrency` clients at once:
//! - `ping`: one long-lived stream per client; the dispatcher's end sends 64 bytes, the agent's
//!   answers 64: CPU per message (one write, one wake-up and one read at either end);
//! - `move`: the messages of a migration's home-agent side, on a fresh stream each time: the
//!   dispatcher opens a stream with an `Import` (400 bytes), the agent answers `Ready` (8), the
//!   dispatcher sends `Commit` (8) and ends its side, the agent ends its side: CPU per move.
//!
//! With a third argument `workers` > 1, the agent's end runs a multi-thread runtime of that many
//! workers instead (the agent's default shape on a multi-core host).
//!
//! Usage: cargo run --release -p baton-link --example message_floor -- [ops] [concurrency] [workers]

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use baton_link::{LinkListener, LinkPool, StreamMeta};
use baton_session::{KeyRing, SharedRing};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KEY: &str = "00000001 1111111111111111111111111111111111111111111111111111111111111111";
const WAIT: Duration = Duration::from_secs(10);

fn ring() -> SharedRing {
    Arc::new(RwLock::new(
        KeyRing::parse_key_file(KEY, Instant::now()).expect("a valid key"),
    ))
}

/// Time on the CPU so far from a schedstat file.
fn schedstat(path: &std::path::Path) -> Duration {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let ns = s.split_whitespace().next().and_then(|v| v.parse().ok());
    Duration::from_nanos(ns.unwrap_or(0))
}

/// This thread's time on the CPU so far.
fn thread_cpu() -> Duration {
    schedstat("/proc/thread-self/schedstat".as_ref())
}

/// The whole process's (every thread alive now; the agent's threads live through the run).
fn process_cpu() -> Duration {
    let tasks = std::fs::read_dir("/proc/self/task").expect("procfs");
    tasks
        .filter_map(Result::ok)
        .map(|t| schedstat(&t.path().join("schedstat")))
        .sum()
}

fn meta(i: usize) -> StreamMeta {
    StreamMeta::followed(
        SocketAddr::from(([192, 0, 2, 7], 1000 + (i % 60000) as u16)),
        "127.0.0.1:443".parse().expect("an address"),
    )
}

#[derive(Clone, Copy, PartialEq)]
enum Work {
    Ping,
    Move,
}

/// The agent's end: answers every stream as the workload says, until told to stop.
async fn agent(listener: LinkListener, work: Work) {
    while let Some(mut s) = listener.accept().await {
        tokio::spawn(async move {
            let mut buf = vec![0u8; 1024];
            match work {
                Work::Ping => loop {
                    if s.read_exact(&mut buf[..64]).await.is_err() {
                        return;
                    }
                    if s.write_all(&buf[..64]).await.is_err() {
                        return;
                    }
                },
                Work::Move => {
                    let _ = s.read_exact(&mut buf[..400]).await; // Import
                    let _ = s.write_all(&[1u8; 8]).await; // Ready
                    let _ = s.read_exact(&mut buf[..8]).await; // Commit
                    let _ = s.read(&mut buf).await; // the dispatcher's end
                    let _ = s.shutdown().await;
                }
            }
        });
    }
}

/// The dispatcher's end: `ops` operations over `conc` clients after a warm-up; returns this
/// thread's CPU over them and the rest of the process's (the agent's end).
async fn dispatcher(
    pool: Arc<LinkPool>,
    work: Work,
    ops: usize,
    conc: usize,
) -> (Duration, Duration) {
    let run = |n: usize| {
        let pool = pool.clone();
        async move {
            let mut clients = Vec::new();
            for c in 0..conc {
                let pool = pool.clone();
                clients.push(tokio::spawn(async move {
                    let link = pool.pick().expect("the link is up");
                    let mut buf = vec![0u8; 1024];
                    let per = n / conc;
                    match work {
                        Work::Ping => {
                            let mut s = link.open(meta(c)).await.expect("a stream");
                            for _ in 0..per {
                                s.write_all(&[7u8; 64]).await.expect("a write");
                                s.read_exact(&mut buf[..64]).await.expect("the echo");
                            }
                        }
                        Work::Move => {
                            for i in 0..per {
                                let mut s = link.open(meta(c * per + i)).await.expect("a stream");
                                s.write_all(&[9u8; 400]).await.expect("Import");
                                s.read_exact(&mut buf[..8]).await.expect("Ready");
                                s.write_all(&[2u8; 8]).await.expect("Commit");
                                s.shutdown().await.expect("the end");
                                while s.read(&mut buf).await.map(|n| n > 0).unwrap_or(false) {}
                            }
                        }
                    }
                }));
            }
            for c in clients {
                c.await.expect("a client");
            }
        }
    };
    run(ops / 10).await; // warm-up: the link's windows, the allocator, the caches
    let (t, p) = (thread_cpu(), process_cpu());
    run(ops).await;
    let own = thread_cpu() - t;
    (own, (process_cpu() - p).saturating_sub(own))
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut arg = |default: usize| args.next().and_then(|a| a.parse().ok()).unwrap_or(default);
    let (ops, conc, workers) = (arg(20_000), arg(16), arg(1));
    for work in [Work::Ping, Work::Move] {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let addr = tcp.local_addr().expect("an address");
        tcp.set_nonblocking(true).expect("non-blocking");
        let agent_rt = match workers {
            0 | 1 => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build(),
            n => tokio::runtime::Builder::new_multi_thread()
                .worker_threads(n)
                .enable_all()
                .build(),
        }
        .expect("a runtime");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let agent_thread = std::thread::spawn(move || {
            agent_rt.block_on(async move {
                let tcp = tokio::net::TcpListener::from_std(tcp).expect("a listener");
                let listener = LinkListener::new(tcp, 1, ring(), Vec::new());
                tokio::select! {
                    _ = agent(listener, work) => {}
                    _ = stop_rx => {}
                }
            });
            // the runtime and its workers end here, after the measurement
            drop(agent_rt);
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let (d_cpu, a_cpu) = rt.block_on(async move {
            let pool = Arc::new(LinkPool::new(addr, 1, ring(), 1));
            let up = Instant::now();
            while !pool.is_up() {
                assert!(up.elapsed() < WAIT, "the link did not come up");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            dispatcher(pool, work, ops, conc).await
        });
        let _ = stop_tx.send(());
        agent_thread.join().expect("the agent thread");
        let per = |d: Duration| d.as_secs_f64() * 1e6 / ops as f64;
        println!(
            "{:<5} ops {:>6} concurrency {:>3} agent workers {}: dispatcher {:>6.1} us, agent {:>6.1} us per op",
            if work == Work::Ping { "ping" } else { "move" },
            ops,
            conc,
            workers,
            per(d_cpu),
            per(a_cpu),
        );
    }
}
