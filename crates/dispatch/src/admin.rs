//! The admin endpoint (`--admin`, loopback only): the roster for operators and scripts. Every
//! call needs the admin token and comes from no web page ([`baton_ops::guard`]).
//!
//! - `GET /agents`: every agent with its state, health and open connections (JSON);
//! - `POST /agents` with a JSON agent (`{"id": 3, "addr": "...", "link": "..."}`): it joins;
//! - `POST /agents/ID/drain`, `/disable`, `/enable`: no new clients and no new homes (its
//!   streams finish), parked, or back in rotation;
//! - `DELETE /agents/ID`: it leaves the roster; its streams finish.
//!
//! Changes last until the agents file (if any) next changes or SIGHUP re-reads it: the file is
//! the source of truth where there is one.

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

use crate::context::Context;
use crate::members::{Admin, Change, Spec};
use crate::roster::{self, ChangeError};

/// The largest request body (one agent's JSON).
const BODY_LIMIT: usize = 4096;
/// A connection's whole life (every call answers at once).
const LIFETIME: Duration = Duration::from_secs(30);

pub(crate) async fn serve(
    listener: TcpListener,
    token: Arc<Token>,
    counters: Arc<Counters>,
    shared: Arc<Context>,
    stop: CancellationToken,
) {
    guard::serve_admin(listener, stop, token, LIFETIME, counters, move |req| {
        let shared = shared.clone();
        async move { handle(req, &shared).await }
    })
    .await
}

async fn handle(req: Request<Incoming>, shared: &Context) -> Response<Full<Bytes>> {
    let segments: Vec<String> = req
        .uri()
        .path()
        .trim_matches('/')
        .split('/')
        .map(str::to_owned)
        .collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let method = req.method().clone();
    match (method, segments.as_slice()) {
        (Method::GET, ["agents"]) => {
            let listed = roster::list(&shared.roster, &shared.router);
            json(StatusCode::OK, &listed)
        }
        (Method::POST, ["agents"]) => {
            let body = match Limited::new(req.into_body(), BODY_LIMIT).collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => return text(StatusCode::PAYLOAD_TOO_LARGE, "body too large\n"),
            };
            match serde_json::from_slice::<Spec>(&body) {
                Ok(spec) => changed(shared, Change::Add(spec), StatusCode::CREATED),
                Err(e) => text(StatusCode::BAD_REQUEST, &format!("not an agent: {e}\n")),
            }
        }
        (Method::POST, ["agents", id, verb]) => {
            let Ok(id) = id.parse::<u16>() else {
                return text(StatusCode::NOT_FOUND, "no such agent\n");
            };
            let admin = match *verb {
                "drain" => Admin::Draining,
                "disable" => Admin::Disabled,
                "enable" => Admin::Active,
                _ => return text(StatusCode::NOT_FOUND, "drain, disable or enable\n"),
            };
            changed(shared, Change::SetAdmin(id, admin), StatusCode::OK)
        }
        (Method::DELETE, ["agents", id]) => {
            let Ok(id) = id.parse::<u16>() else {
                return text(StatusCode::NOT_FOUND, "no such agent\n");
            };
            changed(shared, Change::Remove(id), StatusCode::OK)
        }
        // A hot restart: a successor process takes over the listeners and every live
        // connection (as SIGUSR2). `/handover` is its old name.
        (Method::POST, ["restart" | "handover"]) => {
            if shared.restart.request() {
                text(StatusCode::ACCEPTED, "handover started\n")
            } else {
                text(StatusCode::CONFLICT, "a handover is under way\n")
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "GET /agents, POST /agents, POST /agents/ID/drain|disable|enable, DELETE /agents/ID, \
             POST /restart\n",
        ),
    }
}

fn changed(shared: &Context, change: Change, ok: StatusCode) -> Response<Full<Bytes>> {
    match shared.roster.change(&shared.router, change) {
        Ok(()) => json(ok, &roster::list(&shared.roster, &shared.router)),
        Err(e @ ChangeError::Unknown(_)) => text(StatusCode::NOT_FOUND, &format!("{e}\n")),
        Err(e @ ChangeError::Exists(_)) => text(StatusCode::CONFLICT, &format!("{e}\n")),
        Err(e) => text(StatusCode::BAD_REQUEST, &format!("{e}\n")),
    }
}
