//! HAProxy as the papers' L4 balancer (their TMX3000 / LB): `mode tcp` in front of TLS servers,
//! `balance source` (LB-IP, client affinity by address) or `balance roundrobin` (LB-RR).
//! It runs in the foreground with a stats socket, so the lab reads how many connections it sent
//! to each server from HAProxy itself, and logs every connection to its log file.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::cap::Confine;

pub struct Haproxy {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
}

pub fn binary() -> PathBuf {
    std::env::var_os("BATON_HAPROXY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/haproxy"))
}

pub fn available() -> bool {
    binary().exists()
}

impl Haproxy {
    /// `balance` is `source` or `roundrobin`.
    pub fn start(
        name: &str,
        balance: &str,
        servers: &[SocketAddr],
        dir: &Path,
        confine: Option<&Confine>,
    ) -> anyhow::Result<Haproxy> {
        Self::start_as(name, balance, servers, dir, confine, false, None)
    }

    /// [`Haproxy::start`] on `host` (`--hosts`; not capped, like the lab's balancers): in its
    /// namespace, on its address, port 8443.
    pub fn start_on(
        name: &str,
        balance: &str,
        servers: &[SocketAddr],
        dir: &Path,
        host: Option<&baton_cluster::hosts::Host>,
    ) -> anyhow::Result<Haproxy> {
        Self::start_as(name, balance, servers, dir, None, false, host)
    }

    /// HAProxy as it stands in front of servers that may die (`dispatcher-failover`): TCP
    /// health checks every 0.5 s (two misses take a server out), a refused connect retried on
    /// another server (`option redispatch`), and a PROXY v2 header to the servers, so the
    /// dispatchers behind it see each client's own address (their homes are chosen by it).
    pub fn start_failover(
        name: &str,
        servers: &[SocketAddr],
        dir: &Path,
    ) -> anyhow::Result<Haproxy> {
        Self::start_as(name, "roundrobin", servers, dir, None, true, None)
    }

