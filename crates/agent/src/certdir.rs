//! `--cert-dir`: a directory of certificate/key pairs, one `NAME.crt` with its `NAME.key`.
//!
//! Each pair is served for the names its certificate carries (its subjectAltNames), so the
//! file name is only what pairs the two files. Several pairs for one name (an RSA and an ECDSA
//! certificate, say) are all kept and chosen between per client as for `--cert`.
//!
//! Loading is all or nothing: one unreadable, unparsable or unpaired file fails the whole
//! directory, so a reload never serves a half-copied set.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::certs::{self, CertEntry};

/// The certificate's file name ends with this; its key's with [`KEY_EXT`].
pub const CERT_EXT: &str = "crt";
pub const KEY_EXT: &str = "key";

/// The `(certificate, key)` paths in `dir`, sorted by file name. Hidden files (editors' and
/// atomic writers' temporaries) and other extensions are ignored; a certificate without its
/// key, or a key without its certificate, is an error.
pub fn pairs(dir: &Path) -> anyhow::Result<Vec<(PathBuf, PathBuf)>> {
    let mut certs = Vec::new();
    let mut keys = Vec::new();
    let read = std::fs::read_dir(dir).with_context(|| format!("--cert-dir {}", dir.display()))?;
    for item in read {
        let item = item.with_context(|| format!("--cert-dir {}", dir.display()))?;
        let path = item.path();
        let Some(file) = path.file_name().and_then(|f| f.to_str()) else {
            continue;
        };
        if file.starts_with('.') {
            continue;
        }
        match path.extension().and_then(|e| e.to_str()) {
            Some(CERT_EXT) => certs.push(path),
            Some(KEY_EXT) => keys.push(path),
            _ => {}
        }
    }
    certs.sort();
    keys.sort();
    for key in &keys {
        if !certs.contains(&key.with_extension(CERT_EXT)) {
            bail!(
                "{}: a key without its certificate (.{CERT_EXT})",
                key.display()
            );
        }
    }
    certs
        .into_iter()
        .map(|cert| {
            let key = cert.with_extension(KEY_EXT);
            match keys.contains(&key) {
                true => Ok((cert, key)),
                false => bail!(
                    "{}: a certificate without its key (.{KEY_EXT})",
                    cert.display()
                ),
            }
        })
        .collect()
}

/// Every pair in `dir`, loaded; the first error fails the lot.
pub fn load(dir: &Path) -> anyhow::Result<Vec<CertEntry>> {
    pairs(dir)?
        .iter()
        .map(|(cert, key)| certs::load_pair(cert, key))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, stem: &str, names: &[&str]) {
        let c = rcgen::generate_simple_self_signed(
            names.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
        )
        .unwrap();
        std::fs::write(dir.join(format!("{stem}.crt")), c.cert.pem()).unwrap();
        std::fs::write(
            dir.join(format!("{stem}.key")),
            c.signing_key.serialize_pem(),
        )
        .unwrap();
    }

    #[test]
    fn loads_every_pair_sorted_and_ignores_others() {
        let dir = tempfile::tempdir().unwrap();
        write_pair(dir.path(), "b", &["b.test"]);
        write_pair(dir.path(), "a", &["a.test", "www.a.test"]);
        std::fs::write(dir.path().join("README"), "x").unwrap();
        std::fs::write(dir.path().join(".a.crt.swp"), "x").unwrap();
        std::fs::write(dir.path().join(".tmp.key"), "x").unwrap();
        let loaded = load(dir.path()).unwrap();
        let names: Vec<_> = loaded.iter().map(|e| e.names.clone()).collect();
        assert_eq!(names, vec![vec!["a.test", "www.a.test"], vec!["b.test"]]);
    }

    #[test]
    fn unpaired_or_broken_files_fail_the_whole_directory() {
        let dir = tempfile::tempdir().unwrap();
        write_pair(dir.path(), "a", &["a.test"]);
        std::fs::write(dir.path().join("lone.key"), "x").unwrap();
        let e = format!("{:#}", load(dir.path()).unwrap_err());
        assert!(
            e.contains("lone.key") && e.contains("without its certificate"),
            "{e}"
        );
        std::fs::remove_file(dir.path().join("lone.key")).unwrap();
        std::fs::write(dir.path().join("lone.crt"), "x").unwrap();
        let e = format!("{:#}", load(dir.path()).unwrap_err());
        assert!(
            e.contains("lone.crt") && e.contains("without its key"),
            "{e}"
        );
        std::fs::write(dir.path().join("lone.key"), "x").unwrap();
        let e = format!("{:#}", load(dir.path()).unwrap_err());
        assert!(e.contains("lone"), "{e}");
        let e = format!("{:#}", load(&dir.path().join("missing")).unwrap_err());
        assert!(e.contains("--cert-dir"), "{e}");
    }
}
