//! The ClientHello (RFC 8446 4.1.2, RFC 5246 7.4.1.2) and its extensions: what the dispatcher
//! routes on (SNI, ALPN, versions, a TLS 1.2 session id or ticket, TLS 1.3 PSK identities) and a
//! sans-IO [`HelloReader`] that gets it out of the first bytes of a connection.
//!
//! Extensions are kept in wire order, parsed where Baton has a use for them and raw otherwise,
//! so a parsed hello encodes back to the same bytes (the property tests and fuzz target check
//! this) and a fingerprint of the extension order stays possible.

use std::collections::HashSet;

use crate::codec::{
    encode_bytes, encode_list, encode_vec, read_list, read_vec, Codec, Len, Reader,
};
use crate::enums::{
    CipherSuite, Compression, ExtensionType, HandshakeType, NamedGroup, ProtocolVersion,
    PskKeyExchangeMode, ServerNameType, SignatureScheme,
};
use crate::error::{Error, Malformed};
pub use crate::message::{FirstMessage, MessageReader, Progress};

/// The longest legacy session id (RFC 5246 7.4.1.2).
pub const MAX_SESSION_ID_LEN: usize = 32;

/// The shortest PSK binder: an HMAC of SHA-256 (RFC 8446 4.2.11).
pub const MIN_BINDER_LEN: usize = 32;

/// One entry of the server_name extension (RFC 6066 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerName {
    /// `HOST_NAME` in practice; other types are kept as opaque bytes.
    pub typ: ServerNameType,
    /// The name as sent (not validated as a DNS name).
    pub name: Vec<u8>,
}

impl Codec for ServerName {
    fn encode(&self, out: &mut Vec<u8>) {
        self.typ.encode(out);
        encode_bytes(out, Len::U16_NON_EMPTY, &self.name);
    }
    fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        let typ = ServerNameType::read(r)?;
        let name = read_vec(r, Len::U16_NON_EMPTY, "server name")?.to_vec();
        Ok(Self { typ, name })
    }
}

/// One offered key share (RFC 8446 4.2.8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyShareEntry {
    /// The group.
    pub group: NamedGroup,
    /// The client's public value (1,216 bytes for X25519MLKEM768).
    pub payload: Vec<u8>,
}

impl Codec for KeyShareEntry {
    fn encode(&self, out: &mut Vec<u8>) {
        self.group.encode(out);
        encode_bytes(out, Len::U16_NON_EMPTY, &self.payload);
    }
    fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        let group = NamedGroup::read(r)?;
        let payload = read_vec(r, Len::U16_NON_EMPTY, "key share")?.to_vec();
        Ok(Self { group, payload })
    }
}

/// One offered PSK (RFC 8446 4.2.11): a ticket, or a session id into a server-side store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PskIdentity {
    /// The ticket as the server issued it. Baton's tickets carry the key id and the issuing
    /// agent's id in the clear here, which is what session affinity routes on.
    pub identity: Vec<u8>,
    /// The ticket's age plus the server's `ticket_age_add`, mod 2^32.
    pub obfuscated_ticket_age: u32,
}

impl Codec for PskIdentity {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_bytes(out, Len::U16_NON_EMPTY, &self.identity);
        self.obfuscated_ticket_age.encode(out);
    }
    fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        let identity = read_vec(r, Len::U16_NON_EMPTY, "PSK identity")?.to_vec();
        let obfuscated_ticket_age = u32::read(r)?;
        Ok(Self {
            identity,
            obfuscated_ticket_age,
        })
    }
}

/// The pre_shared_key extension of a ClientHello: identities and one binder per identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferedPsks {
    /// The identities, in the client's order of preference.
    pub identities: Vec<PskIdentity>,
    /// The binders (HMACs over the truncated hello), one per identity, each 32..=255 bytes.
    pub binders: Vec<Vec<u8>>,
}

