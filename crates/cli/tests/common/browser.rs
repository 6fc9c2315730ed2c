//! Headless Chromium screenshots of the HTML reports, and counting a PNG's colours.

use std::path::Path;
use std::process::{Command, Stdio};

use super::{text_of, TempDir};

/// Headless Chromium (Debian package `chromium`), when installed. `None` (the test skips) when
/// it is not, unless `BATON_REQUIRE_SERVERS` is set.
pub fn chromium() -> Option<&'static str> {
    let found = ["chromium", "chromium-browser"].into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if found.is_none() {
        super::require_or_skip("chromium", "headless screenshots of the reports");
    }
    found
}

/// Renders a local HTML file with headless Chromium into a PNG screenshot (nothing but the
/// file is loaded: no network, a throwaway profile).
pub fn screenshot(chromium: &str, html: &Path, png: &Path, width: u32, height: u32) {
    let out = headless(
        chromium,
        &[
            "--hide-scrollbars",
            &format!("--screenshot={}", png.display()),
            &format!("--window-size={width},{height}"),
            &format!("file://{}", html.display()),
        ],
    );
    assert!(
        png.exists(),
        "no screenshot: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Headless Chromium with a throwaway profile, run to its end with `args`.
pub fn headless(chromium: &str, args: &[&str]) -> std::process::Output {
    let profile = TempDir::new("chromium");
    Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            &format!("--user-data-dir={}", profile.0.display()),
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run chromium")
}

/// Decodes a PNG (8-bit RGB/RGBA, not interlaced: what Chromium writes) with python3's zlib
/// and returns (width, height, distinct pixel colours).
pub fn png_colours(png: &Path) -> (u64, u64, u64) {
    const DECODE: &str = r#"
import struct, sys, zlib
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n', 'not a PNG'
pos, idat, ihdr = 8, b'', None
while pos < len(data):
    n, kind = struct.unpack('>I4s', data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    pos += 12 + n
    if kind == b'IHDR': ihdr = struct.unpack('>IIBBBBB', body)
    elif kind == b'IDAT': idat += body
w, h, depth, ctype, _, _, interlace = ihdr
assert depth == 8 and ctype in (2, 6) and interlace == 0, ihdr
bpp = 3 if ctype == 2 else 4
raw, stride = zlib.decompress(idat), w * bpp
prev, colours, i = bytearray(stride), set(), 0
for y in range(h):
    f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride]); i += 1 + stride
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b = prev[x]
        c = prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    colours.update(bytes(line[j:j + bpp]) for j in range(0, stride, bpp))
    prev = line
print(w, h, len(colours))
"#;
    let out = Command::new("python3")
        .args(["-c", DECODE])
        .arg(png)
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", text_of(&out));
    let v: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    (v[0], v[1], v[2])
}
