//! Pebble, Let's Encrypt's test ACME CA, and its `pebble-challtestsrv` as the DNS server that
//! points every name at 127.0.0.1, as child processes on free ports. Built by `scripts/test`
//! (`go install`, pinned to [`PEBBLE_VERSION`]); a test without them skips, or fails under
//! `BATON_REQUIRE_SERVERS`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, require_or_skip, TempDir};

pub const PEBBLE_VERSION: &str = "v2.10.3";

/// The binaries and the module's test folder (its TLS certificate and key, and its CA).
struct Install {
    pebble: PathBuf,
    challtestsrv: PathBuf,
    test_dir: PathBuf,
}

fn go_env(var: &str) -> Option<PathBuf> {
    let out = Command::new("go").args(["env", var]).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then(|| PathBuf::from(s))
}

fn install() -> Option<Install> {
    let bin = go_env("GOBIN")
        .or_else(|| go_env("GOPATH").map(|p| p.join("bin")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join("go/bin")))?;
    let modcache = go_env("GOMODCACHE")
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join("go/pkg/mod")))?;
    let i = Install {
        pebble: bin.join("pebble"),
        challtestsrv: bin.join("pebble-challtestsrv"),
        test_dir: modcache.join(format!(
            "github.com/letsencrypt/pebble/v2@{PEBBLE_VERSION}/test"
        )),
    };
    (i.pebble.exists() && i.challtestsrv.exists() && i.test_dir.exists()).then_some(i)
}

/// Pebble and its DNS, killed on drop.
pub struct Pebble {
    pebble: Option<Child>,
    dns: Child,
    pub directory: String,
    /// The CA of Pebble's own HTTPS certificate (for `--acme-directory-ca`).
    pub https_ca: String,
    pub management: u16,
    /// The DNS server's management API (`/set-txt`, `/clear-txt`).
    pub dns_management: u16,
    dir: TempDir,
}

impl Drop for Pebble {
    fn drop(&mut self) {
        self.stop();
        let _ = self.dns.kill();
        let _ = self.dns.wait();
    }
}

fn wait_port(port: u16) {
    let until = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < until, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Pebble {
    /// Pebble issuing certificates valid `validity` seconds, validating TLS-ALPN-01 on
    /// 127.0.0.1:`tls_port` and HTTP-01 on `http_port`; `None` (the test skips) when it is not
    /// installed.
    pub fn start(validity: u64, tls_port: u16, http_port: u16) -> Option<Pebble> {
        let Some(i) = install() else {
            require_or_skip(
                "pebble",
                "the ACME tests' CA: go install github.com/letsencrypt/pebble/v2/cmd/pebble@v2.10.3 \
                 and .../cmd/pebble-challtestsrv@v2.10.3",
            );
            return None;
        };
        let dir = TempDir::new("pebble");
        let (acme, management, dns_port, dns_management) =
            (free_port(), free_port(), free_port(), free_port());
        let config = serde_json::json!({
            "pebble": {
                "listenAddress": format!("127.0.0.1:{acme}"),
                "managementListenAddress": format!("127.0.0.1:{management}"),
                "certificate": i.test_dir.join("certs/localhost/cert.pem"),
                "privateKey": i.test_dir.join("certs/localhost/key.pem"),
                "httpPort": http_port,
                "tlsPort": tls_port,
                "ocspResponderURL": "",
                "externalAccountBindingRequired": false,
                "retryAfter": { "authz": 1, "order": 1 },
                "keyAlgorithm": "ecdsa",
                "profiles": {
                    "default": { "description": "short-lived, for the tests", "validityPeriod": validity }
                }
            }
        });
        let config_path = dir.path("pebble.json");
        std::fs::write(&config_path, config.to_string()).unwrap();
        let dns = Command::new(&i.challtestsrv)
            .args([
                "-dnsserver",
                &format!("127.0.0.1:{dns_port}"),
                "-management",
                &format!("127.0.0.1:{dns_management}"),
                "-defaultIPv4",
                "127.0.0.1",
                "-defaultIPv6",
                "",
                "-http01",
                "",
                "-https01",
                "",
                "-tlsalpn01",
                "",
                "-doh",
                "",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("pebble-challtestsrv");
        wait_port(dns_management);
        let mut p = Pebble {
            pebble: None,
            dns,
            directory: format!("https://localhost:{acme}/dir"),
            https_ca: i
                .test_dir
                .join("certs/pebble.minica.pem")
                .display()
                .to_string(),
            management,
            dns_management,
            dir,
        };
        p.pebble = Some(
            Command::new(&i.pebble)
                .args(["-config", config_path.to_str().unwrap()])
                .args(["-dnsserver", &format!("127.0.0.1:{dns_port}")])
                .env("PEBBLE_VA_NOSLEEP", "1")
                .env("PEBBLE_WFE_NONCEREJECT", "0")
                // every order validated anew (renewals too), none on an earlier authorization
                .env("PEBBLE_AUTHZREUSE", "0")
                .stdout(Stdio::from(
                    std::fs::File::create(p.dir.path("pebble.log")).unwrap(),
                ))
                .stderr(Stdio::null())
                .spawn()
                .expect("pebble"),
        );
        wait_port(acme);
        wait_port(management);
        Some(p)
    }

    /// Stops the CA (its DNS stays up): orders fail from now on.
    pub fn stop(&mut self) {
        if let Some(mut p) = self.pebble.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
    }

    /// Pebble's root (PEM), from its management API, written to a file: the CA that the issued
    /// chains lead to (generated anew by each Pebble).
    pub fn root_file(&self) -> String {
        let root = self.management("/roots/0", None);
        let path = self.dir.path("root.pem");
        std::fs::write(&path, root).unwrap();
        path.display().to_string()
    }

    /// A call to Pebble's management API (`post`: a POST with that body, else a GET); its
    /// answer, which must be a success.
    pub fn management(&self, path: &str, post: Option<&str>) -> Vec<u8> {
        let mut curl = Command::new("curl");
        curl.args([
            "-sS",
            "--fail",
            "--max-time",
            "10",
            "--cacert",
            &self.https_ca,
        ]);
        if let Some(body) = post {
            curl.args(["-X", "POST", "-d", body]);
        }
        let out = curl
            .arg(format!("https://localhost:{}{path}", self.management))
            .output()
            .expect("curl");
        assert!(
            out.status.success(),
            "{path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// Pebble's log so far (what it validated and issued).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path("pebble.log")).unwrap_or_default()
    }
}