impl Codec for OfferedPsks {
    fn encode(&self, out: &mut Vec<u8>) {
        encode_list(out, Len::U16_NON_EMPTY, &self.identities);
        encode_vec(out, Len::U16_NON_EMPTY, |o| {
            self.binders
                .iter()
                .for_each(|b| encode_bytes(o, Len::U8_NON_EMPTY, b));
        });
    }
    fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        let identities = read_list(r, Len::U16_NON_EMPTY, "PSK identities")?;
        let mut sub = r.sub(Len::U16_NON_EMPTY, "PSK binders")?;
        let mut binders = Vec::new();
        while sub.any_left() {
            let binder = read_vec(&mut sub, Len::U8_NON_EMPTY, "PSK binder")?;
            if binder.len() < MIN_BINDER_LEN {
                return Err(Malformed::TooShort("PSK binder").into());
            }
            binders.push(binder.to_vec());
        }
        if binders.len() != identities.len() {
            return Err(Malformed::PskBinderCount {
                identities: identities.len(),
                binders: binders.len(),
            }
            .into());
        }
        Ok(Self {
            identities,
            binders,
        })
    }
}

/// A ClientHello extension: parsed if Baton routes on it, raw otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientExtension {
    /// server_name (SNI).
    ServerName(Vec<ServerName>),
    /// application_layer_protocol_negotiation: protocol names, e.g. `h2`, `http/1.1`.
    Alpn(Vec<Vec<u8>>),
    /// supported_versions: the versions the client offers (TLS 1.3 and later hellos).
    SupportedVersions(Vec<ProtocolVersion>),
    /// key_share: the shares the client already computed (may be empty).
    KeyShare(Vec<KeyShareEntry>),
    /// supported_groups.
    SupportedGroups(Vec<NamedGroup>),
    /// signature_algorithms.
    SignatureAlgorithms(Vec<SignatureScheme>),
    /// session_ticket (RFC 5077): empty to ask for a ticket, else a TLS 1.2 ticket to resume.
    SessionTicket(Vec<u8>),
    /// pre_shared_key: TLS 1.3 resumption; always the last extension.
    PreSharedKey(OfferedPsks),
    /// early_data: the client sends 0-RTT data after the hello.
    EarlyData,
    /// psk_key_exchange_modes.
    PskKeyExchangeModes(Vec<PskKeyExchangeMode>),
    /// Any other extension, as it came.
    Other {
        /// Its type; never one of the types parsed above.
        typ: ExtensionType,
        /// Its body.
        data: Vec<u8>,
    },
}

impl ClientExtension {
    /// The extension's type.
    pub fn typ(&self) -> ExtensionType {
        match self {
            Self::ServerName(_) => ExtensionType::SERVER_NAME,
            Self::Alpn(_) => ExtensionType::ALPN,
            Self::SupportedVersions(_) => ExtensionType::SUPPORTED_VERSIONS,
            Self::KeyShare(_) => ExtensionType::KEY_SHARE,
            Self::SupportedGroups(_) => ExtensionType::SUPPORTED_GROUPS,
            Self::SignatureAlgorithms(_) => ExtensionType::SIGNATURE_ALGORITHMS,
            Self::SessionTicket(_) => ExtensionType::SESSION_TICKET,
            Self::PreSharedKey(_) => ExtensionType::PRE_SHARED_KEY,
            Self::EarlyData => ExtensionType::EARLY_DATA,
            Self::PskKeyExchangeModes(_) => ExtensionType::PSK_KEY_EXCHANGE_MODES,
            Self::Other { typ, .. } => *typ,
        }
    }

    /// Whether extensions of this type are parsed into their own variant (and so are never
    /// [`Other`](Self::Other)).
    pub fn is_parsed(typ: ExtensionType) -> bool {
        PARSED.contains(&typ)
    }

