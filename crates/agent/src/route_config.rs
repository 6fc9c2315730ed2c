//! The reverse proxy's routes and upstream pools as written in the config file (`[pool.NAME]`
//! tables and `[[route]]` entries; file only, no flags), and resolved: every default filled in,
//! every value checked. `--upstream` is the one-pool shorthand: a pool named `default` that
//! every request goes to when the file has no routes (routes may name it too).
//!
//! ```toml
//! [pool.api]
//! upstreams = ["https://10.0.0.5:8443", "https://10.0.0.6:8443"]
//! ca = "/etc/baton/api-ca.pem"
//! [[route]]
//! name = "api"
//! hosts = ["api.example.com"]
//! pool = "api"
//! ```
//!
//! Every key, commented, is in `examples/agent-routes.toml`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use http::uri::{Authority, Scheme};
use http::StatusCode;
use serde::Deserialize;

use crate::routing::Matcher;
use baton_ops::duration::HumanDuration;

/// How requests are spread over several upstream backends.
#[derive(clap::ValueEnum, Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpstreamBalance {
    /// Each request to the next backend.
    #[default]
    RoundRobin,
    /// A client's requests to one backend, chosen by its address.
    ClientIp,
}

/// Checks `http://HOST:PORT` (no path, no TLS: the backend is plain HTTP).
pub fn parse_upstream(url: &str) -> anyhow::Result<http::uri::Authority> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| anyhow::anyhow!("--upstream `{url}`: {e}"))?;
    if uri.scheme() != Some(&http::uri::Scheme::HTTP) {
        bail!("--upstream `{url}`: must be http://HOST:PORT (the backend speaks plain HTTP)");
    }
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
        bail!("--upstream `{url}`: no path allowed");
    }
    uri.authority()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("--upstream `{url}`: missing host"))
}

/// The name of the pool `--upstream` makes.
pub const DEFAULT_POOL: &str = "default";

/// `[pool.NAME]`: upstreams and how to reach them.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct PoolSpec {
    /// `http://HOST:PORT` or `https://HOST:PORT`, all with the same scheme.
    pub upstreams: Vec<String>,
    pub balance: Option<UpstreamBalance>,
    /// `auto` (default): HTTP/1.1 to `http://`, ALPN `h2` or `http/1.1` to `https://`;
    /// `http1`: HTTP/1.1 only; `h2`: HTTP/2 only (prior knowledge, h2c, to `http://`).
    pub protocol: Option<UpstreamProtocol>,
    /// CA certificates (PEM) the upstreams' certificates must chain to; default the system's.
    pub ca: Option<PathBuf>,
    /// The name sent as SNI and checked in the certificate; default the upstream's host.
    pub sni: Option<String>,
    /// A client certificate chain (PEM) and its key, presented to the upstreams.
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    /// TCP connect, per upstream (the next one is tried after it). Default 3s.
    pub connect_timeout: Option<HumanDuration>,
    /// From sending a request to the response head (TLS handshake included). Default: the
    /// agent's --idle-timeout.
    pub first_byte_timeout: Option<HumanDuration>,
    /// Longest gap between two pieces of a response body. Default: the agent's --idle-timeout.
    pub idle_timeout: Option<HumanDuration>,
    /// Idle keep-alive connections kept per upstream. Default 32.
    pub max_idle: Option<usize>,
    /// How long an idle keep-alive connection is kept. Default 30s.
    pub keepalive_timeout: Option<HumanDuration>,
    /// Active health checks; without them only the passive check runs (a refused
    /// connection passes an upstream over for 5 s).
    pub health: Option<HealthSpec>,
}

/// `[pool.NAME.health]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct HealthSpec {
    /// Between two checks of one upstream. Default 5s.
    pub interval: Option<HumanDuration>,
    /// For one check's answer. Default 2s (at most the interval).
    pub timeout: Option<HumanDuration>,
    /// `GET` this path. Default `/`.
    pub path: Option<String>,
    /// The status a healthy upstream answers. Default 200.
    pub status: Option<u16>,
    /// Checks passed in a row that bring a down upstream back. Default 2.
    pub rise: Option<u32>,
    /// Checks failed in a row that take an upstream out. Default 3.
    pub fall: Option<u32>,
}

