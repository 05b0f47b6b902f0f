//! `fgpu exporter`: Prometheus metrics of the ledgers `fgpu status` would show, served over
//! HTTP (`metrics.rs` builds and encodes them).
//!
//! Every scrape looks at the ledgers afresh (with `--all`, rescans the machine), reclaims
//! dead processes first, and encodes with the `prometheus-client` crate: the Prometheus
//! text format 0.0.4 by default, OpenMetrics when the scraper asks for it.

use super::args::ExporterArgs;
use crate::observe::ledgers;
use crate::observe::metrics::{configured_gpus, encode, registry, wants_openmetrics, ExporterState, OPENMETRICS_CONTENT_TYPE};
use crate::observe::report;
use http_body_util::Full;
use hyper::body::Bytes;
use prometheus_client::encoding::prometheus_text;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const INDEX: &str = "<html><head><title>fgpu exporter</title></head><body><h1>fgpu exporter</h1><p><a href=\"/metrics\">Metrics</a></p></body></html>\n";

/// A connection with no request in progress is closed after this long (hyper's header
/// timeout covers the first request; the reaper covers keep-alive waits and slow clients).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes of a request's head (request line and headers) the exporter reads.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Most connections held open at once; fewer when the descriptor limit is low.
pub const MAX_CONNECTIONS: usize = 512;
/// Most scrapes looking at the ledgers at once; further ones wait their turn.
pub const MAX_SCRAPES: usize = 4;

/// The open connections: when too many are open, or the process runs out of descriptors,
/// the one idle longest is closed to make room, so a flood of idle connections never keeps
/// a scraper out.
#[derive(Default)]
struct Connections {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Conn>>,
}

struct Conn {
    /// When its last request ended, or it was accepted; `None` while a request is served.
    idle_since: Option<Instant>,
    abort: tokio::task::AbortHandle,
}

impl Connections {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Conn>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    /// Closes the connection idle longest; false if none is idle.
    fn shed_one(&self) -> bool {
        let mut open = self.lock();
        let oldest = open.iter().filter_map(|(id, c)| c.idle_since.map(|t| (t, *id))).min();
        match oldest.and_then(|(_, id)| open.remove(&id)) {
            Some(conn) => {
                conn.abort.abort();
                true
            }
            None => false,
        }
    }

    /// Closes the connections idle for longer than `limit`.
    fn reap(&self, limit: Duration) {
        let now = Instant::now();
        self.lock().retain(|_, c| match c.idle_since {
            Some(t) if now.duration_since(t) > limit => {
                c.abort.abort();
                false
            }
            _ => true,
        });
    }

    fn set_busy(&self, id: u64, busy: bool) {
        if let Some(c) = self.lock().get_mut(&id) {
            c.idle_since = if busy { None } else { Some(Instant::now()) };
        }
    }
}

/// How many connections to hold at most: [`MAX_CONNECTIONS`], or fewer when the soft limit
/// on open descriptors leaves less room (keeping some for ledgers, /proc and the listener).
fn connection_limit() -> usize {
    let soft = fgpu_core::sys::host::open_files_limit().map_or(1024, |n| usize::try_from(n).unwrap_or(usize::MAX));
    MAX_CONNECTIONS.min(soft.saturating_sub(64).max(8))
}

/// Everything a request needs.
struct Shared {
    args: ExporterArgs,
    state: Mutex<ExporterState>,
    scrapes: tokio::sync::Semaphore,
}

fn response(status: u16, kind: &str, body: String) -> hyper::Response<Full<Bytes>> {
    let mut r = hyper::Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(value) = hyper::header::HeaderValue::from_str(kind) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
    }
    r
}

async fn handle(request: hyper::Request<hyper::body::Incoming>, shared: Arc<Shared>) -> hyper::Response<Full<Bytes>> {
    let get = matches!(*request.method(), hyper::Method::GET | hyper::Method::HEAD);
    match (get, request.uri().path()) {
        (true, "/metrics") => {
            let accept = request.headers().get(hyper::header::ACCEPT).and_then(|v| v.to_str().ok()).map(str::to_string);
            let openmetrics = wants_openmetrics(accept.as_deref());
            let Ok(_turn) = shared.scrapes.acquire().await else {
                return response(503, "text/plain; charset=utf-8", "shutting down\n".into());
            };
            let work = shared.clone();
            let body = tokio::task::spawn_blocking(move || {
                let report = report::collect(ledgers::resolve(&work.args.select));
                let mut state = work.state.lock().unwrap_or_else(|e| e.into_inner());
                encode(&registry(&report, &mut state), openmetrics)
            })
            .await;
            match body {
                Ok(body) => response(200, if openmetrics { OPENMETRICS_CONTENT_TYPE } else { prometheus_text::CONTENT_TYPE }, body),
                Err(e) => response(500, "text/plain; charset=utf-8", format!("the scrape failed: {e}\n")),
            }
        }
        (true, "/") => response(200, "text/html; charset=utf-8", INDEX.into()),
        _ => response(404, "text/plain; charset=utf-8", "not found; metrics are at /metrics\n".into()),
    }
}

