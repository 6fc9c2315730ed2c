//! What a scenario file keeps of credentials unless `--keep-credentials` (`baton record`, in
//! `baton-recorder`, and `baton scenario import-har` mask the same things): credentials and
//! request bodies are replaced by `x`s of the same length, so a replay still sends requests
//! of the recorded sizes, with valid headers, to the same paths.
//!
//! - `Cookie`: each cookie's value (the names stay: `sid=xxxx; theme=xxxx`).
//! - `Authorization`, `Proxy-Authorization`: the credentials after the scheme
//!   (`Bearer xxxx`, `Basic xxxx`).
//! - Any other header, and any query parameter, whose name looks like a credential
//!   ([`is_credential_name`]: `X-Api-Key`, `X-Auth-Token`, `X-CSRF-Token`, `?access_token=`,
//!   `?session_id=` ...): the whole value.
//! - Request bodies: every byte (a form or JSON body carries passwords and tokens as often
//!   as not); empty bodies stay empty.
//!
//! Neither stores responses, so `Set-Cookie` never reaches the file.

/// Headers whose values are always credentials.
const CREDENTIAL_HEADERS: &[&str] = &["cookie", "authorization", "proxy-authorization"];

/// A header or query parameter whose name (lowercase, `_` read as `-`) contains one of these
/// is taken for a credential.
const CREDENTIAL_WORDS: &[&str] = &[
    "token",
    "secret",
    "passw",
    "api-key",
    "apikey",
    "session",
    "csrf",
    "xsrf",
    "credential",
    "signature",
];

/// Name parts (between `-`) that mean authentication; `author` and the like do not.
const AUTH_PARTS: &[&str] = &["auth", "authn", "authz", "authorization", "authentication"];

/// What was replaced in a recording, for the file's comment and the summary.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub headers: usize,
    pub params: usize,
    pub bodies: usize,
}

impl Counts {
    pub fn add(&mut self, o: Counts) {
        self.headers += o.headers;
        self.params += o.params;
        self.bodies += o.bodies;
    }
}

/// Whether a header or query parameter named `name` carries a credential: `Cookie`,
/// `Authorization`, `Proxy-Authorization`, a name with one of [`CREDENTIAL_WORDS`] in it,
/// or with a part (between `-` or `_`) in [`AUTH_PARTS`].
pub fn is_credential_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase().replace('_', "-");
    CREDENTIAL_HEADERS.contains(&n.as_str())
        || CREDENTIAL_WORDS.iter().any(|w| n.contains(w))
        || n.split('-').any(|part| AUTH_PARTS.contains(&part))
}

/// `x` as many times as `s` has bytes.
fn mask(s: &str) -> String {
    "x".repeat(s.len())
}

/// The value a scenario keeps for header `name`: `None` when it is not a credential.
pub fn header_value(name: &str, value: &str) -> Option<String> {
    let lower = name.to_ascii_lowercase();
    match lower.as_str() {
        "cookie" => Some(
            value
                .split(';')
                .map(|pair| match pair.split_once('=') {
                    Some((n, v)) => format!("{n}={}", mask(v)),
                    None => mask(pair),
                })
                .collect::<Vec<_>>()
                .join(";"),
        ),
        "authorization" | "proxy-authorization" => Some(match value.split_once(' ') {
            // `Scheme credentials`: the scheme says what kind, the rest is the secret
            Some((scheme, rest)) if !scheme.is_empty() => format!("{scheme} {}", mask(rest)),
            _ => mask(value),
        }),
        _ if is_credential_name(&lower) => Some(mask(value)),
        _ => None,
    }
}

/// `url` (or a path) with the values of credential-like query parameters masked; the number
/// masked.
pub fn url(url: &str) -> (String, usize) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), 0);
    };
    let mut n = 0;
    let query = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((k, v)) if !v.is_empty() && is_credential_name(k) => {
                n += 1;
                format!("{k}={}", mask(v))
            }
            _ => param.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&");
    (format!("{base}?{query}"), n)
}

/// The scenario file's comment lines saying what was redacted.
pub fn comment(c: Counts) -> String {
    format!(
        "redacted ({} header values, {} query parameters, {} request bodies): Cookie values,\n\
         Authorization and Proxy-Authorization credentials, headers and query parameters named\n\
         like credentials (token, secret, password, api-key, session, csrf, auth ...) and request\n\
         bodies are replaced by x's of the same length; \
         `baton record --keep-credentials` keeps them",
        c.headers, c.params, c.bodies
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_names() {
        for n in [
            "Cookie",
            "AUTHORIZATION",
            "proxy-authorization",
            "X-Api-Key",
            "x_api_key",
            "apikey",
            "X-Auth-Token",
            "X-CSRF-Token",
            "X-XSRF-TOKEN",
            "x-amz-security-token",
            "X-Session-Id",
            "access_token",
            "client_secret",
            "password",
            "X-Goog-Auth",
            "auth",
        ] {
            assert!(is_credential_name(n), "{n}");
        }
        for n in [
            "accept",
            "user-agent",
            "content-type",
            "referer",
            "author",
            "x-scenario",
            "sec-fetch-mode",
            "page",
        ] {
            assert!(!is_credential_name(n), "{n}");
        }
    }

    #[test]
    fn headers_keep_their_shape_and_length() {
        let h = |n: &str, v: &str| header_value(n, v);
        assert_eq!(
            h("Cookie", "sid=s3cr3t; theme=dark").as_deref(),
            Some("sid=xxxxxx; theme=xxxx")
        );
        assert_eq!(h("cookie", "lonely").as_deref(), Some("xxxxxx"));
        assert_eq!(
            h("Authorization", "Bearer abc.def").as_deref(),
            Some("Bearer xxxxxxx")
        );
        assert_eq!(
            h("proxy-authorization", "Basic dXNlcjpwdw==").as_deref(),
            Some("Basic xxxxxxxxxxxx")
        );
        assert_eq!(h("authorization", "opaque").as_deref(), Some("xxxxxx"));
        assert_eq!(h("X-CSRF-Token", "q1w2e3").as_deref(), Some("xxxxxx"));
        assert_eq!(h("accept", "text/html"), None);
        for (n, v) in [
            ("cookie", "a=1; bb=22;c"),
            ("authorization", "Digest u=\"x\", r=\"y\""),
        ] {
            assert_eq!(h(n, v).unwrap().len(), v.len(), "{n}");
        }
    }

    #[test]
    fn query_parameters() {
        assert_eq!(
            url("https://a.test/p?x=1&access_token=abc&page=2&sig=&API_KEY=k"),
            (
                "https://a.test/p?x=1&access_token=xxx&page=2&sig=&API_KEY=x".into(),
                2
            )
        );
        assert_eq!(url("/plain"), ("/plain".into(), 0));
        assert_eq!(url("/q?author=me"), ("/q?author=me".into(), 0));
    }
}
