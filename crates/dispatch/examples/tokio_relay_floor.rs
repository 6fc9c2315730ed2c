//! The tokio relay floor (`scripts/bench-dispatch`): `relay_floor.rs`'s front on the
//! dispatcher's runtime, with `relay_floor`'s own frames in place of h2. Beside the other two
//! floors it splits what the stack costs: mio and own frames, tokio and own frames, tokio and
//! h2.
//!
//! One thread (a current-thread runtime), a task per client, and per link connection a
//! reader task (it writes what comes for a client straight to the client's socket, and hands
//! over to the client's task only what the socket has no room for) and a writer task (woken
//! when a client task has framed something, it writes everything queued meanwhile in one
//! system call). No flow control, routing, TLS peeking, deadlines or metrics. The far end is
//! `relay_floor demux`. A measuring instrument, not a server: run only by the benchmark, on
//! 127.0.0.1; a peer that stalls holds its connection for ever.
//!
//! `FLOOR_MOVES=1` (two demuxes): a migration's messages per connection, as `relay_floor`'s.
//!
//! Usage: tokio_relay_floor DEMUX_ADDR [DEMUX_ADDR ...]
//! Prints `listening ADDR` and `ready`, then relays until killed.

#[path = "floor/mod.rs"]
mod floor;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr};
use std::rc::Rc;

use floor::frames::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// One client as both its task and its link's reader see it.
struct Client {
    /// The client's socket for writing (its task owns the read half).
    tcp: OwnedWriteHalf,
    /// What the socket had no room for when the link's reader wrote.
    pending: RefCell<Vec<u8>>,
    /// The agent's FIN came: shut the client's write side once `pending` is written.
    fin: Cell<bool>,
    write_shut: Cell<bool>,
    reset: Cell<bool>,
    /// `FLOOR_MOVES`: its migration's messages were started.
    moved: Cell<bool>,
    wake: Notify,
}

impl Client {
    fn shut_write(&self) {
        let _ = socket2::SockRef::from(self.tcp.as_ref()).shutdown(Shutdown::Write);
        self.write_shut.set(true);
    }
}

/// One link connection's shared half: what waits to be written, and its streams.
struct Link {
    out: RefCell<Vec<u8>>,
    wake: Notify,
    streams: RefCell<HashMap<u32, Rc<Client>>>,
}

