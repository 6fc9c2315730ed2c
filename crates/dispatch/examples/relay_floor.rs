//! The relay floor (`scripts/bench-dispatch`): the least a front can spend per client connection
//! when it carries clients over a few long-lived connections to its agents, as the dispatcher
//! does, so that the dispatcher's CPU per connection can be read against what the relaying
//! alone costs on this machine, not only against HAProxy and the dispatcher of old.
//!
//! Two roles, one thread each on mio's poll (tokio's I/O layer without the runtime):
//! - `front`: accepts clients and carries each as a stream over one link connection per
//!   `demux` (round robin): a 7-byte frame header (stream, kind, length), the client's address
//!   as a PROXY v2 header in the stream's opening frame, a client's EOF as a FIN frame. What
//!   every client's bytes produced in one poll leaves on a link in one write. No multiplexer
//!   library, no flow control, no routing, no TLS peeking, no metrics, no deadlines.
//! - `demux`: stands in for the agent's end of the link. It opens a TCP connection to AGENT
//!   per stream (the PROXY header first) and relays both ways. Its CPU is not the front's.
//!
//! Only the front's CPU is the floor. A measuring instrument, not a server: it trusts its
//! peers, holds what a slow reader has not taken (a connection is dropped past 4 MiB), and a
//! peer that stalls holds its connection for ever. Run only by the benchmark, on 127.0.0.1.
//!
//! `FLOOR_MOVES=1` (front, two demuxes): every connection also sends a migration's messages,
//! when the agent's first bytes arrive: a 512-byte IMPORT to the other demux, which answers
//! READY at once, then COMMIT there and DONE to the first; the bytes keep flowing on the first
//! link. The front's and the demuxes' CPU against a run without it is what those messages cost
//! at the least (the export, the import and the agents' TLS work not included).
//!
//! Usage: relay_floor front DEMUX_ADDR [DEMUX_ADDR ...] | relay_floor demux AGENT_ADDR
//! Prints `listening ADDR` and `ready`, then relays until killed.

#[path = "floor/mod.rs"]
mod floor;

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};

use floor::frames::*;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

const LISTENER: Token = Token(usize::MAX);
/// Link connections take the tokens below the listener's.
const LINKS: usize = usize::MAX - 1;
/// What one side may hold for a reader that does not take it.
const MAX_HELD: usize = 4 << 20;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match (args.get(1).map(String::as_str), args.len()) {
        (Some("front"), 3..) => front(&floor::addrs(&args[2..])?),
        (Some("demux"), 3) => demux(args[2].parse()?),
        _ => anyhow::bail!("usage: relay_floor front DEMUX_ADDR... | relay_floor demux AGENT_ADDR"),
    }
}

/// One side of a relayed byte stream: its socket and what waits to be written to it.
struct Peer {
    tcp: TcpStream,
    stream: u32,
    link: usize,
    out: Vec<u8>,
    /// The other end sent its FIN: shut our write side once `out` is written.
    fin_pending: bool,
    write_shut: bool,
    read_closed: bool,
    /// `FLOOR_MOVES`: its migration's messages were started.
    moved: bool,
}

impl Peer {
    fn new(tcp: TcpStream, stream: u32, link: usize) -> Self {
        Peer {
            tcp,
            stream,
            link,
            out: Vec::new(),
            fin_pending: false,
            write_shut: false,
            read_closed: false,
            moved: false,
        }
    }

