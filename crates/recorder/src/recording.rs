//! What the recorder saw, sans-IO: exchanges come in as their responses start (in any order,
//! from concurrent connections and streams), and leave as a scenario in the order the
//! requests started, through the same [`Collector`] `import-har` uses. Unless told to keep
//! credentials, each exchange is redacted as it comes in (`redact`), so what the recording
//! holds and writes has none.

use std::fmt::Write as _;

use super::redact::{self, Redactor};
use baton_bench::scenario::{normalize_host, Collector, Imported, Pushed};

/// One request the browser made and the origin answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Exchange {
    /// When the request arrived, in ms since the recording started.
    pub start_ms: f64,
    pub method: String,
    /// `https://host[:port]/path?query`.
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
}

/// A request that was forwarded but not recorded, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub method: String,
    pub url: String,
    pub why: String,
}

#[derive(Debug, Default)]
pub struct Recording {
    /// `--host`, else the host of the first exchange observed.
    host: Option<String>,
    max: Option<usize>,
    exchanges: Vec<Exchange>,
    /// Exchanges to the recorded host (what `--max-requests` counts).
    to_host: usize,
    failures: Vec<Failure>,
    /// `None`: `--keep-credentials`.
    redactor: Option<Redactor>,
}

/// The finished recording: the scenario with what was dropped, and the failures.
#[derive(Debug)]
pub struct Finished {
    pub imported: Imported,
    pub failures: Vec<Failure>,
    /// Requests that could not be put in a scenario (and why).
    pub unrecordable: Vec<String>,
    /// What was redacted; `None` when credentials were kept.
    pub redacted: Option<redact::Counts>,
}

impl Recording {
    /// `keep_credentials`: record cookies, authorization headers and bodies as they are.
    pub fn new(
        host: Option<&str>,
        max_requests: Option<usize>,
        keep_credentials: bool,
    ) -> Recording {
        Recording {
            host: host.map(normalize_host),
            max: max_requests,
            redactor: (!keep_credentials).then(Redactor::default),
            ..Default::default()
        }
    }

    /// Records an exchange; returns true once `--max-requests` requests to the recorded host
    /// are in (the recording should end). Exchanges past that are ignored.
    pub fn observe(&mut self, mut e: Exchange) -> bool {
        if self.full() {
            return true;
        }
        if let Some(r) = &mut self.redactor {
            r.exchange(&mut e);
        }
        if let Some(h) = host_of(&e.url) {
            if *self.host.get_or_insert_with(|| h.clone()) == h {
                self.to_host += 1;
            }
        }
        self.exchanges.push(e);
        self.full()
    }

    fn full(&self) -> bool {
        self.max.is_some_and(|m| self.to_host >= m)
    }

    /// A request the origin did not answer (the browser got a 502) or that was refused.
    pub fn fail(&mut self, method: &str, url: &str, why: String) {
        // bounded: the first thousand say enough
        if self.failures.len() < 1000 {
            let url = match self.redactor {
                Some(_) => redact::url(url).0,
                None => url.into(),
            };
            self.failures.push(Failure {
                method: method.into(),
                url,
                why,
            });
        }
    }

    /// The scenario: the requests to the recorded host in the order they started, think time
    /// from the gaps between their starts. An error when none was recorded.
    pub fn finish(mut self) -> anyhow::Result<Finished> {
        self.exchanges
            .sort_by(|a, b| a.start_ms.total_cmp(&b.start_ms));
        let mut c = Collector::new(self.host.as_deref());
        let mut unrecordable = Vec::new();
        for e in &self.exchanges {
            match c.push(
                &e.method,
                &e.url,
                Some(e.start_ms),
                &e.headers,
                e.body.clone(),
            ) {
                Ok(Pushed::Kept | Pushed::OtherHost | Pushed::NotHttp) => {}
                Err(err) => unrecordable.push(format!("{} {}: {err:#}", e.method, e.url)),
            }
        }
        let imported = c.finish().map_err(|_| {
            anyhow::anyhow!(
                "no request to {} was recorded; nothing written",
                self.host.as_deref().unwrap_or("any host")
            )
        })?;
        Ok(Finished {
            imported,
            failures: self.failures,
            unrecordable,
            redacted: self.redactor.map(|r| r.counts),
        })
    }
}

