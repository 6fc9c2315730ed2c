//! TLS record framing (RFC 8446 5.1) and the reassembly of the first handshake message from the
//! records that carry it. A ClientHello usually fits one record, but nothing obliges a client to
//! send it so: post-quantum key shares make hellos large, and a client or middlebox may fragment
//! at any size. The dispatcher must see the whole message to route, without holding an unbounded
//! amount of an unauthenticated peer's bytes.

use crate::codec::{Codec, Reader};
use crate::enums::{ContentType, HandshakeType, ProtocolVersion};
use crate::error::{Error, Malformed, NotTls};

/// Bytes in a record header: type, legacy version, length.
pub const HEADER_LEN: usize = 5;

/// The largest plaintext fragment (2^14, RFC 8446 5.1). Handshake records before encryption
/// starts are plaintext, so a longer one is refused.
pub const MAX_PLAINTEXT_LEN: usize = 1 << 14;

/// The largest record on the wire (2^14 + 2048, RFC 5246 6.2.3): room for TLS 1.2's MAC and
/// padding. Anything longer is not TLS, or a peer we should not wait for.
pub const MAX_CIPHERTEXT_LEN: usize = MAX_PLAINTEXT_LEN + 2048;

/// How much of a first handshake message the assembler holds by default. The largest real
/// ClientHellos (hybrid post-quantum key shares, many PSK identities) are a few KiB; 64 KiB
/// leaves room without letting one connection pin much memory.
pub const DEFAULT_MESSAGE_LIMIT: usize = 64 * 1024;

/// Bytes in a handshake message header: type and 24-bit length.
pub const HANDSHAKE_HEADER_LEN: usize = 4;

/// A record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// The content type.
    pub typ: ContentType,
    /// The legacy record version (0x0301 or 0x0303 in practice; ignored by TLS 1.3).
    pub version: ProtocolVersion,
    /// The length of the fragment that follows.
    pub len: usize,
}

impl RecordHeader {
    /// Reads the header at the start of `bytes`: `Ok(None)` if there are fewer than
    /// [`HEADER_LEN`] bytes and they could still begin a record, an error as soon as they
    /// cannot (an unknown type, a version not 3.x, a length over [`MAX_CIPHERTEXT_LEN`]).
    pub fn parse(bytes: &[u8]) -> Result<Option<Self>, Error> {
        check_prefix(bytes)?;
        let Some(header) = bytes.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let mut r = Reader::new(header);
        let typ = ContentType::read(&mut r)?;
        let version = ProtocolVersion::read(&mut r)?;
        let len = usize::from(u16::read(&mut r)?);
        if len > MAX_CIPHERTEXT_LEN {
            return Err(Error::TooLarge {
                what: "record",
                len,
                max: MAX_CIPHERTEXT_LEN,
            });
        }
        Ok(Some(Self { typ, version, len }))
    }

    /// Appends the header. `len` over `u16::MAX` is the caller's bug.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.typ.encode(out);
        self.version.encode(out);
        debug_assert!(self.len <= usize::from(u16::MAX));
        (self.len as u16).encode(out);
    }
}

/// Refuses a header prefix that can no longer become a TLS record.
fn check_prefix(bytes: &[u8]) -> Result<(), Error> {
    if let Some(&t) = bytes.first() {
        let typ = ContentType(t);
        if typ.name().is_none() {
            return Err(NotTls::ContentType(typ).into());
        }
    }
    if let (Some(&major), Some(&minor)) = (bytes.get(1), bytes.get(2)) {
        if major != 3 {
            return Err(
                NotTls::RecordVersion(ProtocolVersion(u16::from_be_bytes([major, minor]))).into(),
            );
        }
    }
    Ok(())
}

