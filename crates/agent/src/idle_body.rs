//! A proxied response body with a deadline between its pieces: an upstream that stops sending
//! in the middle of a body for longer than the route's `idle-timeout` ends it with an error
//! (the client sees the response cut), instead of holding the client's stream open forever.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;

use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;

use crate::body::{Body, BoxError};

pub fn with_idle_timeout(body: Body, idle: Duration) -> Body {
    IdleBody {
        body,
        idle,
        sleep: Box::pin(tokio::time::sleep(idle)),
    }
    .boxed()
}

struct IdleBody {
    body: Body,
    idle: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl http_body::Body for IdleBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(r) => {
                let next = tokio::time::Instant::now() + self.idle;
                self.sleep.as_mut().reset(next);
                Poll::Ready(r)
            }
            Poll::Pending => match self.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                    "upstream sent nothing for {:?} in the middle of a body",
                    self.idle
                )
                .into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body whose frames come from a channel.
    struct Chan(tokio::sync::mpsc::Receiver<Bytes>);

    impl http_body::Body for Chan {
        type Data = Bytes;
        type Error = BoxError;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_ends_in_an_error_and_a_flowing_one_does_not() {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let mut body = with_idle_timeout(Chan(rx).boxed(), Duration::from_secs(5));
        tx.send(Bytes::from_static(b"a")).await.unwrap();
        assert!(body.frame().await.unwrap().is_ok());
        tokio::time::advance(Duration::from_secs(4)).await;
        tx.send(Bytes::from_static(b"b")).await.unwrap();
        assert!(body.frame().await.unwrap().is_ok(), "4 s apart: in time");
        let e = body.frame().await.unwrap().unwrap_err();
        assert!(e.to_string().contains("sent nothing"), "{e}");
        drop(tx);
    }
}
