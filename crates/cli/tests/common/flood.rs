//! Attackers for the listeners' bounds: connections that send a request (or nothing) and never
//! read, opened again as soon as the server closes them.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// `n` threads, each holding one connection to `to` that sends `request` and is opened again
/// when the server closes it. With `pipeline` it sends `request` again and again and never
/// reads (a write error says the server closed it); without, it sends nothing more and
/// discards what the server sends. Stopped on drop.
pub struct Flood {
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl Flood {
    pub fn start(to: SocketAddr, n: usize, request: &'static [u8], pipeline: bool) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicU64::new(0));
        let threads = (0..n)
            .map(|_| {
                let (stop, opened) = (stop.clone(), opened.clone());
                std::thread::spawn(move || hold(to, request, pipeline, &stop, &opened))
            })
            .collect();
        Flood {
            stop,
            opened,
            threads,
        }
    }

    /// Connections opened so far.
    pub fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// Stops the flood; the connections it opened in all.
    pub fn stop(mut self) -> u64 {
        self.halt();
        self.opened()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.halt();
    }
}

fn hold(to: SocketAddr, request: &[u8], pipeline: bool, stop: &AtomicBool, opened: &AtomicU64) {
    let would_block = |e: &std::io::Error| {
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )
    };
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect_timeout(&to, Duration::from_secs(1)) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        opened.fetch_add(1, Ordering::Relaxed);
        let _ = s.set_write_timeout(Some(Duration::from_millis(50)));
        let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
        let _ = s.write_all(request);
        // held until the server closes it
        while !stop.load(Ordering::Relaxed) {
            if pipeline {
                match s.write_all(request) {
                    Ok(()) => std::thread::sleep(Duration::from_millis(10)),
                    Err(e) if would_block(&e) => {}
                    Err(_) => break,
                }
            } else {
                let mut b = [0u8; 4096];
                match std::io::Read::read(&mut s, &mut b) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if would_block(&e) => {}
                    Err(_) => break,
                }
            }
        }
    }
}
