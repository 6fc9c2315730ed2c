//! A man in the middle of an agent link: a TCP relay (std threads) that passes bytes between a
//! dispatcher and an agent's `--link-listen`, records what it passed, and flips a byte when
//! asked.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Bytes recorded per direction of one connection, at most (the rest still passes).
const RECORD_MAX: usize = 8 * 1024 * 1024;

/// What passed on one relayed connection.
#[derive(Debug, Clone, Default)]
pub struct Session {
    /// dispatcher -> agent
    pub to_agent: Vec<u8>,
    /// agent -> dispatcher
    pub to_dispatcher: Vec<u8>,
}

#[derive(Default)]
struct State {
    sessions: Mutex<Vec<Session>>,
    /// Flip the last byte of the next chunk towards the agent.
    armed: AtomicBool,
    flipped: AtomicUsize,
    stop: AtomicBool,
}

/// The relay; stops (its connections closed) on drop.
pub struct LinkRelay {
    pub addr: SocketAddr,
    state: Arc<State>,
}

impl LinkRelay {
    /// Relays every connection made to [`Self::addr`] to `target`.
    pub fn new(target: SocketAddr) -> LinkRelay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        let s = state.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(from) = conn else { continue };
                let Ok(to) = TcpStream::connect(target) else {
                    continue;
                };
                let n = {
                    let mut sessions = s.sessions.lock().unwrap();
                    sessions.push(Session::default());
                    sessions.len() - 1
                };
                for (src, dst, to_agent) in [
                    (from.try_clone().unwrap(), to.try_clone().unwrap(), true),
                    (to, from, false),
                ] {
                    let s = s.clone();
                    std::thread::spawn(move || pass(src, dst, &s, n, to_agent));
                }
            }
        });
        LinkRelay { addr, state }
    }

    /// The next chunk towards the agent leaves with its last byte changed (one bit).
    pub fn arm_flip(&self) {
        self.state.armed.store(true, Ordering::SeqCst);
    }

    /// Bytes flipped so far.
    pub fn flipped(&self) -> usize {
        self.state.flipped.load(Ordering::SeqCst)
    }

    /// What each connection passed so far.
    pub fn sessions(&self) -> Vec<Session> {
        self.state.sessions.lock().unwrap().clone()
    }
}

impl Drop for LinkRelay {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        // wakes the accept loop so that it sees the stop
        let _ = TcpStream::connect(self.addr);
    }
}

/// Copies `src` to `dst` until either ends or the relay stops.
fn pass(mut src: TcpStream, mut dst: TcpStream, s: &State, n: usize, to_agent: bool) {
    let _ = src.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = vec![0u8; 64 * 1024];
    while !s.stop.load(Ordering::Relaxed) {
        let got = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(got) => got,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(_) => break,
        };
        if to_agent && s.armed.swap(false, Ordering::SeqCst) {
            buf[got - 1] ^= 0x01;
            s.flipped.fetch_add(1, Ordering::SeqCst);
        }
        {
            let mut sessions = s.sessions.lock().unwrap();
            let rec = if to_agent {
                &mut sessions[n].to_agent
            } else {
                &mut sessions[n].to_dispatcher
            };
            let room = RECORD_MAX.saturating_sub(rec.len()).min(got);
            rec.extend_from_slice(&buf[..room]);
        }
        if dst.write_all(&buf[..got]).is_err() {
            break;
        }
    }
    let _ = dst.shutdown(Shutdown::Write);
    let _ = src.shutdown(Shutdown::Read);
}

/// Whether `needle` occurs in `hay`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}
