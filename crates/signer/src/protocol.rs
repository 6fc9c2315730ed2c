//! The signer's wire format, sans-IO: length-prefixed, versioned frames carrying a request id.
//!
//! ```text
//! frame    = len:u32 (bytes after it, 10..=MAX_FRAME) version:u8 (=1) type:u8 id:u64 body
//! Auth      0x01  client_nonce[32] proof[32]          client -> signer, answers Challenge
//! ListKeys  0x02  (empty)
//! Sign      0x03  key_id[32] scheme:u16 len:u16 message[len]
//! Challenge 0x81  server_nonce[32]                    signer -> client, first frame
//! Welcome   0x82  proof[32]                           the signer's proof (mutual auth)
//! Keys      0x83  count:u8 { key_id[32] algorithm:u8 n:u8 scheme:u16*n len:u16 spki[len] }*
//! Signature 0x84  len:u16 signature[len]
//! Error     0x85  code:u8 len:u8 detail[len] (UTF-8)
//! ```
//!
//! Every length is checked against what is left and against a fixed limit before anything is
//! allocated, and a body must be consumed exactly, so decoding cannot panic, over-allocate or
//! accept two readings of one frame. Schemes and algorithms are TLS code points (u16 / u8).

use thiserror::Error;

pub const VERSION: u8 = 1;
/// Largest frame body. The messages rustls signs are a few hundred bytes (TLS 1.3: 64 spaces,
/// a context string and a transcript hash; TLS 1.2: two randoms and the ECDHE parameters), and
/// the largest answer is a key list; 16 KiB leaves room without letting a peer make us buffer
/// much.
pub const MAX_FRAME: usize = 16 * 1024;
/// Longest message accepted for signing.
pub const MAX_MESSAGE: usize = 8 * 1024;
/// Most keys one signer lists.
pub const MAX_KEYS: usize = 64;
const HEADER: usize = 4;
const FIXED: usize = 1 + 1 + 8;

pub type KeyId = [u8; 32];
pub type Nonce = [u8; 32];
pub type Proof = [u8; 32];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Auth {
        client_nonce: Nonce,
        proof: Proof,
    },
    ListKeys,
    Sign {
        key_id: KeyId,
        scheme: u16,
        message: Vec<u8>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    Challenge { server_nonce: Nonce },
    Welcome { proof: Proof },
    Keys(Vec<KeyInfo>),
    Signature(Vec<u8>),
    Error { code: ErrorCode, detail: String },
}

/// A key the signer holds: its id (SHA-256 of its SubjectPublicKeyInfo), TLS signature
/// algorithm, the schemes it signs with in preference order, and the SPKI itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    pub key_id: KeyId,
    pub algorithm: u8,
    pub schemes: Vec<u16>,
    pub spki: Vec<u8>,
}

/// Why the signer refused or failed a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The signing queue is full: the signer is overloaded and says so instead of queueing more.
    Busy,
    UnknownKey,
    UnsupportedScheme,
    /// The key's backend (aws-lc, the PKCS#11 token) failed to sign.
    SignFailed,
    BadRequest,
    Unauthenticated,
    /// A code this version does not know (a newer signer).
    Other(u8),
}

impl ErrorCode {
    fn to_u8(self) -> u8 {
        match self {
            ErrorCode::Busy => 1,
            ErrorCode::UnknownKey => 2,
            ErrorCode::UnsupportedScheme => 3,
            ErrorCode::SignFailed => 4,
            ErrorCode::BadRequest => 5,
            ErrorCode::Unauthenticated => 6,
            ErrorCode::Other(n) => n,
        }
    }

