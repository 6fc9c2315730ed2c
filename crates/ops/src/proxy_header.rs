//! Reading a PROXY protocol v2 header off a socket: exactly the header, not one byte of the
//! TLS that follows (the codec is `baton_wire::proxy_v2`).

use baton_wire::proxy_v2::{self, ProxyHeader};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The header, or `None` if the peer closed without sending anything (a port probe). Callers
/// put a deadline around it.
pub async fn read(s: &mut TcpStream) -> std::io::Result<Option<ProxyHeader>> {
    let bad = |e: proxy_v2::ProxyError| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
    let mut fixed = [0u8; proxy_v2::FIXED_LEN];
    let mut got = 0;
    while got < fixed.len() {
        let n = s.read(&mut fixed[got..]).await?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(std::io::ErrorKind::UnexpectedEof.into())
            };
        }
        got += n;
        proxy_v2::header_len(&fixed[..got]).map_err(bad)?;
    }
    let total = proxy_v2::header_len(&fixed)
        .map_err(bad)?
        .unwrap_or(fixed.len());
    let mut header = vec![0u8; total];
    header[..fixed.len()].copy_from_slice(&fixed);
    s.read_exact(&mut header[fixed.len()..]).await?;
    proxy_v2::decode(&header).map(Some).map_err(bad)
}
