//! Which route a proxied request takes: a pure function of the configured routes, the
//! request's host and its path. No I/O; the proxy (`proxy.rs`) asks, then forwards.
//!
//! The host is the request's `Host` (`:authority` in HTTP/2), lower-cased, without its port or
//! a trailing dot; a request that carries none is matched by its TLS SNI. A route's hosts are
//! exact names (`api.example.com`) or wildcards (`*.example.com`: any name below
//! `example.com`, at any depth, not `example.com` itself); a route without hosts takes any
//! host. Its path prefix matches whole segments: `/api` takes `/api`, `/api/` and `/api/v1`,
//! not `/apix`; a prefix ending in `/` takes what starts with it. No prefix is `/`.
//!
//! Among the routes that match, the order is:
//! 1. the most specific host: an exact name, then the longest wildcard, then routes without
//!    hosts;
//! 2. then the longest path prefix;
//! 3. then the first in the configuration.
//!
//! A request whose host no route takes (not even one without hosts) is misdirected (421 by
//! default: this agent does not serve that name); one whose host is known but whose path no
//! route of that host takes is not found (404 by default).

/// One route's match: its hosts and its path prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matcher {
    hosts: Vec<HostPattern>,
    prefix: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Exact(String),
    /// `*.example.com`, kept as `.example.com`.
    Below(String),
}

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// The route at this index of the table.
    Route(usize),
    /// No route takes this host.
    UnknownHost,
    /// Routes take this host, but none this path.
    NoRoute,
}

impl Matcher {
    /// A matcher for `hosts` (empty: any) and `prefix` (`None`: `/`). Errors name the bad
    /// value.
    pub fn new(hosts: &[String], prefix: Option<&str>) -> Result<Matcher, String> {
        let hosts = hosts
            .iter()
            .map(|h| {
                let n = normalize_host(h);
                if let Some(rest) = n.strip_prefix("*.") {
                    if rest.is_empty() || rest.contains('*') {
                        return Err(format!("host `{h}`: a wildcard is `*.NAME`"));
                    }
                    Ok(HostPattern::Below(format!(".{rest}")))
                } else if n.is_empty() || n.contains('*') || n.contains('/') {
                    Err(format!(
                        "host `{h}`: expected a name or `*.NAME` (a wildcard only in front)"
                    ))
                } else {
                    Ok(HostPattern::Exact(n))
                }
            })
            .collect::<Result<_, _>>()?;
        let prefix = prefix.unwrap_or("/");
        if !prefix.starts_with('/') || prefix.contains(['?', '#']) {
            return Err(format!(
                "path-prefix `{prefix}`: must start with `/`, without a query"
            ));
        }
        Ok(Matcher {
            hosts,
            prefix: prefix.to_owned(),
        })
    }

    /// How specifically this route takes `host` (higher is more specific), or `None`.
    fn host_rank(&self, host: Option<&str>) -> Option<usize> {
        if self.hosts.is_empty() {
            return Some(0);
        }
        let host = host?;
        self.hosts
            .iter()
            .filter_map(|p| match p {
                HostPattern::Exact(n) => (n == host).then_some(usize::MAX),
                HostPattern::Below(s) => {
                    (host.len() > s.len() && host.ends_with(s.as_str())).then_some(s.len())
                }
            })
            .max()
    }

    fn takes_path(&self, path: &str) -> bool {
        let p = self.prefix.as_str();
        match path.strip_prefix(p) {
            Some(rest) => p.ends_with('/') || rest.is_empty() || rest.starts_with('/'),
            None => false,
        }
    }
}

/// The route for a request to `host` (already normalized, see [`normalize_host`]) and `path`
/// (without the query), by the order in the module's documentation.
pub fn choose(routes: &[Matcher], host: Option<&str>, path: &str) -> Choice {
    let mut best: Option<(usize, usize, usize)> = None;
    let mut host_known = false;
    for (i, m) in routes.iter().enumerate() {
        let Some(rank) = m.host_rank(host) else {
            continue;
        };
        host_known = true;
        if !m.takes_path(path) {
            continue;
        }
        let key = (rank, m.prefix.len());
        // strictly better only: an equal key keeps the earlier route
        if best.is_none_or(|(r, l, _)| key > (r, l)) {
            best = Some((rank, m.prefix.len(), i));
        }
    }
    match best {
        Some((_, _, i)) => Choice::Route(i),
        None if host_known => Choice::NoRoute,
        None => Choice::UnknownHost,
    }
}

