//! What the proxy tells the access log about a response it forwarded: set by the proxy as a
//! response extension, read (and removed) where the request's log line is written.

use std::sync::Arc;
use std::time::Duration;

/// The upstream side of one proxied request.
#[derive(Clone, Debug, Default)]
pub struct Served {
    /// The route that matched, by its configured name.
    pub route: Option<Arc<str>>,
    /// The upstream that answered (`host:port`).
    pub upstream: Option<Arc<str>>,
    /// From sending the request upstream to its response head.
    pub upstream_time: Option<Duration>,
}
