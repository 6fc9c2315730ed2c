//! The client side of HTTP/1.1, sans-IO: just enough to know where a response ends (status,
//! Content-Length, chunked, or close-delimited) without buffering its body.

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Length(u64),
    Chunked,
    /// Read until the server closes.
    Close,
}

/// A parsed response head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    pub len: usize,
    pub framing: Framing,
    /// The server will close after this response.
    pub close: bool,
}

/// Longest response head accepted.
pub const MAX_HEAD: usize = 64 * 1024;

impl Head {
    /// A 1xx response other than 101: informational, the final response follows.
    pub fn interim(&self) -> bool {
        (100..200).contains(&self.status) && self.status != 101
    }
}

/// `Ok(None)`: incomplete. `Err`: not an HTTP/1.x response.
pub fn parse_head(buf: &[u8], head_request: bool) -> Result<Option<Head>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            return Err("response head too large".into())
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("bad response: {e}")),
    };
    let status = resp.code.ok_or("no status")?;
    let mut framing = Framing::Close;
    let mut close = resp.version == Some(0);
    for h in resp.headers.iter() {
        let value = std::str::from_utf8(h.value).unwrap_or("").trim();
        if h.name.eq_ignore_ascii_case("content-length") {
            if framing != Framing::Chunked {
                framing = Framing::Length(value.parse().map_err(|_| "bad Content-Length")?);
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if value.to_ascii_lowercase().ends_with("chunked") {
                framing = Framing::Chunked;
            }
        } else if h.name.eq_ignore_ascii_case("connection") {
            let v = value.to_ascii_lowercase();
            if v.contains("close") {
                close = true;
            } else if v.contains("keep-alive") {
                close = false;
            }
        }
    }
    // No body: HEAD, 1xx, 204, 304.
    if head_request || status == 204 || status == 304 || (100..200).contains(&status) {
        framing = Framing::Length(0);
    }
    if framing == Framing::Close {
        close = true;
    }
    Ok(Some(Head {
        status,
        len,
        framing,
        close,
    }))
}

/// Chunked transfer coding, consumed without keeping the data.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Chunked {
    state: ChunkState,
    size: u64,
    line: u16,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    #[default]
    Size,
    SizeExt,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    Trailer,
    TrailerLf,
    Done,
}

