//! The admin endpoint (`--admin`, loopback only): the roster for operators and scripts.
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
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use baton_ops::accept::{Acceptor, Admitted};
use baton_ops::reply::{json, text};

use crate::members::{Admin, Change, Spec};
use crate::roster::{self, ChangeError};
use crate::server::Shared;

/// Connections served at once (operators and scripts, not clients).
const CONNECTIONS: usize = 16;
/// The largest request body (one agent's JSON).
const BODY_LIMIT: usize = 4096;

pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS));
    let acceptor = Acceptor::new(listener, stop).capped(slots, || {});
    while let Some(Admitted { tcp, slot, .. }) = acceptor.next().await {
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(req, &shared).await) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10));
            let conn = builder.serve_connection(TokioIo::new(tcp), service);
            let _ = tokio::time::timeout(Duration::from_secs(30), conn).await;
            drop(slot);
        });
    }
}

async fn handle(req: Request<Incoming>, shared: &Shared) -> Response<Full<Bytes>> {
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
        // A successor process takes over the listeners and every live connection (as SIGUSR2).
        (Method::POST, ["handover"]) => {
            if shared.handover.request() {
                text(StatusCode::ACCEPTED, "handover started\n")
            } else {
                text(StatusCode::CONFLICT, "a handover is under way\n")
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "GET /agents, POST /agents, POST /agents/ID/drain|disable|enable, DELETE /agents/ID, \
             POST /handover\n",
        ),
    }
}

fn changed(shared: &Shared, change: Change, ok: StatusCode) -> Response<Full<Bytes>> {
    match shared.roster.change(&shared.router, change) {
        Ok(()) => json(ok, &roster::list(&shared.roster, &shared.router)),
        Err(e @ ChangeError::Unknown(_)) => text(StatusCode::NOT_FOUND, &format!("{e}\n")),
        Err(e @ ChangeError::Exists(_)) => text(StatusCode::CONFLICT, &format!("{e}\n")),
        Err(e) => text(StatusCode::BAD_REQUEST, &format!("{e}\n")),
    }
}