/// Whether `accept` failed for want of a resource that closing a connection gives back.
fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOBUFS) | Some(libc::ENOMEM))
}

/// Whether `accept` failed for the one connection only (the next may succeed).
fn connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
    ) || matches!(e.raw_os_error(), Some(libc::EPROTO) | Some(libc::EPERM) | Some(libc::ENETDOWN) | Some(libc::EHOSTUNREACH))
}

async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) -> i32 {
    let connections = Arc::new(Connections::default());
    let limit = connection_limit();
    let reaper = connections.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            reaper.reap(IDLE_TIMEOUT);
        }
    });
    let mut backoff = Duration::from_millis(10);
    let mut last_said: Option<Instant> = None;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                backoff = Duration::from_millis(10);
                stream
            }
            Err(e) if out_of_descriptors(&e) => {
                // Make room by closing the connection idle longest, give its task a moment
                // to let the descriptor go, and try again; back off while nothing helps.
                if !connections.shed_one() {
                    if last_said.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                        eprintln!("fgpu exporter: accept: {e}; {} connections open, none idle; retrying with a backoff", connections.len());
                        last_said = Some(Instant::now());
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                } else {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                continue;
            }
            Err(e) if connection_error(&e) => continue,
            Err(e) => {
                eprintln!("fgpu exporter: accept failed: {e}; stopping");
                return 1;
            }
        };
        while connections.len() >= limit && connections.shed_one() {}
        let id = connections.next.fetch_add(1, Ordering::Relaxed);
        let (shared, tracked) = (shared.clone(), connections.clone());
        // The task is registered before it can run, so it always finds its own entry.
        let mut open = connections.lock();
        let task = tokio::spawn(async move {
            let marks = tracked.clone();
            let service = hyper::service::service_fn(move |request| {
                let (shared, marks) = (shared.clone(), marks.clone());
                async move {
                    marks.set_busy(id, true);
                    let answer = handle(request, shared).await;
                    marks.set_busy(id, false);
                    Ok::<_, std::convert::Infallible>(answer)
                }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(IDLE_TIMEOUT)
                .max_buf_size(MAX_HEAD_BYTES)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let _ = connection.await;
            tracked.lock().remove(&id);
        });
        open.insert(id, Conn { idle_since: Some(Instant::now()), abort: task.abort_handle() });
    }
}

pub fn exporter(args: &ExporterArgs) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).max_blocking_threads(MAX_SCRAPES + 2).enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("fgpu exporter: cannot start: {e}");
            return 1;
        }
    };
    let listener = match runtime.block_on(tokio::net::TcpListener::bind(args.listen)) {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("fgpu exporter: cannot listen on --listen {}: {e}", args.listen);
            return 1;
        }
    };
    let what = if args.select.all {
        "every ledger on this machine".to_string()
    } else {
        let resolved = ledgers::resolve(&args.select);
        resolved.targets.first().map(|t| format!("ledger {}", crate::observe::text::clean(&t.path.display().to_string()))).unwrap_or_default()
    };
    let bound = listener.local_addr().unwrap_or(args.listen);
    eprintln!("fgpu exporter: serving metrics of {what} at http://{bound}/metrics");
    let configured = if args.select.all {
        Vec::new()
    } else {
        ledgers::resolve(&args.select).targets.first().map(|t| configured_gpus(&t.path.display().to_string())).unwrap_or_default()
    };
    let state = ExporterState { configured, ..Default::default() };
    let shared = Arc::new(Shared { args: args.clone(), state: Mutex::new(state), scrapes: tokio::sync::Semaphore::new(MAX_SCRAPES) });
    runtime.block_on(serve(listener, shared))
}