/// `[[route]]`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct RouteSpec {
    /// For logs and the access log. Default `route-N` (N from 1, in file order).
    pub name: Option<String>,
    /// Exact names or `*.NAME` wildcards; none: any host.
    pub hosts: Vec<String>,
    /// Default `/`.
    pub path_prefix: Option<String>,
    /// The `[pool.NAME]` requests go to.
    pub pool: String,
    pub request_headers: HeaderEditSpec,
    pub response_headers: HeaderEditSpec,
    /// Largest request body; a larger one is answered 413. Default: no limit.
    pub max_body_bytes: Option<u64>,
    /// Overrides the pool's.
    pub first_byte_timeout: Option<HumanDuration>,
    /// Overrides the pool's.
    pub idle_timeout: Option<HumanDuration>,
}

/// Header changes, applied in this order: remove, set (replacing), add (beside any).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct HeaderEditSpec {
    pub remove: Vec<String>,
    pub set: BTreeMap<String, String>,
    pub add: BTreeMap<String, String>,
}

/// HTTP versions spoken to a pool's upstreams.
#[derive(clap::ValueEnum, Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpstreamProtocol {
    #[default]
    Auto,
    Http1,
    H2,
}

/// A pool, resolved.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub name: Arc<str>,
    pub scheme: Scheme,
    pub upstreams: Vec<Authority>,
    pub balance: UpstreamBalance,
    pub protocol: UpstreamProtocol,
    pub ca: Option<PathBuf>,
    pub sni: Option<String>,
    pub client_cert: Option<(PathBuf, PathBuf)>,
    pub connect_timeout: Duration,
    pub first_byte_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_idle: usize,
    pub keepalive_timeout: Duration,
    pub health: Option<HealthConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthConfig {
    pub interval: Duration,
    pub timeout: Duration,
    pub path: String,
    pub status: StatusCode,
    pub rise: u32,
    pub fall: u32,
}

/// A route, resolved.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// `None` for the `--upstream` shorthand's catch-all.
    pub name: Option<Arc<str>>,
    pub matcher: Matcher,
    /// Index into [`Routing::pools`].
    pub pool: usize,
    pub request_headers: HeaderEdits,
    pub response_headers: HeaderEdits,
    pub max_body_bytes: Option<u64>,
    pub first_byte_timeout: Duration,
    pub idle_timeout: Duration,
}

/// Header changes, checked.
#[derive(Debug, Clone, Default)]
pub struct HeaderEdits {
    pub remove: Vec<http::HeaderName>,
    pub set: Vec<(http::HeaderName, http::HeaderValue)>,
    pub add: Vec<(http::HeaderName, http::HeaderValue)>,
}

impl HeaderEdits {
    pub fn apply(&self, h: &mut http::HeaderMap) {
        for n in &self.remove {
            h.remove(n);
        }
        for (n, v) in &self.set {
            h.insert(n.clone(), v.clone());
        }
        for (n, v) in &self.add {
            h.append(n.clone(), v.clone());
        }
    }

    fn resolve(spec: &HeaderEditSpec, what: &str) -> anyhow::Result<Self> {
        let name = |n: &str| {
            http::HeaderName::from_bytes(n.as_bytes())
                .with_context(|| format!("{what}: `{n}` is not a header name"))
        };
        let pairs = |m: &BTreeMap<String, String>| {
            m.iter()
                .map(|(n, v)| {
                    let value = http::HeaderValue::from_str(v)
                        .with_context(|| format!("{what}: the value of `{n}` is not allowed"))?;
                    Ok((name(n)?, value))
                })
                .collect::<anyhow::Result<Vec<_>>>()
        };
        Ok(Self {
            remove: spec
                .remove
                .iter()
                .map(|n| name(n))
                .collect::<anyhow::Result<_>>()?,
            set: pairs(&spec.set)?,
            add: pairs(&spec.add)?,
        })
    }
}

/// Everything the proxy needs: the pools, and the routes in configuration order.
#[derive(Debug, Clone)]
pub struct Routing {
    pub pools: Vec<PoolConfig>,
    pub routes: Vec<RouteConfig>,
    pub unknown_host_status: StatusCode,
    pub no_route_status: StatusCode,
}

