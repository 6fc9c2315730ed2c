//! Helpers shared by the unit tests.

/// Bytes from hex, ignoring whitespace (RFC test vectors are printed with spaces and breaks).
pub(crate) fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s
        .bytes()
        .filter(|b| !b.is_ascii_whitespace())
        .map(|b| match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => panic!("not hex: {}", b as char),
        })
        .collect();
    assert!(digits.len().is_multiple_of(2), "odd number of hex digits");
    digits.chunks(2).map(|p| p[0] << 4 | p[1]).collect()
}
