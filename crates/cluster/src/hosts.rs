//! Hosts made of network namespaces (`baton up --hosts`): each process of a cluster runs in a
//! namespace of its own, with its own address on a bridge, so every byte between them crosses
//! a real network stack (veth, bridge, ARP, the kernel's TCP on both ends) instead of
//! loopback. The host running this command sits on the bridge too (the first address), so
//! clients here reach the cluster as they would across a LAN.
//!
//! Names carry this process's id (`baton-<pid>-<host>`, bridge `bt<pid>`), so concurrent runs
//! do not meet and a run that crashed is recognised later: [`Hosts::create`] first removes
//! every namespace and bridge whose owner process is gone. Everything is removed on drop.

use std::net::Ipv4Addr;
use std::process::Command;

use anyhow::{bail, Context};

/// A network of namespaces on one bridge.
#[derive(Debug)]
pub struct Hosts {
    pid: u32,
    bridge: String,
    subnet: [u8; 3],
    hosts: Vec<Host>,
}

/// One namespace: its name and address.
#[derive(Debug, Clone)]
pub struct Host {
    pub name: String,
    pub netns: String,
    pub addr: Ipv4Addr,
}

impl Hosts {
    /// Creates the bridge, with this host's address on it. Needs root (CAP_NET_ADMIN and
    /// CAP_SYS_ADMIN); says so and fails without.
    pub fn create() -> anyhow::Result<Hosts> {
        sweep_leftovers();
        let pid = std::process::id();
        // A /24 per run, from the pid: 10.231.0.0 - 10.250.255.0.
        let subnet = [10, 231 + ((pid >> 8) % 20) as u8, (pid & 0xff) as u8];
        let bridge = format!("bt{pid}");
        let hosts = Hosts {
            pid,
            bridge: bridge.clone(),
            subnet,
            hosts: Vec::new(),
        };
        if let Err(e) = ip(&["link", "add", &bridge, "type", "bridge"]) {
            bail!(
                "--hosts needs the privileges to create network namespaces and bridges \
                 (root, or CAP_NET_ADMIN and CAP_SYS_ADMIN): {e:#}"
            );
        }
        ip(&[
            "addr",
            "add",
            &format!("{}/24", hosts.gateway()),
            "dev",
            &bridge,
        ])?;
        ip(&["link", "set", &bridge, "up"])?;
        Ok(hosts)
    }

    /// This host's address on the bridge (where clients here come from).
    pub fn gateway(&self) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, 1)
    }

    /// The bridge's network, every host's (`a.b.c.0/24`).
    pub fn network(&self) -> String {
        let [a, b, c] = self.subnet;
        format!("{a}.{b}.{c}.0/24")
    }

    /// A new host named `name` (`agent0`, `dispatch`, `redis`, `client1`...).
    pub fn add(&mut self, name: &str) -> anyhow::Result<Host> {
        let n = self.hosts.len() as u8 + 2;
        if n > 250 {
            bail!("too many hosts");
        }
        let netns = format!("baton-{}-{name}", self.pid);
        let [a, b, c] = self.subnet;
        let addr = Ipv4Addr::new(a, b, c, n);
        // veth names are at most 15 bytes: `bv<pid>x<n>` and its peer `bp<pid>x<n>`
        let outer = format!("bv{}x{n}", self.pid);
        let inner = format!("bp{}x{n}", self.pid);
        ip(&["netns", "add", &netns])?;
        let host = Host {
            name: name.into(),
            netns: netns.clone(),
            addr,
        };
        self.hosts.push(host.clone());
        ip(&[
            "link", "add", &outer, "type", "veth", "peer", "name", &inner, "netns", &netns,
        ])?;
        ip(&["link", "set", &outer, "master", &self.bridge])?;
        ip(&["link", "set", &outer, "up"])?;
        let exec = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &netns, "ip"];
            all.extend_from_slice(args);
            ip(&all)
        };
        exec(&["link", "set", "lo", "up"])?;
        exec(&["link", "set", &inner, "name", "eth0"])?;
        exec(&["addr", "add", &format!("{addr}/24"), "dev", "eth0"])?;
        exec(&["link", "set", "eth0", "up"])?;
        Ok(host)
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }
}

