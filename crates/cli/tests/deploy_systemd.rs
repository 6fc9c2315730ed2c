//! The systemd units in `deploy/systemd`: `systemd-analyze verify` and `security` accept them,
//! their sandbox is what the README promises, and their command lines (with the example
//! configuration files) really start a signer, an agent signing through it and a dispatcher
//! that serves clients, the signer and the agent as two users of one group (as the units'
//! dynamic users are). Also: the signer cannot be inspected by another process of its user.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use rustls::version::TLS13;

const UNITS: [&str; 3] = [
    "baton-agent.service",
    "baton-dispatch.service",
    "baton-signer.service",
];

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/systemd")
}

fn unit(name: &str) -> String {
    std::fs::read_to_string(deploy().join(name)).unwrap()
}

/// `key=value` settings of a unit, continuation lines joined (repeated keys keep all values).
fn settings(text: &str) -> HashMap<String, Vec<String>> {
    let joined = text.replace("\\\n", " ");
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    for line in joined.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with('[') {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            out.entry(k.to_string())
                .or_default()
                .push(v.trim().to_string());
        }
    }
    out
}

fn systemd_analyze() -> Option<&'static str> {
    let found = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        require_or_skip("systemd-analyze", "checking the units");
        return None;
    }
    Some("systemd-analyze")
}