    /// Writes what it holds, then the FIN if one is due; Err when the socket failed.
    fn flush(&mut self) -> io::Result<()> {
        while !self.out.is_empty() {
            match self.tcp.write(&self.out) {
                Ok(n) => drop(self.out.drain(..n)),
                // not yet connected (the demux's connect in progress) counts as no room
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::NotConnected
                    ) =>
                {
                    return Ok(())
                }
                Err(e) => return Err(e),
            }
        }
        if self.fin_pending && !self.write_shut {
            // once both ways are done the close says FIN by itself
            if !self.read_closed {
                self.tcp.shutdown(Shutdown::Write)?;
            }
            self.write_shut = true;
        }
        Ok(())
    }

    /// Reads what the socket has into frames for the link; Err when it failed. A short read
    /// took everything there was (epoll says when more comes), so no read is made only to
    /// hear "nothing yet", unless the peer's FIN came with the event: then on to its EOF.
    fn read_into(&mut self, link_out: &mut Vec<u8>, buf: &mut [u8], eof: bool) -> io::Result<()> {
        while !self.read_closed {
            match self.tcp.read(buf) {
                Ok(0) => {
                    self.read_closed = true;
                    frame(link_out, self.stream, FIN, &[]);
                }
                Ok(n) => {
                    frame(link_out, self.stream, DATA, &buf[..n]);
                    if n < buf.len() && !eof {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::NotConnected => break,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.read_closed && self.write_shut
    }
}

/// A link connection: frames out, frames in, and which peer each stream is.
struct Link {
    tcp: TcpStream,
    out: Vec<u8>,
    /// What was read and not yet framed out: `inb[..filled]` (zeroed once, never again).
    inb: Vec<u8>,
    filled: usize,
    streams: HashMap<u32, Token>,
}

impl Link {
    fn new(tcp: TcpStream) -> Self {
        Link {
            tcp,
            out: Vec::new(),
            inb: vec![0; 256 << 10],
            filled: 0,
            streams: HashMap::new(),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        while !self.out.is_empty() {
            match self.tcp.write(&self.out) {
                Ok(n) => drop(self.out.drain(..n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads what the link has, as far as the buffer goes (a frame is at most 64 KiB, so
    /// there is always room for the next one); Err on its EOF or failure.
    fn fill(&mut self) -> io::Result<bool> {
        while self.filled < self.inb.len() {
            match self.tcp.read(&mut self.inb[self.filled..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    self.filled += n;
                    // short: that was all (see `Peer::read_into`)
                    if self.filled < self.inb.len() {
                        return Ok(false);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        // full: more may wait in the socket, read it after these frames went out
        Ok(true)
    }

    /// The next whole frame in what was read: (stream, kind, payload range).
    fn next_frame(&self, at: usize) -> Option<(u32, u8, std::ops::Range<usize>)> {
        next_frame(&self.inb[..self.filled], at)
    }

    /// Reads and delivers until the socket has nothing more; what the migration's messages
    /// ask of the caller is added to `moves`.
    fn serve(
        &mut self,
        peers: &mut HashMap<Token, Peer>,
        moves: &mut Moves,
        mut open: impl FnMut(u32, &[u8]) -> Option<(Token, Peer)>,
    ) -> io::Result<()> {
        loop {
            let more = self.fill()?;
            deliver(self, peers, moves, &mut open);
            if !more {
                return Ok(());
            }
        }
    }
}

fn register(poll: &Poll, tcp: &mut TcpStream, token: Token) -> io::Result<()> {
    poll.registry()
        .register(tcp, token, Interest::READABLE | Interest::WRITABLE)
}

/// The poll, again after a signal (a tracer attaching is one).
fn wait(poll: &mut Poll, events: &mut Events) -> io::Result<()> {
    match poll.poll(events, None) {
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
        other => other,
    }
}

fn listen(poll: &Poll) -> anyhow::Result<TcpListener> {
    let mut listener = TcpListener::from_std(floor::listener()?);
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    floor::announce(listener.local_addr()?)?;
    Ok(listener)
}

/// Frames the link's input for the peers: their data queued and written, their FINs, resets.
/// Peers done in both directions are dropped (their close takes them out of the poll).
fn deliver(
    link: &mut Link,
    peers: &mut HashMap<Token, Peer>,
    moves: &mut Moves,
    open: &mut impl FnMut(u32, &[u8]) -> Option<(Token, Peer)>,
) {
    let mut at = 0;
    while let Some((stream, kind, body)) = link.next_frame(at) {
        at = body.end;
        match kind {
            OPEN => {
                if let Some((token, peer)) = open(stream, &link.inb[body]) {
                    link.streams.insert(stream, token);
                    peers.insert(token, peer);
                }
                continue;
            }
            // the home agent's side: ready at once (its import is not the relay's work)
            IMPORT => {
                frame(&mut link.out, stream, READY, &[]);
                continue;
            }
            // the front's side: commit to the home, release at the other
            READY => {
                frame(&mut link.out, stream, COMMIT, &[]);
                moves.releases += 1;
                continue;
            }
            COMMIT | DONE => continue,
            _ => {}
        }
        let Some(&token) = link.streams.get(&stream) else {
            continue;
        };
        let peer = peers
            .get_mut(&token)
            .expect("a stream's peer lives as long as the stream");
        if moves.enabled && !peer.moved && kind == DATA {
            // the agent's first flight: time for the session to move (its bytes still flow
            // here; what is measured is the messages' cost)
            peer.moved = true;
            moves.imports += 1;
        }
        match kind {
            DATA => peer.out.extend_from_slice(&link.inb[body]),
            FIN => peer.fin_pending = true,
            _ => peer.read_closed = true, // RESET: dropped below, unwritten
        }
        let failed = kind == RESET || peer.flush().is_err() || peer.out.len() > MAX_HELD;
        if failed && kind != RESET {
            frame(&mut link.out, stream, RESET, &[]);
        }
        if failed || peer.done() {
            link.streams.remove(&stream);
            peers.remove(&token);
        }
    }
    link.inb.copy_within(at..link.filled, 0);
    link.filled -= at;
}

/// `FLOOR_MOVES`: what a link's frames asked of the front, for the other link.
#[derive(Default)]
struct Moves {
    enabled: bool,
    /// imports to start at the other link
    imports: usize,
    /// releases to send to the other link
    releases: usize,
}

/// A peer's own readiness: what it reads goes to its link, what it holds is written.
/// Only what the event says is ready is tried: a read that would only say "nothing yet" is a
/// system call the floor must not make.
fn serve_peer(
    peers: &mut HashMap<Token, Peer>,
    links: &mut [Link],
    event: &mio::event::Event,
    buf: &mut [u8],
) {
    let token = event.token();
    let Some(peer) = peers.get_mut(&token) else {
        return;
    };
    let link = &mut links[peer.link];
    let eof = event.is_read_closed();
    let read = event.is_readable() || eof;
    let write = event.is_writable() && (!peer.out.is_empty() || peer.fin_pending);
    let failed = (read && peer.read_into(&mut link.out, buf, eof).is_err())
        || (write && peer.flush().is_err())
        || link.out.len() > MAX_HELD;
    if failed {
        frame(&mut link.out, peer.stream, RESET, &[]);
    }
    if failed || peer.done() {
        link.streams.remove(&peer.stream);
        peers.remove(&token);
    }
}

fn front(demuxes: &[SocketAddr]) -> anyhow::Result<()> {
    let mut poll = Poll::new()?;
    let mut links = Vec::new();
    for (i, addr) in demuxes.iter().enumerate() {
        let tcp = std::net::TcpStream::connect(addr)?;
        tcp.set_nodelay(true)?;
        tcp.set_nonblocking(true)?;
        let mut tcp = TcpStream::from_std(tcp);
        register(&poll, &mut tcp, Token(LINKS - i))?;
        links.push(Link::new(tcp));
    }
    let listener = listen(&poll)?;
    let local = listener.local_addr()?;
    let mut events = Events::with_capacity(1024);
    let mut clients: HashMap<Token, Peer> = HashMap::new();
    let (mut next_token, mut next_stream, mut turn) = (0usize, 0u32, 0usize);
    let mut buf = vec![0u8; 16 << 10];
    let mut moves = Moves {
        enabled: std::env::var_os("FLOOR_MOVES").is_some(),
        ..Moves::default()
    };
    anyhow::ensure!(
        !moves.enabled || links.len() == 2,
        "FLOOR_MOVES wants two demuxes"
    );
    let mut next_import = 1u32 << 31;
    loop {
        wait(&mut poll, &mut events)?;
        for event in events.iter() {
            let token = event.token();
            if token == LISTENER {
                loop {
                    let (mut tcp, from) = match listener.accept() {
                        Ok(accepted) => accepted,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e.into()),
                    };
                    let token = Token(next_token);
                    next_token = (next_token + 1) % (LINKS - links.len());
                    next_stream = next_stream.wrapping_add(1);
                    let link = turn % links.len();
                    turn += 1;
                    register(&poll, &mut tcp, token)?;
                    // the client's address travels as the stream's metadata
                    let meta = floor::proxy_header(from, local);
                    frame(&mut links[link].out, next_stream, OPEN, &meta);
                    links[link].streams.insert(next_stream, token);
                    clients.insert(token, Peer::new(tcp, next_stream, link));
                }
            } else if token.0 > LINKS - links.len() {
                let at = LINKS - token.0;
                if event.is_readable() {
                    links[at].serve(&mut clients, &mut moves, |_, _| None)?;
                    let other = &mut links[(at + 1) % 2];
                    for _ in 0..std::mem::take(&mut moves.imports) {
                        next_import = next_import.wrapping_add(1) | 1 << 31;
                        frame(&mut other.out, next_import, IMPORT, &SEALED);
                    }
                    for _ in 0..std::mem::take(&mut moves.releases) {
                        frame(&mut other.out, 0, DONE, &[]);
                    }
                }
            } else {
                serve_peer(&mut clients, &mut links, event, &mut buf);
            }
        }
        // what this poll produced leaves each link in one write
        for link in &mut links {
            link.flush()?;
        }
    }
}

fn demux(agent: SocketAddr) -> anyhow::Result<()> {
    let mut poll = Poll::new()?;
    let listener = listen(&poll)?;
    // the front's one link connection
    let tcp = loop {
        wait(&mut poll, &mut Events::with_capacity(1))?;
        match listener.accept() {
            Ok((tcp, _)) => break tcp,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e.into()),
        }
    };
    tcp.set_nodelay(true)?;
    let mut links = vec![Link::new(tcp)];
    register(&poll, &mut links[0].tcp, Token(LINKS))?;
    let mut events = Events::with_capacity(1024);
    let mut upstreams: HashMap<Token, Peer> = HashMap::new();
    let mut next_token = 0usize;
    let mut buf = vec![0u8; 16 << 10];
    loop {
        wait(&mut poll, &mut events)?;
        for event in events.iter() {
            let token = event.token();
            if token == LISTENER {
                continue;
            }
            if token == Token(LINKS) {
                if event.is_readable() {
                    let registry = poll.registry();
                    links[0].serve(&mut upstreams, &mut Moves::default(), |stream, meta| {
                        let mut tcp = TcpStream::connect(agent).ok()?;
                        tcp.set_nodelay(true).ok()?;
                        let token = Token(next_token);
                        next_token = (next_token + 1) % LINKS;
                        registry
                            .register(&mut tcp, token, Interest::READABLE | Interest::WRITABLE)
                            .ok()?;
                        let mut peer = Peer::new(tcp, stream, 0);
                        peer.out.extend_from_slice(meta);
                        Some((token, peer))
                    })?;
                }
            } else {
                serve_peer(&mut upstreams, &mut links, event, &mut buf);
            }
        }
        links[0].flush()?;
    }
}
