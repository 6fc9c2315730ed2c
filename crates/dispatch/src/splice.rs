//! Splicing a client to its agent once routing (and any handoff) is over: bytes both ways until
//! both ends are done.
//!
//! tokio's `copy_bidirectional`, with one saving: once the client has ended its side and the
//! agent ends too, the client socket is simply closed (a FIN all the same: everything it sent
//! was read) instead of a `shutdown` first, which by then usually fails anyway (ENOTCONN) and
//! costs a system call per connection.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Copies both ways; returns the bytes client -> agent and agent -> client.
pub(crate) async fn splice<S>(client: &mut TcpStream, agent: &mut S) -> io::Result<(u64, u64)>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut client = Client {
        tcp: client,
        read_eof: false,
    };
    tokio::io::copy_bidirectional(&mut client, agent).await
}

struct Client<'a> {
    tcp: &'a mut TcpStream,
    read_eof: bool,
}

impl AsyncRead for Client<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut *this.tcp).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() == before {
            this.read_eof = true;
        }
        r
    }
}

impl AsyncWrite for Client<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read_eof {
            // Both directions are over: the caller closes the socket next.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut *this.tcp).poll_shutdown(cx)
    }
}
