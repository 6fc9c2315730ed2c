//! The binary's own surface: exit codes that tell a typo from a failed run, and the man pages
//! and completion scripts `baton generate` writes.

mod common;

use std::process::Command;

use common::*;

fn baton(args: &[&str]) -> std::process::Output {
    Command::new(BATON).args(args).output().unwrap()
}

#[test]
fn a_typo_a_bad_configuration_and_a_failed_run_exit_differently() {
    // a flag clap does not know: usage
    let out = baton(&["dispatch", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2), "{}", text_of(&out));
    // flags that parse but cannot be used together: configuration
    let out = baton(&[
        "agent",
        "--self-signed",
        "ecdsa-p256",
        "--migration-timeout",
        "0s",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text_of(&out));
    assert!(
        text_of(&out).contains("--migration-timeout"),
        "{}",
        text_of(&out)
    );
    let dir = TempDir::new("cli");
    std::fs::write(
        dir.path("d.toml"),
        "agent = [\"127.0.0.1:1\"]\nwrokers = 1\n",
    )
    .unwrap();
    let out = baton(&["dispatch", "--config", &dir.arg("d.toml")]);
    assert_eq!(out.status.code(), Some(2), "{}", text_of(&out));
    // a run that fails: nothing listens where the benchmark points
    let port = free_port();
    let url = format!("https://127.0.0.1:{port}/");
    let out = baton(&["bench", &url, "--insecure", "-n", "2", "-c", "1", "--quiet"]);
    assert_eq!(out.status.code(), Some(1), "{}", text_of(&out));
    // and a process that cannot start for what the host gives it: a run failure too
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = baton(&["agent", "--self-signed", "ecdsa-p256", "--listen", &addr]);
    assert_eq!(out.status.code(), Some(1), "{}", text_of(&out));
}

#[test]
fn man_pages_for_every_command() {
    let dir = TempDir::new("man");
    let out = baton(&["generate", "man", &dir.arg("man")]);
    assert!(out.status.success(), "{}", text_of(&out));
    let page = |name: &str| {
        std::fs::read_to_string(dir.path("man").join(format!("{name}.1")))
            .unwrap_or_else(|e| panic!("{name}.1: {e}"))
    };
    assert!(page("baton").contains(".TH baton 1"));
    for (cmd, flag) in [
        ("baton-agent", "migration\\-timeout"),
        ("baton-dispatch", "migration\\-timeout"),
        ("baton-bench", "insecure"),
        ("baton-up", "agents"),
        ("baton-signer", "auth\\-key\\-file"),
    ] {
        assert!(page(cmd).contains(flag), "{cmd}.1 lacks {flag}");
    }
    // groff reads every page without a warning (when it is installed)
    if Command::new("groff").arg("--version").output().is_ok() {
        for entry in std::fs::read_dir(dir.path("man")).unwrap() {
            let path = entry.unwrap().path();
            let out = Command::new("groff")
                .args(["-man", "-ww", "-z"])
                .arg(&path)
                .output()
                .unwrap();
            assert!(
                out.status.success() && out.stderr.is_empty(),
                "{}: {}",
                path.display(),
                text_of(&out)
            );
        }
    } else {
        require_or_skip("groff", "to read the man pages");
    }
}

#[test]
fn completion_scripts_are_valid_for_their_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = baton(&["generate", "completions", shell]);
        assert!(out.status.success(), "{shell}: {}", text_of(&out));
        let script = String::from_utf8(out.stdout).unwrap();
        assert!(script.contains("dispatch") && script.contains("--migration-timeout"));
        if shell == "bash" {
            let dir = TempDir::new("completions");
            std::fs::write(dir.path("baton.bash"), &script).unwrap();
            let check = Command::new("bash")
                .args(["-n", &dir.arg("baton.bash")])
                .output()
                .unwrap();
            assert!(check.status.success(), "{}", text_of(&check));
        }
    }
    assert_eq!(
        baton(&["generate", "completions", "tcsh"]).status.code(),
        Some(2)
    );
}

