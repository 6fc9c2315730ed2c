//! The ServerHello (RFC 8446 4.1.3, RFC 5246 7.4.1.3), read from the server's first bytes. The
//! dispatcher's session affinity learns from it which TLS 1.2 session id the agent assigned
//! (to route a later resumption back there) and whether the connection is TLS 1.3, where the
//! session id is only an echo and resumption goes by PSK identity instead.

use crate::codec::{
    encode_bytes, encode_list, encode_vec, read_list, read_vec, Codec, Len, Reader,
};
use crate::enums::{CipherSuite, Compression, ExtensionType, HandshakeType, ProtocolVersion};
use crate::error::{Error, Malformed};
use crate::hello::{check_extensions, MAX_SESSION_ID_LEN};
use crate::message::{FirstMessage, MessageReader};

/// The `random` of a HelloRetryRequest: SHA-256("HelloRetryRequest") (RFC 8446 4.1.3). An HRR
/// travels as a ServerHello with this random.
pub const HELLO_RETRY_REQUEST_RANDOM: [u8; 32] = [
    0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91,
    0xc2, 0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
];

/// A ServerHello extension: supported_versions parsed (it decides the version), others raw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerExtension {
    /// supported_versions: the version the server selected (TLS 1.3 and later).
    SupportedVersions(ProtocolVersion),
    /// Any other extension, as it came.
    Other {
        /// Its type; never SUPPORTED_VERSIONS.
        typ: ExtensionType,
        /// Its body.
        data: Vec<u8>,
    },
}

impl ServerExtension {
    /// The extension's type.
    pub fn typ(&self) -> ExtensionType {
        match self {
            Self::SupportedVersions(_) => ExtensionType::SUPPORTED_VERSIONS,
            Self::Other { typ, .. } => *typ,
        }
    }
}

impl Codec for ServerExtension {
    fn encode(&self, out: &mut Vec<u8>) {
        self.typ().encode(out);
        encode_vec(out, Len::U16, |o| match self {
            Self::SupportedVersions(v) => v.encode(o),
            Self::Other { data, .. } => o.extend_from_slice(data),
        });
    }
    fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        let typ = ExtensionType::read(r)?;
        let mut body = r.sub(Len::U16, "extension")?;
        let ext = match typ {
            ExtensionType::SUPPORTED_VERSIONS => {
                Self::SupportedVersions(ProtocolVersion::read(&mut body)?)
            }
            typ => Self::Other {
                typ,
                data: body.rest().to_vec(),
            },
        };
        body.expect_empty("extension")?;
        Ok(ext)
    }
}

/// A parsed ServerHello (or HelloRetryRequest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerHello {
    /// `legacy_version`: 0x0303 from a TLS 1.3 server, which says 1.3 in supported_versions.
    pub legacy_version: ProtocolVersion,
    /// The server's random ([`HELLO_RETRY_REQUEST_RANDOM`] for an HRR).
    pub random: [u8; 32],
    /// In TLS 1.2 the id of the session (new, or the one resumed); in TLS 1.3 the client's
    /// legacy session id echoed.
    pub session_id: Vec<u8>,
    /// The chosen suite.
    pub cipher_suite: CipherSuite,
    /// The chosen compression (must be `NULL`; not checked here).
    pub compression_method: Compression,
    /// Extensions in wire order; an empty list encodes as no extensions block.
    pub extensions: Vec<ServerExtension>,
}

impl Codec for ServerHello {
    fn encode(&self, out: &mut Vec<u8>) {
        self.legacy_version.encode(out);
        out.extend_from_slice(&self.random);
        encode_bytes(out, Len::U8, &self.session_id);
        self.cipher_suite.encode(out);
        self.compression_method.encode(out);
        if !self.extensions.is_empty() {
            encode_list(out, Len::U16, &self.extensions);
        }
    }

    fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        let legacy_version = ProtocolVersion::read(r)?;
        let random = r.take_array("random")?;
        let session_id = read_vec(r, Len::U8, "session id")?;
        if session_id.len() > MAX_SESSION_ID_LEN {
            return Err(Malformed::OverLong("session id").into());
        }
        let cipher_suite = CipherSuite::read(r)?;
        let compression_method = Compression::read(r)?;
        let extensions: Vec<ServerExtension> = if r.any_left() {
            read_list(r, Len::U16, "extensions")?
        } else {
            Vec::new()
        };
        check_extensions(extensions.iter().map(ServerExtension::typ), false)?;
        Ok(Self {
            legacy_version,
            random,
            session_id: session_id.to_vec(),
            cipher_suite,
            compression_method,
            extensions,
        })
    }
}

impl FirstMessage for ServerHello {
    const TYPE: HandshakeType = HandshakeType::SERVER_HELLO;
    const NAME: &'static str = "ServerHello";
    const MESSAGE: &'static str = "ServerHello message";
    const RECORD_VERSION: ProtocolVersion = ProtocolVersion::TLSV1_2;
    // Certificate, ServerHelloDone (TLS 1.2) may share its record
    const MAY_BE_FOLLOWED: bool = true;
}

