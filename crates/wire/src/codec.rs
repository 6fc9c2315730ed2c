//! The building blocks of TLS encoding, in the style of rustls' `msgs/codec.rs`: a [`Reader`]
//! that never reads past its slice and can refuse trailing bytes, a [`Codec`] trait for types
//! with one wire form, and length-prefixed vectors whose prefix rule is a named [`Len`], so a
//! field's width and "may it be empty" are written once, next to the field, and cannot be
//! forgotten at a call site.

use crate::error::{Error, Malformed};

/// A cursor over a byte slice. Every read is bounds-checked and fails with
/// [`Error::Truncated`] instead of panicking.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    used: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, used: 0 }
    }

    /// The next `n` bytes, or `Truncated(what)` if there are fewer.
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Error> {
        let end = self.used.checked_add(n).ok_or(Error::Truncated(what))?;
        let bytes = self.buf.get(self.used..end).ok_or(Error::Truncated(what))?;
        self.used = end;
        Ok(bytes)
    }

    /// The next `N` bytes as an array.
    pub fn take_array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], Error> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    /// Everything not read yet (and marks it read).
    pub fn rest(&mut self) -> &'a [u8] {
        let rest = self.buf.get(self.used..).unwrap_or_default();
        self.used = self.buf.len();
        rest
    }

    /// Bytes not read yet.
    pub fn left(&self) -> usize {
        self.buf.len().saturating_sub(self.used)
    }

    /// Whether anything is left.
    pub fn any_left(&self) -> bool {
        self.left() > 0
    }

    /// Bytes read so far.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Succeeds only if everything was read: a length that covers more than its contents is a
    /// malformed message, not padding to skip.
    pub fn expect_empty(&self, what: &'static str) -> Result<(), Error> {
        if self.any_left() {
            return Err(Malformed::TrailingBytes(what).into());
        }
        Ok(())
    }

    /// A reader over the next length-prefixed vector (prefix rule `len`), advancing past it.
    pub fn sub(&mut self, len: Len, what: &'static str) -> Result<Reader<'a>, Error> {
        read_vec(self, len, what).map(Reader::new)
    }
}

/// A type with exactly one wire form.
pub trait Codec: Sized {
    /// Appends the wire form.
    fn encode(&self, out: &mut Vec<u8>);

    /// Reads one value from `r`.
    fn read(r: &mut Reader<'_>) -> Result<Self, Error>;

    /// Reads one value that must fill `bytes` exactly.
    fn read_bytes(bytes: &[u8]) -> Result<Self, Error> {
        let mut r = Reader::new(bytes);
        let v = Self::read(&mut r)?;
        r.expect_empty(std::any::type_name::<Self>())?;
        Ok(v)
    }

    /// The wire form as a new vector.
    fn get_encoding(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }
}

impl Codec for u8 {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(*self);
    }
    fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        let [b] = r.take_array::<1>("u8")?;
        Ok(b)
    }
}

impl Codec for u16 {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_be_bytes());
    }
    fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        Ok(u16::from_be_bytes(r.take_array("u16")?))
    }
}

impl Codec for u32 {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_be_bytes());
    }
    fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        Ok(u32::from_be_bytes(r.take_array("u32")?))
    }
}

impl Codec for u64 {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_be_bytes());
    }
    fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        Ok(u64::from_be_bytes(r.take_array("u64")?))
    }
}

/// A socket address: `4 | ip[4] | port u16` or `6 | ip[16] | port u16` (the link's stream
/// metadata, a hot restart's connection hand-over).
impl Codec for std::net::SocketAddr {
    fn encode(&self, out: &mut Vec<u8>) {
        match self.ip() {
            std::net::IpAddr::V4(ip) => {
                out.push(4);
                out.extend_from_slice(&ip.octets());
            }
            std::net::IpAddr::V6(ip) => {
                out.push(6);
                out.extend_from_slice(&ip.octets());
            }
        }
        self.port().encode(out);
    }
    fn read(r: &mut Reader<'_>) -> Result<Self, Error> {
        let ip = match u8::read(r)? {
            4 => std::net::IpAddr::from(r.take_array::<4>("ipv4 address")?),
            6 => std::net::IpAddr::from(r.take_array::<16>("ipv6 address")?),
            _ => return Err(Malformed::Unknown("address family").into()),
        };
        Ok(Self::new(ip, u16::read(r)?))
    }
}

/// Reads a 24-bit big-endian integer (handshake message lengths).
pub fn read_u24(r: &mut Reader<'_>) -> Result<usize, Error> {
    let [a, b, c] = r.take_array::<3>("u24")?;
    Ok(usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c))
}

