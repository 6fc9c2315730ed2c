//! nginx as a baseline: the TLS server (the papers' Apache/mod_ssl), the single TLS reverse proxy
//! in front of plain HTTP backends (the CSSL paper's Pound), and those plain backends.
//!
//! Each instance runs in the foreground (`daemon off`, master + one worker) under its own prefix
//! directory, capped like any other server, and logs every request with whether its TLS session
//! was resumed, so the lab reads the server's own full/resumed counts from its access log.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::cap::Confine;
use baton_cluster::signal::Signal;

/// What this nginx does.
#[derive(Debug, Clone)]
pub enum Role {
    /// Terminates TLS and serves the files under `www`.
    TlsServer,
    /// Terminates TLS and proxies to plain HTTP backends (`ip_hash` keeps a client on one).
    TlsProxy {
        backends: Vec<SocketAddr>,
        ip_hash: bool,
    },
    /// Plain HTTP, serving `www`.
    Plain,
}

#[derive(Debug, Clone)]
pub struct Spec {
    pub name: String,
    pub role: Role,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Document root (see [`write_bodies`]).
    pub www: PathBuf,
    /// OpenSSL cipher string for TLS 1.2 (`ssl_ciphers`), e.g. `AES128-GCM-SHA256` for RSA key
    /// exchange; `None` keeps nginx's default.
    pub ciphers: Option<String>,
    /// `ssl_ecdh_curve`, e.g. `X25519` or `prime256v1`.
    pub curve: Option<String>,
}

impl Spec {
    /// An instance named `name` with the lab's certificate and nginx's default ciphers.
    pub fn new(name: &str, role: Role, pki: &baton_cluster::pki::Pki, www: &Path) -> Spec {
        Spec {
            name: name.into(),
            role,
            cert: pki.cert.clone(),
            key: pki.key.clone(),
            www: www.to_path_buf(),
            ciphers: None,
            curve: None,
        }
    }
}

pub struct Nginx {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
}

/// Which nginx binary (`BATON_NGINX` overrides).
pub fn binary() -> PathBuf {
    std::env::var_os("BATON_NGINX")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/nginx"))
}

pub fn available() -> bool {
    binary().exists()
}

impl Nginx {
    pub fn start(spec: &Spec, dir: &Path, confine: Option<&Confine>) -> anyhow::Result<Nginx> {
        Self::start_on(spec, dir, confine, None)
    }

    /// [`Nginx::start`] on `host` (`--hosts`): in its namespace, on its address, port 8443
    /// (the host's ports are its own).
    pub fn start_on(
        spec: &Spec,
        dir: &Path,
        confine: Option<&Confine>,
        host: Option<&baton_cluster::hosts::Host>,
    ) -> anyhow::Result<Nginx> {
        let dir = dir.join(&spec.name);
        std::fs::create_dir_all(dir.join("logs"))?;
        let addr = match host {
            Some(h) => SocketAddr::from((h.addr, 8443)),
            None => SocketAddr::from(([127, 0, 0, 1], super::free_port()?)),
        };
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, config(spec, &dir, addr))?;
        let mut cmd = match host {
            Some(h) => h.command(binary()),
            None => Command::new(binary()),
        };
        cmd.arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(dir.join("logs/error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr.log"))?);
        if let Some(c) = confine {
            c.apply(&mut cmd)?;
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", binary().display()))?;
        let mut n = Nginx { child, addr, dir };
        n.wait_listening()?;
        Ok(n)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_listening(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                bail!("nginx exited at start ({status}): {}", self.error_tail());
            }
            if std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok()
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "nginx did not listen on {} in 10 s: {}",
            self.addr,
            self.error_tail()
        )
    }

    fn error_tail(&self) -> String {
        let mut s = std::fs::read_to_string(self.dir.join("logs/error.log")).unwrap_or_default();
        s.push_str(&std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default());
        s.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
    }

    /// The server's own view from its access log: requests and TLS handshakes full/resumed.
    /// nginx writes the log as requests finish, so read it after the run.
    pub fn counts(&self) -> anyhow::Result<Counts> {
        let log = std::fs::read_to_string(self.dir.join("logs/access.log"))
            .with_context(|| format!("reading {}/logs/access.log", self.dir.display()))?;
        Ok(Counts::parse(&log))
    }

    /// Errors nginx logged at `[error]` or worse (a baseline that silently failed would make
    /// every comparison a lie).
    pub fn logged_errors(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("logs/error.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                ["[error]", "[crit]", "[alert]", "[emerg]"]
                    .iter()
                    .any(|k| l.contains(k))
            })
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM is nginx's fast shutdown; the master takes its worker with it.
        baton_cluster::signal::send(self.child.id(), Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Requests and handshakes seen by one nginx, from its access log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    pub requests: u64,
    /// Requests on a connection whose TLS session was new (a full handshake). With one request
    /// per connection this is the number of full handshakes.
    pub full: u64,
    pub resumed: u64,
    /// Responses with status >= 400.
    pub errors: u64,
}