    fn read_body(typ: ExtensionType, r: &mut Reader<'_>) -> Result<Self, Error> {
        Ok(match typ {
            ExtensionType::SERVER_NAME => {
                Self::ServerName(read_list(r, Len::U16_NON_EMPTY, "server_name")?)
            }
            ExtensionType::ALPN => {
                let mut sub = r.sub(Len::U16_NON_EMPTY, "ALPN")?;
                let mut protocols = Vec::new();
                while sub.any_left() {
                    protocols
                        .push(read_vec(&mut sub, Len::U8_NON_EMPTY, "ALPN protocol")?.to_vec());
                }
                Self::Alpn(protocols)
            }
            ExtensionType::SUPPORTED_VERSIONS => {
                Self::SupportedVersions(read_list(r, Len::U8_NON_EMPTY, "supported_versions")?)
            }
            ExtensionType::KEY_SHARE => Self::KeyShare(read_list(r, Len::U16, "key_share")?),
            ExtensionType::SUPPORTED_GROUPS => {
                Self::SupportedGroups(read_list(r, Len::U16_NON_EMPTY, "supported_groups")?)
            }
            ExtensionType::SIGNATURE_ALGORITHMS => {
                Self::SignatureAlgorithms(read_list(r, Len::U16_NON_EMPTY, "signature_algorithms")?)
            }
            ExtensionType::SESSION_TICKET => Self::SessionTicket(r.rest().to_vec()),
            ExtensionType::PRE_SHARED_KEY => Self::PreSharedKey(OfferedPsks::read(r)?),
            ExtensionType::EARLY_DATA => Self::EarlyData,
            ExtensionType::PSK_KEY_EXCHANGE_MODES => Self::PskKeyExchangeModes(read_list(
                r,
                Len::U8_NON_EMPTY,
                "psk_key_exchange_modes",
            )?),
            typ => Self::Other {
                typ,
                data: r.rest().to_vec(),
            },
        })
    }

    fn encode_body(&self, out: &mut Vec<u8>) {
        match self {
            Self::ServerName(names) => encode_list(out, Len::U16_NON_EMPTY, names),
            Self::Alpn(protocols) => encode_vec(out, Len::U16_NON_EMPTY, |o| {
                protocols
                    .iter()
                    .for_each(|p| encode_bytes(o, Len::U8_NON_EMPTY, p));
            }),
            Self::SupportedVersions(v) => encode_list(out, Len::U8_NON_EMPTY, v),
            Self::KeyShare(shares) => encode_list(out, Len::U16, shares),
            Self::SupportedGroups(g) => encode_list(out, Len::U16_NON_EMPTY, g),
            Self::SignatureAlgorithms(s) => encode_list(out, Len::U16_NON_EMPTY, s),
            Self::SessionTicket(t) => out.extend_from_slice(t),
            Self::PreSharedKey(psks) => psks.encode(out),
            Self::EarlyData => {}
            Self::PskKeyExchangeModes(m) => encode_list(out, Len::U8_NON_EMPTY, m),
            Self::Other { data, .. } => out.extend_from_slice(data),
        }
    }
}

const PARSED: [ExtensionType; 10] = [
    ExtensionType::SERVER_NAME,
    ExtensionType::ALPN,
    ExtensionType::SUPPORTED_VERSIONS,
    ExtensionType::KEY_SHARE,
    ExtensionType::SUPPORTED_GROUPS,
    ExtensionType::SIGNATURE_ALGORITHMS,
    ExtensionType::SESSION_TICKET,
    ExtensionType::PRE_SHARED_KEY,
    ExtensionType::EARLY_DATA,
    ExtensionType::PSK_KEY_EXCHANGE_MODES,
];

impl Codec for ClientExtension {
    fn encode(&self, out: &mut Vec<u8>) {
        self.typ().encode(out);
        encode_vec(out, Len::U16, |o| self.encode_body(o));
    }
    fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        let typ = ExtensionType::read(r)?;
        let mut body = r.sub(Len::U16, "extension")?;
        let ext = Self::read_body(typ, &mut body)?;
        body.expect_empty("extension")?;
        Ok(ext)
    }
}

