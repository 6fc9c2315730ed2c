//! A byte queue that is consumed from the front and appended at the back, without moving the
//! unread bytes on every consume. Each of the record layer's three buffers (ciphertext in,
//! plaintext out, ciphertext out) is one of these; the layer, not the queue, enforces bounds.

/// Bytes appended at the back, taken from the front.
#[derive(Default)]
pub(crate) struct ByteQueue {
    buf: Vec<u8>,
    start: usize,
}

impl ByteQueue {
    /// Unread bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        self.buf.get(self.start..).unwrap_or_default()
    }

    /// Unread bytes, mutable (for decryption in place).
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        self.buf.get_mut(self.start..).unwrap_or_default()
    }

    /// How many bytes are unread.
    pub(crate) fn len(&self) -> usize {
        self.buf.len().saturating_sub(self.start)
    }

    /// Whether nothing is unread.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Marks up to `n` bytes as read (more than there are is the same as all of them).
    pub(crate) fn consume(&mut self, n: usize) {
        self.start = self.start.saturating_add(n.min(self.len()));
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
    }

    /// Gives the allocation back if nothing is unread (a connection that idles keeps no
    /// buffer); returns whether the queue is empty.
    pub(crate) fn release_if_empty(&mut self) -> bool {
        if self.is_empty() {
            self.buf = Vec::new();
            self.start = 0;
        }
        self.is_empty()
    }

    /// Forgets everything.
    pub(crate) fn clear(&mut self) {
        self.buf.clear();
        self.start = 0;
    }

    /// The vector to append to, after moving the unread bytes to its front (at most the
    /// queue's bound is moved, once per append).
    pub(crate) fn tail(&mut self) -> &mut Vec<u8> {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        &mut self.buf
    }

    /// Appends bytes.
    pub(crate) fn extend(&mut self, data: &[u8]) {
        self.tail().extend_from_slice(data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consume_then_append_keeps_order() {
        let mut q = ByteQueue::default();
        q.extend(b"hello");
        q.consume(2);
        assert_eq!(q.as_slice(), b"llo");
        q.extend(b" world");
        assert_eq!(q.as_slice(), b"llo world");
        q.consume(100);
        assert!(q.is_empty());
        q.consume(1);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn release_only_when_empty() {
        let mut q = ByteQueue::default();
        q.extend(&[7; 4096]);
        q.consume(4095);
        assert!(!q.release_if_empty(), "a byte is unread");
        assert_eq!(q.as_slice(), [7]);
        q.consume(1);
        assert!(q.buf.capacity() >= 4096, "consuming keeps the allocation");
        assert!(q.release_if_empty());
        assert_eq!(q.buf.capacity(), 0);
        q.extend(b"again");
        assert_eq!(q.as_slice(), b"again");
    }
}