/// Appends `payload` as records of type `typ` with at most `max_fragment` bytes each
/// (clamped to 1..=[`MAX_PLAINTEXT_LEN`]). An empty payload writes no record.
pub fn encode_records(
    out: &mut Vec<u8>,
    typ: ContentType,
    version: ProtocolVersion,
    payload: &[u8],
    max_fragment: usize,
) {
    for chunk in payload.chunks(max_fragment.clamp(1, MAX_PLAINTEXT_LEN)) {
        RecordHeader {
            typ,
            version,
            len: chunk.len(),
        }
        .encode(out);
        out.extend_from_slice(chunk);
    }
}

/// Sans-IO reassembly of the first handshake message of a stream from its plaintext handshake
/// records. Feed it bytes as they arrive with [`push`](Self::push); it holds at most `limit`
/// bytes of the message (plus a partial record header in a fixed array) and fails as soon as the
/// input cannot be the expected message or would exceed the limit.
///
/// Once it has returned a message or an error it is finished: later pushes consume nothing and
/// repeat the outcome.
#[derive(Debug, Clone)]
pub struct HandshakeAssembler {
    expected: HandshakeType,
    limit: usize,
    trailing_ok: bool,
    header: [u8; HEADER_LEN],
    header_len: usize,
    record_left: usize,
    msg: Vec<u8>,
    msg_len: Option<usize>,
    consumed: usize,
    outcome: Option<Result<(), Error>>,
}

impl HandshakeAssembler {
    /// An assembler waiting for a message of type `expected`, holding at most `limit` bytes of
    /// it. With `trailing_ok` other handshake messages may follow it in its last record (a
    /// server's ServerHello, Certificate, ...); without, the message must end its record (a
    /// client's first flight is the ClientHello alone).
    pub fn new(expected: HandshakeType, limit: usize, trailing_ok: bool) -> Self {
        Self {
            expected,
            limit,
            trailing_ok,
            header: [0; HEADER_LEN],
            header_len: 0,
            record_left: 0,
            msg: Vec::new(),
            msg_len: None,
            consumed: 0,
            outcome: None,
        }
    }

    /// Takes the next bytes of the stream. Returns `Ok(None)` when all of `input` was consumed
    /// and more is needed, `Ok(Some(n))` when the message is complete after the first `n` bytes
    /// of `input` (the rest is not looked at), or the reason the stream is not what we wait for.
    pub fn push(&mut self, input: &[u8]) -> Result<Option<usize>, Error> {
        if let Some(outcome) = &self.outcome {
            return outcome.clone().map(|()| Some(0));
        }
        let result = self.step(input);
        match &result {
            Ok(Some(_)) => self.outcome = Some(Ok(())),
            Err(e) => self.outcome = Some(Err(e.clone())),
            Ok(None) => {}
        }
        result
    }

    fn step(&mut self, input: &[u8]) -> Result<Option<usize>, Error> {
        let mut used = 0;
        loop {
            let rest = input.get(used..).unwrap_or_default();
            if rest.is_empty() {
                self.consumed += used;
                return Ok(None);
            }
            if self.record_left == 0 {
                let n = rest.len().min(HEADER_LEN - self.header_len);
                if let (Some(dst), Some(src)) = (
                    self.header.get_mut(self.header_len..self.header_len + n),
                    rest.get(..n),
                ) {
                    dst.copy_from_slice(src);
                }
                self.header_len += n;
                used += n;
                // Say "not a handshake" from the first byte, without waiting for a full header.
                if let Some(&t) = self
                    .header
                    .first()
                    .filter(|&&t| t != ContentType::HANDSHAKE.0)
                {
                    RecordHeader::parse(&[t])?;
                    return Err(NotTls::NotHandshake(ContentType(t)).into());
                }
                let Some(header) =
                    RecordHeader::parse(self.header.get(..self.header_len).unwrap_or_default())?
                else {
                    continue;
                };
                if header.typ != ContentType::HANDSHAKE {
                    return Err(NotTls::NotHandshake(header.typ).into());
                }
                if header.len > MAX_PLAINTEXT_LEN {
                    return Err(Error::TooLarge {
                        what: "handshake record",
                        len: header.len,
                        max: MAX_PLAINTEXT_LEN,
                    });
                }
                if header.len == 0 {
                    return Err(Malformed::EmptyRecord.into());
                }
                self.header_len = 0;
                self.record_left = header.len;
                continue;
            }
            let wanted = match self.msg_len {
                Some(total) => total - self.msg.len(),
                None => HANDSHAKE_HEADER_LEN - self.msg.len(),
            };
            let n = rest.len().min(self.record_left).min(wanted);
            if self.msg.len() + n > self.limit {
                return Err(Error::TooLarge {
                    what: "handshake message",
                    len: self.msg.len() + n,
                    max: self.limit,
                });
            }
            self.msg
                .extend_from_slice(rest.get(..n).unwrap_or_default());
            used += n;
            self.record_left -= n;
            if self.msg_len.is_none() {
                self.read_message_header()?;
            }
            if self.msg_len == Some(self.msg.len()) {
                if self.record_left > 0 && !self.trailing_ok {
                    return Err(Malformed::DataAfterHello.into());
                }
                self.consumed += used;
                return Ok(Some(used));
            }
        }
    }

