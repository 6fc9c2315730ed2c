//! Reassembly of the handshake messages a peer may still send after the handshake. They may be
//! coalesced several to a record or fragmented across records (RFC 8446 5.1), so this keeps a
//! partial header between records; but nothing legitimate here is larger than a few bytes
//! (KeyUpdate: one byte of body), so message bodies we do not want are skipped, not buffered,
//! and bodies we do want are capped at [`MAX_BODY`]. What a message means is the
//! [`Handler`]'s business.

use crate::error::{Error, InvalidMessage};
use crate::message::{HandshakeType, HANDSHAKE_HEADER_LEN};

/// The largest message body this joiner buffers. KeyUpdate has one byte and HelloRequest
/// none; everything longer that we accept at all (a TLS 1.2 renegotiation ClientHello, a TLS
/// 1.3 NewSessionTicket on the client side) is skipped without being held.
pub const MAX_BODY: usize = 16;

/// What to do with the body of a message whose header has arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// Buffer it (it is at most [`MAX_BODY`] long) and hand it to [`Handler::message`].
    Body,
    /// Drop its bytes as they come; [`Handler::message`] gets an empty body.
    Skip,
}

/// Decides about and consumes complete handshake messages.
pub(crate) trait Handler {
    /// A message header: type and body length. Refuse with an error, or say what to keep.
    fn header(&mut self, typ: HandshakeType, len: usize) -> Result<Want, Error>;
    /// A complete message; `ends_record` is whether it ended exactly at its record's end.
    fn message(&mut self, typ: HandshakeType, body: &[u8], ends_record: bool) -> Result<(), Error>;
}

/// A handshake message in progress across records.
#[derive(Default)]
pub(crate) struct HandshakeJoiner {
    header: [u8; HANDSHAKE_HEADER_LEN],
    header_fill: usize,
    /// Set once the header is complete: the message type, what we keep, body bytes to go.
    current: Option<(HandshakeType, Want, usize)>,
    body: Vec<u8>,
}

impl HandshakeJoiner {
    /// Whether no message is in progress: a record of another type may come now (RFC 8446
    /// 5.1 forbids interleaving one inside a fragmented handshake message).
    pub(crate) fn is_idle(&self) -> bool {
        self.header_fill == 0 && self.current.is_none()
    }

    /// Gives the body buffer's allocation back if no message is in progress; returns whether
    /// none was.
    pub(crate) fn release_if_idle(&mut self) -> bool {
        if self.is_idle() {
            self.body = Vec::new();
        }
        self.is_idle()
    }

    /// Feeds one record's handshake plaintext.
    pub(crate) fn push(
        &mut self,
        mut data: &[u8],
        handler: &mut impl Handler,
    ) -> Result<(), Error> {
        while !data.is_empty() {
            let (typ, want, remaining) = match self.current {
                Some(current) => current,
                None => {
                    let n = (HANDSHAKE_HEADER_LEN - self.header_fill).min(data.len());
                    self.header[self.header_fill..self.header_fill + n].copy_from_slice(&data[..n]);
                    self.header_fill += n;
                    data = &data[n..];
                    if self.header_fill < HANDSHAKE_HEADER_LEN {
                        return Ok(());
                    }
                    let typ = HandshakeType(self.header[0]);
                    let len = usize::from(self.header[1]) << 16
                        | usize::from(self.header[2]) << 8
                        | usize::from(self.header[3]);
                    let want = handler.header(typ, len)?;
                    if want == Want::Body && len > MAX_BODY {
                        return Err(InvalidMessage::HandshakeLength(typ).into());
                    }
                    self.body.clear();
                    (typ, want, len)
                }
            };
            let n = remaining.min(data.len());
            if want == Want::Body {
                self.body.extend_from_slice(&data[..n]);
            }
            data = &data[n..];
            let remaining = remaining - n;
            if remaining > 0 {
                self.current = Some((typ, want, remaining));
                continue;
            }
            self.current = None;
            self.header_fill = 0;
            let body = std::mem::take(&mut self.body);
            let result = handler.message(typ, &body, data.is_empty());
            self.body = body;
            result?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Log(Vec<(u8, Vec<u8>, bool)>);

    impl Handler for Log {
        fn header(&mut self, typ: HandshakeType, _len: usize) -> Result<Want, Error> {
            Ok(if typ == HandshakeType::CLIENT_HELLO {
                Want::Skip
            } else {
                Want::Body
            })
        }
        fn message(&mut self, typ: HandshakeType, body: &[u8], end: bool) -> Result<(), Error> {
            self.0.push((typ.0, body.to_vec(), end));
            Ok(())
        }
    }

    #[test]
    fn coalesced_and_fragmented_messages() {
        let mut j = HandshakeJoiner::default();
        let mut log = Log::default();
        // two KeyUpdates in one record, then one split byte by byte across records
        j.push(&[24, 0, 0, 1, 0, 24, 0, 0, 1, 1], &mut log).unwrap();
        assert!(j.is_idle());
        for b in [24u8, 0, 0, 1] {
            j.push(&[b], &mut log).unwrap();
            assert!(!j.is_idle());
        }
        j.push(&[0], &mut log).unwrap();
        assert_eq!(
            log.0,
            vec![
                (24, vec![0], false),
                (24, vec![1], true),
                (24, vec![0], true)
            ]
        );
    }

    #[test]
    fn skipped_bodies_are_not_held_and_empty_bodies_complete() {
        let mut j = HandshakeJoiner::default();
        let mut log = Log::default();
        j.push(&[1, 0xff, 0xff, 0xff], &mut log).unwrap();
        for _ in 0..1023 {
            j.push(&[0u8; 16 * 1024], &mut log).unwrap();
            assert!(j.body.capacity() <= MAX_BODY);
        }
        assert!(log.0.is_empty());
        j.push(&[0, 0, 0, 0], &mut log).unwrap(); // HelloRequest with an empty body, header only
        assert_eq!(log.0.len(), 0, "still inside the skipped hello");
    }

    #[test]
    fn wanted_bodies_are_capped() {
        let mut j = HandshakeJoiner::default();
        let mut log = Log::default();
        assert!(j.push(&[24, 0, 1, 0], &mut log).is_err());
        let mut j = HandshakeJoiner::default();
        j.push(&[0, 0, 0, 0], &mut log).unwrap();
        assert_eq!(log.0, vec![(0, vec![], true)]);
    }
}