/// The settings [`resolve`] reads, beside the tables.
pub struct Inputs<'a> {
    pub upstream: &'a [String],
    pub upstream_balance: UpstreamBalance,
    pub pools: &'a BTreeMap<String, PoolSpec>,
    pub routes: &'a [RouteSpec],
    pub unknown_host_status: Option<u16>,
    pub no_route_status: Option<u16>,
    /// The agent's --idle-timeout: the default upstream timeouts.
    pub idle_timeout: Duration,
}

/// The proxy's configuration, or `None` when the agent serves its built-in responder.
pub fn resolve(i: Inputs<'_>) -> anyhow::Result<Option<Routing>> {
    if i.upstream.is_empty() && i.pools.is_empty() && i.routes.is_empty() {
        if i.unknown_host_status.is_some() || i.no_route_status.is_some() {
            bail!("unknown-host-status and no-route-status need routes");
        }
        return Ok(None);
    }
    let mut pools = Vec::new();
    if !i.upstream.is_empty() {
        if i.pools.contains_key(DEFAULT_POOL) {
            bail!("[pool.{DEFAULT_POOL}] and --upstream: the flag makes that pool, give one");
        }
        let upstreams = i
            .upstream
            .iter()
            .map(|u| parse_upstream(u))
            .collect::<anyhow::Result<_>>()?;
        pools.push(PoolConfig {
            name: DEFAULT_POOL.into(),
            scheme: Scheme::HTTP,
            upstreams,
            balance: i.upstream_balance,
            protocol: UpstreamProtocol::Http1,
            ca: None,
            sni: None,
            client_cert: None,
            connect_timeout: DEFAULT_CONNECT,
            first_byte_timeout: i.idle_timeout,
            idle_timeout: i.idle_timeout,
            max_idle: DEFAULT_MAX_IDLE,
            keepalive_timeout: DEFAULT_KEEPALIVE,
            health: None,
        });
    }
    for (name, spec) in i.pools {
        pools.push(pool(name, spec, i.idle_timeout).with_context(|| format!("[pool.{name}]"))?);
    }
    let routes = if i.routes.is_empty() {
        if i.upstream.is_empty() {
            bail!("[pool] tables without [[route]]: no request would reach them");
        }
        vec![RouteConfig {
            name: None,
            matcher: Matcher::new(&[], None).map_err(anyhow::Error::msg)?,
            pool: 0,
            request_headers: HeaderEdits::default(),
            response_headers: HeaderEdits::default(),
            max_body_bytes: None,
            first_byte_timeout: pools[0].first_byte_timeout,
            idle_timeout: pools[0].idle_timeout,
        }]
    } else {
        let mut names = std::collections::BTreeSet::new();
        i.routes
            .iter()
            .enumerate()
            .map(|(n, spec)| {
                let name = spec.name.clone().unwrap_or(format!("route-{}", n + 1));
                if !names.insert(name.clone()) {
                    bail!("[[route]] `{name}`: two routes with one name");
                }
                route(&name, spec, &pools).with_context(|| format!("[[route]] `{name}`"))
            })
            .collect::<anyhow::Result<_>>()?
    };
    let status = |s: Option<u16>, default: u16, key: &str| {
        let code = s.unwrap_or(default);
        match StatusCode::from_u16(code) {
            Ok(c) if c.is_client_error() || c.is_server_error() => Ok(c),
            _ => bail!("{key} = {code}: expected a 4xx or 5xx status"),
        }
    };
    Ok(Some(Routing {
        pools,
        routes,
        unknown_host_status: status(i.unknown_host_status, 421, "unknown-host-status")?,
        no_route_status: status(i.no_route_status, 404, "no-route-status")?,
    }))
}

const DEFAULT_CONNECT: Duration = Duration::from_secs(3);
const DEFAULT_MAX_IDLE: usize = 32;
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(30);