/// Appends a 24-bit big-endian integer; only the low 24 bits of `v` are written.
pub fn encode_u24(v: usize, out: &mut Vec<u8>) {
    out.extend_from_slice(&[(v >> 16) as u8, (v >> 8) as u8, v as u8]);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Width {
    U8,
    U16,
    U24,
    U32,
}

impl Width {
    const fn bytes(self) -> usize {
        match self {
            Width::U8 => 1,
            Width::U16 => 2,
            Width::U24 => 3,
            Width::U32 => 4,
        }
    }

    const fn max(self) -> usize {
        match self {
            Width::U8 => 0xff,
            Width::U16 => 0xffff,
            Width::U24 => 0xff_ffff,
            Width::U32 => u32::MAX as usize,
        }
    }
}

/// The rule of a vector's length prefix: its width, whether the vector may be empty
/// (RFC 8446 3.4 writes these as `<0..2^16-1>` versus `<1..2^16-1>`), and optionally a limit
/// below what the width can say (`<0..MAX_MESSAGE>`), checked before the body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Len {
    width: Width,
    non_empty: bool,
    max: usize,
}

impl Len {
    /// `<0..2^8-1>`
    pub const U8: Len = Len::new(Width::U8, false);
    /// `<1..2^8-1>`
    pub const U8_NON_EMPTY: Len = Len::new(Width::U8, true);
    /// `<0..2^16-1>`
    pub const U16: Len = Len::new(Width::U16, false);
    /// `<1..2^16-1>`
    pub const U16_NON_EMPTY: Len = Len::new(Width::U16, true);
    /// `<0..2^24-1>`
    pub const U24: Len = Len::new(Width::U24, false);
    /// `<1..2^24-1>`
    pub const U24_NON_EMPTY: Len = Len::new(Width::U24, true);
    /// `<0..2^32-1>`
    pub const U32: Len = Len::new(Width::U32, false);
    /// `<1..2^32-1>`
    pub const U32_NON_EMPTY: Len = Len::new(Width::U32, true);

    const fn new(width: Width, non_empty: bool) -> Len {
        Len {
            width,
            non_empty,
            max: width.max(),
        }
    }

    /// The same prefix, but a reader refuses a vector longer than `max` with
    /// [`Error::TooLarge`] before reading (or allocating for) its body. Writers keep within it
    /// themselves: a format may cut a field to its limit, or refuse to write it.
    pub const fn at_most(self, max: usize) -> Len {
        Len {
            max: if max < self.max { max } else { self.max },
            ..self
        }
    }

    /// The longest vector a reader accepts under this rule.
    pub const fn max(self) -> usize {
        self.max
    }
}

/// The bytes of the next length-prefixed vector.
pub fn read_vec<'a>(r: &mut Reader<'a>, len: Len, what: &'static str) -> Result<&'a [u8], Error> {
    let n = match len.width {
        Width::U8 => usize::from(u8::read(r)?),
        Width::U16 => usize::from(u16::read(r)?),
        Width::U24 => read_u24(r)?,
        // A length usize cannot hold is more than any slice has: the take below fails.
        Width::U32 => usize::try_from(u32::read(r)?).unwrap_or(usize::MAX),
    };
    if n == 0 && len.non_empty {
        return Err(Malformed::Empty(what).into());
    }
    if n > len.max {
        return Err(Error::TooLarge {
            what,
            len: n,
            max: len.max,
        });
    }
    r.take(n, what)
}

/// The items of the next length-prefixed vector of `T`; the items must fill it exactly.
pub fn read_list<T: Codec>(
    r: &mut Reader<'_>,
    len: Len,
    what: &'static str,
) -> Result<Vec<T>, Error> {
    let mut sub = r.sub(len, what)?;
    let mut items = Vec::new();
    while sub.any_left() {
        items.push(T::read(&mut sub).map_err(|e| match e {
            Error::Truncated(_) => Malformed::Ragged(what).into(),
            other => other,
        })?);
    }
    Ok(items)
}

/// Appends a vector with prefix rule `len` whose body `body` writes. A body longer than the
/// prefix can describe is a bug of the caller (the parser would refuse the result).
pub fn encode_vec(out: &mut Vec<u8>, len: Len, body: impl FnOnce(&mut Vec<u8>)) {
    let at = out.len();
    let width = len.width.bytes();
    out.resize(at + width, 0);
    body(out);
    let n = out.len() - at - width;
    debug_assert!(
        n <= len.width.max(),
        "vector of {n} bytes under a prefix of max {}",
        len.width.max()
    );
    let prefix = (n as u32).to_be_bytes();
    if let (Some(dst), Some(src)) = (out.get_mut(at..at + width), prefix.get(4 - width..)) {
        dst.copy_from_slice(src);
    }
}