/// Refuses a repeated extension type (RFC 8446 4.2) and, in a ClientHello, a pre_shared_key
/// that is not last (RFC 8446 4.2.11: its binders cover everything before it).
pub(crate) fn check_extensions(
    types: impl ExactSizeIterator<Item = ExtensionType>,
    psk_last: bool,
) -> Result<(), Error> {
    let count = types.len();
    let mut seen = HashSet::with_capacity(count);
    for (i, typ) in types.enumerate() {
        if !seen.insert(typ) {
            return Err(Malformed::DuplicateExtension(typ).into());
        }
        if psk_last && typ == ExtensionType::PRE_SHARED_KEY && i + 1 != count {
            return Err(Malformed::PskNotLast.into());
        }
    }
    Ok(())
}

/// A parsed ClientHello. Fields are public: tests build hellos field by field and encode them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello {
    /// `legacy_version`: 0x0303 from TLS 1.3 clients, who say what they offer in
    /// supported_versions; the highest version for older ones.
    pub legacy_version: ProtocolVersion,
    /// The client's 32 random bytes.
    pub random: [u8; 32],
    /// The legacy session id (0..=32 bytes): a TLS 1.2 session to resume, or in TLS 1.3 a
    /// random value for middlebox compatibility.
    pub session_id: Vec<u8>,
    /// Offered suites, in preference order, GREASE included.
    pub cipher_suites: Vec<CipherSuite>,
    /// Offered compression methods (`[NULL]` from any sane client).
    pub compression_methods: Vec<Compression>,
    /// Extensions in wire order. An empty list encodes as no extensions block at all.
    pub extensions: Vec<ClientExtension>,
}

impl Codec for ClientHello {
    fn encode(&self, out: &mut Vec<u8>) {
        self.legacy_version.encode(out);
        out.extend_from_slice(&self.random);
        encode_bytes(out, Len::U8, &self.session_id);
        encode_list(out, Len::U16_NON_EMPTY, &self.cipher_suites);
        encode_list(out, Len::U8_NON_EMPTY, &self.compression_methods);
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
        let cipher_suites = read_list(r, Len::U16_NON_EMPTY, "cipher suites")?;
        let compression_methods = read_list(r, Len::U8_NON_EMPTY, "compression methods")?;
        // TLS 1.2 allows a hello to end here (RFC 5246 7.4.1.2).
        let extensions: Vec<ClientExtension> = if r.any_left() {
            read_list(r, Len::U16, "extensions")?
        } else {
            Vec::new()
        };
        check_extensions(extensions.iter().map(ClientExtension::typ), true)?;
        Ok(Self {
            legacy_version,
            random,
            session_id: session_id.to_vec(),
            cipher_suites,
            compression_methods,
            extensions,
        })
    }
}

impl FirstMessage for ClientHello {
    const TYPE: HandshakeType = HandshakeType::CLIENT_HELLO;
    const NAME: &'static str = "ClientHello";
    const MESSAGE: &'static str = "ClientHello message";
    // a client's first flight: the widest-compatible legacy record version
    const RECORD_VERSION: ProtocolVersion = ProtocolVersion::TLSV1_0;
    const MAY_BE_FOLLOWED: bool = false;
}

impl ClientHello {
    /// The extension of type `typ`, if sent.
    pub fn extension(&self, typ: ExtensionType) -> Option<&ClientExtension> {
        self.extensions.iter().find(|e| e.typ() == typ)
    }

    /// The host name from SNI, if sent and valid UTF-8 (DNS names are ASCII).
    pub fn server_name(&self) -> Option<&str> {
        self.server_names()?
            .iter()
            .find(|n| n.typ == ServerNameType::HOST_NAME)
            .and_then(|n| std::str::from_utf8(&n.name).ok())
    }