fn pool(name: &str, spec: &PoolSpec, idle: Duration) -> anyhow::Result<PoolConfig> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        bail!("a pool name is letters, digits, `-`, `_` and `.`");
    }
    if spec.upstreams.is_empty() {
        bail!("no upstreams");
    }
    let parsed: Vec<(Scheme, Authority)> = spec
        .upstreams
        .iter()
        .map(|u| parse_pool_upstream(u))
        .collect::<anyhow::Result<_>>()?;
    let scheme = parsed[0].0.clone();
    if parsed.iter().any(|(s, _)| *s != scheme) {
        bail!("upstreams mix http:// and https://: give each its own pool");
    }
    let tls = scheme == Scheme::HTTPS;
    if !tls && (spec.ca.is_some() || spec.sni.is_some() || spec.client_cert.is_some()) {
        bail!("ca, sni and client-cert are for https:// upstreams");
    }
    let client_cert = match (&spec.client_cert, &spec.client_key) {
        (Some(c), Some(k)) => Some((c.clone(), k.clone())),
        (None, None) => None,
        _ => bail!("client-cert and client-key come together"),
    };
    if let Some(sni) = &spec.sni {
        rustls::pki_types::ServerName::try_from(sni.as_str())
            .map_err(|e| anyhow::anyhow!("sni `{sni}`: {e}"))?;
    }
    let dur = |d: Option<HumanDuration>, default: Duration, key: &str| {
        let d = d.map_or(default, |d| d.0);
        if d.is_zero() {
            bail!("{key} must be greater than zero");
        }
        Ok(d)
    };
    let health = spec
        .health
        .as_ref()
        .map(|h| -> anyhow::Result<HealthConfig> {
            let interval = dur(h.interval, Duration::from_secs(5), "health.interval")?;
            let timeout = dur(
                h.timeout,
                Duration::from_secs(2).min(interval),
                "health.timeout",
            )?;
            let path = h.path.clone().unwrap_or_else(|| "/".into());
            if !path.starts_with('/') || path.parse::<http::uri::PathAndQuery>().is_err() {
                bail!("health.path `{path}`: a path starting with `/`");
            }
            let status = StatusCode::from_u16(h.status.unwrap_or(200))
                .map_err(|_| anyhow::anyhow!("health.status: not a status code"))?;
            let (rise, fall) = (h.rise.unwrap_or(2), h.fall.unwrap_or(3));
            if rise == 0 || fall == 0 {
                bail!("health.rise and health.fall must be at least 1");
            }
            Ok(HealthConfig {
                interval,
                timeout,
                path,
                status,
                rise,
                fall,
            })
        })
        .transpose()?;
    let max_idle = spec.max_idle.unwrap_or(DEFAULT_MAX_IDLE);
    Ok(PoolConfig {
        name: name.into(),
        scheme,
        upstreams: parsed.into_iter().map(|(_, a)| a).collect(),
        balance: spec.balance.unwrap_or_default(),
        protocol: spec.protocol.unwrap_or_default(),
        ca: spec.ca.clone(),
        sni: spec.sni.clone(),
        client_cert,
        connect_timeout: dur(spec.connect_timeout, DEFAULT_CONNECT, "connect-timeout")?,
        first_byte_timeout: dur(spec.first_byte_timeout, idle, "first-byte-timeout")?,
        idle_timeout: dur(spec.idle_timeout, idle, "idle-timeout")?,
        max_idle,
        keepalive_timeout: dur(
            spec.keepalive_timeout,
            DEFAULT_KEEPALIVE,
            "keepalive-timeout",
        )?,
        health,
    })
}

fn route(name: &str, spec: &RouteSpec, pools: &[PoolConfig]) -> anyhow::Result<RouteConfig> {
    let pool = pools
        .iter()
        .position(|p| *p.name == *spec.pool)
        .with_context(|| format!("pool `{}` is not defined", spec.pool))?;
    let matcher =
        Matcher::new(&spec.hosts, spec.path_prefix.as_deref()).map_err(anyhow::Error::msg)?;
    let or_pool = |d: Option<HumanDuration>, pool: Duration, key: &str| match d {
        Some(d) if d.0.is_zero() => bail!("{key} must be greater than zero"),
        Some(d) => Ok(d.0),
        None => Ok(pool),
    };
    Ok(RouteConfig {
        name: Some(name.into()),
        matcher,
        request_headers: HeaderEdits::resolve(&spec.request_headers, "request-headers")?,
        response_headers: HeaderEdits::resolve(&spec.response_headers, "response-headers")?,
        max_body_bytes: spec.max_body_bytes,
        first_byte_timeout: or_pool(
            spec.first_byte_timeout,
            pools[pool].first_byte_timeout,
            "first-byte-timeout",
        )?,
        idle_timeout: or_pool(spec.idle_timeout, pools[pool].idle_timeout, "idle-timeout")?,
        pool,
    })
}

