//! Hardening findings (issue 15) with real processes: key files others can read are refused,
//! `baton ticket-key` writes private files and never through a symlink, a Redis password never
//! appears in a start-up error, and the signer replaces only a stale socket, never a file.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Runs `baton` with `args`, expecting it to exit by itself within 20 s (a process that starts
/// serving instead is killed and the test fails).
fn run_to_exit(args: &[&str]) -> Output {
    let mut child = Command::new(BATON)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("`baton {}` kept running: {}", args.join(" "), text_of(&out));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn mode(path: &str) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn chmod(path: &str, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn key_files_group_or_others_can_read_are_refused() {
    let pki = Pki::new();
    let dir = TempDir::new("keyfile-mode");
    let keys = key_file(&dir, "k");
    assert_eq!(mode(&keys), 0o600);
    chmod(&keys, 0o644);
    let mut agent: Vec<String> = vec!["agent".into(), "--listen".into(), "127.0.0.1:0".into()];
    agent.extend(pki.server_args());
    let agent: Vec<&str> = agent.iter().map(String::as_str).collect();
    for flag in ["--ticket-key-file", "--cluster-key-file"] {
        let mut args = agent.clone();
        args.extend([flag, &keys]);
        if flag == "--cluster-key-file" {
            args.extend(["--link-listen", "127.0.0.1:0"]);
        }
        let out = run_to_exit(&args);
        assert!(!out.status.success());
        assert!(
            text_of(&out).contains("readable by group or others"),
            "{flag}: {}",
            text_of(&out)
        );
    }
    let out = run_to_exit(&[
        "dispatch",
        "--listen",
        "127.0.0.1:0",
        "--agent",
        "127.0.0.1:9",
        "--agent-link",
        "127.0.0.1:9",
        "--cluster-key-file",
        &keys,
    ]);
    assert!(!out.status.success());
    assert!(
        text_of(&out).contains("readable by group or others"),
        "{}",
        text_of(&out)
    );
}

#[test]
fn ticket_key_writes_a_private_file_and_never_through_a_symlink() {
    let dir = TempDir::new("ticket-key-cmd");
    let keys = dir.arg("k");
    // a stale (or planted) world-readable temporary file, and one that is a symlink
    std::fs::write(dir.path("k.tmp"), "old\n").unwrap();
    chmod(&dir.arg("k.tmp"), 0o666);
    let out = run_to_exit(&["ticket-key", "--out", &keys]);
    assert!(out.status.success(), "{}", text_of(&out));
    assert_eq!(mode(&keys), 0o600);
    std::fs::write(dir.path("elsewhere"), "precious\n").unwrap();
    std::os::unix::fs::symlink(dir.path("elsewhere"), dir.path("k.tmp")).unwrap();
    let out = run_to_exit(&["ticket-key", "--out", &keys]);
    assert!(out.status.success(), "{}", text_of(&out));
    assert_eq!(mode(&keys), 0o600);
    assert_eq!(
        std::fs::read_to_string(dir.path("elsewhere")).unwrap(),
        "precious\n",
        "written through the temporary file's symlink"
    );
    // the key file itself a symlink: refused, its target untouched
    let link = dir.arg("link");
    std::os::unix::fs::symlink(dir.path("elsewhere"), &link).unwrap();
    let out = run_to_exit(&["ticket-key", "--out", &link]);
    assert!(!out.status.success());
    assert!(text_of(&out).contains("symbolic link"), "{}", text_of(&out));
    assert_eq!(
        std::fs::read_to_string(dir.path("elsewhere")).unwrap(),
        "precious\n"
    );
}

#[test]
fn a_redis_password_never_appears_in_a_start_up_error() {
    let pki = Pki::new();
    let dir = TempDir::new("redis-url");
    let keys = key_file(&dir, "k");
    let mut args: Vec<String> = vec!["agent".into(), "--listen".into(), "127.0.0.1:0".into()];
    args.extend(pki.server_args());
    args.extend(["--cluster-key-file".into(), keys]);
    for store in [
        // not a redis:// URL: refused by the flag parser
        "redis=rediss://user:hunter2secret@127.0.0.1:1/",
        // a redis:// URL the client library refuses
        "redis=redis://user:hunter2secret@127.0.0.1:notaport/",
    ] {
        let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
        a.extend(["--store", store]);
        let out = run_to_exit(&a);
        assert!(!out.status.success(), "{store}: {}", text_of(&out));
        let text = text_of(&out);
        assert!(!text.contains("hunter2secret"), "{store}: {text}");
        assert!(text.contains("***"), "{store}: {text}");
    }
}

#[test]
fn the_signer_replaces_a_stale_socket_but_never_a_file() {
    let pki = Pki::new();
    let dir = TempDir::new("signer-path");
    let auth = dir.arg("auth");
    std::fs::write(&auth, "a".repeat(64)).unwrap();
    chmod(&auth, 0o600);
    let file = dir.arg("not-a-socket");
    std::fs::write(&file, "someone's data\n").unwrap();
    let out = run_to_exit(&[
        "signer",
        "--listen",
        &format!("unix:{file}"),
        "--auth-key-file",
        &auth,
        "--key",
        &pki.arg("ecdsa.key"),
    ]);
    assert!(!out.status.success());
    assert!(text_of(&out).contains("not a socket"), "{}", text_of(&out));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "someone's data\n");
}
