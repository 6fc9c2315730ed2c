//! The handover's unix socket: [`Message`]s with the sockets they carry beside them
//! (`SCM_RIGHTS`, through rustix's safe API).
//!
//! On a stream socket the kernel delivers a message's sockets with the read that takes its
//! first byte, never later, and in order; so every socket received goes into one queue and
//! each decoded message takes its own count from the front.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use baton_migrate::restart::{Message, MAX_MESSAGE};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::Interest;
use tokio::net::UnixStream;

/// The most sockets one message carries (the listeners: clients, metrics, admin).
const MAX_FDS: usize = 32;
/// Sockets received but not yet claimed by a message: more means a confused peer.
const MAX_QUEUED_FDS: usize = 256;

pub(crate) struct Channel {
    sock: UnixStream,
    buf: Vec<u8>,
    fds: VecDeque<OwnedFd>,
}

/// How many sockets travel with a message.
pub(crate) fn fds_of(m: &Message) -> usize {
    match m {
        Message::Listeners(kinds) => kinds.len(),
        Message::Conn(_) => 1,
        Message::Ready | Message::Done => 0,
    }
}

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

impl Channel {
    pub(crate) fn new(sock: UnixStream) -> Self {
        Self {
            sock,
            buf: Vec::new(),
            fds: VecDeque::new(),
        }
    }

    /// Sends `m` with `fds` (as many as the message says) attached to its first byte.
    pub(crate) async fn send(&self, m: &Message, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        if fds.len() != fds_of(m) || fds.len() > MAX_FDS {
            return Err(io::Error::other("handover message with the wrong sockets"));
        }
        let bytes = m.to_bytes();
        let mut sent = 0;
        while sent < bytes.len() {
            self.sock.writable().await?;
            let r = self.sock.try_io(Interest::WRITABLE, || {
                let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
                let mut control = SendAncillaryBuffer::new(&mut space);
                // the sockets ride with the message's first byte only
                if sent == 0
                    && !fds.is_empty()
                    && !control.push(SendAncillaryMessage::ScmRights(fds))
                {
                    return Err(io::Error::other("too many sockets for one message"));
                }
                rustix::net::sendmsg(
                    self.sock.as_fd(),
                    &[IoSlice::new(&bytes[sent..])],
                    &mut control,
                    SendFlags::NOSIGNAL,
                )
                .map_err(io::Error::from)
            });
            match r {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The next message and its sockets; `None` at a clean end between messages.
    pub(crate) async fn recv(&mut self) -> io::Result<Option<(Message, Vec<OwnedFd>)>> {
        loop {
            let need = Message::needs(&self.buf).map_err(invalid)?;
            if need == 0 {
                let (m, used) = Message::decode(&self.buf).map_err(invalid)?;
                self.buf.drain(..used);
                let n = fds_of(&m);
                if self.fds.len() < n {
                    return Err(invalid("a handover message without its sockets"));
                }
                let fds = self.fds.drain(..n).collect();
                return Ok(Some((m, fds)));
            }
            let mut chunk = vec![0u8; need.min(MAX_MESSAGE)];
            self.sock.readable().await?;
            let r = self.sock.try_io(Interest::READABLE, || {
                let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
                let mut control = RecvAncillaryBuffer::new(&mut space);
                let got = rustix::net::recvmsg(
                    self.sock.as_fd(),
                    &mut [IoSliceMut::new(&mut chunk)],
                    &mut control,
                    RecvFlags::CMSG_CLOEXEC,
                )
                .map_err(io::Error::from)?;
                let mut fds = Vec::new();
                for msg in control.drain() {
                    if let RecvAncillaryMessage::ScmRights(received) = msg {
                        fds.extend(received);
                    }
                }
                Ok((got.bytes, fds))
            });
            let (n, fds) = match r {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            };
            self.fds.extend(fds);
            if self.fds.len() > MAX_QUEUED_FDS {
                return Err(invalid("more sockets than handover messages"));
            }
            if n == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(io::ErrorKind::UnexpectedEof.into())
                };
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_migrate::restart::ListenerKind;
    use std::io::{Read, Write};

    /// Sockets cross the channel as sockets: what is written on the sent end's peer is read
    /// from the received copy.
    #[tokio::test]
    async fn sockets_travel_with_their_messages_in_order() {
        let (a, b) = UnixStream::pair().unwrap();
        let (tx, mut rx) = (Channel::new(a), Channel::new(b));
        let mut pairs = Vec::new();
        for _ in 0..3 {
            pairs.push(std::os::unix::net::UnixStream::pair().unwrap());
        }
        let kinds = vec![ListenerKind::Public, ListenerKind::Metrics];
        let two = [pairs[0].0.as_fd(), pairs[1].0.as_fd()];
        tx.send(&Message::Listeners(kinds.clone()), &two)
            .await
            .unwrap();
        tx.send(&Message::Ready, &[]).await.unwrap();
        tx.send(&Message::Done, &[pairs[2].0.as_fd()])
            .await
            .unwrap_err();
        drop(tx);
        let (m, fds) = rx.recv().await.unwrap().unwrap();
        assert_eq!(m, Message::Listeners(kinds));
        assert_eq!(fds.len(), 2);
        for (i, fd) in fds.into_iter().enumerate() {
            let mut s = std::os::unix::net::UnixStream::from(fd);
            s.write_all(&[i as u8]).unwrap();
            let mut b = [0u8; 1];
            pairs[i].1.read_exact(&mut b).unwrap();
            assert_eq!(b[0], i as u8);
        }
        let (m, fds) = rx.recv().await.unwrap().unwrap();
        assert_eq!((m, fds.len()), (Message::Ready, 0));
        assert!(rx.recv().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_message_without_its_socket_is_an_error() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut rx = Channel::new(b);
        // a Conn written as plain bytes: no socket beside it
        let conn = Message::Conn(Box::new(baton_migrate::restart::Handed {
            source: "127.0.0.1:1".parse().unwrap(),
            destination: "127.0.0.1:2".parse().unwrap(),
            agent: 1,
            token: [0; 16],
            position: baton_migrate::Relay::serving().position().unwrap(),
            to_client: Vec::new(),
            to_agent: Vec::new(),
        }));
        a.try_write(&conn.to_bytes()).unwrap();
        assert_eq!(
            rx.recv().await.unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }
}