    fn from_u8(n: u8) -> Self {
        match n {
            1 => ErrorCode::Busy,
            2 => ErrorCode::UnknownKey,
            3 => ErrorCode::UnsupportedScheme,
            4 => ErrorCode::SignFailed,
            5 => ErrorCode::BadRequest,
            6 => ErrorCode::Unauthenticated,
            n => ErrorCode::Other(n),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            ErrorCode::Busy => "busy",
            ErrorCode::UnknownKey => "unknown_key",
            ErrorCode::UnsupportedScheme => "unsupported_scheme",
            ErrorCode::SignFailed => "sign_failed",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::Other(_) => "other",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME}")]
    TooLong(usize),
    #[error("frame shorter than its header")]
    TooShort,
    #[error("protocol version {0}, expected {VERSION}")]
    Version(u8),
    #[error("unknown frame type 0x{0:02x}")]
    Type(u8),
    #[error("frame body truncated")]
    Truncated,
    #[error("{0} trailing bytes after the frame body")]
    Trailing(usize),
    #[error("{0} over its limit")]
    Limit(&'static str),
    #[error("error detail is not UTF-8")]
    Utf8,
}

/// Finds the first complete frame in `buf`: `Ok(None)` when more bytes are needed, else the
/// frame's bytes (length prefix excluded) and how many bytes of `buf` it used. A length over
/// the limit is an error as soon as the prefix arrives, so a reader never buffers more than
/// `MAX_FRAME + 4` bytes for one frame.
pub fn split_frame(buf: &[u8]) -> Result<Option<(&[u8], usize)>, DecodeError> {
    let Some(prefix) = buf.get(..HEADER) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
    if len > MAX_FRAME {
        return Err(DecodeError::TooLong(len));
    }
    if len < FIXED {
        return Err(DecodeError::TooShort);
    }
    match buf.get(HEADER..HEADER + len) {
        Some(frame) => Ok(Some((frame, HEADER + len))),
        None => Ok(None),
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn array32(&mut self) -> Result<[u8; 32], DecodeError> {
        let mut out = [0; 32];
        out.copy_from_slice(self.take(32)?);
        Ok(out)
    }
    fn finish(self) -> Result<(), DecodeError> {
        match self.0.len() {
            0 => Ok(()),
            n => Err(DecodeError::Trailing(n)),
        }
    }
}

/// Reads version, type and id; returns them with the body reader.
fn open(frame: &[u8]) -> Result<(u8, u64, Reader<'_>), DecodeError> {
    let mut r = Reader(frame);
    let version = r.u8()?;
    if version != VERSION {
        return Err(DecodeError::Version(version));
    }
    let kind = r.u8()?;
    let id = u64::from_be_bytes(r.take(8)?.try_into().map_err(|_| DecodeError::Truncated)?);
    Ok((kind, id, r))
}

/// Appends one frame: the header, then what `body` writes, then patches the length in.
fn frame(out: &mut Vec<u8>, kind: u8, id: u64, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER]);
    out.push(VERSION);
    out.push(kind);
    out.extend_from_slice(&id.to_be_bytes());
    body(out);
    let len = (out.len() - start - HEADER) as u32;
    out[start..start + HEADER].copy_from_slice(&len.to_be_bytes());
}

impl Request {
    /// Appends this request as one frame. Callers keep values within the limits (the client
    /// checks the message length before it gets here); an oversize field is cut to its limit
    /// rather than written as a frame the peer must refuse.
    pub fn encode(&self, id: u64, out: &mut Vec<u8>) {
        match self {
            Request::Auth {
                client_nonce,
                proof,
            } => frame(out, 0x01, id, |b| {
                b.extend_from_slice(client_nonce);
                b.extend_from_slice(proof);
            }),
            Request::ListKeys => frame(out, 0x02, id, |_| {}),
            Request::Sign {
                key_id,
                scheme,
                message,
            } => frame(out, 0x03, id, |b| {
                let m = &message[..message.len().min(MAX_MESSAGE)];
                b.extend_from_slice(key_id);
                b.extend_from_slice(&scheme.to_be_bytes());
                b.extend_from_slice(&(m.len() as u16).to_be_bytes());
                b.extend_from_slice(m);
            }),
        }
    }