    /// Checks the message type as soon as its byte is in, and the length once all four are.
    fn read_message_header(&mut self) -> Result<(), Error> {
        if let Some(&t) = self.msg.first() {
            if HandshakeType(t) != self.expected {
                return Err(NotTls::UnexpectedMessage {
                    got: HandshakeType(t),
                    expected: self.expected,
                }
                .into());
            }
        }
        if let Some(&[_, a, b, c]) = self.msg.get(..HANDSHAKE_HEADER_LEN) {
            let total = HANDSHAKE_HEADER_LEN
                + (usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c));
            if total > self.limit {
                return Err(Error::TooLarge {
                    what: "handshake message",
                    len: total,
                    max: self.limit,
                });
            }
            self.msg.reserve_exact(total - self.msg.len());
            self.msg_len = Some(total);
        }
        Ok(())
    }

    /// The complete message (header included) once `push` returned it; before, what is held.
    pub fn message(&self) -> &[u8] {
        &self.msg
    }

    /// Bytes of the message held so far; never more than the limit.
    pub fn buffered(&self) -> usize {
        self.msg.len()
    }

    /// The limit this assembler was made with.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Stream bytes consumed over all pushes that needed more or completed the message (a push
    /// that failed is not counted: after an error the stream is not parsed any further).
    pub fn consumed(&self) -> usize {
        self.consumed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handshake(typ: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![typ, 0, 0, body.len() as u8];
        m.extend_from_slice(body);
        m
    }

    fn records(payload: &[u8], frag: usize) -> Vec<u8> {
        let mut out = Vec::new();
        encode_records(
            &mut out,
            ContentType::HANDSHAKE,
            ProtocolVersion::TLSV1_0,
            payload,
            frag,
        );
        out
    }

    #[test]
    fn header_parse_waits_then_decides() {
        assert_eq!(RecordHeader::parse(&[22, 3]), Ok(None));
        assert_eq!(
            RecordHeader::parse(&[22, 3, 1, 0, 5]),
            Ok(Some(RecordHeader {
                typ: ContentType::HANDSHAKE,
                version: ProtocolVersion::TLSV1_0,
                len: 5
            }))
        );
        assert_eq!(
            RecordHeader::parse(b"GET / HTTP/1.1"),
            Err(NotTls::ContentType(ContentType(b'G')).into())
        );
        // an SSLv2-compatible hello: 0x80 0x2e 0x01 ...
        assert!(matches!(
            RecordHeader::parse(&[0x80, 0x2e, 1]),
            Err(Error::NotTls(_))
        ));
        assert_eq!(
            RecordHeader::parse(&[22, 2, 0]),
            Err(NotTls::RecordVersion(ProtocolVersion(0x0200)).into())
        );
        assert!(matches!(
            RecordHeader::parse(&[23, 3, 3, 0xff, 0xff]),
            Err(Error::TooLarge { .. })
        ));
    }

    #[test]
    fn reassembles_across_records_and_reports_consumption() {
        let msg = handshake(1, &[9; 40]);
        let mut wire = records(&msg, 7);
        wire.extend_from_slice(&[23, 3, 3, 0, 1, 0]); // the next record is not ours to read
        let mut a = HandshakeAssembler::new(HandshakeType::CLIENT_HELLO, 100, false);
        assert_eq!(a.push(&wire[..10]), Ok(None));
        let n = a.push(&wire[10..]).unwrap().unwrap();
        assert_eq!(10 + n, wire.len() - 6);
        assert_eq!(a.message(), &msg[..]);
        assert_eq!(a.consumed(), wire.len() - 6);
        assert_eq!(
            a.push(&[1, 2, 3]),
            Ok(Some(0)),
            "finished: consumes nothing more"
        );
    }

    #[test]
    fn refuses_what_is_not_a_first_handshake_message() {
        let mut a = HandshakeAssembler::new(HandshakeType::CLIENT_HELLO, 100, false);
        assert_eq!(
            a.push(&[23]),
            Err(NotTls::NotHandshake(ContentType::APPLICATION_DATA).into())
        );
        assert_eq!(
            a.push(&[22]),
            Err(NotTls::NotHandshake(ContentType::APPLICATION_DATA).into()),
            "the error sticks"
        );
        let mut a = HandshakeAssembler::new(HandshakeType::CLIENT_HELLO, 100, false);
        assert_eq!(
            a.push(&[22, 3, 1, 0, 1, 2]),
            Err(NotTls::UnexpectedMessage {
                got: HandshakeType::SERVER_HELLO,
                expected: HandshakeType::CLIENT_HELLO
            }
            .into())
        );
        let mut a = HandshakeAssembler::new(HandshakeType::CLIENT_HELLO, 100, false);
        assert_eq!(
            a.push(&[22, 3, 1, 0, 0]),
            Err(Malformed::EmptyRecord.into())
        );
        let mut a = HandshakeAssembler::new(HandshakeType::CLIENT_HELLO, 100, false);
        assert!(matches!(
            a.push(&[22, 3, 1, 0x40, 0x01]),
            Err(Error::TooLarge {
                what: "handshake record",
                ..
            })
        ));
    }

    #[test]
    fn refuses_a_message_over_the_limit_before_buffering_it() {
        let msg = handshake(1, &[0; 200]);
        let mut a = HandshakeAssembler::new(HandshakeType::CLIENT_HELLO, 100, false);
        assert!(matches!(
            a.push(&records(&msg, 1000)),
            Err(Error::TooLarge {
                len: 204,
                max: 100,
                ..
            })
        ));
        assert!(a.buffered() <= 4);
        let mut a = HandshakeAssembler::new(HandshakeType::CLIENT_HELLO, 2, false);
        assert!(matches!(
            a.push(&records(&msg, 1000)),
            Err(Error::TooLarge { max: 2, .. })
        ));
        assert!(a.buffered() <= 2);
    }

    #[test]
    fn client_hello_must_end_its_record_but_server_hello_need_not() {
        let mut two = handshake(1, &[1, 2]);
        two.extend_from_slice(&handshake(1, &[3]));
        let wire = records(&two, 1000);
        let mut a = HandshakeAssembler::new(HandshakeType::CLIENT_HELLO, 100, false);
        assert_eq!(a.push(&wire), Err(Malformed::DataAfterHello.into()));
        let mut a = HandshakeAssembler::new(HandshakeType::CLIENT_HELLO, 100, true);
        assert_eq!(a.push(&wire), Ok(Some(HEADER_LEN + 6)));
        // even a single byte after it
        let mut one = handshake(1, &[1, 2]);
        one.push(0);
        let mut a = HandshakeAssembler::new(HandshakeType::CLIENT_HELLO, 100, false);
        assert_eq!(
            a.push(&records(&one, 1000)),
            Err(Malformed::DataAfterHello.into())
        );
    }
}