impl Host {
    /// `program` run inside this host (`ip netns exec`, which execs it: the child's pid is
    /// the program's).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns]).arg(program);
        c
    }
}

/// Moves the calling thread into network namespace `netns` (a name of `ip netns`): its
/// sockets, and those of the threads it spawns afterwards, are that host's. The lab's load
/// runs in-process (its reports and CPU accounting), so a client host is a thread that
/// entered the namespace rather than an `ip netns exec` child; the bytes take the same path.
pub fn enter(netns: &str) -> anyhow::Result<()> {
    use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};
    use std::os::fd::AsFd;
    let path = format!("/var/run/netns/{netns}");
    let f = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
    move_into_link_name_space(f.as_fd(), Some(LinkNameSpaceType::Network))
        .with_context(|| format!("entering network namespace {netns}"))
}

/// Adds `rtt` of delay to everything `host` sends (`tc qdisc ... netem` on its link): the
/// lab's RTT for clients on hosts of their own, where its delay proxy would sit on loopback.
pub fn netem_delay(host: &Host, rtt: std::time::Duration) -> anyhow::Result<()> {
    let delay = format!("{}us", rtt.as_micros());
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &host.netns,
            "tc",
            "qdisc",
            "replace",
            "dev",
            "eth0",
        ])
        .args(["root", "netem", "delay", &delay, "limit", "100000"])
        .output()
        .context("running tc (iproute2)")?;
    if !out.status.success() {
        bail!(
            "adding {delay} of delay on {} (the RTT of --hosts is netem's: this kernel needs \
             sch_netem, or run with --rtt 0): {}",
            host.name,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Drop for Hosts {
    fn drop(&mut self) {
        remove(self.pid);
    }
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Removes the namespaces and bridge of run `pid` (their veth pairs go with the namespaces).
fn remove(pid: u32) {
    let prefix = format!("baton-{pid}-");
    for ns in namespaces() {
        if ns.starts_with(&prefix) {
            // a crashed run's children may still be running there
            kill_inside(&ns);
            let _ = ip(&["netns", "del", &ns]);
        }
    }
    // A veth pair goes with its namespace only once the kernel has cleaned the namespace
    // up, which is asynchronous: delete this side now, so a new set of hosts of the same run
    // (the lab starts one per system under test) can take the same names at once.
    let veth = format!("bv{pid}x");
    if let Ok(out) = Command::new("ip").args(["-o", "link", "show"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split(':').nth(1).unwrap_or("").trim();
            let name = name.split('@').next().unwrap_or("");
            if name.starts_with(&veth) {
                let _ = ip(&["link", "del", name]);
            }
        }
    }
    let _ = ip(&["link", "del", &format!("bt{pid}")]);
}

/// Namespaces and bridges of runs whose process is gone (a crash, a SIGKILL).
fn sweep_leftovers() {
    let mut owners: Vec<u32> = namespaces()
        .iter()
        .filter_map(|ns| ns.strip_prefix("baton-")?.split('-').next()?.parse().ok())
        .collect();
    if let Ok(out) = Command::new("ip")
        .args(["-o", "link", "show", "type", "bridge"])
        .output()
    {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split(':').nth(1).unwrap_or("").trim();
            if let Some(pid) = name.strip_prefix("bt").and_then(|p| p.parse().ok()) {
                owners.push(pid);
            }
        }
    }
    owners.sort_unstable();
    owners.dedup();
    for pid in owners {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            tracing::info!(pid, "removing the namespaces of a run that is gone");
            remove(pid);
        }
    }
}

fn namespaces() -> Vec<String> {
    Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().next().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// SIGKILL to every process in namespace `ns`.
fn kill_inside(ns: &str) {
    let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() else {
        return;
    };
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        let _ = Command::new("kill").args(["-KILL", pid]).status();
    }
}
