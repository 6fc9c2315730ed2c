//! ACME across a cluster: `baton up` with three agents behind the dispatcher orders its
//! certificates from Pebble (Let's Encrypt's test CA, validating TLS-ALPN-01 on the
//! dispatcher's port), once per name for the cluster, and every agent serves them; a short
//! lifetime renews under load with no failed request; with the CA gone the attempts back off
//! and the certificate served stays. DNS-01 through the hook, HTTP-01 through the agent's
//! plain-HTTP listener.

mod common;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

const NAMES: [&str; 2] = ["a.baton.test", "b.baton.test"];

/// A lifetime no test outlives: Pebble's renewal window for it (two thirds of the lifetime,
/// give or take a day) is weeks away, so nothing is renewed unless a test means it.
const LONG: u64 = 60 * 86400;

/// Polls `f` every 500 ms until it holds, for at most `limit`.
fn until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A cluster of three agents sharing `store` (peers, redis=URL) ordering `NAMES` from
/// `pebble`, its dispatcher on `port` (where Pebble validates).
fn cluster(pebble: &Pebble, port: u16, store: &str) -> Up {
    let mut args: Vec<String> = vec![
        "--agents".into(),
        "3".into(),
        "--store".into(),
        store.into(),
        format!("--agent-arg=--acme-directory={}", pebble.directory),
        format!("--agent-arg=--acme-directory-ca={}", pebble.https_ca),
        "--agent-arg=--acme-email=ops@baton.test".into(),
    ];
    for n in NAMES {
        args.push(format!("--agent-arg=--acme-domain={n}"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Up::start_on(([127, 0, 0, 1], port).into(), &args)
}

/// Orders of `name` that succeeded, over all agents.
fn issued(up: &Up, name: &str) -> f64 {
    up.agents_sum(
        "baton_certificate_renewals_total",
        &format!("name=\"{name}\",outcome=\"ok\""),
    )
}

/// The serial of the certificate the cluster serves for `name` on one connection, checked by
/// `openssl s_client` against Pebble's root; `None` when it does not verify.
fn served_serial(up: &Up, root: &str, name: &str) -> Option<String> {
    served_serial_at(&up.addr().to_string(), root, name)
}

fn served_serial_at(addr: &str, root: &str, name: &str) -> Option<String> {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", addr])
        .args(["-servername", name, "-verify_hostname", name])
        .args(["-CAfile", root, "-verify_return_error"])
        .stdin(Stdio::null())
        .output()
        .expect("openssl s_client");
    let text = String::from_utf8_lossy(&out.stdout);
    if !text.contains("Verify return code: 0 (ok)") {
        return None;
    }
    let mut x509 = Command::new("openssl")
        .args(["x509", "-noout", "-serial"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    x509.stdin.take().unwrap().write_all(&out.stdout).unwrap();
    let serial = String::from_utf8(x509.wait_with_output().unwrap().stdout).unwrap();
    // no certificate at all (a handshake that failed) verifies nothing
    serial
        .trim()
        .starts_with("serial=")
        .then(|| serial.trim().to_string())
}

/// What each of the three agents serves for `name`: the dispatcher spreads connections in
/// turn (round-robin), so six in a row reach every agent twice.
fn served_by_all(up: &Up, root: &str, name: &str) -> Vec<Option<String>> {
    (0..6).map(|_| served_serial(up, root, name)).collect()
}

/// Waits (20 s at most) until every agent serves one certificate for `name` that verifies
/// against `root`; its serial.
fn served_by_every_agent(up: &Up, root: &str, name: &str) -> String {
    let mut serials = Vec::new();
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        serials = served_by_all(up, root, name);
        if serials.iter().all(|s| s.is_some() && *s == serials[0]) {
            return serials[0].clone().unwrap();
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!("{name}: every agent serves the one issued certificate: {serials:?}");
}

#[test]
fn one_order_per_name_for_the_cluster_and_every_agent_serves_it() {
    one_order_for_the_cluster(|| Some(("peers".to_string(), None)));
}

#[test]
fn one_order_per_name_for_a_cluster_sharing_redis() {
    one_order_for_the_cluster(|| {
        let redis = Redis::start()?;
        Some((format!("redis={}", redis.url()), Some(redis)))
    });
}

/// Both names issued once for the cluster sharing the store `store` gives (and keeps up while
/// the test runs), and served by every agent.
fn one_order_for_the_cluster(store: impl FnOnce() -> Option<(String, Option<Redis>)>) {
    let port = free_port();
    let Some(pebble) = Pebble::start(LONG, port, free_port()) else {
        return;
    };
    let Some((store, _redis)) = store() else {
        return;
    };
    let up = cluster(&pebble, port, &store);
    until("both certificates issued", Duration::from_secs(120), || {
        NAMES.iter().all(|n| issued(&up, n) >= 1.0)
    });
    let root = pebble.root_file();
    for name in NAMES {
        served_by_every_agent(&up, &root, name);
    }
    // the names the file certificate is for are served as before, beside them
    let roots = baton_lab::soak::load::roots(up.ca().as_ref()).unwrap();
    let config = Arc::new(
        rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );
    let r = fetch_sni(&Addr(up.addr()), &config, "localhost", "/").unwrap();
    assert_eq!(r.status, 200);
    // no agent orders again: each name was ordered once, and the others only serve it
    std::thread::sleep(Duration::from_secs(10));
    for name in NAMES {
        assert_eq!(issued(&up, name), 1.0, "{name}: one order for the cluster");
        assert_eq!(
            up.agents_sum(
                "baton_certificate_renewals_total",
                &format!("name=\"{name}\",outcome=\"failed\"")
            ),
            0.0
        );
    }
}

#[test]
fn renews_under_load_without_a_failed_request_and_keeps_it_while_the_ca_is_down() {
    let port = free_port();
    // renewed at two thirds: about every 30 s
    let Some(mut pebble) = Pebble::start(45, port, free_port()) else {
        return;
    };
    let up = cluster(&pebble, port, "peers");
    until("first certificates", Duration::from_secs(120), || {
        NAMES.iter().all(|n| issued(&up, n) >= 1.0)
    });
    let root = pebble.root_file();
    // the agents that did not order adopt the certificates within a few seconds
    let first = served_by_every_agent(&up, &root, NAMES[0]);
    served_by_every_agent(&up, &root, NAMES[1]);

    // Requests in a loop (bounded in count and time) while the certificate is renewed.
    let roots = baton_lab::soak::load::roots(root.as_ref()).unwrap();
    let config = Arc::new(
        rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let load = {
        let (stop, ok, failed, addr) = (stop.clone(), ok.clone(), failed.clone(), up.addr());
        std::thread::spawn(move || {
            let mut errors = Vec::new();
            for i in 0..20_000u32 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let name = NAMES[i as usize % 2];
                match fetch_sni(&Addr(addr), &config, name, "/") {
                    Ok(r) if r.status == 200 => ok.fetch_add(1, Ordering::Relaxed),
                    other => {
                        errors.push(format!("{name}: {:?}", other.map(|r| r.status)));
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
                std::thread::sleep(Duration::from_millis(20));
            }
            errors
        })
    };
    until(
        "both certificates renewed",
        Duration::from_secs(120),
        || NAMES.iter().all(|n| issued(&up, n) >= 2.0),
    );
    // a little more load on the renewed certificates
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let errors = load.join().unwrap();
    assert!(ok.load(Ordering::Relaxed) > 50, "the load ran");
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "failed requests: {errors:?}"
    );
    let renewed = served_serial(&up, &root, NAMES[0]).expect("renewed, served and verified");
    assert_ne!(renewed, first, "a new certificate is served");
    for name in NAMES {
        // renewed (as often as the CA's window, the whole short lifetime here, had it), and
        // by one agent for the cluster
        let n = issued(&up, name);
        assert!(n >= 2.0, "{name}: {n} orders");
        let by: Vec<f64> = (0..3)
            .map(|i| {
                up.agent_sum(
                    i,
                    "baton_certificate_renewals_total",
                    &format!("name=\"{name}\",outcome=\"ok\""),
                )
            })
            .collect();
        assert_eq!(by.iter().filter(|&&n| n > 0.0).count(), 1, "{name}: {by:?}");
    }

    // The CA goes away: the next renewal fails, is retried with backoff, and the certificate
    // served stays the renewed one (still valid) on every agent.
    pebble.stop();
    let failed_of = |name: &str| {
        up.agents_sum(
            "baton_certificate_renewals_total",
            &format!("name=\"{name}\",outcome=\"failed\""),
        )
    };
    until("failed renewals", Duration::from_secs(90), || {
        failed_of(NAMES[0]) >= 2.0
    });
    let since = up.agents_sum(
        "baton_certificate_renewal_failing_since_timestamp_seconds",
        &format!("name=\"{}\"", NAMES[0]),
    );
    assert!(since > 1.7e9, "the failing run is dated: {since}");
    let serving = served_serial(&up, &root, NAMES[0]);
    let latest = serving
        .clone()
        .expect("the old certificate is still served and valid");
    assert!(issued(&up, NAMES[0]) >= 2.0);
    // backoff: a handful of attempts in those seconds, not one per period
    assert!(
        failed_of(NAMES[0]) <= 6.0,
        "{} attempts",
        failed_of(NAMES[0])
    );
    for s in served_by_all(&up, &root, NAMES[0]) {
        assert_eq!(s.as_deref(), Some(latest.as_str()), "every agent keeps it");
    }
}

/// The key type of the certificate `addr` serves for `name` when the client offers only
/// `sigalgs`, verified against `root`.
fn served_key(addr: std::net::SocketAddr, root: &str, name: &str, sigalgs: &str) -> Option<String> {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string(), "-tls1_3"])
        .args(["-servername", name, "-verify_hostname", name])
        .args(["-CAfile", root, "-verify_return_error", "-sigalgs", sigalgs])
        .stdin(Stdio::null())
        .output()
        .expect("openssl s_client");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if !text.contains("Verify return code: 0 (ok)") {
        return None;
    }
    text.lines()
        .find(|l| l.contains("Peer signature type:") || l.contains("Peer signature type"))
        .map(|l| l.trim().to_string())
}

#[test]
fn dns_01_through_the_hook_with_dual_certificates() {
    let Some(pebble) = Pebble::start(LONG, free_port(), free_port()) else {
        return;
    };
    let dir = TempDir::new("acme-dns");
    let hook = dns_hook(&dir, pebble.dns_management);
    let calls = dir.path("calls");
    let name = "dns.baton.test";
    // ACME alone: no file certificate
    let agent = Agent::start(&[
        &format!("--acme-directory={}", pebble.directory),
        &format!("--acme-directory-ca={}", pebble.https_ca),
        &format!("--acme-domain={name}"),
        "--acme-challenge=dns-01",
        &format!("--acme-dns-hook={hook}"),
        "--acme-key=ecdsa-p256",
        "--acme-key=rsa-2048",
    ]);
    let ok = format!("baton_certificate_renewals_total{{name=\"{name}\",outcome=\"ok\"}}");
    until("both certificates issued", Duration::from_secs(120), || {
        agent.metric(&ok) >= 2.0
    });
    let root = pebble.root_file();
    let ecdsa = served_key(agent.addr, &root, name, "ECDSA+SHA256").expect("ECDSA verified");
    assert!(ecdsa.contains("ECDSA"), "{ecdsa}");
    let rsa = served_key(agent.addr, &root, name, "RSA-PSS+SHA256").expect("RSA verified");
    assert!(rsa.contains("RSA"), "{rsa}");
    let calls = std::fs::read_to_string(&calls).unwrap();
    let record = format!("_acme-challenge.{name}");
    assert_eq!(
        calls.matches(&format!("present {record}")).count(),
        2,
        "{calls}"
    );
    assert_eq!(
        calls.matches(&format!("cleanup {record}")).count(),
        2,
        "{calls}"
    );
}

#[test]
fn an_agent_that_starts_while_the_store_holds_a_valid_certificate_never_orders() {
    let Some(pebble) = Pebble::start(LONG, free_port(), free_port()) else {
        return;
    };
    let Some(redis) = Redis::start() else {
        return;
    };
    let dir = TempDir::new("acme-restart");
    let line = baton_session::generate_key_line().unwrap();
    let key = cluster_key_file(&dir, "cluster.key", &[&line]);
    let name = "solo.baton.test";
    let store = format!("--store=redis={}", redis.url());
    let args = [
        format!("--acme-directory={}", pebble.directory),
        format!("--acme-directory-ca={}", pebble.https_ca),
        format!("--acme-domain={name}"),
        "--acme-challenge=dns-01".to_string(),
        format!("--acme-dns-hook={}", dns_hook(&dir, pebble.dns_management)),
        store,
        format!("--cluster-key-file={key}"),
        "--agent-id=0".to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ok = format!("baton_certificate_renewals_total{{name=\"{name}\",outcome=\"ok\"}}");
    let root;
    let first = {
        let agent = Agent::start(&args);
        until("issued", Duration::from_secs(120), || {
            agent.metric(&ok) >= 1.0
        });
        root = pebble.root_file();
        served_key_serial(agent.addr, &root, name).expect("served")
    };
    // Long after the last agent stopped posting: only what the store keeps is left.
    std::thread::sleep(Duration::from_secs(12));
    let agent = Agent::start(&args);
    until(
        "the kept certificate served",
        Duration::from_secs(30),
        || served_key_serial(agent.addr, &root, name).as_deref() == Some(first.as_str()),
    );
    // settled, and the lowest (only) agent: it orders nothing, the certificate being valid
    std::thread::sleep(Duration::from_secs(10));
    assert_eq!(agent.metric(&ok), 0.0, "no order");
    assert_eq!(
        served_key_serial(agent.addr, &root, name).as_deref(),
        Some(first.as_str())
    );
}

/// The serial of what `addr` serves for `name`, verified against `root`.
/// Pebble, Redis, a cluster key and a dns-01 hook that holds every order `delay` seconds: two
/// agents' orders then overlap for as long as a test needs.
struct HeldOrders {
    pebble: Pebble,
    redis: Redis,
    dir: TempDir,
    key: String,
    hook: String,
}

impl HeldOrders {
    fn start(dir: &str, delay: u64) -> Option<HeldOrders> {
        let pebble = Pebble::start(LONG, free_port(), free_port())?;
        let redis = Redis::start()?;
        let dir = TempDir::new(dir);
        let line = baton_session::generate_key_line().unwrap();
        let key = cluster_key_file(&dir, "cluster.key", &[&line]);
        let hook = dns_hook(&dir, pebble.dns_management);
        std::fs::write(dir.path("delay"), delay.to_string()).unwrap();
        Some(HeldOrders {
            pebble,
            redis,
            dir,
            key,
            hook,
        })
    }

    /// An agent `id` ordering `name` by dns-01 through the hook, sharing the Redis store.
    fn agent_args(&self, name: &str, id: u16) -> Vec<String> {
        vec![
            format!("--acme-directory={}", self.pebble.directory),
            format!("--acme-directory-ca={}", self.pebble.https_ca),
            format!("--acme-domain={name}"),
            "--acme-challenge=dns-01".to_string(),
            format!("--acme-dns-hook={}", self.hook),
            format!("--store=redis={}", self.redis.url()),
            format!("--cluster-key-file={}", self.key),
            format!("--agent-id={id}"),
        ]
    }
}

fn served_key_serial(addr: std::net::SocketAddr, root: &str, name: &str) -> Option<String> {
    served_serial_at(&addr.to_string(), root, name)
}

/// A `--acme-dns-hook` that sets and clears the TXT record in Pebble's DNS (its management API
/// on `port`), and notes each call in `calls` in `dir`; its path. While a file `delay` in `dir`
/// holds a number of seconds, `present` waits that long first (an order held in flight).
fn dns_hook(dir: &TempDir, port: u16) -> String {
    let hook = dir.path("hook.sh");
    let calls = dir.path("calls");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\nset -e\necho \"$1 $2\" >> {calls}\ncase \"$1\" in\n\
             present) body=\"{{\\\"host\\\":\\\"$2.\\\",\\\"value\\\":\\\"$3\\\"}}\"; path=set-txt ;;\n\
             cleanup) body=\"{{\\\"host\\\":\\\"$2.\\\"}}\"; path=clear-txt ;;\n\
             *) exit 2 ;;\nesac\n\
             if [ \"$1\" = present ] && [ -f {delay} ]; then sleep \"$(cat {delay})\"; fi\n\
             curl -sS --fail --max-time 10 -X POST -d \"$body\" http://127.0.0.1:{port}/$path\n",
            calls = calls.display(),
            delay = dir.path("delay").display(),
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    hook.display().to_string()
}

#[test]
fn http_01_through_the_plain_http_listener() {
    let http_port = free_port();
    let Some(pebble) = Pebble::start(LONG, free_port(), http_port) else {
        return;
    };
    let name = "web.baton.test";
    // ACME alone, validated on the plain-HTTP listener, which redirects everything else
    let agent = Agent::start(&[
        &format!("--acme-directory={}", pebble.directory),
        &format!("--acme-directory-ca={}", pebble.https_ca),
        &format!("--acme-domain={name}"),
        "--acme-challenge=http-01",
        &format!("--http-listen=127.0.0.1:{http_port}"),
    ]);
    let ok = format!("baton_certificate_renewals_total{{name=\"{name}\",outcome=\"ok\"}}");
    until("the certificate issued", Duration::from_secs(120), || {
        agent.metric(&ok) >= 1.0
    });
    let root = pebble.root_file();
    let served = served_key(agent.addr, &root, name, "ECDSA+SHA256")
        .unwrap_or_else(|| panic!("no verified certificate for {name}\n{}", pebble.log()));
    assert!(served.contains("ECDSA"), "{served}");
}

#[test]
fn an_agent_killed_mid_order_and_restarted_leaves_one_certificate_and_one_account() {
    // every order waits 20 s in its hook: long enough to kill its agent in the middle
    let Some(held) = HeldOrders::start("acme-killed", 20) else {
        return;
    };
    let (pebble, dir) = (&held.pebble, &held.dir);
    let name = "killed.baton.test";
    let start = |id: u16| {
        let a = held.agent_args(name, id);
        Agent::start(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let calls = dir.path("calls");
    let presents = || {
        std::fs::read_to_string(&calls)
            .unwrap_or_default()
            .matches("present ")
            .count()
    };
    let mut first = start(0);
    let second = start(1);
    // agent 0 (the lowest id) orders; killed while its challenge is being answered
    until("agent 0's order in flight", Duration::from_secs(60), || {
        presents() >= 1
    });
    first.signal("KILL");
    first.wait_exit(Duration::from_secs(10)).expect("killed");
    drop(first);
    // agent 1 hears agent 0 is gone, and orders in its turn
    until("agent 1 orders", Duration::from_secs(60), || {
        presents() >= 2
    });
    // agent 0 is back (the lower id) while agent 1's order is in flight
    let first = start(0);
    let root = pebble.root_file();
    let ok = format!("baton_certificate_renewals_total{{name=\"{name}\",outcome=\"ok\"}}");
    let serials = |agents: &[&Agent]| -> Vec<Option<String>> {
        agents
            .iter()
            .map(|a| served_key_serial(a.addr, &root, name))
            .collect()
    };
    until(
        "both agents serve one certificate",
        Duration::from_secs(120),
        || {
            let s = serials(&[&first, &second]);
            s[0].is_some() && s[0] == s[1]
        },
    );
    // long enough for a second order to start and finish, were one started
    std::fs::write(dir.path("delay"), "0").unwrap();
    std::thread::sleep(Duration::from_secs(15));
    let s = serials(&[&first, &second]);
    assert!(s[0].is_some() && s[0] == s[1], "one certificate: {s:?}");
    assert_eq!(
        first.metric(&ok) + second.metric(&ok),
        1.0,
        "one certificate issued for the cluster\n{}",
        pebble.log()
    );
    assert_eq!(presents(), 2, "no order after agent 1's");
    let log = pebble.log();
    let accounts = log.matches("There are now 1 accounts").count();
    assert!(
        accounts == 1 && !log.contains("There are now 2 accounts"),
        "one account for the cluster\n{log}"
    );
}

/// The leaf certificate (PEM) `addr` serves for `name`, verified against `root`.
fn served_leaf_pem(addr: std::net::SocketAddr, root: &str, name: &str) -> Option<String> {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string()])
        .args(["-servername", name, "-verify_hostname", name])
        .args(["-CAfile", root, "-verify_return_error"])
        .stdin(Stdio::null())
        .output()
        .expect("openssl s_client");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if !text.contains("Verify return code: 0 (ok)") {
        return None;
    }
    let begin = text.find("-----BEGIN CERTIFICATE-----")?;
    let end = text[begin..].find("-----END CERTIFICATE-----")? + begin;
    Some(format!("{}-----END CERTIFICATE-----\n", &text[begin..end]))
}

/// Unix seconds of an OpenSSL time.
fn unix_of(t: &openssl::asn1::Asn1TimeRef) -> i64 {
    let epoch = openssl::asn1::Asn1Time::from_unix(0).unwrap();
    let d = epoch.diff(t).unwrap();
    i64::from(d.days) * 86400 + i64::from(d.secs)
}

#[test]
fn renews_when_the_ca_s_renewal_information_says_so() {
    // 15 minutes: the renewal window Pebble suggests is the whole lifetime; its renewal
    // information is asked again every 90 s (a tenth of the lifetime)
    let Some(pebble) = Pebble::start(900, free_port(), free_port()) else {
        return;
    };
    let dir = TempDir::new("acme-ari");
    let name = "ari.baton.test";
    let agent = Agent::start(&[
        &format!("--acme-directory={}", pebble.directory),
        &format!("--acme-directory-ca={}", pebble.https_ca),
        &format!("--acme-domain={name}"),
        "--acme-challenge=dns-01",
        &format!("--acme-dns-hook={}", dns_hook(&dir, pebble.dns_management)),
    ]);
    let ok = format!("baton_certificate_renewals_total{{name=\"{name}\",outcome=\"ok\"}}");
    let scheduled = format!(
        "baton_certificate_renewal_scheduled_timestamp_seconds{{name=\"{name}\",key=\"ecdsa-p256\"}}"
    );
    until("issued", Duration::from_secs(120), || {
        agent.metric(&ok) >= 1.0
    });
    let root = pebble.root_file();
    let pem = served_leaf_pem(agent.addr, &root, name).expect("served");
    // the agent asked the CA, and planned the renewal inside the window it was given
    until(
        "the renewal information asked",
        Duration::from_secs(20),
        || pebble.log().contains("renewalInfo/") && agent.metric(&scheduled) > 0.0,
    );
    let cert = openssl::x509::X509::from_pem(pem.as_bytes()).unwrap();
    let (nb, na) = (unix_of(cert.not_before()), unix_of(cert.not_after()));
    let at = agent.metric(&scheduled) as i64;
    assert!(
        nb <= at && at <= nb + (na - nb) * 3 / 4 + 1,
        "renewal at {at}: within the window [{nb}, {na}], by three quarters"
    );

    // The CA moves the window to the past (as for a revoked certificate): the agent hears of
    // it when it asks again, and renews at once, the new order replacing the old certificate.
    let ari = serde_json::json!({
        "suggestedWindow": { "start": "2000-01-01T00:00:00Z", "end": "2000-01-02T00:00:00Z" }
    });
    let body = serde_json::json!({ "Certificate": pem, "ARIResponse": ari.to_string() });
    pebble.management("/set-renewal-info/", Some(&body.to_string()));
    until("renewed", Duration::from_secs(150), || {
        agent.metric(&ok) >= 2.0
    });
    let log = pebble.log();
    assert!(
        log.contains("is a replacement of"),
        "the renewal order names the certificate it replaces\n{log}"
    );
    let renewed = served_leaf_pem(agent.addr, &root, name).expect("renewed, served");
    assert_ne!(renewed, pem);
}

#[test]
fn two_agents_that_both_think_they_order_take_turns_through_the_redis_lock() {
    // each order holds 10 s in its hook: the two agents' turns overlap
    let Some(held) = HeldOrders::start("acme-lock", 10) else {
        return;
    };
    let (pebble, redis, dir) = (&held.pebble, &held.redis, &held.dir);
    let name = "locked.baton.test";
    // the same id on both (a mistake): each believes itself the lowest live agent, and only
    // the store's lock keeps them from ordering the name twice
    let args = held.agent_args(name, 0);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = Agent::start(&args);
    let b = Agent::start(&args);
    let root = pebble.root_file();
    until(
        "both agents serve one certificate",
        Duration::from_secs(120),
        || {
            let s = [
                served_key_serial(a.addr, &root, name),
                served_key_serial(b.addr, &root, name),
            ];
            s[0].is_some() && s[0] == s[1]
        },
    );
    // long enough for the other's order to end, were one running
    std::thread::sleep(Duration::from_secs(15));
    let ok = format!("baton_certificate_renewals_total{{name=\"{name}\",outcome=\"ok\"}}");
    assert_eq!(a.metric(&ok) + b.metric(&ok), 1.0, "one order");
    let calls = std::fs::read_to_string(dir.path("calls")).unwrap();
    assert_eq!(calls.matches("present ").count(), 1, "{calls}");
    // the lock is released once the order is done
    let keys = Command::new("redis-cli")
        .args([
            "-p",
            &redis.port.to_string(),
            "--scan",
            "--pattern",
            "*baton-acme/lock/*",
        ])
        .output()
        .expect("redis-cli");
    assert_eq!(
        String::from_utf8_lossy(&keys.stdout).trim(),
        "",
        "no lock left"
    );
}
