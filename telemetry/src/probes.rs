//! The listener: `/metrics` (forwarded from the SDK's exporter), `/healthz`, `/readyz`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::header::{CONNECTION, HOST};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use temporalio_common::telemetry::metrics::CoreMeter;
use temporalio_common::telemetry::{PrometheusExporterOptions, start_prometheus_metric_exporter};
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

/// Where the listener binds, and a file it names the bound address in once it listens. With
/// port 0 that file is how a probe finds the listener: replicas that share a network
/// namespace (compose's `network_mode: service:…`) cannot all bind one fixed port.
#[derive(Clone, Debug)]
pub struct Listen {
    pub bind: SocketAddr,
    pub address_file: Option<PathBuf>,
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
    listen: &Listen,
    render: Render,
) -> anyhow::Result<(SocketAddr, Readiness)> {
    let listener = bind_listener(listen).await?;
    let addr = listener.local_addr()?;
    let ready = Readiness::default();
    tokio::spawn(accept(listener, Source::Rendered(render), ready.clone()));
    Ok((addr, ready))
}

async fn bind_listener(listen: &Listen) -> anyhow::Result<TcpListener> {
    let bind = listen.bind;
    let listener = TcpListener::bind(bind)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {bind} for metrics: {e}"))?;
    if let Some(path) = &listen.address_file {
        let addr = listener.local_addr()?;
        write_address(path, addr)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    Ok(listener)
}

/// Written whole (a temporary file renamed over it), so a probe never reads half an address.
fn write_address(path: &std::path::Path, addr: SocketAddr) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, format!("{addr}\n"))?;
    std::fs::rename(&tmp, path)
}

/// The address a listener named in its address file (see [`Listen`]).
pub fn read_address(path: &std::path::Path) -> Result<SocketAddr, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read {}: {e} (is the process running with --metrics-address-file?)",
            path.display()
        )
    })?;
    text.trim()
        .parse()
        .map_err(|e| format!("{} does not hold an address: {e}", path.display()))
}

/// Whether an address is loopback only: the listener is unauthenticated, so anything else must
/// be asked for on purpose.
pub fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

impl Telemetry {
    /// Starts the SDK's exporter on an ephemeral loopback port and the listener on `bind`.
    /// Needs a Tokio runtime.
    pub async fn serve(listen: &Listen) -> anyhow::Result<Self> {
        // Prometheus's conventions: `_total` on counters, and every histogram named with its
        // unit (`_seconds`), which the SDK adds only when asked.
        let options = PrometheusExporterOptions::builder()
            .socket_addr(SocketAddr::from(([127, 0, 0, 1], 0)))
            .counters_total_suffix(true)
            .unit_suffix(true)
            .use_seconds_for_durations(true)
            .histogram_bucket_overrides(crate::metrics::bucket_overrides())
            .build();
        let exporter = start_prometheus_metric_exporter(options)?;
        let listener = bind_listener(listen).await?;
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

/// The exporter's `/metrics` body, over one request on loopback.
async fn scrape(exporter: SocketAddr) -> std::io::Result<Bytes> {
    get(exporter, "/metrics").await
}

/// One probe of a listener (`casebatch health`): Ok when `path` answers 200 within `timeout`,
/// else what went wrong, for the health check's log.
pub async fn check(addr: SocketAddr, path: &str, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, get(addr, path)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("http://{addr}{path}: {e}")),
        Err(_) => Err(format!("http://{addr}{path}: no answer within {timeout:?}")),
    }
}

/// The body of `GET path`, on a connection of its own that closes with the answer (probes
/// and scrapes are rare), or an error for any status but 200. Everything runs inside the
/// returned future: dropping it (a probe's timeout) drops the connection too.
async fn get(addr: SocketAddr, path: &str) -> std::io::Result<Bytes> {
    let stream = TcpStream::connect(addr).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    let request = Request::get(path)
        .header(HOST, addr.to_string())
        .header(CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(std::io::Error::other)?;
    let exchange = async move {
        let response = sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        Ok::<_, hyper::Error>((status, body))
    };
    // The connection is driven beside the exchange and ends after the answer (`close`).
    let (answer, _closed) = tokio::join!(exchange, connection);
    let (status, body) = answer.map_err(std::io::Error::other)?;
    if status != StatusCode::OK {
        return Err(std::io::Error::other(format!("answered {status}")));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn rendered(body: &'static str) -> (SocketAddr, Readiness) {
        let listen = Listen {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            address_file: None,
        };
        let render: Render = Arc::new(move || Box::pin(async move { body.to_string() }));
        serve_rendered(&listen, render).await.unwrap()
    }

    const WAIT: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn a_probe_passes_on_200_only_and_says_what_it_got() {
        let (addr, ready) = rendered("m 1\n").await;
        assert_eq!(check(addr, "/healthz", WAIT).await, Ok(()));
        assert_eq!(
            check(addr, "/readyz", WAIT).await,
            Err(format!(
                "http://{addr}/readyz: answered 503 Service Unavailable"
            ))
        );
        ready.set(true);
        assert_eq!(check(addr, "/readyz", WAIT).await, Ok(()));
        assert_eq!(
            check(addr, "/nope", WAIT).await,
            Err(format!("http://{addr}/nope: answered 404 Not Found"))
        );
        assert_eq!(&get(addr, "/metrics").await.unwrap()[..], b"m 1\n");
    }

    /// A worker's `/metrics` is the exporter's body, fetched by the same client.
    #[tokio::test]
    async fn metrics_are_forwarded_from_the_exporter() {
        let (exporter, _) = rendered("exported_total 3\n").await;
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(accept(
            listener,
            Source::Exporter(exporter),
            Readiness::default(),
        ));
        assert_eq!(
            &get(addr, "/metrics").await.unwrap()[..],
            b"exported_total 3\n"
        );
    }

    #[tokio::test]
    async fn a_listener_that_never_answers_fails_the_probe_in_time() {
        // Bound but never accepting: the connection opens (the kernel's backlog), no answer.
        let silent = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .unwrap();
        let addr = silent.local_addr().unwrap();
        let timeout = Duration::from_millis(200);
        assert_eq!(
            check(addr, "/healthz", timeout).await,
            Err(format!(
                "http://{addr}/healthz: no answer within {timeout:?}"
            ))
        );
        drop(silent);
        let refused = check(addr, "/healthz", WAIT).await.unwrap_err();
        assert!(
            refused.starts_with(&format!("http://{addr}/healthz: ")),
            "{refused}"
        );
    }
}
