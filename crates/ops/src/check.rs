//! `baton check`: what a configuration check found, every problem at once rather than the
//! first, and the rules for files that hold secrets.

use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use crate::exit;

/// The problems (the process would refuse to start, or start wrong) and warnings (it would
/// start, but something needs attention soon) found in one file.
#[derive(Debug)]
pub struct Report {
    subject: String,
    problems: Vec<String>,
    warnings: Vec<String>,
}

impl Report {
    pub fn new(subject: impl Into<String>) -> Self {
        Self {
            subject: subject.into(),
            problems: Vec::new(),
            warnings: Vec::new(),
        }
    }

    pub fn problem(&mut self, what: impl std::fmt::Display) {
        self.problems.push(format!("{what:#}"));
    }

    pub fn warning(&mut self, what: impl std::fmt::Display) {
        self.warnings.push(format!("{what:#}"));
    }

    /// Records `result`'s error as a problem; the value otherwise.
    pub fn take<T>(&mut self, result: anyhow::Result<T>) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(e) => {
                self.problem(format!("{e:#}"));
                None
            }
        }
    }

    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// A file holding a secret (a private key, a cluster or ticket key, a token): it must be a
    /// regular file that only its owner can read or write.
    pub fn secret_file(&mut self, flag: &str, path: &Path) {
        match std::fs::symlink_metadata(path).and_then(|m| {
            if m.file_type().is_symlink() {
                std::fs::metadata(path)
            } else {
                Ok(m)
            }
        }) {
            Err(e) => self.problem(format!("{flag} {}: {e}", path.display())),
            Ok(m) if !m.is_file() => {
                self.problem(format!("{flag} {}: not a regular file", path.display()))
            }
            Ok(m) if m.permissions().mode() & 0o077 != 0 => self.problem(format!(
                "{flag} {}: mode {:o} lets others read or change a secret (chmod 600)",
                path.display(),
                m.permissions().mode() & 0o777
            )),
            Ok(_) => {}
        }
    }

    /// What `baton check` prints: one line per finding, then a verdict.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for p in &self.problems {
            let _ = writeln!(out, "{}: error: {p}", self.subject);
        }
        for w in &self.warnings {
            let _ = writeln!(out, "{}: warning: {w}", self.subject);
        }
        let _ = match self.problems.len() {
            0 => writeln!(out, "{}: ok", self.subject),
            n => writeln!(out, "{}: {n} problem(s)", self.subject),
        };
        out
    }

    /// 0 when nothing stops the process from starting, else the usage/configuration code.
    pub fn exit_code(&self) -> u8 {
        if self.problems.is_empty() {
            0
        } else {
            exit::USAGE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_files_must_be_private_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key");
        std::fs::write(&key, "k").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut r = Report::new("t");
        r.secret_file("--key", &key);
        r.secret_file("--key", &dir.path().join("missing"));
        r.secret_file("--key", dir.path());
        assert_eq!(r.problems().len(), 3, "{:?}", r.problems());
        assert!(r.problems()[0].contains("chmod 600"));
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut r = Report::new("t");
        r.secret_file("--key", &key);
        assert!(r.problems().is_empty());
        assert_eq!(r.exit_code(), 0);
        assert!(r.render().ends_with("t: ok\n"));
    }
}