/// A host as routes compare it: lower case, without a port, brackets or a trailing dot.
pub fn normalize_host(raw: &str) -> String {
    let raw = raw.trim();
    let name = if let Some(rest) = raw.strip_prefix('[') {
        // [v6]:port
        rest.split(']').next().unwrap_or(rest)
    } else if raw.matches(':').count() == 1 {
        raw.split(':').next().unwrap_or(raw)
    } else {
        raw
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn m(hosts: &[&str], prefix: &str) -> Matcher {
        let hosts: Vec<String> = hosts.iter().map(|s| s.to_string()).collect();
        Matcher::new(&hosts, Some(prefix)).unwrap()
    }

    #[test]
    fn the_documented_order() {
        let routes = [
            m(&[], "/"),                           // 0: anything
            m(&["*.example.com"], "/"),            // 1
            m(&["api.example.com"], "/"),          // 2
            m(&["api.example.com"], "/v1"),        // 3
            m(&["*.eu.example.com"], "/"),         // 4: a longer wildcard
            m(&[], "/static/"),                    // 5
            m(&["api.example.com"], "/v1"),        // 6: same as 3, later
            m(&["only.test"], "/app"),             // 7
            m(&["Only.Test.", "other.test"], "/"), // 8
        ];
        let c = |h: &str, p: &str| choose(&routes, Some(h), p);
        assert_eq!(c("api.example.com", "/v1/users"), Choice::Route(3));
        assert_eq!(c("api.example.com", "/v1"), Choice::Route(3));
        assert_eq!(c("api.example.com", "/v10"), Choice::Route(2));
        assert_eq!(c("www.example.com", "/v1"), Choice::Route(1));
        assert_eq!(c("a.b.example.com", "/"), Choice::Route(1));
        assert_eq!(c("x.eu.example.com", "/"), Choice::Route(4));
        assert_eq!(c("example.com", "/"), Choice::Route(0), "not below itself");
        // the host's specificity wins over the longer prefix
        assert_eq!(c("api.example.com", "/static/a.css"), Choice::Route(2));
        assert_eq!(c("elsewhere.test", "/static/a.css"), Choice::Route(5));
        assert_eq!(c("only.test", "/app/x"), Choice::Route(7));
        assert_eq!(c("only.test", "/"), Choice::Route(8));
        assert_eq!(choose(&routes, None, "/x"), Choice::Route(0));
    }

    #[test]
    fn unknown_host_and_unknown_path() {
        let routes = [m(&["a.test"], "/api"), m(&["*.b.test"], "/")];
        let c = |h: Option<&str>, p: &str| choose(&routes, h, p);
        assert_eq!(c(Some("a.test"), "/api/x"), Choice::Route(0));
        assert_eq!(c(Some("a.test"), "/apix"), Choice::NoRoute);
        assert_eq!(c(Some("a.test"), "/"), Choice::NoRoute);
        assert_eq!(c(Some("c.test"), "/api"), Choice::UnknownHost);
        assert_eq!(c(Some("b.test"), "/"), Choice::UnknownHost);
        assert_eq!(c(None, "/api"), Choice::UnknownHost);
        assert_eq!(choose(&[], Some("a.test"), "/"), Choice::UnknownHost);
    }

    #[test]
    fn hosts_and_prefixes_are_checked() {
        for bad in ["*", "a.*.test", "*.", "", "a/b"] {
            assert!(Matcher::new(&[bad.into()], None).is_err(), "{bad}");
        }
        for bad in ["api", "/a?b"] {
            assert!(Matcher::new(&[], Some(bad)).is_err(), "{bad}");
        }
        assert_eq!(normalize_host("API.Example.com:8443"), "api.example.com");
        assert_eq!(normalize_host("example.com."), "example.com");
        assert_eq!(normalize_host("[::1]:443"), "::1");
        assert_eq!(normalize_host("::1"), "::1");
        assert_eq!(normalize_host("127.0.0.1:1"), "127.0.0.1");
    }

    /// Routes drawn from a small alphabet, so that they overlap often.
    fn route() -> impl Strategy<Value = Matcher> {
        let host = prop_oneof![
            Just("a.test"),
            Just("b.a.test"),
            Just("*.a.test"),
            Just("*.b.a.test"),
            Just("c.test"),
        ];
        let prefix = prop_oneof![Just("/"), Just("/x"), Just("/x/"), Just("/x/y"), Just("/z")];
        (proptest::collection::vec(host, 0..3), prefix).prop_map(|(h, p)| m(&h, p))
    }

    fn matches(r: &Matcher, host: Option<&str>, path: &str) -> Option<(usize, usize)> {
        Some((r.host_rank(host)?, r.prefix.len())).filter(|_| r.takes_path(path))
    }

    proptest! {
        /// The choice matches the request, no matching route is more specific, an equally
        /// specific one is never earlier, and the misdirected / not found split is by host.
        #[test]
        fn the_choice_is_the_most_specific_match(
            routes in proptest::collection::vec(route(), 0..8),
            host in prop_oneof![
                Just(None), Just(Some("a.test")), Just(Some("b.a.test")),
                Just(Some("d.b.a.test")), Just(Some("c.test")), Just(Some("e.test"))
            ],
            path in prop_oneof![
                Just("/"), Just("/x"), Just("/xy"), Just("/x/"), Just("/x/y/z"), Just("/z")
            ],
        ) {
            let choice = choose(&routes, host, path);
            let any_host = routes.iter().any(|r| r.host_rank(host).is_some());
            match choice {
                Choice::Route(i) => {
                    let key = matches(&routes[i], host, path).expect("the choice matches");
                    for (j, r) in routes.iter().enumerate() {
                        if let Some(k) = matches(r, host, path) {
                            prop_assert!(k < key || (k == key && j >= i), "{j} beats {i}");
                        }
                    }
                }
                Choice::NoRoute => {
                    prop_assert!(any_host);
                    prop_assert!(routes.iter().all(|r| matches(r, host, path).is_none()));
                }
                Choice::UnknownHost => prop_assert!(!any_host),
            }
            // the same host written another way is the same host
            if let Some(h) = host {
                let shouted = format!("{}.:443", h.to_ascii_uppercase());
                let again = normalize_host(&shouted);
                prop_assert_eq!(choose(&routes, Some(again.as_str()), path), choice);
            }
        }
    }
}