impl Chunked {
    /// Consumes body bytes; returns how many belonged to the body (the rest, if any, follows
    /// it) and whether the body is complete.
    pub fn push(&mut self, mut input: &[u8]) -> Result<(usize, bool), String> {
        use ChunkState::*;
        let total = input.len();
        while !input.is_empty() && self.state != Done {
            let b = input[0];
            let mut used = 1;
            self.state = match self.state {
                Size => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        let d = (b as char).to_digit(16).unwrap_or(0) as u64;
                        self.size = self
                            .size
                            .checked_mul(16)
                            .and_then(|s| s.checked_add(d))
                            .ok_or("chunk size overflow")?;
                        Size
                    }
                    b';' | b' ' | b'\t' => SizeExt,
                    b'\r' => SizeLf,
                    _ => return Err("bad chunk size".into()),
                },
                SizeExt => match b {
                    b'\r' => SizeLf,
                    _ => {
                        self.line += 1;
                        if self.line > 4096 {
                            return Err("chunk extension too long".into());
                        }
                        SizeExt
                    }
                },
                SizeLf if b == b'\n' => {
                    self.line = 0;
                    if self.size == 0 {
                        Trailer
                    } else {
                        Data
                    }
                }
                Data => {
                    let n = (input.len() as u64).min(self.size) as usize;
                    used = n;
                    self.size -= n as u64;
                    if self.size == 0 {
                        DataCr
                    } else {
                        Data
                    }
                }
                DataCr if b == b'\r' => DataLf,
                DataLf if b == b'\n' => Size,
                Trailer => match b {
                    b'\r' if self.line == 0 => TrailerLf,
                    b'\n' => {
                        self.line = 0;
                        Trailer
                    }
                    _ => {
                        self.line += 1;
                        if self.line > 4096 {
                            return Err("trailer line too long".into());
                        }
                        Trailer
                    }
                },
                TrailerLf if b == b'\n' => Done,
                _ => return Err("bad chunked body".into()),
            };
            input = &input[used..];
        }
        Ok((total - input.len(), self.state == Done))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads() {
        let h = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", false)
            .unwrap()
            .unwrap();
        assert_eq!(
            (h.status, h.framing, h.close, h.len),
            (200, Framing::Length(5), false, 38)
        );
        let h = parse_head(b"HTTP/1.0 200 ok\r\nContent-type: text/html\r\n\r\n", false)
            .unwrap()
            .unwrap();
        assert_eq!((h.framing, h.close), (Framing::Close, true));
        let h = parse_head(
            b"HTTP/1.1 404 NF\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (h.status, h.framing, h.close),
            (404, Framing::Chunked, true)
        );
        assert_eq!(
            parse_head(b"HTTP/1.1 200 OK\r\nContent-Le", false),
            Ok(None)
        );
        assert!(parse_head(b"SSH-2.0-OpenSSH\r\n\r\n", false).is_err());
        assert_eq!(
            parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", true)
                .unwrap()
                .unwrap()
                .framing,
            Framing::Length(0)
        );
    }

    #[test]
    fn interim_responses() {
        let h = |s: &[u8]| parse_head(s, false).unwrap().unwrap();
        assert!(h(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n").interim());
        assert!(h(b"HTTP/1.1 100 Continue\r\n\r\n").interim());
        assert!(!h(b"HTTP/1.1 101 Switching\r\n\r\n").interim());
        assert!(!h(b"HTTP/1.1 204 No Content\r\n\r\n").interim());
    }

    proptest::proptest! {
        /// Whatever a server sends, the parsers answer; they never panic.
        #[test]
        fn any_bytes_are_answered(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2048), head in proptest::bool::ANY) {
            let _ = parse_head(&bytes, head);
            let mut c = Chunked::default();
            if let Ok((used, _)) = c.push(&bytes) {
                proptest::prop_assert!(used <= bytes.len());
            }
        }

        /// A chunked body cut anywhere, in any chunk sizes, ends exactly where it ends.
        #[test]
        fn chunked_any_sizes_any_cut(sizes in proptest::collection::vec(1usize..300, 0..8), cut in 0usize..4000) {
            let mut body = Vec::new();
            for n in &sizes {
                body.extend(format!("{n:x}\r\n").bytes());
                body.extend(std::iter::repeat_n(b'x', *n));
                body.extend(b"\r\n");
            }
            body.extend(b"0\r\n\r\n");
            let len = body.len();
            body.extend(b"HTTP/1.1 200 OK\r\n");
            let cut = cut.min(len);
            let mut c = Chunked::default();
            let (a, done) = c.push(&body[..cut]).unwrap();
            let (b, done) = if done { (0, true) } else { c.push(&body[a..]).unwrap() };
            proptest::prop_assert!(done);
            proptest::prop_assert_eq!(a + b, len);
        }
    }

    #[test]
    fn chunked_in_any_split() {
        let body = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        for split in 1..body.len() {
            let mut c = Chunked::default();
            let (a, done_a) = c.push(&body[..split]).unwrap();
            assert_eq!(a, split.min(body.len() - 4));
            let (b, done) = if done_a {
                (0, true)
            } else {
                c.push(&body[split..]).unwrap()
            };
            assert!(done, "split {split}");
            assert_eq!(a + b, body.len() - 4);
        }
        assert!(Chunked::default().push(b"zz\r\n").is_err());
    }

    #[test]
    fn endless_trailer_line_is_an_error_not_an_overflow() {
        let mut c = Chunked::default();
        assert!(c.push(b"0\r\nX-T: ").is_ok());
        assert!(c.push(&[b'a'; 70_000]).is_err());
    }
}