#[test]
fn check_passes_a_config_that_starts_and_lists_every_problem_of_one_that_does_not() {
    use std::os::unix::fs::PermissionsExt as _;
    let pki = Pki::new();
    for key in ["ecdsa.key", "rsa.key"] {
        std::fs::set_permissions(pki.dir.path(key), std::fs::Permissions::from_mode(0o600))
            .unwrap();
    }
    let dir = TempDir::new("check");
    let config = dir.path("agent.toml");
    std::fs::write(
        &config,
        format!(
            "listen = [\"127.0.0.1:0\"]\ncert = [{:?}, {:?}]\nkey = [{:?}, {:?}]\n",
            pki.arg("ecdsa.pem"),
            pki.arg("rsa.pem"),
            pki.arg("ecdsa.key"),
            pki.arg("rsa.key"),
        ),
    )
    .unwrap();
    let out = baton(&["check", "agent", &dir.arg("agent.toml")]);
    assert_eq!(out.status.code(), Some(0), "{}", text_of(&out));
    assert!(
        text_of(&out).contains("agent.toml: ok"),
        "{}",
        text_of(&out)
    );
    // the same file, with flags that break it the way a unit's command line could
    std::fs::set_permissions(
        pki.dir.path("rsa.key"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let out = baton(&[
        "check",
        "agent",
        &dir.arg("agent.toml"),
        "--key",
        &pki.arg("rsa.key"),
        "--key",
        &pki.arg("ecdsa.key"),
        "--workers",
        "0",
    ]);
    let text = text_of(&out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    // the keys given the wrong way round (two pairs that do not match), one key readable by
    // others, and zero workers: each is listed
    assert_eq!(text.matches("does not match").count(), 2, "{text}");
    assert!(text.contains("chmod 600"), "{text}");
    assert!(text.contains("--workers"), "{text}");
    // a dispatcher whose admin endpoint would face the network, and an agents file with one id
    // twice
    std::fs::write(
        dir.path("agents.toml"),
        "[[agent]]\nid = 1\naddr = \"127.0.0.1:9001\"\n[[agent]]\nid = 1\naddr = \"127.0.0.1:9002\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.path("dispatch.toml"),
        format!(
            "agents-file = {:?}\nadmin = \"0.0.0.0:9000\"\nadmin-token-file = {:?}\n",
            dir.arg("agents.toml"),
            dir.arg("token")
        ),
    )
    .unwrap();
    let out = baton(&["check", "dispatch", &dir.arg("dispatch.toml")]);
    assert_eq!(out.status.code(), Some(2), "{}", text_of(&out));
    assert!(text_of(&out).contains("loopback"), "{}", text_of(&out));
    assert!(!dir.path("token").exists(), "check created the token file");
    let out = baton(&["check", "agents", &dir.arg("agents.toml")]);
    assert_eq!(out.status.code(), Some(2), "{}", text_of(&out));
    assert!(text_of(&out).contains("appears twice"), "{}", text_of(&out));
}

#[test]
fn the_configuration_reference_in_docs_is_the_binarys_own() {
    let out = baton(&["generate", "reference"]);
    assert_eq!(out.status.code(), Some(0), "{}", text_of(&out));
    let generated = String::from_utf8(out.stdout).unwrap();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    let written = std::fs::read_to_string(&path).unwrap();
    assert!(
        written == generated,
        "docs/configuration.md is out of date: run `baton generate reference > docs/configuration.md`"
    );
}

#[test]
fn environment_variables_set_flags_and_a_flag_wins_over_its_variable() {
    let check = |env: &[(&str, &str)], args: &[&str]| {
        let mut cmd = Command::new(BATON);
        cmd.args(["check", "agent", "--self-signed", "ecdsa-p256"])
            .args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let out = check(&[("BATON_WORKERS", "0")], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text_of(&out));
    assert!(text_of(&out).contains("--workers"), "{}", text_of(&out));
    let out = check(&[("BATON_WORKERS", "0")], &["--workers", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text_of(&out));
    // a process configured by its environment alone
    let port = free_port();
    let mut agent = Command::new(BATON)
        .arg("agent")
        .env("BATON_LISTEN", format!("127.0.0.1:{port}"))
        .env("BATON_SELF_SIGNED", "ecdsa-p256")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(agent.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let _ = agent.kill();
    let _ = agent.wait();
    assert_eq!(line.trim(), format!("listening tls 127.0.0.1:{port}"));
}

#[test]
fn on_off_settings_are_switches_with_negations_and_the_old_spelling_still_parses() {
    let check = |args: &[&str]| {
        let out = Command::new(BATON)
            .args(["check", "agent", "--self-signed", "ecdsa-p256"])
            .args(args)
            .output()
            .unwrap();
        (out.status.code(), text_of(&out))
    };
    // `--handoff` alone turns migration on, which needs a cluster key: refused
    let (code, text) = check(&["--handoff"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("--cluster-key-file"), "{text}");
    let (code, text) = check(&["--handoff", "true"]);
    assert_eq!(code, Some(2), "{text}");
    for off in [
        &["--no-handoff"][..],
        &["--handoff", "false"],
        &["--handoff=false"],
    ] {
        let (code, text) = check(off);
        assert_eq!(code, Some(0), "{off:?}: {text}");
    }
    // a config file turns it on, the negation on the command line off
    let dir = TempDir::new("switches");
    std::fs::write(dir.path("a.toml"), "handoff = true\n").unwrap();
    let (code, text) = check(&["--config", &dir.arg("a.toml")]);
    assert_eq!(code, Some(2), "{text}");
    let (code, text) = check(&["--config", &dir.arg("a.toml"), "--no-handoff"]);
    assert_eq!(code, Some(0), "{text}");
}
