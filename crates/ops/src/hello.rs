//! Reading a connection's first bytes until they hold a ClientHello (the codec is
//! `baton_wire::HelloReader`): the dispatcher peeks at it to route, the agent to decide on
//! early data. Every byte read is kept, to be forwarded or fed to rustls unchanged.

use baton_wire::{ClientHello, HelloReader, Progress};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Raw bytes kept while looking for the ClientHello: the hello's own bound plus room for its
/// record headers when sent in full-size records. The reader bounds the hello's payload; this
/// bounds the bytes, which a hello sent as 1-byte records (5 header bytes each) would otherwise
/// inflate six-fold.
pub const RAW_LIMIT: usize = baton_wire::DEFAULT_MESSAGE_LIMIT + 64;

/// What was read: every byte, and the hello when one could be parsed (`None`: not a hello we
/// can read, or more than [`RAW_LIMIT`] bytes without one; the bytes go on regardless and the
/// TLS server answers them). What followed the hello in the last read (early data records) is
/// among the bytes. Callers put a deadline around it.
pub async fn read<S: AsyncRead + Unpin>(
    s: &mut S,
) -> std::io::Result<(Vec<u8>, Option<ClientHello>)> {
    use bytes::BufMut;
    let mut reader = HelloReader::new();
    // Read straight into `bytes`' spare capacity: no buffer in the caller's future (the
    // dispatcher's is moved when a connection is spawned), no copy, nothing zeroed.
    let mut bytes = Vec::with_capacity(4096);
    loop {
        let room = RAW_LIMIT.saturating_sub(bytes.len()).min(4096);
        if room == 0 {
            return Ok((bytes, None));
        }
        let start = bytes.len();
        bytes.reserve(room);
        let n = s.read_buf(&mut (&mut bytes).limit(room)).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        match reader.push(&bytes[start..]) {
            Ok(Progress::NeedMore) => continue,
            Ok(Progress::Done(hello, _)) => return Ok((bytes, Some(hello))),
            Err(_) => return Ok((bytes, None)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keeps_every_byte_and_bounds_them() {
        // not TLS: the bytes come back, no hello
        let mut plain: &[u8] = b"GET / HTTP/1.1\r\n\r\n";
        let (bytes, hello) = read(&mut plain).await.unwrap();
        assert_eq!(
            (bytes.as_slice(), hello.is_none()),
            (&b"GET / HTTP/1.1\r\n\r\n"[..], true)
        );
        // a handshake record header that promises more than ever comes: stops at the bound
        let mut endless = [0x16u8, 3, 1, 0xff, 0xff].repeat(RAW_LIMIT);
        endless.truncate(RAW_LIMIT * 2);
        let (bytes, hello) = read(&mut endless.as_slice()).await.unwrap();
        assert!(
            hello.is_none() && bytes.len() <= RAW_LIMIT,
            "{}",
            bytes.len()
        );
        // closed before a hello: an error
        let mut short: &[u8] = &[0x16, 3, 1, 0, 40, 1];
        assert!(read(&mut short).await.is_err());
    }
}