/// Checks `http://HOST:PORT` or `https://HOST:PORT` (no path).
pub fn parse_pool_upstream(url: &str) -> anyhow::Result<(Scheme, Authority)> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| anyhow::anyhow!("upstream `{url}`: {e}"))?;
    let scheme = match uri.scheme() {
        Some(s) if *s == Scheme::HTTP || *s == Scheme::HTTPS => s.clone(),
        _ => bail!("upstream `{url}`: must be http://HOST:PORT or https://HOST:PORT"),
    };
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
        bail!("upstream `{url}`: no path allowed");
    }
    let authority = uri
        .authority()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("upstream `{url}`: missing host"))?;
    if authority.port_u16().is_none() {
        bail!("upstream `{url}`: give the port");
    }
    Ok((scheme, authority))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_toml(text: &str, upstream: &[&str]) -> anyhow::Result<Option<Routing>> {
        #[derive(Deserialize)]
        #[serde(rename_all = "kebab-case")]
        struct File {
            #[serde(default)]
            pool: BTreeMap<String, PoolSpec>,
            #[serde(default)]
            route: Vec<RouteSpec>,
            unknown_host_status: Option<u16>,
            no_route_status: Option<u16>,
        }
        let f: File = toml::from_str(text)?;
        let upstream: Vec<String> = upstream.iter().map(|s| s.to_string()).collect();
        resolve(Inputs {
            upstream: &upstream,
            upstream_balance: UpstreamBalance::RoundRobin,
            pools: &f.pool,
            routes: &f.route,
            unknown_host_status: f.unknown_host_status,
            no_route_status: f.no_route_status,
            idle_timeout: Duration::from_secs(60),
        })
    }

    #[test]
    fn pools_and_routes_resolve_with_defaults() {
        let r = from_toml(
            r#"
            no-route-status = 403
            [pool.api]
            upstreams = ["https://127.0.0.1:8443"]
            sni = "api.internal"
            protocol = "h2"
            first-byte-timeout = "5s"
            [pool.api.health]
            path = "/healthz"
            [[route]]
            hosts = ["api.example.com"]
            pool = "api"
            max-body-bytes = 1024
            idle-timeout = "7s"
            request-headers = { set = { x-env = "prod" }, remove = ["x-debug"] }
            [[route]]
            name = "rest"
            pool = "default"
            "#,
            &["http://127.0.0.1:8080"],
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.pools.len(), 2);
        assert_eq!(&*r.pools[1].name, "api");
        assert_eq!(r.pools[1].scheme, Scheme::HTTPS);
        assert_eq!(r.pools[1].protocol, UpstreamProtocol::H2);
        let h = r.pools[1].health.clone().unwrap();
        assert_eq!((h.rise, h.fall, h.status.as_u16()), (2, 3, 200));
        assert_eq!(h.path, "/healthz");
        assert_eq!(r.routes[0].name.as_deref(), Some("route-1"));
        assert_eq!(r.routes[0].pool, 1);
        assert_eq!(r.routes[0].first_byte_timeout, Duration::from_secs(5));
        assert_eq!(r.routes[0].idle_timeout, Duration::from_secs(7));
        assert_eq!(r.routes[0].request_headers.set.len(), 1);
        assert_eq!(r.routes[1].pool, 0);
        assert_eq!(r.unknown_host_status.as_u16(), 421);
        assert_eq!(r.no_route_status.as_u16(), 403);
    }

    #[test]
    fn the_upstream_flag_alone_is_one_catch_all_route() {
        let r = from_toml("", &["http://127.0.0.1:8080"]).unwrap().unwrap();
        assert_eq!(r.routes.len(), 1);
        assert_eq!(r.routes[0].name, None);
        assert!(from_toml("", &[]).unwrap().is_none());
    }

    #[test]
    fn mistakes_are_clear_errors() {
        let err = |text: &str| format!("{:#}", from_toml(text, &[]).unwrap_err());
        let e = err("[[route]]\npool = \"nope\"");
        assert!(e.contains("pool `nope` is not defined"), "{e}");
        let e = err("[pool.a]\nupstreams = [\"http://127.0.0.1:1\", \"https://127.0.0.1:2\"]\n[[route]]\npool = \"a\"");
        assert!(e.contains("mix"), "{e}");
        let e = err("[pool.a]\nupstreams = [\"http://127.0.0.1:1\"]\nca = \"x.pem\"\n[[route]]\npool = \"a\"");
        assert!(e.contains("https://"), "{e}");
        let e = err("[pool.a]\nupstreams = [\"http://127.0.0.1:1\"]");
        assert!(e.contains("without [[route]]"), "{e}");
        let e = err("[pool.a]\nupstreams = [\"http://127.0.0.1:1\"]\n[[route]]\npool = \"a\"\nhosts = [\"a.*\"]");
        assert!(e.contains("wildcard"), "{e}");
        let e = err("[pool.a]\nupstreams = [\"http://127.0.0.1:1\"]\n[[route]]\npool = \"a\"\nname = \"x\"\n[[route]]\npool = \"a\"\nname = \"x\"");
        assert!(e.contains("one name"), "{e}");
        let e = err("[pool.a]\nupstreams = [\"http://127.0.0.1:1\"]\nhealth = { rise = 0 }\n[[route]]\npool = \"a\"");
        assert!(e.contains("rise"), "{e}");
        let e = err("unknown-host-status = 200\n[pool.a]\nupstreams = [\"http://127.0.0.1:1\"]\n[[route]]\npool = \"a\"");
        assert!(e.contains("4xx or 5xx"), "{e}");
        let e = err("[pool.a]\nupstreams = [\"http://127.0.0.1\"]\n[[route]]\npool = \"a\"");
        assert!(e.contains("port"), "{e}");
        let e = err("[pool.a]\nupstreams = [\"http://127.0.0.1:1\"]\n[[route]]\npool = \"a\"\nresponse-headers = { set = { \"bad name\" = \"1\" } }");
        assert!(e.contains("not a header name"), "{e}");
    }

    #[test]
    fn header_edits_remove_then_set_then_add() {
        let spec = HeaderEditSpec {
            remove: vec!["x-gone".into()],
            set: [("x-set".to_string(), "new".to_string())].into(),
            add: [("x-add".to_string(), "2".to_string())].into(),
        };
        let edits = HeaderEdits::resolve(&spec, "t").unwrap();
        let mut h = http::HeaderMap::new();
        h.insert("x-gone", "1".parse().unwrap());
        h.append("x-set", "old".parse().unwrap());
        h.append("x-set", "older".parse().unwrap());
        h.insert("x-add", "1".parse().unwrap());
        edits.apply(&mut h);
        assert!(!h.contains_key("x-gone"));
        assert_eq!(h.get_all("x-set").iter().collect::<Vec<_>>(), ["new"]);
        assert_eq!(h.get_all("x-add").iter().collect::<Vec<_>>(), ["1", "2"]);
    }

    #[test]
    fn the_commented_example_is_valid() {
        let text = include_str!("../../../examples/agent-routes.toml");
        let args: crate::config::AgentArgs = toml::from_str(text).unwrap();
        let r = resolve(Inputs {
            upstream: &args.upstream,
            upstream_balance: UpstreamBalance::RoundRobin,
            pools: &args.pool,
            routes: &args.route,
            unknown_host_status: args.unknown_host_status,
            no_route_status: args.no_route_status,
            idle_timeout: Duration::from_secs(60),
        })
        .unwrap()
        .unwrap();
        assert_eq!(r.pools.len(), 3);
        assert_eq!(r.routes.len(), 4);
        assert!(r.pools.iter().any(|p| p.health.is_some()));
    }
}
