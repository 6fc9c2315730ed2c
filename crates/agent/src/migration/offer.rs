//! How a link stream begins: with the dispatcher's Offer (this agent hands the session on
//! after the handshake), an Import (a session to carry on here), or a ClientHello.

use baton_migrate::Frame;

use crate::transport::agent_io::AgentIo;

/// The dispatcher's Offer: where the session should go, and what its object is bound to.
#[derive(Debug, Clone, Copy)]
pub struct Offer {
    pub home: u16,
    pub binding: [u8; baton_migrate::BINDING_LEN],
}

/// How a link stream begins.
pub(crate) enum FirstFrame {
    /// With anything but a frame (a ClientHello), left unread.
    None,
    Offer(Offer),
    /// With an Import frame, left unread for the importer.
    Import,
}

/// Looks at the first frame of a link stream, consuming it only if it is an Offer. Bounded by
/// the frame format (64 KiB).
pub(crate) async fn first_frame(io: &mut AgentIo) -> std::io::Result<FirstFrame> {
    use tokio::io::AsyncReadExt;
    let mut head = [0u8; 6];
    let n = io.peek(&mut head).await?;
    if n == 0 || head[0] != baton_migrate::FRAME_TYPE {
        return Ok(FirstFrame::None);
    }
    if n < head.len() {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    if head[5] == baton_migrate::IMPORT_KIND {
        return Ok(FirstFrame::Import);
    }
    let len = usize::from(u16::from_be_bytes([head[3], head[4]]));
    let mut frame = vec![0u8; 5 + len];
    io.read_exact(&mut frame).await?;
    let bad = |e: baton_migrate::MigrationError| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
    };
    match baton_migrate::Splitter::new()
        .split(&frame)
        .map_err(bad)?
        .frame
    {
        Some(Frame::Offer { home, binding }) => Ok(FirstFrame::Offer(Offer { home, binding })),
        _ => Err(std::io::ErrorKind::InvalidData.into()),
    }
}