    /// Decodes one frame's bytes (as returned by [`split_frame`]) into (id, request).
    pub fn decode(frame: &[u8]) -> Result<(u64, Request), DecodeError> {
        let (kind, id, mut r) = open(frame)?;
        let req = match kind {
            0x01 => Request::Auth {
                client_nonce: r.array32()?,
                proof: r.array32()?,
            },
            0x02 => Request::ListKeys,
            0x03 => {
                let key_id = r.array32()?;
                let scheme = r.u16()?;
                let len = r.u16()? as usize;
                if len > MAX_MESSAGE {
                    return Err(DecodeError::Limit("message"));
                }
                Request::Sign {
                    key_id,
                    scheme,
                    message: r.take(len)?.to_vec(),
                }
            }
            other => return Err(DecodeError::Type(other)),
        };
        r.finish()?;
        Ok((id, req))
    }
}

impl Response {
    /// Appends this response as one frame; lists and strings over their limits are cut.
    pub fn encode(&self, id: u64, out: &mut Vec<u8>) {
        match self {
            Response::Challenge { server_nonce } => {
                frame(out, 0x81, id, |b| b.extend_from_slice(server_nonce))
            }
            Response::Welcome { proof } => frame(out, 0x82, id, |b| b.extend_from_slice(proof)),
            Response::Keys(keys) => frame(out, 0x83, id, |b| {
                let keys = &keys[..keys.len().min(MAX_KEYS)];
                b.push(keys.len() as u8);
                for k in keys {
                    b.extend_from_slice(&k.key_id);
                    b.push(k.algorithm);
                    let schemes = &k.schemes[..k.schemes.len().min(32)];
                    b.push(schemes.len() as u8);
                    for s in schemes {
                        b.extend_from_slice(&s.to_be_bytes());
                    }
                    let spki = &k.spki[..k.spki.len().min(MAX_SPKI)];
                    b.extend_from_slice(&(spki.len() as u16).to_be_bytes());
                    b.extend_from_slice(spki);
                }
            }),
            Response::Signature(sig) => frame(out, 0x84, id, |b| {
                let sig = &sig[..sig.len().min(MAX_SIGNATURE)];
                b.extend_from_slice(&(sig.len() as u16).to_be_bytes());
                b.extend_from_slice(sig);
            }),
            Response::Error { code, detail } => frame(out, 0x85, id, |b| {
                b.push(code.to_u8());
                let mut end = detail.len().min(255);
                while !detail.is_char_boundary(end) {
                    end -= 1;
                }
                b.push(end as u8);
                b.extend_from_slice(&detail.as_bytes()[..end]);
            }),
        }
    }

    pub fn decode(frame: &[u8]) -> Result<(u64, Response), DecodeError> {
        let (kind, id, mut r) = open(frame)?;
        let resp = match kind {
            0x81 => Response::Challenge {
                server_nonce: r.array32()?,
            },
            0x82 => Response::Welcome {
                proof: r.array32()?,
            },
            0x83 => {
                let count = r.u8()? as usize;
                if count > MAX_KEYS {
                    return Err(DecodeError::Limit("key count"));
                }
                let mut keys = Vec::with_capacity(count);
                for _ in 0..count {
                    let key_id = r.array32()?;
                    let algorithm = r.u8()?;
                    let n = r.u8()? as usize;
                    if n > 32 {
                        return Err(DecodeError::Limit("scheme count"));
                    }
                    let schemes = (0..n).map(|_| r.u16()).collect::<Result<_, _>>()?;
                    let len = r.u16()? as usize;
                    if len > MAX_SPKI {
                        return Err(DecodeError::Limit("public key"));
                    }
                    let spki = r.take(len)?.to_vec();
                    keys.push(KeyInfo {
                        key_id,
                        algorithm,
                        schemes,
                        spki,
                    });
                }
                Response::Keys(keys)
            }
            0x84 => {
                let len = r.u16()? as usize;
                if len > MAX_SIGNATURE {
                    return Err(DecodeError::Limit("signature"));
                }
                Response::Signature(r.take(len)?.to_vec())
            }
            0x85 => {
                let code = ErrorCode::from_u8(r.u8()?);
                let len = r.u8()? as usize;
                let detail = std::str::from_utf8(r.take(len)?)
                    .map_err(|_| DecodeError::Utf8)?
                    .to_string();
                Response::Error { code, detail }
            }
            other => return Err(DecodeError::Type(other)),
        };
        r.finish()?;
        Ok((id, resp))
    }
}

/// Largest SubjectPublicKeyInfo carried (RSA-8192 is ~1.1 KB).
pub const MAX_SPKI: usize = 2048;
/// Largest signature carried (RSA-8192: 1 KB).
pub const MAX_SIGNATURE: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn one_frame(bytes: &[u8]) -> &[u8] {
        let (frame, used) = split_frame(bytes).unwrap().unwrap();
        assert_eq!(used, bytes.len());
        frame
    }

    fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            (any::<[u8; 32]>(), any::<[u8; 32]>()).prop_map(|(client_nonce, proof)| {
                Request::Auth {
                    client_nonce,
                    proof,
                }
            }),
            Just(Request::ListKeys),
            (
                any::<[u8; 32]>(),
                any::<u16>(),
                proptest::collection::vec(any::<u8>(), 0..600)
            )
                .prop_map(|(key_id, scheme, message)| Request::Sign {
                    key_id,
                    scheme,
                    message
                }),
        ]
    }

    fn response() -> impl Strategy<Value = Response> {
        let key = (
            any::<[u8; 32]>(),
            any::<u8>(),
            proptest::collection::vec(any::<u16>(), 0..8),
            proptest::collection::vec(any::<u8>(), 0..300),
        )
            .prop_map(|(key_id, algorithm, schemes, spki)| KeyInfo {
                key_id,
                algorithm,
                schemes,
                spki,
            });
        prop_oneof![
            any::<[u8; 32]>().prop_map(|server_nonce| Response::Challenge { server_nonce }),
            any::<[u8; 32]>().prop_map(|proof| Response::Welcome { proof }),
            proptest::collection::vec(key, 0..5).prop_map(Response::Keys),
            proptest::collection::vec(any::<u8>(), 0..600).prop_map(Response::Signature),
            (1u8..=9, "[a-z é]{0,60}").prop_map(|(c, detail)| Response::Error {
                code: ErrorCode::from_u8(c),
                detail
            }),
        ]
    }

    proptest! {
        #[test]
        fn requests_round_trip(req in request(), id in any::<u64>()) {
            let mut out = Vec::new();
            req.encode(id, &mut out);
            prop_assert_eq!(Request::decode(one_frame(&out)).unwrap(), (id, req));
        }

        #[test]
        fn responses_round_trip(resp in response(), id in any::<u64>()) {
            let mut out = Vec::new();
            resp.encode(id, &mut out);
            prop_assert_eq!(Response::decode(one_frame(&out)).unwrap(), (id, resp));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            crate::fuzzing::frames(&bytes);
        }

        #[test]
        fn truncations_are_incomplete_or_errors(req in request(), cut in any::<prop::sample::Index>()) {
            let mut out = Vec::new();
            req.encode(7, &mut out);
            let cut = cut.index(out.len());
            // A prefix is never a complete frame.
            prop_assert!(!matches!(split_frame(&out[..cut]), Ok(Some(_))));
        }
    }

    #[test]
    fn limits_and_errors() {
        assert_eq!(split_frame(&[0, 1, 0, 0]), Err(DecodeError::TooLong(65536)));
        assert_eq!(split_frame(&[0, 0, 0, 2, 1, 1]), Err(DecodeError::TooShort));
        assert_eq!(split_frame(&[0, 0, 0]), Ok(None));
        let mut out = Vec::new();
        Request::ListKeys.encode(1, &mut out);
        out[4] = 2;
        assert_eq!(Request::decode(&out[4..]), Err(DecodeError::Version(2)));
        out[4] = VERSION;
        out[5] = 0x7f;
        assert_eq!(Request::decode(&out[4..]), Err(DecodeError::Type(0x7f)));
        // a trailing byte is refused: one frame, one reading
        let mut out = Vec::new();
        Request::ListKeys.encode(1, &mut out);
        out.push(0);
        out[3] += 1;
        assert_eq!(Request::decode(&out[4..]), Err(DecodeError::Trailing(1)));
        // a message length over the limit is refused before anything is read
        let mut out = Vec::new();
        frame(&mut out, 0x03, 1, |b| {
            b.extend_from_slice(&[0; 34]);
            b.extend_from_slice(&(MAX_MESSAGE as u16 + 1).to_be_bytes());
        });
        assert_eq!(
            Request::decode(&out[4..]),
            Err(DecodeError::Limit("message"))
        );
    }

    /// Frames as the code before `baton_wire::codec` wrote them (agents and signers of both
    /// versions meet during an upgrade). Each value decodes back from its golden bytes.
    #[test]
    fn encoding_is_unchanged() {
        let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let id = 0x0102_0304_0506_0708;
        let requests = [
            (
                Request::Auth {
                    client_nonce: [0xaa; 32],
                    proof: [0xbb; 32],
                },
                "0000004a01010102030405060708aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\
                    aaaaaaaaaaaaaaaaaaaaaaaaaaaabbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\
                    bbbbbbbbbbbbbbbbbbbbbbbbbbbb",
            ),
            (Request::ListKeys, "0000000a01020102030405060708"),
            (
                Request::Sign {
                    key_id: [0x11; 32],
                    scheme: 0x0804,
                    message: b"tbs".to_vec(),
                },
                "0000003101030102030405060708111111111111111111111111111111111111\
                    111111111111111111111111111108040003746273",
            ),
        ];
        for (req, golden) in requests {
            let mut out = Vec::new();
            req.encode(id, &mut out);
            assert_eq!(hex(&out), golden);
            assert_eq!(Request::decode(one_frame(&out)), Ok((id, req)));
        }
        let responses = [
            (
                Response::Challenge {
                    server_nonce: [0xcc; 32],
                },
                "0000002a01810102030405060708cccccccccccccccccccccccccccccccccccc\
                    cccccccccccccccccccccccccccc",
            ),
            (
                Response::Welcome { proof: [0xdd; 32] },
                "0000002a01820102030405060708dddddddddddddddddddddddddddddddddddd\
                dddddddddddddddddddddddddddd",
            ),
            (
                Response::Keys(vec![
                    KeyInfo {
                        key_id: [0x22; 32],
                        algorithm: 3,
                        schemes: vec![0x0403, 0x0804],
                        spki: vec![0x30, 0x59],
                    },
                    KeyInfo {
                        key_id: [0x33; 32],
                        algorithm: 1,
                        schemes: vec![],
                        spki: vec![],
                    },
                ]),
                "0000005901830102030405060708022222222222222222222222222222222222\
                    2222222222222222222222222222220302040308040002305933333333333333\
                    3333333333333333333333333333333333333333333333333301000000",
            ),
            (Response::Keys(vec![]), "0000000b0183010203040506070800"),
            (
                Response::Signature(vec![1, 2, 3]),
                "0000000f018401020304050607080003010203",
            ),
            (
                Response::Error {
                    code: ErrorCode::UnknownKey,
                    detail: "no é".into(),
                },
                "000000110185010203040506070802056e6f20c3a9",
            ),
            (
                Response::Error {
                    code: ErrorCode::Other(200),
                    detail: String::new(),
                },
                "0000000c01850102030405060708c800",
            ),
        ];
        for (resp, golden) in responses {
            let mut out = Vec::new();
            resp.encode(id, &mut out);
            assert_eq!(hex(&out), golden);
            assert_eq!(Response::decode(one_frame(&out)), Ok((id, resp)));
        }
    }

    #[test]
    fn two_frames_in_one_buffer() {
        let mut out = Vec::new();
        Request::ListKeys.encode(1, &mut out);
        Request::ListKeys.encode(2, &mut out);
        let (f, used) = split_frame(&out).unwrap().unwrap();
        assert_eq!(Request::decode(f).unwrap().0, 1);
        let (f, _) = split_frame(&out[used..]).unwrap().unwrap();
        assert_eq!(Request::decode(f).unwrap().0, 2);
    }
}