/// Appends `bytes` as a vector with prefix rule `len`.
pub fn encode_bytes(out: &mut Vec<u8>, len: Len, bytes: &[u8]) {
    encode_vec(out, len, |o| o.extend_from_slice(bytes));
}

/// Appends `items` as a vector with prefix rule `len`.
pub fn encode_list<T: Codec>(out: &mut Vec<u8>, len: Len, items: &[T]) {
    encode_vec(out, len, |o| items.iter().for_each(|i| i.encode(o)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_refuses_to_read_past_the_end() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(u16::read(&mut r), Ok(0x0102));
        assert_eq!(u16::read(&mut r), Err(Error::Truncated("u16")));
        assert_eq!(r.take(usize::MAX, "huge"), Err(Error::Truncated("huge")));
        assert_eq!(r.left(), 1);
    }

    #[test]
    fn read_bytes_refuses_trailing_bytes() {
        assert_eq!(u16::read_bytes(&[0, 1]), Ok(1));
        assert!(matches!(
            u16::read_bytes(&[0, 1, 2]),
            Err(Error::Malformed(Malformed::TrailingBytes(_)))
        ));
    }

    #[test]
    fn non_empty_prefix_refuses_empty_vectors() {
        let mut r = Reader::new(&[0, 0]);
        assert_eq!(
            read_vec(&mut r, Len::U16_NON_EMPTY, "x"),
            Err(Malformed::Empty("x").into())
        );
        let mut r = Reader::new(&[0, 0]);
        assert_eq!(read_vec(&mut r, Len::U16, "x"), Ok(&[][..]));
    }

    #[test]
    fn lists_of_fixed_items_must_not_be_ragged() {
        let mut r = Reader::new(&[3, 0, 1, 2]);
        assert_eq!(
            read_list::<u16>(&mut r, Len::U8, "l"),
            Err(Malformed::Ragged("l").into())
        );
        let mut r = Reader::new(&[4, 0, 1, 0, 2]);
        assert_eq!(read_list::<u16>(&mut r, Len::U8, "l"), Ok(vec![1, 2]));
    }

    #[test]
    fn encode_writes_each_prefix_width() {
        for (len, prefix) in [
            (Len::U8, &[2][..]),
            (Len::U16, &[0, 2]),
            (Len::U24, &[0, 0, 2]),
            (Len::U32, &[0, 0, 0, 2]),
        ] {
            let mut out = Vec::new();
            encode_bytes(&mut out, len, &[7, 8]);
            assert_eq!(&out[..prefix.len()], prefix);
            let mut r = Reader::new(&out);
            assert_eq!(read_vec(&mut r, len, "v"), Ok(&[7, 8][..]));
            assert!(!r.any_left());
        }
    }

    #[test]
    fn u24_round_trips() {
        let mut out = Vec::new();
        encode_u24(0x01_02_03, &mut out);
        assert_eq!(out, [1, 2, 3]);
        assert_eq!(read_u24(&mut Reader::new(&out)), Ok(0x01_02_03));
    }

    #[test]
    fn u64_round_trips_big_endian() {
        let v = 0x0102_0304_0506_0708u64;
        assert_eq!(v.get_encoding(), [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(u64::read_bytes(&v.get_encoding()), Ok(v));
        assert_eq!(
            u64::read(&mut Reader::new(&[0; 7])),
            Err(Error::Truncated("u64"))
        );
    }

    #[test]
    fn u32_prefixes_read_and_refuse_like_the_others() {
        let mut r = Reader::new(&[0, 0, 0, 0]);
        assert_eq!(
            read_vec(&mut r, Len::U32_NON_EMPTY, "x"),
            Err(Malformed::Empty("x").into())
        );
        let mut r = Reader::new(&[0xff, 0xff, 0xff, 0xff, 1]);
        assert_eq!(read_vec(&mut r, Len::U32, "x"), Err(Error::Truncated("x")));
        assert_eq!(Len::U32.max(), u32::MAX as usize);
    }

    #[test]
    fn a_capped_prefix_refuses_long_vectors_before_their_body() {
        const CAPPED: Len = Len::U16.at_most(3);
        assert_eq!(CAPPED.max(), 3);
        assert_eq!(Len::U8.at_most(1000).max(), 0xff, "no cap above the width");
        let mut r = Reader::new(&[0, 3, 7, 8, 9]);
        assert_eq!(read_vec(&mut r, CAPPED, "v"), Ok(&[7, 8, 9][..]));
        // only the prefix is there: the refusal comes before the missing body
        let mut r = Reader::new(&[0, 4]);
        assert_eq!(
            read_vec(&mut r, CAPPED, "v"),
            Err(Error::TooLarge {
                what: "v",
                len: 4,
                max: 3
            })
        );
    }
}