impl Finished {
    /// The lines the recorder adds to the import summary.
    pub fn notes(&self) -> String {
        let mut s = String::new();
        for f in &self.failures {
            let _ = write!(s, "\nnot recorded: {} {}: {}", f.method, f.url, f.why);
        }
        for u in &self.unrecordable {
            let _ = write!(s, "\nnot recorded: {u}");
        }
        match self.redacted {
            Some(c) => {
                let _ = write!(
                    s,
                    "\nredacted: header values {}, query parameters {}, request bodies {} \
                     (x's, same lengths; --keep-credentials keeps them)",
                    c.headers, c.params, c.bodies
                );
            }
            None => s.push_str("\ncredentials kept (--keep-credentials): keep the file private"),
        }
        s
    }
}

/// `https://Host:443/x` -> `host` (as the collector compares hosts).
fn host_of(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    Some(normalize_host(authority))
}

/// A request's headers as a scenario holds them: in order, values as text (bytes that are not
/// UTF-8 replaced), HTTP/2's split `cookie` fields joined back into one, as HTTP/1.1 sends it.
pub fn headers_of(map: &http::HeaderMap) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (name, value) in map {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        if name == http::header::COOKIE {
            if let Some((_, v)) = out.iter_mut().find(|(n, _)| n == "cookie") {
                v.push_str("; ");
                v.push_str(&value);
                continue;
            }
        }
        out.push((name.as_str().to_string(), value));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_bench::scenario::{parse, to_toml};

    fn ex(start_ms: f64, method: &str, url: &str) -> Exchange {
        Exchange {
            start_ms,
            method: method.into(),
            url: url.into(),
            headers: vec![("accept".into(), "*/*".into()), ("host".into(), "x".into())],
            body: None,
        }
    }

    #[test]
    fn exchanges_become_a_scenario_in_start_order() {
        let mut r = Recording::new(None, None, true);
        // the page completes first; its subresources complete out of order
        assert!(!r.observe(ex(10.0, "GET", "https://shop.test/")));
        r.observe(ex(250.0, "GET", "https://shop.test/b.png"));
        r.observe(ex(120.0, "GET", "https://cdn.test/lib.js"));
        r.observe(ex(200.0, "GET", "https://shop.test/a.css"));
        let mut post = ex(900.4, "POST", "https://shop.test/cart?x=1");
        post.body = Some(b"sku=1".to_vec());
        r.observe(post);
        r.fail("GET", "https://shop.test/down", "connection refused".into());
        let f = r.finish().unwrap();
        let s = &f.imported.scenario;
        assert_eq!(s.host.as_deref(), Some("shop.test"));
        let got: Vec<(&str, &str, u64)> = s
            .requests
            .iter()
            .map(|q| (q.method.as_str(), q.path.as_str(), q.think_ms))
            .collect();
        assert_eq!(
            got,
            vec![
                ("GET", "/", 0),
                ("GET", "/a.css", 190),
                ("GET", "/b.png", 50),
                ("POST", "/cart?x=1", 650),
            ]
        );
        assert_eq!(f.imported.dropped_hosts, vec![("cdn.test".into(), 1)]);
        assert_eq!(f.imported.dropped_headers, vec!["host".to_string()]);
        assert_eq!(s.requests[0].headers, vec![("accept".into(), "*/*".into())]);
        assert!(f
            .notes()
            .contains("not recorded: GET https://shop.test/down"));
        // what the recorder writes is what bench reads
        let text = to_toml(s, "recorded").unwrap();
        assert_eq!(&parse(&text).unwrap(), s);
    }

    #[test]
    fn host_and_max_requests() {
        let mut r = Recording::new(Some("Shop.test:443"), Some(2), true);
        assert!(!r.observe(ex(1.0, "GET", "https://other.test/")));
        assert!(!r.observe(ex(2.0, "GET", "https://shop.test/1")));
        assert!(r.observe(ex(3.0, "GET", "https://shop.test:443/2")));
        assert!(r.observe(ex(4.0, "GET", "https://shop.test/3")));
        let f = r.finish().unwrap();
        assert_eq!(f.imported.scenario.requests.len(), 2);
        assert_eq!(f.imported.dropped_hosts, vec![("other.test".into(), 1)]);

        let mut r = Recording::new(Some("a.test"), None, true);
        r.observe(ex(1.0, "GET", "https://b.test/"));
        let e = r.finish().unwrap_err().to_string();
        assert!(e.contains("no request to a.test"), "{e}");
    }

    #[test]
    fn unrecordable_requests_are_reported_not_fatal() {
        let mut r = Recording::new(None, None, true);
        r.observe(ex(1.0, "GET", "https://a.test/"));
        r.observe(ex(2.0, "GET", "https://a.test/with space"));
        let f = r.finish().unwrap();
        assert_eq!(f.imported.scenario.requests.len(), 1);
        assert!(f.notes().contains("with space"), "{}", f.notes());
    }

    #[test]
    fn header_values_and_cookies() {
        let mut m = http::HeaderMap::new();
        m.append("cookie", "a=1".parse().unwrap());
        m.append("accept", "text/html".parse().unwrap());
        m.append("cookie", "b=2".parse().unwrap());
        m.append("x-bin", http::HeaderValue::from_bytes(b"caf\xe9").unwrap());
        let h = headers_of(&m);
        assert_eq!(h[0], ("cookie".into(), "a=1; b=2".into()));
        assert_eq!(h[1], ("accept".into(), "text/html".into()));
        assert_eq!(h[2], ("x-bin".into(), "caf\u{fffd}".into()));
    }

    #[test]
    fn credentials_are_redacted_unless_kept() {
        let secret = |keep: bool| {
            let mut r = Recording::new(None, None, keep);
            let mut e = ex(1.0, "POST", "https://a.test/login?token=T0K");
            e.headers = vec![
                ("cookie".into(), "sid=C00KIE".into()),
                ("authorization".into(), "Bearer B3ARER".into()),
                ("x-csrf-token".into(), "CSRF".into()),
                ("accept".into(), "*/*".into()),
            ];
            e.body = Some(b"user=u&pw=PASSW0RD".to_vec());
            r.observe(e);
            r.fail("GET", "https://a.test/x?api_key=K3Y", "refused".into());
            let f = r.finish().unwrap();
            let text = to_toml(&f.imported.scenario, "recorded").unwrap();
            // what is written reads back, with the same sizes
            let back = parse(&text).unwrap();
            assert_eq!(back.requests[0].body.as_ref().unwrap().len(), 18);
            assert_eq!(back.requests[0].path.len(), "/login?token=T0K".len());
            (format!("{text}{}", f.notes()), f.redacted)
        };
        let (text, counts) = secret(false);
        for s in ["C00KIE", "B3ARER", "CSRF", "PASSW0RD", "T0K", "K3Y"] {
            assert!(!text.contains(s), "{s} in\n{text}");
        }
        assert!(text.contains("cookie: sid=xxxxxx"), "{text}");
        assert!(text.contains("authorization: Bearer xxxxxx"), "{text}");
        assert!(text.contains("accept: */*"), "{text}");
        assert!(
            text.contains("redacted: header values 3, query parameters 1, request bodies 1"),
            "{text}"
        );
        assert_eq!(
            counts,
            Some(redact::Counts {
                headers: 3,
                params: 1,
                bodies: 1
            })
        );
        let (text, counts) = secret(true);
        for s in ["C00KIE", "B3ARER", "CSRF", "PASSW0RD", "T0K", "K3Y"] {
            assert!(text.contains(s), "{s} not in\n{text}");
        }
        assert!(text.contains("credentials kept"), "{text}");
        assert_eq!(counts, None);
    }
}