impl ServerHello {
    /// The negotiated version: supported_versions if present (RFC 8446 4.2.1), else
    /// `legacy_version`.
    pub fn version(&self) -> ProtocolVersion {
        self.extensions
            .iter()
            .find_map(|e| match e {
                ServerExtension::SupportedVersions(v) => Some(*v),
                ServerExtension::Other { .. } => None,
            })
            .unwrap_or(self.legacy_version)
    }

    /// Whether this is a TLS 1.3 hello (then `session_id` is only an echo).
    pub fn is_tls13(&self) -> bool {
        self.version() == ProtocolVersion::TLSV1_3
    }

    /// Whether this is a HelloRetryRequest: the client will send a second ClientHello.
    pub fn is_hello_retry_request(&self) -> bool {
        self.random == HELLO_RETRY_REQUEST_RANDOM
    }

    /// The session id that identifies a TLS 1.2 session on the server: `None` for TLS 1.3 and
    /// for an empty id (the server will not cache the session).
    pub fn tls12_session_id(&self) -> Option<&[u8]> {
        (!self.is_tls13() && !self.session_id.is_empty()).then_some(&self.session_id[..])
    }
}

/// Sans-IO: peeks the ServerHello out of the first bytes a server sends (see
/// [`MessageReader`]): `Done`'s count ends at the ServerHello, not at its record's end.
pub type ServerHelloReader = MessageReader<ServerHello>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enums::ContentType;
    use crate::message::Progress;
    use crate::record;

    fn hello(session_id: &[u8], extensions: Vec<ServerExtension>) -> ServerHello {
        ServerHello {
            legacy_version: ProtocolVersion::TLSV1_2,
            random: [7; 32],
            session_id: session_id.to_vec(),
            cipher_suite: CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            compression_method: Compression::NULL,
            extensions,
        }
    }

    #[test]
    fn tls12_hello_gives_its_session_id() {
        let sh = hello(
            &[0xab; 32],
            vec![ServerExtension::Other {
                typ: ExtensionType::RENEGOTIATION_INFO,
                data: vec![0],
            }],
        );
        let mut msg = Vec::new();
        sh.encode_message(&mut msg);
        let back = ServerHello::read_message(&msg).unwrap();
        assert_eq!(back, sh);
        assert_eq!(back.version(), ProtocolVersion::TLSV1_2);
        assert_eq!(back.tls12_session_id(), Some(&[0xab; 32][..]));
        assert!(!back.is_hello_retry_request());
    }

    #[test]
    fn tls13_is_told_by_supported_versions_and_hrr_by_its_random() {
        let mut sh = hello(
            &[1; 32],
            vec![ServerExtension::SupportedVersions(ProtocolVersion::TLSV1_3)],
        );
        assert!(sh.is_tls13());
        assert_eq!(sh.tls12_session_id(), None);
        sh.random = HELLO_RETRY_REQUEST_RANDOM;
        let back = ServerHello::read_message(&{
            let mut m = Vec::new();
            sh.encode_message(&mut m);
            m
        })
        .unwrap();
        assert!(back.is_hello_retry_request());
    }

    #[test]
    fn hello_without_extensions_and_duplicate_extensions() {
        let sh = hello(&[], vec![]);
        let mut body = Vec::new();
        sh.encode(&mut body);
        assert_eq!(body.len(), 2 + 32 + 1 + 2 + 1, "no extensions block");
        assert_eq!(ServerHello::read_bytes(&body), Ok(sh));
        let dup = ServerExtension::SupportedVersions(ProtocolVersion::TLSV1_3);
        let mut body = Vec::new();
        hello(&[], vec![dup.clone(), dup]).encode(&mut body);
        assert_eq!(
            ServerHello::read_bytes(&body),
            Err(Malformed::DuplicateExtension(ExtensionType::SUPPORTED_VERSIONS).into())
        );
    }

    #[test]
    fn reader_stops_at_the_end_of_the_server_hello() {
        let sh = hello(&[5; 16], vec![]);
        let mut msg = Vec::new();
        sh.encode_message(&mut msg);
        let hello_len = msg.len();
        msg.extend_from_slice(&[11, 0, 0, 3, 1, 2, 3]); // a Certificate in the same record
        let mut wire = Vec::new();
        record::encode_records(
            &mut wire,
            ContentType::HANDSHAKE,
            ProtocolVersion::TLSV1_2,
            &msg,
            1 << 14,
        );
        let mut reader = ServerHelloReader::new();
        assert_eq!(reader.push(&wire[..3]), Ok(Progress::NeedMore));
        assert_eq!(
            reader.push(&wire[3..]),
            Ok(Progress::Done(sh, 5 + hello_len - 3))
        );
    }
}
