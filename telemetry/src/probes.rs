//! The listener: `/metrics` (forwarded from the SDK's exporter), `/healthz`, `/readyz`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use temporalio_common::telemetry::metrics::CoreMeter;
use temporalio_common::telemetry::{PrometheusExporterOptions, start_prometheus_metric_exporter};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::Metrics;

/// Whether the worker is connected and polling (`/readyz`). Cloning shares the flag.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }

    fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// A started listener and what records into it.
pub struct Telemetry {
    /// For the SDK runtime's telemetry options: its worker metrics land here.
    pub meter: Arc<dyn CoreMeter>,
    pub metrics: Metrics,
    pub ready: Readiness,
    /// Where the listener is bound (the port is the kernel's pick when asked for 0).
    pub addr: SocketAddr,
}

/// A `/metrics` body made at each scrape.
pub type Render = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = String> + Send>> + Send + Sync>;

/// Where `/metrics` comes from.
#[derive(Clone)]
enum Source {
    /// The SDK's exporter on loopback (a worker).
    Exporter(SocketAddr),
    /// Rendered by the process itself (the agent: gauges read from its job table).
    Rendered(Render),
}

/// Serves `/metrics` from `render`, with `/healthz` and `/readyz`, on `bind`: for a process
/// without a Temporal worker. Returns the bound address and the readiness flag to set.
pub async fn serve_rendered(
    bind: SocketAddr,
    render: Render,
) -> anyhow::Result<(SocketAddr, Readiness)> {
    let listener = bind_listener(bind).await?;
    let addr = listener.local_addr()?;
    let ready = Readiness::default();
    tokio::spawn(accept(listener, Source::Rendered(render), ready.clone()));
    Ok((addr, ready))
}

async fn bind_listener(bind: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(bind)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {bind} for metrics: {e}"))
}

/// Whether an address is loopback only: the listener is unauthenticated, so anything else must
/// be asked for on purpose.
pub fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

impl Telemetry {
    /// Starts the SDK's exporter on an ephemeral loopback port and the listener on `bind`.
    /// Needs a Tokio runtime.
    pub async fn serve(bind: SocketAddr) -> anyhow::Result<Self> {
        let options = PrometheusExporterOptions::builder()
            .socket_addr(SocketAddr::from(([127, 0, 0, 1], 0)))
            .counters_total_suffix(true)
            .use_seconds_for_durations(true)
            .build();
        let exporter = start_prometheus_metric_exporter(options)?;
        let listener = bind_listener(bind).await?;
        let addr = listener.local_addr()?;
        let ready = Readiness::default();
        let source = Source::Exporter(exporter.bound_addr);
        tokio::spawn(accept(listener, source, ready.clone()));
        let meter: Arc<dyn CoreMeter> = exporter.meter;
        Ok(Self {
            metrics: Metrics::new(meter.clone()),
            meter,
            ready,
            addr,
        })
    }
}

async fn accept(listener: TcpListener, source: Source, ready: Readiness) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (source, ready) = (source.clone(), ready.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req| answer(req, source.clone(), ready.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(body.into()))
        .expect("static response parts are valid")
}

async fn answer(
    req: Request<Incoming>,
    source: Source,
    ready: Readiness,
) -> Result<Response<Full<Bytes>>, Infallible> {
    const TEXT: &str = "text/plain; charset=utf-8";
    const EXPOSITION: &str = "text/plain; version=0.0.4";
    if req.method() != Method::GET {
        return Ok(reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n"));
    }
    Ok(match req.uri().path() {
        "/metrics" => match source {
            Source::Exporter(exporter) => match scrape(exporter).await {
                Ok(body) => reply(StatusCode::OK, EXPOSITION, body),
                Err(e) => reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    TEXT,
                    format!("the SDK's metrics exporter did not answer: {e}\n"),
                ),
            },
            Source::Rendered(render) => reply(StatusCode::OK, EXPOSITION, render().await),
        },
        "/healthz" => reply(StatusCode::OK, TEXT, "ok\n"),
        "/readyz" if ready.get() => reply(StatusCode::OK, TEXT, "ready\n"),
        "/readyz" => reply(
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            "not ready: not connected and serving yet, or stopping\n",
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: /metrics, /healthz or /readyz\n",
        ),
    })
}

/// The exporter's `/metrics` body, over one HTTP/1.0 request on loopback.
async fn scrape(exporter: SocketAddr) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(exporter).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("a response without a header end"))?;
    let status_ok = response
        .split(|&b| b == b'\n')
        .next()
        .is_some_and(|line| line.windows(5).any(|w| w == b" 200 "));
    if !status_ok {
        return Err(std::io::Error::other("a status other than 200"));
    }
    Ok(response.split_off(split + 4))
}
