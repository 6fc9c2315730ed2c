//! What an idle connection holds on the agent's heap: runs `baton agent` (the same flags) under
//! a counting allocator and, for every line read on stdin, prints the live heap (bytes and
//! allocations) and which allocation sizes changed since the previous line. Used to break the
//! RSS per idle connection of `scripts/bench-agent` down (issue 20): take a snapshot, open the
//! connections (`scripts/lib/hold_connections.py`), take another.
//!
//! Usage: cargo run --release -p baton-agent --example idle_memory -- --listen 127.0.0.1:0 ...
//! Prints the agent's own start-up lines, then for each stdin line:
//! `heap BYTES allocs N rss_kb KB`, then `size S count +N bytes +B` for the sizes whose live
//! count changed the most (in bytes), largest first.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::BufRead as _;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

use clap::Parser as _;

/// Sizes counted one by one up to this; larger ones share the last slot.
const EXACT: usize = 64 * 1024;

struct Counting;

static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
static LIVE_ALLOCS: AtomicI64 = AtomicI64::new(0);
static BY_SIZE: [AtomicI64; EXACT + 1] = [const { AtomicI64::new(0) }; EXACT + 1];

fn counted(size: usize, sign: i64) {
    LIVE_BYTES.fetch_add(sign * size as i64, Relaxed);
    LIVE_ALLOCS.fetch_add(sign, Relaxed);
    BY_SIZE[size.min(EXACT)].fetch_add(sign, Relaxed);
}

// SAFETY: every call is passed on to the system allocator unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            counted(layout.size(), 1);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            counted(layout.size(), 1);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        counted(layout.size(), -1);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            counted(layout.size(), -1);
            counted(new_size, 1);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    agent: baton_agent::AgentArgs,
}

fn snapshot() -> Vec<i64> {
    BY_SIZE.iter().map(|c| c.load(Relaxed)).collect()
}

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    std::thread::spawn(|| {
        let mut before = snapshot();
        for _ in std::io::stdin().lock().lines() {
            let now = snapshot();
            println!(
                "heap {} allocs {} rss_kb {}",
                LIVE_BYTES.load(Relaxed),
                LIVE_ALLOCS.load(Relaxed),
                rss_kb()
            );
            let mut changed: Vec<(usize, i64)> = (0..=EXACT)
                .map(|s| (s, now[s] - before[s]))
                .filter(|&(_, n)| n != 0)
                .collect();
            changed.sort_by_key(|&(s, n)| std::cmp::Reverse((n * s as i64).abs()));
            for (size, n) in changed.into_iter().take(25) {
                let shown = if size == EXACT {
                    format!(">={EXACT}")
                } else {
                    size.to_string()
                };
                println!("size {shown} count {n:+} bytes {:+}", n * size as i64);
            }
            println!("end");
            before = now;
        }
    });
    baton_agent::run(cli.agent)
}