impl Counts {
    /// Lines are `lab <reused> <status> <connection requests>` (see [`config`]): `r` marks a
    /// resumed session, `.` a new one, `-` plain HTTP. Only the first request of a connection
    /// counts as its handshake.
    pub fn parse(log: &str) -> Counts {
        let mut c = Counts::default();
        for line in log.lines() {
            let mut f = line.split_whitespace();
            if f.next() != Some("lab") {
                continue;
            }
            let reused = f.next().unwrap_or("-");
            let status: u16 = f.next().and_then(|s| s.parse().ok()).unwrap_or(0);
            let nth: u64 = f.next().and_then(|s| s.parse().ok()).unwrap_or(1);
            c.requests += 1;
            if status >= 400 || status == 0 {
                c.errors += 1;
            }
            if nth == 1 {
                match reused {
                    "r" => c.resumed += 1,
                    "." => c.full += 1,
                    _ => {}
                }
            }
        }
        c
    }
}

/// The nginx.conf of one instance: foreground, one worker, everything under `dir`.
fn config(spec: &Spec, dir: &Path, addr: SocketAddr) -> String {
    let d = dir.display();
    let tls = !matches!(spec.role, Role::Plain);
    let mut server = String::new();
    if tls {
        server.push_str(&format!(
            "    listen {addr} ssl;\n    ssl_certificate {};\n    ssl_certificate_key {};\n    \
             ssl_protocols TLSv1.2 TLSv1.3;\n    ssl_session_cache shared:lab:10m;\n    \
             ssl_session_timeout 10m;\n    ssl_session_tickets on;\n",
            spec.cert.display(),
            spec.key.display()
        ));
        if let Some(c) = &spec.ciphers {
            server.push_str(&format!("    ssl_ciphers {c};\n"));
        }
        if let Some(c) = &spec.curve {
            server.push_str(&format!("    ssl_ecdh_curve {c};\n"));
        }
    } else {
        server.push_str(&format!("    listen {addr};\n"));
    }
    let (upstream, location) = match &spec.role {
        Role::TlsProxy { backends, ip_hash } => {
            let mut u = String::from("  upstream backends {\n");
            if *ip_hash {
                u.push_str("    ip_hash;\n");
            }
            for b in backends {
                u.push_str(&format!("    server {b};\n"));
            }
            u.push_str("    keepalive 32;\n  }\n");
            (
                u,
                "    location / {\n      proxy_pass http://backends;\n      \
                 proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }\n"
                    .to_string(),
            )
        }
        _ => (
            String::new(),
            format!("    root {};\n    location / {{ }}\n", spec.www.display()),
        ),
    };
    let reused = if tls { "$ssl_session_reused" } else { "-" };
    format!(
        "daemon off;\nmaster_process on;\nworker_processes 1;\nuser root;\npid {d}/nginx.pid;\n\
         error_log {d}/logs/error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  \
           default_type application/octet-stream;\n  \
           log_format lab 'lab {reused} $status $connection_requests';\n  \
           access_log {d}/logs/access.log lab buffer=64k flush=1s;\n  \
           client_body_temp_path {d}/tmp-body;\n  proxy_temp_path {d}/tmp-proxy;\n  \
           fastcgi_temp_path {d}/tmp-fcgi;\n  uwsgi_temp_path {d}/tmp-uwsgi;\n  \
           scgi_temp_path {d}/tmp-scgi;\n  \
           keepalive_requests 100000;\n\
         {upstream}  server {{\n{server}{location}  }}\n}}\n"
    )
}

/// Writes `www/bytes/N` files of N bytes, so nginx answers `/bytes/N` like `baton agent`'s
/// built-in responder.
pub fn write_bodies(www: &Path, sizes: &[usize]) -> anyhow::Result<()> {
    std::fs::create_dir_all(www.join("bytes"))?;
    for &n in sizes {
        let body: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
        std::fs::write(www.join(format!("bytes/{n}")), body)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_take_the_first_request_of_each_connection_as_its_handshake() {
        let log = "lab . 200 1\nlab r 200 1\nlab r 200 2\nlab . 404 1\nnoise\nlab - 200 1\n";
        assert_eq!(
            Counts::parse(log),
            Counts {
                requests: 5,
                full: 2,
                resumed: 1,
                errors: 1
            }
        );
    }

    #[test]
    fn the_proxy_config_lists_its_backends() {
        let spec = Spec {
            name: "p".into(),
            role: Role::TlsProxy {
                backends: vec![
                    "127.0.0.1:1".parse().unwrap(),
                    "127.0.0.1:2".parse().unwrap(),
                ],
                ip_hash: true,
            },
            cert: "c.pem".into(),
            key: "k.pem".into(),
            www: "www".into(),
            ciphers: None,
            curve: None,
        };
        let c = config(&spec, Path::new("/d"), "127.0.0.1:9".parse().unwrap());
        assert!(c.contains("ip_hash;"));
        assert!(c.contains("server 127.0.0.1:1;") && c.contains("server 127.0.0.1:2;"));
        assert!(c.contains("listen 127.0.0.1:9 ssl;"));
    }
}
