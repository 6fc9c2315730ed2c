//! What a ClientHello and a ServerHello share: the handshake message around the body (type and
//! 24-bit length), its first flight as records, and the sans-IO reader that peeks the message out
//! of the first bytes of a connection.

use crate::codec::{encode_vec, Codec, Len, Reader};
use crate::enums::{ContentType, HandshakeType, ProtocolVersion};
use crate::error::{Error, NotTls};
use crate::record::{self, HandshakeAssembler, DEFAULT_MESSAGE_LIMIT};

/// A handshake message that opens a side's first flight, read by peeking at the connection.
pub trait FirstMessage: Codec + Clone {
    /// Its handshake type.
    const TYPE: HandshakeType;
    /// Its name, in errors about its body.
    const NAME: &'static str;
    /// Its name as a whole message (header and body), in errors.
    const MESSAGE: &'static str;
    /// The legacy version of the records its flight is written in.
    const RECORD_VERSION: ProtocolVersion;
    /// Whether other handshake messages may follow it in its record (a ServerHello's may).
    const MAY_BE_FOLLOWED: bool;

    /// Reads a whole handshake message (4-byte header included) that must be of this type.
    fn read_message(msg: &[u8]) -> Result<Self, Error> {
        let mut r = Reader::new(msg);
        let typ = HandshakeType::read(&mut r)?;
        if typ != Self::TYPE {
            return Err(NotTls::UnexpectedMessage {
                got: typ,
                expected: Self::TYPE,
            }
            .into());
        }
        let mut body = r.sub(Len::U24, Self::NAME)?;
        r.expect_empty(Self::MESSAGE)?;
        let message = Self::read(&mut body)?;
        body.expect_empty(Self::NAME)?;
        Ok(message)
    }

    /// Appends the message as a handshake message (with its 4-byte header).
    fn encode_message(&self, out: &mut Vec<u8>) {
        Self::TYPE.encode(out);
        encode_vec(out, Len::U24, |o| self.encode(o));
    }

    /// Appends the message as handshake records of at most `max_fragment` bytes.
    fn encode_records(&self, out: &mut Vec<u8>, max_fragment: usize) {
        let mut msg = Vec::new();
        self.encode_message(&mut msg);
        record::encode_records(
            out,
            ContentType::HANDSHAKE,
            Self::RECORD_VERSION,
            &msg,
            max_fragment,
        );
    }
}

/// What a [`MessageReader`] made of the bytes so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress<T = crate::ClientHello> {
    /// All input was consumed; the message is not complete yet.
    NeedMore,
    /// The message is complete after the first `.1` bytes of the last input.
    Done(T, usize),
}

/// Sans-IO: peeks a side's first handshake message out of the first bytes it sends, across as
/// many records as it takes, holding at most a configurable number of bytes.
///
/// The dispatcher pushes each read into it, and forwards the same bytes untouched: the parse is
/// a peek. A ServerHello may share its record with the messages after it (Certificate,
/// ServerHelloDone in TLS 1.2; in TLS 1.3 the next records are encrypted): `Done`'s count ends at
/// the message. After `Done` or an error the reader is finished; later pushes consume nothing
/// and repeat the outcome.
#[derive(Debug, Clone)]
pub struct MessageReader<T> {
    assembler: HandshakeAssembler,
    parsed: Option<Result<T, Error>>,
}

impl<T: FirstMessage> Default for MessageReader<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: FirstMessage> MessageReader<T> {
    /// A reader holding at most [`DEFAULT_MESSAGE_LIMIT`] bytes of the message.
    pub fn new() -> Self {
        Self::with_limit(DEFAULT_MESSAGE_LIMIT)
    }

    /// A reader holding at most `limit` bytes of the message (its 4-byte header included).
    pub fn with_limit(limit: usize) -> Self {
        Self {
            assembler: HandshakeAssembler::new(T::TYPE, limit, T::MAY_BE_FOLLOWED),
            parsed: None,
        }
    }

    /// Takes the next bytes the peer sent.
    pub fn push(&mut self, input: &[u8]) -> Result<Progress<T>, Error> {
        if let Some(parsed) = &self.parsed {
            return parsed.clone().map(|m| Progress::Done(m, 0));
        }
        let Some(used) = self.assembler.push(input)? else {
            return Ok(Progress::NeedMore);
        };
        let parsed = T::read_message(self.assembler.message());
        self.parsed = Some(parsed.clone());
        parsed.map(|m| Progress::Done(m, used))
    }

    /// Bytes of the message held; never more than the limit.
    pub fn buffered(&self) -> usize {
        self.assembler.buffered()
    }

    /// The limit this reader was made with.
    pub fn limit(&self) -> usize {
        self.assembler.limit()
    }

    /// Bytes of the stream consumed by pushes that needed more or completed the message.
    pub fn consumed(&self) -> usize {
        self.assembler.consumed()
    }
}
