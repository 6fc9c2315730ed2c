//! The relay floors' link frames (`relay_floor.rs`, `tokio_relay_floor.rs`): a 7-byte header,
//! stream u32 | kind u8 | length u16 (big-endian), then the payload.

use std::ops::Range;

pub const HEADER: usize = 7;
/// A stream's first frame; its payload is the client's address as a PROXY v2 header.
pub const OPEN: u8 = 0;
pub const DATA: u8 = 1;
/// The sender's half of the stream ended (a TCP FIN).
pub const FIN: u8 = 2;
pub const RESET: u8 = 3;
/// A migration's messages (`FLOOR_MOVES=1`): front -> home's demux, answered by READY; then
/// front -> home COMMIT, front -> the other DONE (the handshake agent's release).
pub const IMPORT: u8 = 4;
pub const READY: u8 = 5;
pub const COMMIT: u8 = 6;
pub const DONE: u8 = 7;
/// About a sealed session object's size.
pub const SEALED: [u8; 512] = [0; 512];

/// Appends `payload` as frames of `kind` (one frame, empty, for no payload).
pub fn frame(out: &mut Vec<u8>, stream: u32, kind: u8, payload: &[u8]) {
    for chunk in payload.chunks(u16::MAX as usize) {
        out.extend_from_slice(&stream.to_be_bytes());
        out.push(kind);
        out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    if payload.is_empty() {
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(&[kind, 0, 0]);
    }
}

/// The whole frame at `at` in `buf`, if it is all there: (stream, kind, payload range).
pub fn next_frame(buf: &[u8], at: usize) -> Option<(u32, u8, Range<usize>)> {
    let h = buf.get(at..at + HEADER)?;
    let stream = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
    let len = u16::from_be_bytes([h[5], h[6]]) as usize;
    let body = at + HEADER..at + HEADER + len;
    (buf.len() >= body.end).then_some((stream, h[4], body))
}