impl Link {
    fn push(&self, stream: u32, kind: u8, payload: &[u8]) {
        let mut out = self.out.borrow_mut();
        if out.is_empty() {
            self.wake.notify_one();
        }
        frame(&mut out, stream, kind, payload);
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let demuxes = floor::addrs(&args)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    tokio::task::LocalSet::new().block_on(&runtime, front(demuxes))
}

async fn front(demuxes: Vec<SocketAddr>) -> anyhow::Result<()> {
    let moves = std::env::var_os("FLOOR_MOVES").is_some();
    anyhow::ensure!(
        !moves || demuxes.len() == 2,
        "FLOOR_MOVES wants two demuxes"
    );
    let mut links = Vec::new();
    let mut reads = Vec::new();
    for addr in demuxes {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (read, write) = tcp.into_split();
        let link = Rc::new(Link {
            out: RefCell::new(Vec::with_capacity(64 << 10)),
            wake: Notify::new(),
            streams: RefCell::new(HashMap::new()),
        });
        tokio::task::spawn_local(link_writer(link.clone(), write));
        reads.push(read);
        links.push(link);
    }
    let links = Rc::new(links);
    for (i, read) in reads.into_iter().enumerate() {
        let other = moves.then(|| links[(i + 1) % 2].clone());
        tokio::task::spawn_local(link_reader(links[i].clone(), other, read));
    }
    let listener = TcpListener::from_std(floor::listener()?)?;
    let local = listener.local_addr()?;
    floor::announce(local)?;
    let (mut turn, mut next_stream) = (0usize, 0u32);
    loop {
        let Ok((tcp, from)) = listener.accept().await else {
            continue;
        };
        let link = links[turn % links.len()].clone();
        turn += 1;
        next_stream = next_stream.wrapping_add(1);
        let (read, write) = tcp.into_split();
        let client = Rc::new(Client {
            tcp: write,
            pending: RefCell::new(Vec::new()),
            fin: Cell::new(false),
            write_shut: Cell::new(false),
            reset: Cell::new(false),
            moved: Cell::new(false),
            wake: Notify::new(),
        });
        // the client's address travels as the stream's metadata
        let meta = floor::proxy_header(from, local);
        link.streams
            .borrow_mut()
            .insert(next_stream, client.clone());
        link.push(next_stream, OPEN, &meta);
        tokio::task::spawn_local(client_task(link, client, read, next_stream));
    }
}

/// A client's bytes into frames; what the link's reader could not write, written.
async fn client_task(link: Rc<Link>, client: Rc<Client>, mut read: OwnedReadHalf, stream: u32) {
    let mut buf = Vec::with_capacity(16 << 10);
    let mut read_closed = false;
    loop {
        if client.reset.get() || (read_closed && client.write_shut.get()) {
            break;
        }
        tokio::select! {
            // (a short read clears tokio's readiness: no read only to hear "nothing yet")
            r = read.read_buf(&mut buf), if !read_closed => {
                match r {
                    Ok(0) => {
                        read_closed = true;
                        link.push(stream, FIN, &[]);
                    }
                    Ok(n) => {
                        link.push(stream, DATA, &buf[..n]);
                        buf.clear();
                    }
                    Err(_) => {
                        link.push(stream, RESET, &[]);
                        break;
                    }
                }
            }
            _ = client.wake.notified() => {
                if flush(&client).await.is_err() {
                    link.push(stream, RESET, &[]);
                    break;
                }
            }
        }
    }
    link.streams.borrow_mut().remove(&stream);
}

/// Writes what the client's socket had no room for, then the FIN if one is due.
async fn flush(client: &Client) -> std::io::Result<()> {
    loop {
        let written = {
            let pending = client.pending.borrow();
            if pending.is_empty() {
                break;
            }
            client.tcp.try_write(&pending)
        };
        match written {
            Ok(n) => drop(client.pending.borrow_mut().drain(..n)),
            Err(e) if e.kind() == ErrorKind::WouldBlock => client.tcp.writable().await?,
            Err(e) => return Err(e),
        }
    }
    if client.fin.get() && !client.write_shut.get() {
        client.shut_write();
    }
    Ok(())
}

/// Everything queued since it last woke, in one write.
async fn link_writer(link: Rc<Link>, mut tcp: OwnedWriteHalf) {
    let mut spare = Vec::with_capacity(64 << 10);
    loop {
        link.wake.notified().await;
        std::mem::swap(&mut spare, &mut *link.out.borrow_mut());
        if tcp.write_all(&spare).await.is_err() {
            std::process::exit(1);
        }
        spare.clear();
    }
}

/// The link's frames to their clients: written at once where the socket has room. With
/// `other` (`FLOOR_MOVES`), a client's first bytes start its migration's messages there.
async fn link_reader(link: Rc<Link>, other: Option<Rc<Link>>, mut tcp: OwnedReadHalf) {
    let mut inb: Vec<u8> = Vec::with_capacity(256 << 10);
    let mut next_import = 1u32 << 31;
    loop {
        match tcp.read_buf(&mut inb).await {
            Ok(0) | Err(_) => std::process::exit(1),
            Ok(_) => {}
        }
        let mut at = 0;
        while let Some((stream, kind, body)) = next_frame(&inb, at) {
            at = body.end;
            if let (READY, Some(other)) = (kind, &other) {
                link.push(stream, COMMIT, &[]);
                other.push(0, DONE, &[]);
                continue;
            }
            let Some(client) = link.streams.borrow().get(&stream).cloned() else {
                continue;
            };
            match kind {
                DATA => {
                    if let (false, Some(other)) = (client.moved.replace(true), &other) {
                        next_import = next_import.wrapping_add(1) | 1 << 31;
                        other.push(next_import, IMPORT, &SEALED);
                    }
                    let data = &inb[body];
                    let mut pending = client.pending.borrow_mut();
                    let n = if pending.is_empty() {
                        client.tcp.try_write(data).unwrap_or(0)
                    } else {
                        0
                    };
                    if n < data.len() {
                        pending.extend_from_slice(&data[n..]);
                        client.wake.notify_one();
                    }
                }
                FIN if client.pending.borrow().is_empty() => {
                    client.shut_write();
                    client.wake.notify_one();
                }
                FIN => client.fin.set(true),
                _ => {
                    client.reset.set(true);
                    client.wake.notify_one();
                }
            }
        }
        inb.drain(..at);
        if inb.capacity() - inb.len() < 16 << 10 {
            inb.reserve(64 << 10);
        }
    }
}
