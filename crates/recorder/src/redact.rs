//! The recorder's side of redaction: each exchange is masked as it comes in, with the rules
//! `baton scenario import-har` uses too ([`baton_bench::redact`]: cookie values, credentials,
//! credential-like headers and query parameters, request bodies, each replaced by `x`s of the
//! same length), and what was masked is counted for the file's comment and the summary.

use baton_bench::redact::header_value;
pub use baton_bench::redact::{comment, url, Counts};

use crate::recording::Exchange;

/// Redacts one exchange in place; what it replaced.
pub fn exchange(e: &mut Exchange) -> Counts {
    let mut c = Counts::default();
    for (name, value) in &mut e.headers {
        if let Some(v) = header_value(name, value) {
            *value = v;
            c.headers += 1;
        }
    }
    let (u, params) = url(&e.url);
    e.url = u;
    c.params = params;
    if let Some(b) = &mut e.body {
        if !b.is_empty() {
            b.fill(b'x');
            c.bodies = 1;
        }
    }
    c
}

/// Redacts exchanges as they come in, counting what it replaced.
#[derive(Debug, Default)]
pub struct Redactor {
    pub counts: Counts,
}

impl Redactor {
    pub fn exchange(&mut self, e: &mut Exchange) {
        self.counts.add(exchange(e));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exchange_keeps_sizes_and_nothing_secret() {
        let mut e = Exchange {
            start_ms: 0.0,
            method: "POST".into(),
            url: "https://shop.test/login?session=S3".into(),
            headers: vec![
                ("cookie".into(), "sid=SECRET1".into()),
                ("authorization".into(), "Bearer SECRET2".into()),
                ("x-api-key".into(), "SECRET3".into()),
                ("content-type".into(), "application/json".into()),
            ],
            body: Some(br#"{"password":"SECRET4"}"#.to_vec()),
        };
        let before = e.clone();
        let mut r = Redactor::default();
        r.exchange(&mut e);
        assert_eq!(
            r.counts,
            Counts {
                headers: 3,
                params: 1,
                bodies: 1
            }
        );
        let all = format!("{e:?}");
        assert!(!all.contains("SECRET") && !all.contains("S3"), "{all}");
        assert_eq!(e.url.len(), before.url.len());
        assert_eq!(
            e.body.as_ref().unwrap().len(),
            before.body.as_ref().unwrap().len()
        );
        for (a, b) in e.headers.iter().zip(&before.headers) {
            assert_eq!((&a.0, a.1.len()), (&b.0, b.1.len()));
        }
        assert_eq!(e.headers[3].1, "application/json");
        // an empty body stays empty, no body stays none
        let mut get = Exchange {
            body: Some(Vec::new()),
            ..before
        };
        assert_eq!(exchange(&mut get).bodies, 0);
        assert_eq!(get.body, Some(Vec::new()));
    }
}
