//! What an HTTP/2 connection's frames say about it, followed from its plaintext bytes each way
//! without decoding them (hyper does that): which streams the client opened that the agent has
//! not finished answering, whether a request head is part-way in, and how many open streams
//! the client cancelled. Frame headers only (9 bytes, RFC 9113 section 4.1); payloads are
//! skipped, so nothing is buffered.
//!
//! A *pending unit* is what must arrive whole within `--header-timeout`: the client preface, a
//! header block (a HEADERS frame and its CONTINUATIONs, which nothing may interleave) or any
//! other frame but DATA (control frames are a few bytes; a request body is bounded like an
//! HTTP/1.1 body, by the idle timeout). It is pending from its first byte to its last.

use std::collections::BTreeSet;

use tokio::time::Instant;

/// What a client sends first (RFC 9113 section 3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// Open streams followed at most. hyper refuses streams past `--h2-max-streams`, so more are
/// open only briefly (read, not yet refused); past this a new one is not followed.
const OPEN_MAX: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FrameHead {
    kind: u8,
    flags: u8,
    stream: u32,
}

/// A boundary in the bytes, at an offset into what was fed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Edge {
    /// The first byte of the preface or of a frame.
    Start,
    /// A frame's 9-byte head is complete.
    Head(FrameHead),
    /// The last byte of a frame (`None`: of the preface).
    End(Option<FrameHead>),
}

/// Frame boundaries in one direction.
#[derive(Debug, Default)]
struct Splitter {
    /// Preface bytes still to come (reads only).
    preface: usize,
    head: [u8; 9],
    /// Bytes of `head` received.
    have: usize,
    /// The frame whose payload is being received, and how much of it is left.
    current: Option<FrameHead>,
    left: u32,
}

