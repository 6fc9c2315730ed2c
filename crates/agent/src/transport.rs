//! Where an agent's client connection comes from: a TCP socket on the public port (direct
//! clients, or an L4 balancer in front), or a stream of the agent link from the dispatcher
//! (`baton-link`). Everything above this — TLS, HTTP, migration — sees one byte stream.
//!
//! A link stream cannot be peeked like a socket, so bytes read to look at the first flight
//! (legacy client check, client random) are kept in front and read again.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use baton_link::LinkStream;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

pub enum AgentIo {
    Tcp(TcpStream),
    Link {
        stream: Box<LinkStream>,
        /// Bytes read ahead by [`AgentIo::peek`], served first.
        ahead: Vec<u8>,
    },
}

impl AgentIo {
    pub fn link(stream: LinkStream) -> Self {
        AgentIo::Link {
            stream: Box::new(stream),
            ahead: Vec::new(),
        }
    }

    /// Up to `buf.len()` of the first unread bytes, without consuming them; on a link stream
    /// it waits until that many arrived or the stream ended. 0 at EOF.
    pub async fn peek(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            AgentIo::Tcp(t) => t.peek(buf).await,
            AgentIo::Link { stream, ahead } => {
                while ahead.len() < buf.len() {
                    let mut chunk = [0u8; 512];
                    let want = (buf.len() - ahead.len()).min(chunk.len());
                    let n = stream.read(&mut chunk[..want]).await?;
                    if n == 0 {
                        break;
                    }
                    ahead.extend_from_slice(&chunk[..n]);
                }
                let n = ahead.len().min(buf.len());
                buf[..n].copy_from_slice(&ahead[..n]);
                Ok(n)
            }
        }
    }

    /// Writes without waiting for more than a free send buffer (best effort: an alert).
    pub async fn write_best_effort(&mut self, data: &[u8]) {
        match self {
            AgentIo::Tcp(t) => {
                if t.writable().await.is_ok() {
                    let _ = t.try_write(data);
                }
            }
            AgentIo::Link { stream, .. } => {
                let _ = tokio::io::AsyncWriteExt::write_all(stream.as_mut(), data).await;
            }
        }
    }

    /// Waits until bytes can be read (or EOF / an error is due), reading none.
    pub async fn readable(&mut self) -> io::Result<()> {
        match self {
            AgentIo::Tcp(t) => t.readable().await,
            AgentIo::Link { ahead, .. } if !ahead.is_empty() => Ok(()),
            AgentIo::Link { stream, .. } => stream.readable().await,
        }
    }

    /// Reads what is there without waiting (`WouldBlock` if nothing).
    pub fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            AgentIo::Tcp(t) => t.try_read(buf),
            AgentIo::Link { ahead, .. } if !ahead.is_empty() => Ok(take_ahead(ahead, buf)),
            AgentIo::Link { stream, .. } => stream.try_read(buf),
        }
    }
}

fn take_ahead(ahead: &mut Vec<u8>, buf: &mut [u8]) -> usize {
    let n = ahead.len().min(buf.len());
    buf[..n].copy_from_slice(&ahead[..n]);
    ahead.drain(..n);
    if ahead.is_empty() {
        *ahead = Vec::new(); // give the capacity back: connections idle for long
    }
    n
}

impl AsyncRead for AgentIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AgentIo::Tcp(t) => Pin::new(t).poll_read(cx, buf),
            AgentIo::Link { ahead, .. } if !ahead.is_empty() => {
                let n = take_ahead(ahead, buf.initialize_unfilled());
                buf.advance(n);
                Poll::Ready(Ok(()))
            }
            AgentIo::Link { stream, .. } => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for AgentIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            AgentIo::Tcp(t) => Pin::new(t).poll_write(cx, buf),
            AgentIo::Link { stream, .. } => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            AgentIo::Tcp(t) => Pin::new(t).poll_write_vectored(cx, bufs),
            AgentIo::Link { stream, .. } => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            AgentIo::Tcp(t) => t.is_write_vectored(),
            AgentIo::Link { stream, .. } => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AgentIo::Tcp(t) => Pin::new(t).poll_flush(cx),
            AgentIo::Link { stream, .. } => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AgentIo::Tcp(t) => Pin::new(t).poll_shutdown(cx),
            AgentIo::Link { stream, .. } => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}