#[test]
fn units_verify_and_are_sandboxed() {
    let Some(analyze) = systemd_analyze() else {
        return;
    };
    let dir = TempDir::new("systemd-units");
    for name in UNITS {
        // verify checks that the executable exists: point it at this build's binary
        let text = unit(name).replace("/usr/local/bin/baton", BATON);
        std::fs::write(dir.path(name), &text).unwrap();
        let s = settings(&text);
        let one = |k: &str| s.get(k).and_then(|v| v.last()).map(String::as_str);
        assert_eq!(one("DynamicUser"), Some("yes"), "{name}");
        assert_eq!(one("NoNewPrivileges"), Some("yes"), "{name}");
        assert_eq!(one("ProtectSystem"), Some("strict"), "{name}");
        let caps = one("CapabilityBoundingSet").unwrap_or_else(|| panic!("{name}: no caps"));
        assert!(
            caps.is_empty() || caps == "CAP_NET_BIND_SERVICE",
            "{name}: capabilities {caps}"
        );
        assert!(
            s.get("AmbientCapabilities")
                .is_none_or(|v| v.iter().all(|c| c == "CAP_NET_BIND_SERVICE")),
            "{name}"
        );
        // secrets only through credentials, never a key path on the command line
        let exec = one("ExecStart").unwrap();
        for word in exec.split_whitespace() {
            assert!(
                !(word.starts_with("/etc/baton/") && word.ends_with(".key")),
                "{name}: {word} should be a credential"
            );
        }
    }
    let of = |name: &str, k: &str| {
        settings(&unit(name))
            .get(k)
            .and_then(|v| v.last().cloned())
            .unwrap_or_default()
    };
    // the signer has a user of its own, with the agent's as its group, and serves that group
    let agent_user = of("baton-agent.service", "User");
    assert!(!agent_user.is_empty());
    assert_ne!(of("baton-signer.service", "User"), agent_user);
    assert_eq!(of("baton-signer.service", "Group"), agent_user);
    assert!(of("baton-signer.service", "ExecStart").contains("--allow-own-group"));
    assert_eq!(of("baton-signer.service", "RuntimeDirectoryMode"), "0750");
    // the dispatcher tells systemd when it serves and who serves after a handover, which a
    // reload starts; a stop reaches every process of the unit
    assert_eq!(of("baton-dispatch.service", "Type"), "notify");
    assert_eq!(of("baton-dispatch.service", "NotifyAccess"), "all");
    assert_eq!(
        of("baton-dispatch.service", "ExecReload"),
        "/bin/kill -USR2 $MAINPID"
    );
    assert_eq!(of("baton-dispatch.service", "KillMode"), "control-group");
    // the example roster is one the dispatcher takes
    let roster = std::fs::read_to_string(deploy().join("agents.toml")).unwrap();
    let agents = baton_dispatch::members::parse_file(&roster).unwrap();
    assert_eq!(agents.len(), 3);
    let names: Vec<String> = UNITS.iter().map(|u| dir.arg(u)).collect();
    let out = Command::new(analyze)
        .arg("verify")
        .args(&names)
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for n in &names {
        // exposure at most 2.0 of 10 ("OK"); the signer, without network, lower still
        let out = Command::new(analyze)
            .args(["security", "--offline=true", "--threshold=20", n])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{n}: exposure above 2.0\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

/// A unit's ExecStart with the host's paths moved under `root` (its credentials in
/// `root/cred/UNIT`), as a command.
fn exec_start(name: &str, root: &Path) -> Command {
    let s = settings(&unit(name));
    let exec = s["ExecStart"].last().unwrap().clone();
    let exec = exec
        .replace("/usr/local/bin/baton", BATON)
        .replace(
            "${CREDENTIALS_DIRECTORY}",
            &root.join("cred").join(name).display().to_string(),
        )
        .replace("/etc/baton/", &format!("{}/", root.join("etc").display()))
        .replace(
            "/run/baton-signer/",
            &format!("{}/", root.join("run").display()),
        );
    let mut words = exec.split_whitespace();
    let mut cmd = Command::new(words.next().unwrap());
    cmd.args(words);
    cmd
}

/// Runs `cmd` (plus `extra`) until it prints `ready`; returns it and its `listening` lines.
fn start(mut cmd: Command, extra: &[&str]) -> (Killed, HashMap<String, SocketAddr>) {
    let mut child = cmd
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut addrs = HashMap::new();
    loop {
        let Some(Ok(line)) = lines.next() else {
            panic!("exited before ready: {:?}", child.wait());
        };
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["listening", kind, a] => {
                addrs.insert(kind.to_string(), a.parse().unwrap());
            }
            ["ready"] => break,
            _ => {}
        }
    }
    std::thread::spawn(move || for _ in lines {});
    (Killed(child), addrs)
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn secret(path: &Path, cmd: &[&str]) {
    use std::os::unix::fs::PermissionsExt;
    let out = Command::new(cmd[0]).args(&cmd[1..]).output().unwrap();
    assert!(out.status.success(), "{cmd:?}");
    std::fs::write(path, &out.stdout).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// `cmd` run as `uid`, with `gid` as its only group.
fn as_user(cmd: Command, uid: u32, gid: u32) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid", &uid.to_string(), "--regid", &gid.to_string()])
        .args(["--clear-groups", "--"])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    c
}

/// The units' dynamic users, as systemd would pick them: the agent's user `baton` (its group
/// too), and the signer's `baton-signer`, whose group is `baton`.
const AGENT_UID: u32 = 61190;
const SIGNER_UID: u32 = 61191;

#[test]
fn the_units_command_lines_start_a_serving_cluster() {
    use std::os::unix::fs::{chown, PermissionsExt};
    let pki = Pki::new();
    let root = TempDir::new("systemd-run");
    let cred = |unit: &str| root.path("cred").join(unit);
    for d in ["etc", "run"] {
        std::fs::create_dir_all(root.path(d)).unwrap();
    }
    for u in UNITS {
        std::fs::create_dir_all(cred(u)).unwrap();
    }
    // what an operator puts in /etc/baton (configuration) and what systemd copies into each
    // unit's credentials directory
    let etc = format!("{}/", root.path("etc").display());
    for f in ["agent.toml", "dispatch.toml"] {
        let text = std::fs::read_to_string(deploy().join(f)).unwrap();
        std::fs::write(root.path("etc").join(f), text.replace("/etc/baton/", &etc)).unwrap();
    }
    std::fs::copy(pki.dir.path("ecdsa.pem"), root.path("etc").join("tls.crt")).unwrap();
    let signer_cred = cred("baton-signer.service");
    let agent_cred = cred("baton-agent.service");
    std::fs::copy(pki.dir.path("ecdsa.key"), signer_cred.join("tls.key")).unwrap();
    secret(
        &signer_cred.join("signer-auth.key"),
        &["openssl", "rand", "-hex", "32"],
    );
    std::fs::copy(
        signer_cred.join("signer-auth.key"),
        agent_cred.join("signer-auth.key"),
    )
    .unwrap();
    for k in ["cluster.key", "ticket.key"] {
        secret(&agent_cred.join(k), &[BATON, "ticket-key"]);
    }
    std::fs::copy(
        agent_cred.join("cluster.key"),
        cred("baton-dispatch.service").join("cluster.key"),
    )
    .unwrap();

    // As root, agent and signer run as the two users the units give them (else both as this
    // test's user): each owns its credentials, and the signer's runtime directory is its own
    // with the agent's group (RuntimeDirectoryMode=0750).
    let (mut signer_cmd, mut agent_cmd) = (
        exec_start("baton-signer.service", &root.0),
        exec_start("baton-agent.service", &root.0),
    );
    if is_root() {
        for (dir, uid) in [(&signer_cred, SIGNER_UID), (&agent_cred, AGENT_UID)] {
            for e in std::fs::read_dir(dir).unwrap() {
                chown(e.unwrap().path(), Some(uid), Some(AGENT_UID)).unwrap();
            }
            chown(dir, Some(uid), Some(AGENT_UID)).unwrap();
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o500)).unwrap();
        }
        chown(root.path("run"), Some(SIGNER_UID), Some(AGENT_UID)).unwrap();
        std::fs::set_permissions(root.path("run"), std::fs::Permissions::from_mode(0o750)).unwrap();
        signer_cmd = as_user(signer_cmd, SIGNER_UID, AGENT_UID);
        agent_cmd = as_user(agent_cmd, AGENT_UID, AGENT_UID);
    } else {
        eprintln!("not root: agent and signer run as one user");
    }

    let (_signer, _) = start(signer_cmd, &[]);
    // the example agent.toml, with this machine's addresses and a store that needs no Redis
    let (_agent, agent) = start(
        agent_cmd,
        &[
            "--listen",
            "127.0.0.1:0",
            "--link-listen",
            "127.0.0.1:0",
            "--metrics",
            "127.0.0.1:0",
            "--store",
            "memory",
        ],
    );
    std::fs::write(
        root.path("etc").join("agents.toml"),
        format!(
            "[[agent]]\nid = 0\naddr = \"{}\"\nlink = \"{}\"\n",
            agent["tls"], agent["link"]
        ),
    )
    .unwrap();
    let (_dispatch, d) = start(
        exec_start("baton-dispatch.service", &root.0),
        &[
            "--listen",
            "127.0.0.1:0",
            "--metrics",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--admin-token-file",
            admin_token_file(),
            "--accept-proxy-protocol",
            "false",
        ],
    );
    let config = Arc::new(pki.client(&[&TLS13], None));
    let target = Addr(d["dispatch"]);
    for _ in 0..3 {
        let r = fetch(&target, &config, "/").unwrap();
        assert_eq!(r.status, 200);
    }
    // the agent signed through the signer
    let (_, text) = plain_get(agent["metrics"], "/metrics");
    let signed: f64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("baton_key_signer_requests_total{result=\"ok\"} ")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no signer counter in\n{text}"));
    assert!(signed >= 1.0, "{signed}");
}