    fn start_as(
        name: &str,
        balance: &str,
        servers: &[SocketAddr],
        dir: &Path,
        confine: Option<&Confine>,
        failover: bool,
        host: Option<&baton_cluster::hosts::Host>,
    ) -> anyhow::Result<Haproxy> {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir)?;
        let addr = match host {
            Some(h) => SocketAddr::from((h.addr, 8443)),
            None => SocketAddr::from(([127, 0, 0, 1], super::free_port()?)),
        };
        let cfg = dir.join("haproxy.cfg");
        let mut text = config(balance, addr, servers, &dir);
        if failover {
            text = failover_config(&text);
        }
        std::fs::write(&cfg, text)?;
        let log = std::fs::File::create(dir.join("haproxy.log"))?;
        let mut cmd = match host {
            Some(h) => h.command(binary()),
            None => Command::new(binary()),
        };
        cmd.arg("-db")
            .arg("-f")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some(c) = confine {
            c.apply(&mut cmd)?;
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", binary().display()))?;
        let mut h = Haproxy { child, addr, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = h.child.try_wait()? {
                bail!("haproxy exited at start ({status}): {}", h.log_tail());
            }
            // Ready when its stats socket answers (a probe connection to the frontend would be
            // forwarded, logged and counted as a client's).
            if h.per_server_connections().is_ok() {
                return Ok(h);
            }
            if Instant::now() > deadline {
                bail!(
                    "haproxy did not listen on {} in 10 s: {}",
                    h.addr,
                    h.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log_tail(&self) -> String {
        std::fs::read_to_string(self.dir.join("haproxy.log"))
            .unwrap_or_default()
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .join(" | ")
    }

    /// Connections sent to each server so far (`stot` of `show stat`), in server order.
    pub fn per_server_connections(&self) -> anyhow::Result<Vec<u64>> {
        let mut s = UnixStream::connect(self.dir.join("stats.sock"))
            .context("connecting to haproxy's stats socket")?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"show stat\n")?;
        let mut out = String::new();
        s.take(1 << 20).read_to_string(&mut out)?;
        parse_stot(&out)
    }

    /// Whether every connection HAProxy sent on has been logged (it logs one when both sides
    /// have closed, which may come a moment after the client is done).
    pub fn all_logged(&self) -> bool {
        self.per_server_connections()
            .is_ok_and(|per| self.logged_connections() as u64 >= per.iter().sum::<u64>())
    }

    /// Connections HAProxy logged (one line per connection with `option tcplog`).
    pub fn logged_connections(&self) -> usize {
        std::fs::read_to_string(self.dir.join("haproxy.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(" be/s"))
            .count()
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One thread (`nbthread 1`): with two, HAProxy drops a log line whenever the other thread is
/// writing one and does not finish within 200 spins (`fd_write_frag_line`, "we prefer to fail
/// on collision than to block"). On a loaded 2-core machine that happened (599 lines for 600
/// connections), and the lab reads the connection log as HAProxy's own count. One thread
/// carries these loads with room to spare (under 0.5 ms of CPU per connection).
fn config(balance: &str, addr: SocketAddr, servers: &[SocketAddr], dir: &Path) -> String {
    let mut s = format!(
        "global\n  nbthread 1\n  maxconn 8000\n  stats socket {}/stats.sock mode 600 level user\n  \
         log stdout format raw local0 info\n\
         defaults\n  mode tcp\n  log global\n  option tcplog\n  timeout connect 5s\n  \
         timeout client 60s\n  timeout server 60s\n\
         frontend fe\n  bind {addr}\n  default_backend be\n\
         backend be\n  balance {balance}\n",
        dir.display()
    );
    for (i, a) in servers.iter().enumerate() {
        s.push_str(&format!("  server s{i} {a}\n"));
    }
    s
}

/// [`config`] with health checks, redispatch and PROXY v2 to every server.
fn failover_config(base: &str) -> String {
    let mut out = String::new();
    for line in base.lines() {
        if line.trim_start().starts_with("server ") {
            out.push_str(line);
            out.push_str(" check\n");
            continue;
        }
        out.push_str(line);
        out.push('\n');
        if line == "defaults" {
            out.push_str("  retries 3\n  option redispatch 1\n");
        }
        if line.trim_start().starts_with("balance ") {
            out.push_str("  default-server inter 500ms fall 2 rise 1 send-proxy-v2\n");
        }
    }
    out
}

/// `stot` (total sessions) of each `be,sN` row of `show stat` CSV.
fn parse_stot(csv: &str) -> anyhow::Result<Vec<u64>> {
    let mut lines = csv.lines();
    let header = lines
        .next()
        .and_then(|h| h.strip_prefix("# "))
        .context("haproxy stats: no header")?;
    let col = |name: &str| header.split(',').position(|c| c == name);
    let (px, sv, stot) = match (col("pxname"), col("svname"), col("stot")) {
        (Some(a), Some(b), Some(c)) => (a, b, c),
        _ => bail!("haproxy stats: missing pxname/svname/stot"),
    };
    let mut out = Vec::new();
    for l in lines {
        let f: Vec<&str> = l.split(',').collect();
        if f.get(px) == Some(&"be") && f.get(sv).is_some_and(|s| s.starts_with('s')) {
            out.push(f.get(stot).and_then(|v| v.parse().ok()).unwrap_or(0));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failover_config_checks_redispatches_and_sends_proxy_v2() {
        let servers = [
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
        ];
        let base = config(
            "roundrobin",
            "127.0.0.1:9".parse().unwrap(),
            &servers,
            Path::new("/d"),
        );
        let c = failover_config(&base);
        assert!(
            c.contains("defaults\n  retries 3\n  option redispatch 1\n"),
            "{c}"
        );
        assert!(
            c.contains(
                "balance roundrobin\n  default-server inter 500ms fall 2 rise 1 send-proxy-v2\n"
            ),
            "{c}"
        );
        assert!(
            c.contains("  server s0 127.0.0.1:1 check\n  server s1 127.0.0.1:2 check\n"),
            "{c}"
        );
    }

    #[test]
    fn stot_per_server_from_show_stat() {
        let csv = "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin\n\
                   fe,FRONTEND,,,0,3,20000,30,1\nbe,s0,0,0,0,2,,21,1\nbe,s1,0,0,0,1,,9,1\n\
                   be,BACKEND,0,0,0,3,2000,30,1\n";
        assert_eq!(parse_stot(csv).unwrap(), vec![21, 9]);
    }
}
