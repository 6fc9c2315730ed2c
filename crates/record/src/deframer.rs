//! Cuts the peer's byte stream into records, holding at most one maximum-size record
//! ([`INPUT_LIMIT`]) of ciphertext that has not been decrypted yet. The header is checked as
//! soon as its bytes arrive, before the rest of the record: a stream that is not TLS (or not
//! this connection's TLS) fails at its first byte instead of after 18 KiB.

use crate::buffer::ByteQueue;
use crate::cipher::{HEADER_LEN, TLS12_MAX_CIPHERTEXT_LEN, TLS13_MAX_CIPHERTEXT_LEN};
use crate::error::{Error, InvalidMessage, PeerMisbehaved};
use crate::message::ContentType;
use crate::suite::Version;

/// The most undecrypted ciphertext held: one TLS 1.2 record of the largest size (TLS 1.3
/// records are smaller). `read_tls` takes no more until `process` has used a record.
pub const INPUT_LIMIT: usize = HEADER_LEN + TLS12_MAX_CIPHERTEXT_LEN;

/// Undecrypted ciphertext of one connection.
pub(crate) struct Deframer {
    version: Version,
    buf: ByteQueue,
}

/// A complete record at the front of the buffer.
pub(crate) struct RecordAt {
    /// Its header.
    pub(crate) header: [u8; HEADER_LEN],
    /// Header plus payload.
    pub(crate) total_len: usize,
}

impl Deframer {
    pub(crate) fn new(version: Version) -> Self {
        Self {
            version,
            buf: ByteQueue::default(),
        }
    }

    /// Copies as much of `data` as fits under [`INPUT_LIMIT`]; returns the count.
    pub(crate) fn read(&mut self, data: &[u8]) -> usize {
        let room = INPUT_LIMIT.saturating_sub(self.buf.len());
        let n = room.min(data.len());
        if n > 0 {
            self.buf.extend(&data[..n]);
        }
        n
    }

    /// Bytes buffered.
    pub(crate) fn as_slice(&self) -> &[u8] {
        self.buf.as_slice()
    }

    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    /// Gives the buffer's allocation back if it holds nothing; returns whether it was empty.
    pub(crate) fn release_if_empty(&mut self) -> bool {
        self.buf.release_if_empty()
    }

    /// Drops everything buffered (after close_notify or a fatal error).
    pub(crate) fn clear(&mut self) {
        self.buf.clear();
    }

    /// The complete record at the front, `None` if it has not fully arrived, an error as soon
    /// as the bytes of its header break a rule.
    pub(crate) fn peek(&self) -> Result<Option<RecordAt>, Error> {
        let bytes = self.buf.as_slice();
        if let Some(&typ) = bytes.first() {
            check_type(self.version, ContentType(typ))?;
        }
        if let Some(&major) = bytes.get(1) {
            if major != 3 {
                let minor = bytes.get(2).copied().unwrap_or(0);
                let version = u16::from_be_bytes([major, minor]);
                return Err(InvalidMessage::RecordVersion(version).into());
            }
        }
        let Some(header) = bytes.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let header: [u8; HEADER_LEN] = [header[0], header[1], header[2], header[3], header[4]];
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        let max = match self.version {
            Version::Tls12 => TLS12_MAX_CIPHERTEXT_LEN,
            Version::Tls13 => TLS13_MAX_CIPHERTEXT_LEN,
        };
        if len > max {
            return Err(Error::RecordOverflow { len, max });
        }
        let total_len = HEADER_LEN + len;
        if bytes.len() < total_len {
            return Ok(None);
        }
        Ok(Some(RecordAt { header, total_len }))
    }

    /// The payload of the record `peek` returned, for decryption in place.
    pub(crate) fn payload_mut(&mut self, record: &RecordAt) -> &mut [u8] {
        self.buf
            .as_mut_slice()
            .get_mut(HEADER_LEN..record.total_len)
            .unwrap_or_default()
    }

    /// Forgets the record `peek` returned.
    pub(crate) fn consume(&mut self, record: &RecordAt) {
        self.buf.consume(record.total_len);
    }
}

/// Which outer record types may follow a finished handshake: in TLS 1.3 only
/// application_data (everything is encrypted under that outer type, RFC 8446 5.2); in TLS
/// 1.2 alerts, handshake (renegotiation attempts) and data. ChangeCipherSpec and unknown
/// types are `unexpected_message` (RFC 8446 5, RFC 5246 6.2.1).
fn check_type(version: Version, typ: ContentType) -> Result<(), Error> {
    let allowed = match version {
        Version::Tls13 => typ == ContentType::APPLICATION_DATA,
        Version::Tls12 => matches!(
            typ,
            ContentType::ALERT | ContentType::HANDSHAKE | ContentType::APPLICATION_DATA
        ),
    };
    if allowed {
        Ok(())
    } else {
        Err(PeerMisbehaved::UnexpectedContentType(typ).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_errors_show_as_soon_as_their_byte_arrives() {
        let mut d = Deframer::new(Version::Tls13);
        d.read(b"G");
        assert_eq!(
            d.peek().err().and_then(|e| e.alert()),
            Some(crate::AlertDescription::UNEXPECTED_MESSAGE)
        );

        let mut d = Deframer::new(Version::Tls12);
        d.read(&[23, 2]);
        assert!(matches!(
            d.peek(),
            Err(Error::InvalidMessage(InvalidMessage::RecordVersion(0x0200)))
        ));

        let mut d = Deframer::new(Version::Tls13);
        d.read(&[23, 3, 3, 0x41, 0x01]);
        assert!(matches!(
            d.peek(),
            Err(Error::RecordOverflow { len: 0x4101, .. })
        ));

        let mut d = Deframer::new(Version::Tls12);
        d.read(&[23, 3, 3, 0x41, 0x01]);
        assert!(matches!(d.peek(), Ok(None)));
    }

    #[test]
    fn tls13_refuses_change_cipher_spec_after_the_handshake() {
        let mut d = Deframer::new(Version::Tls13);
        d.read(&[20, 3, 3, 0, 1, 1]);
        assert_eq!(
            d.peek().err(),
            Some(PeerMisbehaved::UnexpectedContentType(ContentType::CHANGE_CIPHER_SPEC).into())
        );
    }

    #[test]
    fn input_is_bounded() {
        let mut d = Deframer::new(Version::Tls12);
        let data = vec![23u8; INPUT_LIMIT + 10];
        assert_eq!(d.read(&data), INPUT_LIMIT);
        assert_eq!(d.read(&data), 0);
        assert_eq!(d.len(), INPUT_LIMIT);
    }

    #[test]
    fn a_whole_record_is_returned_once_complete() {
        let mut d = Deframer::new(Version::Tls12);
        d.read(&[23, 3, 3, 0, 2, 0xaa]);
        assert!(d.peek().unwrap().is_none());
        d.read(&[0xbb, 21]);
        let r = d.peek().unwrap().unwrap();
        assert_eq!(r.total_len, 7);
        assert_eq!(d.payload_mut(&r), &[0xaa, 0xbb]);
        d.consume(&r);
        assert_eq!(d.len(), 1);
    }
}
