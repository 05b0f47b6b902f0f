//! The HTTP endpoint of the plugin's metrics (`--metrics-address`): `GET /metrics` answers
//! the Prometheus text format (0.0.4), or OpenMetrics when the scraper asks for it in
//! `Accept` (Prometheus does); `/` a page that links to it; anything else 404.
//!
//! It is the plugin's only TCP port, so it is kept small and hard to hold: at most
//! [`MAX_CONNECTIONS`] connections at once (more wait to be accepted), a request head
//! within [`HEAD_TIMEOUT`], and no connection kept longer than [`CONNECTION_LIFETIME`]
//! (a scraper opens another).

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

pub const MAX_CONNECTIONS: usize = 64;
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(120);

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const INDEX: &str =
    "<html><head><title>fgpu-kubelet-plugin</title></head><body><h1>fgpu-kubelet-plugin</h1><p><a href=\"/metrics\">Metrics</a></p></body></html>\n";

/// Makes the body of a scrape: `true` for OpenMetrics.
pub type Scrape = Arc<dyn Fn(bool) -> String + Send + Sync>;

/// Whether the scraper's `Accept` header asks for OpenMetrics.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.split(',').any(|part| part.trim().starts_with("application/openmetrics-text")))
}

fn response(status: u16, kind: &str, body: String) -> hyper::Response<Full<Bytes>> {
    let mut r = hyper::Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(value) = hyper::header::HeaderValue::from_str(kind) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
    }
    r
}

fn handle(request: &hyper::Request<hyper::body::Incoming>, scrape: &Scrape) -> hyper::Response<Full<Bytes>> {
    let get = matches!(*request.method(), hyper::Method::GET | hyper::Method::HEAD);
    match (get, request.uri().path()) {
        (true, "/metrics") => {
            let openmetrics = wants_openmetrics(request.headers().get(hyper::header::ACCEPT).and_then(|v| v.to_str().ok()));
            let kind = if openmetrics { OPENMETRICS } else { prometheus_client::encoding::prometheus_text::CONTENT_TYPE };
            response(200, kind, scrape(openmetrics))
        }
        (true, "/") => response(200, "text/html; charset=utf-8", INDEX.into()),
        _ => response(404, "text/plain; charset=utf-8", "not found; metrics are at /metrics\n".into()),
    }
}

/// Why the endpoint cannot be served.
#[derive(Debug, thiserror::Error)]
#[error("--metrics-address {address}: cannot listen: {source}")]
pub struct ListenError {
    address: std::net::SocketAddr,
    source: std::io::Error,
}

/// A listener on `address` (`--metrics-address`).
pub async fn listen(address: std::net::SocketAddr) -> Result<TcpListener, ListenError> {
    TcpListener::bind(address).await.map_err(|source| ListenError { address, source })
}

/// Serves `listener` for as long as the plugin runs.
pub async fn serve(listener: TcpListener, scrape: Scrape) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, or one connection that failed: wait a little.
                crate::log(&format!("the metrics endpoint cannot accept a connection: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let scrape = scrape.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let answer = handle(&request, &scrape);
                async move { Ok::<_, std::convert::Infallible>(answer) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, connection).await;
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_when_asked() {
        assert!(wants_openmetrics(Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5")));
        assert!(!wants_openmetrics(Some("text/plain")));
        assert!(!wants_openmetrics(None));
    }
}
