//! A migrated TLS connection as a tokio stream: `baton-record`'s sans-IO record layer pumped
//! over the socket, so the HTTP code serves it exactly like a rustls stream.
//!
//! Reads decrypt records (answering a client's KeyUpdate on the way out); writes seal records
//! and push them to the socket; shutdown sends close_notify. Plaintext the handshake agent had
//! already decrypted comes first. Buffers are the record layer's own, bounded.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use baton_migrate::{MigrationError, Splitter};
use baton_record::RecordLayer;

use super::agent_io::AgentIo;
use super::conn_io::ConnIo;
use crate::metering::{CryptoOp, METER};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use zeroize::Zeroizing;

/// Ciphertext read from the socket per read call: one maximum-size record and a bit. (Not
/// zeroed first: the read fills what it reports.)
const READ_CHUNK: usize = 17 * 1024;

/// What a wait for a request reads at once ([`MigratedStream::read_available`]): a request
/// head, or its first part (the rest is read with the request).
const WAIT_CHUNK: usize = 4 * 1024;

pub struct MigratedStream<IO> {
    io: IO,
    layer: RecordLayer,
    /// Client plaintext decrypted before the move, served before anything from the layer.
    ahead: Zeroizing<Vec<u8>>,
    ahead_pos: usize,
    /// Ciphertext read but not yet taken by the layer (it takes at most a record ahead).
    inbox: Vec<u8>,
    eof: bool,
    close_sent: bool,
    /// A fatal record-layer error: reads fail after the alert is sent.
    failed: Option<String>,
    /// The IANA version and cipher suite the session was negotiated with (the layer knows only
    /// the AEAD), for moving it on again.
    negotiated: (u16, u16),
}

impl<IO> MigratedStream<IO> {
    pub fn new(io: IO, layer: RecordLayer, ahead: Zeroizing<Vec<u8>>) -> Self {
        Self {
            io,
            layer,
            ahead,
            ahead_pos: 0,
            inbox: Vec::new(),
            eof: false,
            close_sent: false,
            failed: None,
            negotiated: (0, 0),
        }
    }

    /// Names the version and suite (IANA codes) the session was negotiated with.
    pub fn negotiated(mut self, version: u16, suite: u16) -> Self {
        self.negotiated = (version, suite);
        self
    }

    pub fn negotiated_suite(&self) -> (u16, u16) {
        self.negotiated
    }

    /// Ciphertext that arrived with the last protocol frame, to be decrypted first.
    pub fn prefill_ciphertext(&mut self, bytes: &[u8]) {
        self.inbox.extend_from_slice(bytes);
    }

    /// Client plaintext to serve before anything else (what came while a move was tried).
    pub fn prefill_plaintext(&mut self, plain: Vec<u8>) {
        let mut ahead = Zeroizing::new(self.ahead[self.ahead_pos..].to_vec());
        ahead.extend_from_slice(&plain);
        self.ahead = ahead;
        self.ahead_pos = 0;
    }

    /// Decrypts what ciphertext is buffered (the client bytes held during a move come in at
    /// once, before the socket has anything to read): an error shows in [`Self::ended`].
    pub fn decrypt_buffered(&mut self) {
        if !self.inbox.is_empty() || self.layer.buffered_tls() > 0 {
            let _ = self.process();
        }
    }

    /// Whether client plaintext is waiting to be read (a request has come).
    pub fn has_plaintext(&self) -> bool {
        self.ahead_pos < self.ahead.len() || !self.layer.plaintext().is_empty()
    }

    /// Whether ciphertext is waiting for the rest of its record (after [`Self::decrypt_buffered`]:
    /// whole records are decrypted by then).
    pub fn mid_record(&self) -> bool {
        !self.inbox.is_empty() || self.layer.buffered_tls() > 0
    }

    /// Whether the client closed or the layer failed: reading meets that at once.
    pub fn ended(&self) -> bool {
        self.eof || self.layer.peer_closed() || self.failed.is_some()
    }

    /// Gives back the allocations of empty buffers (the layer's, and ciphertext read ahead),
    /// for a connection that parks between requests; returns whether all were empty: nothing
    /// undecrypted or unread, nothing to send.
    pub fn release_buffers(&mut self) -> bool {
        if self.inbox.is_empty() {
            self.inbox = Vec::new();
        }
        let layer = self.layer.release_buffers();
        layer && self.inbox.is_empty() && self.ahead_pos >= self.ahead.len()
    }

    pub fn io_mut(&mut self) -> &mut IO {
        &mut self.io
    }

    /// Where the client's records stand in what was read from the socket: the ciphertext not
    /// yet decrypted starts at a record boundary, and may end inside one. For a move, which
    /// must cut the client's stream at a boundary.
    pub fn records(&self) -> Result<Splitter, MigrationError> {
        let mut s = Splitter::new();
        s.track(self.layer.undecrypted())?;
        s.track(&self.inbox)?;
        Ok(s)
    }

