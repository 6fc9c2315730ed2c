//! The admin endpoint of `baton up` (loopback only): `POST /rollout` restarts the agents one at
//! a time, `POST /restart` hot-restarts the dispatchers (alias: `POST /handover`), `GET /status`
//! lists the processes and the operations' progress.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use baton_ops::control::Counters;
use baton_ops::guard::{self, Token};
use baton_ops::reply::{json, text};

use crate::control::{Control, RestartStatus, Status};
use crate::restart::RestartRequest;
use crate::rollout::RolloutRequest;

/// The largest request body (`{"pause_ms": ...}`).
const BODY_LIMIT: usize = 4096;
/// A connection's whole life: a rollout answers when it is done, and each of its phases
/// has its own deadline, so this only ends a client that never goes away.
const CONNECTION_LIMIT: Duration = Duration::from_secs(3600);

/// Serves the endpoint to callers that show `token` ([`baton_ops::guard`]).
pub(crate) async fn serve(
    listener: TcpListener,
    token: Arc<Token>,
    control: Arc<Control>,
    stop: CancellationToken,
) {
    let counters = Counters::new("admin");
    guard::serve_admin(
        listener,
        stop,
        token,
        CONNECTION_LIMIT,
        counters,
        move |req| {
            let control = control.clone();
            async move { handle(req, control).await }
        },
    )
    .await
}

async fn handle(req: Request<Incoming>, control: Arc<Control>) -> Response<Full<Bytes>> {
    let path = req.uri().path().trim_end_matches('/').to_string();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/status") => {
            let s = control
                .status
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            json(
                StatusCode::OK,
                &StatusAnswer {
                    handover: &s.restart,
                    status: &s,
                },
            )
        }
        (Method::POST, "/rollout") => {
            let asked: RolloutRequest = match body(req, "{\"pause_ms\": N, \"drain_timeout_ms\": N, \"ready_timeout_ms\": N}").await {
                Ok(r) => r,
                Err(answer) => return answer,
            };
            let opts = match asked.options() {
                Ok(o) => o,
                Err(e) => return text(StatusCode::BAD_REQUEST, &format!("{e}\n")),
            };
            run(control, "rollout", move |c| c.rollout(opts), |r| r.ok).await
        }
        // `/handover`: an alias
        (Method::POST, "/restart" | "/handover") => {
            let asked: RestartRequest = match body(req, "{\"timeout_ms\": N}").await {
                Ok(r) => r,
                Err(answer) => return answer,
            };
            let deadline = match asked.deadline() {
                Ok(d) => d,
                Err(e) => return text(StatusCode::BAD_REQUEST, &format!("{e}\n")),
            };
            run(control, "hot restart", move |c| c.restart(deadline), |r| r.ok).await
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "GET /status, POST /rollout (body optional: {\"pause_ms\": N, \"drain_timeout_ms\": N, \"ready_timeout_ms\": N}), POST /restart (body optional: {\"timeout_ms\": N}; POST /handover is an alias)\n",
        ),
    }
}

/// Runs an operation off the runtime (it blocks for its whole length) and answers with
/// its report: 200 when `ok`, 500 when it stopped on a failure, 409 while another runs.
async fn run<R: serde::Serialize + Send + 'static>(
    control: Arc<Control>,
    what: &str,
    op: impl FnOnce(&Control) -> Result<R, &'static str> + Send + 'static,
    ok: impl Fn(&R) -> bool,
) -> Response<Full<Bytes>> {
    match tokio::task::spawn_blocking(move || op(&control)).await {
        Ok(Ok(report)) => {
            let status = if ok(&report) {
                StatusCode::OK
            } else {
                StatusCode::INTERNAL_SERVER_ERROR
            };
            json(status, &report)
        }
        Ok(Err(busy)) => text(StatusCode::CONFLICT, &format!("{busy}\n")),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("the {what} failed: {e}\n"),
        ),
    }
}

/// A request's JSON body (empty: the defaults), or the answer that refuses it.
async fn body<T: serde::de::DeserializeOwned + Default>(
    req: Request<Incoming>,
    expected: &str,
) -> Result<T, Response<Full<Bytes>>> {
    let body = match tokio::time::timeout(
        Duration::from_secs(10),
        Limited::new(req.into_body(), BODY_LIMIT).collect(),
    )
    .await
    {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(_)) => return Err(text(StatusCode::PAYLOAD_TOO_LARGE, "body too large\n")),
        Err(_) => return Err(text(StatusCode::REQUEST_TIMEOUT, "body too slow\n")),
    };
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&body).map_err(|e| {
        text(
            StatusCode::BAD_REQUEST,
            &format!("expected {expected} (all optional): {e}\n"),
        )
    })
}

/// `GET /status`'s answer: the status, its `restart` also under the alias `handover`.
#[derive(serde::Serialize)]
struct StatusAnswer<'a> {
    #[serde(flatten)]
    status: &'a Status,
    handover: &'a RestartStatus,
}