impl Splitter {
    /// Feeds `bytes`, telling `on` each edge in them with its offset. `Err` if they are not
    /// HTTP/2 (a bad preface).
    fn feed(&mut self, bytes: &[u8], mut on: impl FnMut(Edge, usize)) -> Result<(), ()> {
        let mut at = 0;
        while at < bytes.len() {
            let rest = &bytes[at..];
            if self.preface > 0 {
                let n = self.preface.min(rest.len());
                let from = PREFACE.len() - self.preface;
                if rest[..n] != PREFACE[from..from + n] {
                    return Err(());
                }
                if from == 0 {
                    on(Edge::Start, at);
                }
                self.preface -= n;
                at += n;
                if self.preface == 0 {
                    on(Edge::End(None), at);
                }
            } else if let Some(frame) = self.current {
                let n = (self.left as usize).min(rest.len());
                self.left -= n as u32;
                at += n;
                if self.left == 0 {
                    self.current = None;
                    on(Edge::End(Some(frame)), at);
                }
            } else {
                if self.have == 0 {
                    on(Edge::Start, at);
                }
                let n = (9 - self.have).min(rest.len());
                self.head[self.have..self.have + n].copy_from_slice(&rest[..n]);
                self.have += n;
                at += n;
                if self.have == 9 {
                    self.have = 0;
                    let h = self.head;
                    let frame = FrameHead {
                        kind: h[3],
                        flags: h[4],
                        stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
                    };
                    on(Edge::Head(frame), at);
                    match u32::from_be_bytes([0, h[0], h[1], h[2]]) {
                        0 => on(Edge::End(Some(frame)), at),
                        len => {
                            self.current = Some(frame);
                            self.left = len;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// One HTTP/2 connection's frames, followed both ways.
#[derive(Debug)]
pub struct H2Frames {
    reads: Splitter,
    writes: Splitter,
    /// Streams the client opened whose response the agent has not ended.
    open: BTreeSet<u32>,
    /// The highest stream the client opened (a HEADERS frame on a stream at or below it is a
    /// trailer block, not a new request).
    last_stream: u32,
    /// A header block's HEADERS frame came without END_HEADERS: CONTINUATIONs follow.
    in_block: bool,
    /// The unit part-way in after the last read: since when, and its bytes so far.
    pending: Option<(Instant, u64)>,
    /// When the last open stream ended (or following began).
    quiet_since: Instant,
    /// Set when the bytes stopped looking like HTTP/2: nothing more is followed (hyper ends
    /// such a connection itself).
    lost: bool,
}

/// What one read brought.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    /// Open streams the client reset (RST_STREAM) before their response ended.
    pub cancelled: u32,
}

impl H2Frames {
    /// Follows a connection from its first byte each way (the client's preface first).
    pub fn new(now: Instant) -> Self {
        H2Frames {
            reads: Splitter {
                preface: PREFACE.len(),
                ..Splitter::default()
            },
            writes: Splitter::default(),
            open: BTreeSet::new(),
            last_stream: 0,
            in_block: false,
            pending: None,
            quiet_since: now,
            lost: false,
        }
    }

    /// Follows bytes read from the client, at `now`.
    pub fn read(&mut self, bytes: &[u8], now: Instant) -> Read {
        let mut read = Read::default();
        if self.lost || bytes.is_empty() {
            return read;
        }
        let mut pending = self.pending.is_some();
        // where the unit under way began in these bytes (`None`: before them)
        let mut began = None;
        let (open, last_stream, in_block) =
            (&mut self.open, &mut self.last_stream, &mut self.in_block);
        let fed = self.reads.feed(bytes, |edge, at| match edge {
            Edge::Start if !pending => {
                pending = true;
                began = Some(at);
            }
            Edge::Start => {}
            Edge::Head(f) => match f.kind {
                // a body: bounded as a body, not as a head
                DATA if !*in_block => pending = false,
                HEADERS if f.stream > *last_stream && f.stream % 2 == 1 => {
                    *last_stream = f.stream;
                    if open.len() < OPEN_MAX {
                        open.insert(f.stream);
                    }
                }
                RST_STREAM if open.remove(&f.stream) => read.cancelled += 1,
                _ => {}
            },
            Edge::End(f) => {
                match f {
                    Some(f) if f.kind == HEADERS => *in_block = f.flags & END_HEADERS == 0,
                    Some(f) if f.kind == CONTINUATION && f.flags & END_HEADERS != 0 => {
                        *in_block = false
                    }
                    _ => {}
                }
                pending = *in_block;
            }
        });
        if fed.is_err() {
            self.lost = true;
            self.pending = None;
            return read;
        }
        if read.cancelled > 0 && self.open.is_empty() {
            self.quiet_since = now;
        }
        let len = bytes.len() as u64;
        self.pending = match (pending, began, self.pending) {
            (false, _, _) => None,
            (true, Some(at), _) => Some((now, len - at as u64)),
            (true, None, Some((since, n))) => Some((since, n + len)),
            (true, None, None) => Some((now, len)), // not reached: a unit begins at a Start
        };
        read
    }

    /// Follows bytes written to the client, at `now`; `true` if they ended the last open
    /// stream (the connection is quiet from now).
    pub fn wrote(&mut self, bytes: &[u8], now: Instant) -> bool {
        if self.lost || bytes.is_empty() {
            return false;
        }
        let was_open = !self.open.is_empty();
        let open = &mut self.open;
        let fed = self.writes.feed(bytes, |edge, _| {
            let Edge::Head(f) = edge else { return };
            let ends = match f.kind {
                HEADERS | DATA => f.flags & END_STREAM != 0,
                RST_STREAM => true,
                _ => false,
            };
            if ends {
                open.remove(&f.stream);
            }
        });
        if fed.is_err() {
            self.lost = true;
            self.pending = None;
            return false;
        }
        let quiet = was_open && self.open.is_empty();
        if quiet {
            self.quiet_since = now;
        }
        quiet
    }

    /// The unit that must complete within `--header-timeout`, if one is part-way in: since
    /// when, and its bytes so far.
    pub fn pending(&self) -> Option<(Instant, u64)> {
        self.pending
    }

    /// Streams the client opened that the agent has not finished answering.
    pub fn open_streams(&self) -> usize {
        self.open.len()
    }

    /// When the connection last had no open stream (meaningful while it has none).
    pub fn quiet_since(&self) -> Instant {
        self.quiet_since
    }

    /// Whether the bytes stopped looking like HTTP/2 (nothing is followed any more).
    pub fn lost(&self) -> bool {
        self.lost
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::Duration;

    /// A frame's bytes: 9-byte head, then `len` zero bytes of payload.
    pub(crate) fn frame(kind: u8, flags: u8, stream: u32, len: usize) -> Vec<u8> {
        let l = (len as u32).to_be_bytes();
        let mut f = vec![l[1], l[2], l[3], kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.resize(9 + len, 0);
        f
    }

    /// A client's opening: preface and an empty SETTINGS.
    pub(crate) fn opening() -> Vec<u8> {
        [PREFACE.as_slice(), &frame(0x4, 0, 0, 0)].concat()
    }

    pub(crate) fn request(stream: u32) -> Vec<u8> {
        frame(HEADERS, END_HEADERS | END_STREAM, stream, 20)
    }

    fn response(stream: u32) -> Vec<u8> {
        [
            frame(HEADERS, END_HEADERS, stream, 10),
            frame(DATA, END_STREAM, stream, 100),
        ]
        .concat()
    }

    #[tokio::test(start_paused = true)]
    async fn requests_open_streams_and_responses_end_them() {
        let t0 = Instant::now();
        let mut f = H2Frames::new(t0);
        f.read(&[opening(), request(1), request(3)].concat(), t0);
        assert_eq!(f.open_streams(), 2);
        assert_eq!(f.pending(), None);
        // a trailer block on an open stream opens nothing
        f.read(&frame(HEADERS, END_HEADERS | END_STREAM, 1, 5), t0);
        assert_eq!(f.open_streams(), 2);
        let t1 = t0 + Duration::from_secs(1);
        // server SETTINGS and a response's head: still open
        assert!(!f.wrote(
            &[frame(0x4, 0, 0, 6), frame(HEADERS, END_HEADERS, 1, 10)].concat(),
            t1
        ));
        assert!(!f.wrote(&frame(DATA, END_STREAM, 1, 50), t1));
        assert_eq!(f.open_streams(), 1);
        // the last one ends in a write split anywhere
        let r = response(3);
        assert!(!f.wrote(&r[..12], t1));
        assert!(f.wrote(&r[12..], t1));
        assert_eq!((f.open_streams(), f.quiet_since()), (0, t1));
        // an agent's RST_STREAM ends a stream too
        f.read(&request(5), t1);
        assert!(f.wrote(&frame(RST_STREAM, 0, 5, 4), t1));
        assert!(!f.lost());
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickled_head_is_pending_from_its_first_byte() {
        let t0 = Instant::now();
        let mut f = H2Frames::new(t0);
        f.read(&opening(), t0);
        let head = request(1);
        let mut t = t0;
        for (i, b) in head.iter().enumerate() {
            t += Duration::from_secs(1);
            f.read(&[*b], t);
            if i + 1 < head.len() {
                assert_eq!(
                    f.pending(),
                    Some((t0 + Duration::from_secs(1), i as u64 + 1))
                );
            }
        }
        assert_eq!(f.pending(), None);
        assert_eq!(f.open_streams(), 1);

        // a head that begins at the end of a read with other frames before it
        let mut f = H2Frames::new(t0);
        let bytes = [opening(), request(1), request(3)[..5].to_vec()].concat();
        f.read(&bytes, t0);
        assert_eq!(f.pending(), Some((t0, 5)));
        f.read(&request(3)[5..7], t);
        assert_eq!(f.pending(), Some((t0, 7)));
    }

    #[tokio::test(start_paused = true)]
    async fn header_blocks_span_continuations_and_data_is_not_a_head() {
        let t0 = Instant::now();
        let mut f = H2Frames::new(t0);
        f.read(&opening(), t0);
        // HEADERS without END_HEADERS: pending until the CONTINUATION that ends the block
        f.read(&frame(HEADERS, 0, 1, 8), t0);
        assert_eq!(f.pending(), Some((t0, 17)));
        f.read(&frame(CONTINUATION, 0, 1, 8), t0);
        assert!(f.pending().is_some());
        f.read(&frame(CONTINUATION, END_HEADERS, 1, 8), t0);
        assert_eq!(f.pending(), None);
        // a DATA frame part-way in is a body: not pending, once its type is known
        let data = frame(DATA, 0, 1, 1000);
        f.read(&data[..3], t0);
        assert!(f.pending().is_some(), "type not known yet");
        f.read(&data[3..500], t0);
        assert_eq!(f.pending(), None);
        f.read(&data[500..], t0);
        // a control frame part-way in is bounded like a head
        let ping = frame(0x6, 0, 0, 8);
        f.read(&ping[..10], t0);
        assert_eq!(f.pending(), Some((t0, 10)));
        f.read(&ping[10..], t0);
        assert_eq!(f.pending(), None);
        // as is a trickled preface
        let mut f = H2Frames::new(t0);
        f.read(&PREFACE[..3], t0);
        assert_eq!(f.pending(), Some((t0, 3)));
    }

    #[tokio::test(start_paused = true)]
    async fn resets_count_only_streams_still_open() {
        let t0 = Instant::now();
        let mut f = H2Frames::new(t0);
        f.read(&opening(), t0);
        // the rapid-reset pattern: a request and its cancel, in one read
        let mut burst = Vec::new();
        for s in (1..=19).step_by(2) {
            burst.extend(request(s));
            burst.extend(frame(RST_STREAM, 0, s, 4));
        }
        assert_eq!(f.read(&burst, t0).cancelled, 10);
        assert_eq!(f.open_streams(), 0);
        // a reset after the response ended, or of a stream never opened, cancels nothing
        f.read(&request(21), t0);
        f.wrote(&response(21), t0);
        assert_eq!(f.read(&frame(RST_STREAM, 0, 21, 4), t0).cancelled, 0);
        assert_eq!(f.read(&frame(RST_STREAM, 0, 99, 4), t0).cancelled, 0);
        // a reset frame split over reads counts once, when its head is in
        let rst = frame(RST_STREAM, 0, 23, 4);
        f.read(&request(23), t0);
        assert_eq!(f.read(&rst[..6], t0).cancelled, 0);
        assert_eq!(f.read(&rst[6..], t0).cancelled, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_that_are_not_http2_stop_the_following() {
        let t0 = Instant::now();
        let mut f = H2Frames::new(t0);
        f.read(b"GET / HTTP/1.1\r\n", t0);
        assert!(f.lost());
        assert_eq!(f.pending(), None);
        assert_eq!(f.read(&frame(RST_STREAM, 0, 1, 4), t0).cancelled, 0);
    }
}