    /// All entries of the server_name extension.
    pub fn server_names(&self) -> Option<&[ServerName]> {
        self.extensions.iter().find_map(|e| match e {
            ClientExtension::ServerName(n) => Some(&n[..]),
            _ => None,
        })
    }

    /// The ALPN protocol names offered.
    pub fn alpn_protocols(&self) -> Option<&[Vec<u8>]> {
        self.extensions.iter().find_map(|e| match e {
            ClientExtension::Alpn(p) => Some(&p[..]),
            _ => None,
        })
    }

    /// The supported_versions list.
    pub fn supported_versions(&self) -> Option<&[ProtocolVersion]> {
        self.extensions.iter().find_map(|e| match e {
            ClientExtension::SupportedVersions(v) => Some(&v[..]),
            _ => None,
        })
    }

    /// The key shares sent.
    pub fn key_shares(&self) -> Option<&[KeyShareEntry]> {
        self.extensions.iter().find_map(|e| match e {
            ClientExtension::KeyShare(k) => Some(&k[..]),
            _ => None,
        })
    }

    /// The groups of the key shares sent, with each share's length.
    pub fn key_share_groups(&self) -> impl Iterator<Item = (NamedGroup, usize)> + '_ {
        self.key_shares()
            .unwrap_or_default()
            .iter()
            .map(|k| (k.group, k.payload.len()))
    }

    /// The supported_groups list.
    pub fn supported_groups(&self) -> Option<&[NamedGroup]> {
        self.extensions.iter().find_map(|e| match e {
            ClientExtension::SupportedGroups(g) => Some(&g[..]),
            _ => None,
        })
    }

    /// The signature_algorithms list.
    pub fn signature_algorithms(&self) -> Option<&[SignatureScheme]> {
        self.extensions.iter().find_map(|e| match e {
            ClientExtension::SignatureAlgorithms(s) => Some(&s[..]),
            _ => None,
        })
    }

    /// The TLS 1.2 session_ticket extension's bytes: empty when the client asks for a ticket,
    /// the ticket when it resumes.
    pub fn session_ticket(&self) -> Option<&[u8]> {
        self.extensions.iter().find_map(|e| match e {
            ClientExtension::SessionTicket(t) => Some(&t[..]),
            _ => None,
        })
    }

    /// The TLS 1.3 PSKs offered for resumption.
    pub fn pre_shared_key(&self) -> Option<&OfferedPsks> {
        self.extensions.iter().find_map(|e| match e {
            ClientExtension::PreSharedKey(p) => Some(p),
            _ => None,
        })
    }

    /// The psk_key_exchange_modes list.
    pub fn psk_key_exchange_modes(&self) -> Option<&[PskKeyExchangeMode]> {
        self.extensions.iter().find_map(|e| match e {
            ClientExtension::PskKeyExchangeModes(m) => Some(&m[..]),
            _ => None,
        })
    }

    /// Whether the client will send 0-RTT data.
    pub fn early_data(&self) -> bool {
        self.extension(ExtensionType::EARLY_DATA).is_some()
    }

    /// Whether TLS 1.3 is among the offered versions.
    pub fn offers_tls13(&self) -> bool {
        self.supported_versions()
            .is_some_and(|v| v.contains(&ProtocolVersion::TLSV1_3))
    }

    /// The highest version offered: from supported_versions when it names any non-GREASE
    /// version (then `legacy_version` is to be ignored, RFC 8446 4.2.1), else `legacy_version`.
    pub fn max_version(&self) -> ProtocolVersion {
        self.supported_versions()
            .and_then(|v| v.iter().filter(|v| !v.is_grease()).max().copied())
            .unwrap_or(self.legacy_version)
    }
}

/// Sans-IO: peeks the ClientHello out of the first bytes a client sends (see [`MessageReader`]).
pub type HelloReader = MessageReader<ClientHello>;

#[cfg(test)]
#[path = "hello_test.rs"]
mod tests;