    /// Gives the layer client records and appends all the plaintext it then holds (and any
    /// carried from before) to `plain`; returns how much it appended.
    pub fn decrypt(&mut self, tls: &[u8], plain: &mut Vec<u8>) -> Result<usize, String> {
        let before = plain.len();
        plain.extend_from_slice(&self.ahead[self.ahead_pos..]);
        self.ahead = Zeroizing::new(Vec::new());
        self.ahead_pos = 0;
        self.inbox.extend_from_slice(tls);
        loop {
            self.process().map_err(|e| e.to_string())?;
            let n = self.layer.plaintext().len();
            if n > 0 {
                plain.extend_from_slice(self.layer.plaintext());
                self.layer.consume_plaintext(n);
                continue;
            }
            if self.inbox.is_empty() {
                return Ok(plain.len() - before);
            }
        }
    }

    /// The session's keys, if the connection is at rest (nothing undecrypted or unread, nothing
    /// to send): from then on they are for the next agent only.
    pub fn keys_at_rest(&self) -> Option<baton_record::SessionKeys> {
        if !self.inbox.is_empty() || self.has_plaintext() {
            return None;
        }
        self.layer.export()
    }

    pub fn into_io(self) -> IO {
        self.io
    }

    /// Ciphertext just read: into the layer at once while nothing waits before it (the
    /// rest, if the layer's input is full, waits in the inbox); then decrypts what is
    /// complete.
    fn take_in(&mut self, data: &[u8]) {
        let taken = match self.inbox.is_empty() {
            true => self.layer.read_tls(data),
            false => 0,
        };
        self.inbox.extend_from_slice(&data[taken..]);
        let _ = self.process();
    }

    /// Moves buffered ciphertext into the layer and decrypts what is complete.
    fn process(&mut self) -> io::Result<()> {
        loop {
            let n = self.layer.read_tls(&self.inbox);
            self.inbox.drain(..n);
            // Metered like rustls' records (`baton_crypto_seconds_total`): the home agent's
            // bulk phase is crypto too.
            let layer = &mut self.layer;
            if let Err(e) = METER.time(CryptoOp::BulkDecrypt, || layer.process()) {
                self.failed = Some(e.to_string());
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
            if n == 0 || self.inbox.is_empty() || !self.layer.plaintext().is_empty() {
                return Ok(());
            }
        }
    }
}

impl MigratedStream<ConnIo<AgentIo>> {
    /// Reads what the socket holds without waiting and decrypts what is complete; `Ok(0)` at
    /// the client's EOF, `WouldBlock` if nothing came.
    pub fn read_available(&mut self) -> io::Result<usize> {
        let mut chunk = [0u8; WAIT_CHUNK];
        let n = self.io.try_read(&mut chunk)?;
        if n == 0 {
            self.eof = true;
            return Ok(0);
        }
        self.take_in(&chunk[..n]);
        Ok(n)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> MigratedStream<IO> {
    /// Writes pending ciphertext until none is left or the socket would block.
    fn poll_flush_tls(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.layer.wants_write() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, self.layer.pending_tls()))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.layer.consume_tls(n);
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for MigratedStream<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.ahead_pos < this.ahead.len() {
            let n = (this.ahead.len() - this.ahead_pos).min(buf.remaining());
            buf.put_slice(&this.ahead[this.ahead_pos..this.ahead_pos + n]);
            this.ahead_pos += n;
            if this.ahead_pos == this.ahead.len() {
                this.ahead = Zeroizing::new(Vec::new());
                this.ahead_pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        loop {
            if let Some(e) = this.failed.clone() {
                // the alert the layer queued goes out best-effort
                let _ = this.poll_flush_tls(cx);
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
            }
            let plain = this.layer.plaintext();
            if !plain.is_empty() {
                let n = plain.len().min(buf.remaining());
                buf.put_slice(&plain[..n]);
                this.layer.consume_plaintext(n);
                return Poll::Ready(Ok(()));
            }
            // A KeyUpdate answer or an alert may be waiting: send it without blocking the read.
            if let Poll::Ready(Err(e)) = this.poll_flush_tls(cx) {
                return Poll::Ready(Err(e));
            }
            if this.layer.peer_closed() || this.eof {
                return Poll::Ready(Ok(()));
            }
            if !this.inbox.is_empty() {
                let before = this.inbox.len();
                let _ = this.process();
                if this.failed.is_some() || !this.layer.plaintext().is_empty() {
                    continue;
                }
                if this.layer.peer_closed() || this.inbox.len() < before {
                    continue;
                }
            }
            let mut chunk = [MaybeUninit::<u8>::uninit(); READ_CHUNK];
            let mut rb = ReadBuf::uninit(&mut chunk);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut rb))?;
            if rb.filled().is_empty() {
                this.eof = true;
                continue;
            }
            this.take_in(rb.filled());
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for MigratedStream<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        loop {
            let layer = &mut this.layer;
            let n = METER
                .time(CryptoOp::BulkEncrypt, || layer.write_plaintext(data))
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            // Push what we can now; a full socket is fine once the data is taken.
            match this.poll_flush_tls(cx) {
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) | Poll::Pending if n > 0 => return Poll::Ready(Ok(n)),
                Poll::Ready(Ok(())) => {
                    if data.is_empty() {
                        return Poll::Ready(Ok(0));
                    }
                    continue;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_flush_tls(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.close_sent && this.failed.is_none() {
            this.close_sent = true;
            this.layer.send_close_notify();
        }
        ready!(this.poll_flush_tls(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}