struct Addr(SocketAddr);

impl Endpoint for Addr {
    fn tls_addr(&self) -> SocketAddr {
        self.0
    }
}

/// Runs `args` as uid/gid 65534 (nobody) with no supplementary groups.
fn as_nobody(args: &[&str]) -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid",
        "65534",
        "--regid",
        "65534",
        "--clear-groups",
        "--",
    ]);
    c.args(args);
    c
}

#[test]
fn the_signer_cannot_be_read_by_another_process_of_its_user() {
    use std::os::unix::fs::{chown, PermissionsExt};
    if !root_or_skip("setpriv drops to another user") {
        return;
    }
    let pki = Pki::new();
    let dir = TempDir::new("signer-dumpable");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let key = dir.path("tls.key");
    std::fs::copy(pki.dir.path("ecdsa.key"), &key).unwrap();
    let auth = dir.path("auth.key");
    secret(&auth, &["openssl", "rand", "-hex", "32"]);
    let run = dir.path("run");
    std::fs::create_dir(&run).unwrap();
    for p in [&key, &auth, &run] {
        chown(p, Some(65534), Some(65534)).unwrap();
    }
    let socket = format!("unix:{}/s.sock", run.display());
    let (signer, _) = start(
        as_nobody(&[
            BATON,
            "signer",
            "--listen",
            &socket,
            "--key",
            key.to_str().unwrap(),
            "--auth-key-file",
            auth.to_str().unwrap(),
        ]),
        &[],
    );
    // a plain process of the same user: its memory map is readable by its user (the control
    // that shows this test can fail)
    let mut sleeper = Killed(as_nobody(&["sleep", "30"]).spawn().unwrap());
    std::thread::sleep(Duration::from_millis(200));
    let read = |pid: u32| {
        as_nobody(&["cat", &format!("/proc/{pid}/maps")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    };
    assert!(
        read(sleeper.0.id()),
        "control: same-user /proc read refused"
    );
    assert!(
        !read(signer.0.id()),
        "the signer's memory map is readable by its user"
    );
    let _ = sleeper.0.kill();
}
