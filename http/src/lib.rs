//! A minimal HTTP/1.1 client over hyper: one request per connection, `http://` only. Used to
//! pull traces (collect stage) and by the demo's actor and evaluator. Owns no policy: callers
//! decide timeouts and what a status means.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Why a request failed; the message names the URL.
#[derive(Debug, thiserror::Error)]
#[error("failed to {0}")]
pub struct HttpError(String);

/// Sends one request to an `http://host:port/path` URL; returns status and body.
pub async fn request(method: &str, url: &str, body: &str) -> Result<(u16, String), HttpError> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| HttpError(format!("parse URL {url}: {e}")))?;
    if uri.scheme_str() != Some("http") {
        return Err(HttpError(format!("use an http:// URL, not {url}")));
    }
    let host = uri.host().unwrap_or("127.0.0.1").to_string();
    let port = uri.port_u16().unwrap_or(80);
    let stream = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| HttpError(format!("connect to {host}:{port}: {e}")))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| HttpError(format!("talk HTTP to {host}:{port}: {e}")))?;
    tokio::spawn(conn);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", format!("{host}:{port}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| HttpError(format!("build request: {e}")))?;
    let res = sender
        .send_request(req)
        .await
        .map_err(|e| HttpError(format!("{method} {url}: {e}")))?;
    let status = res.status().as_u16();
    let bytes = res
        .into_body()
        .collect()
        .await
        .map_err(|e| HttpError(format!("read the response of {url}: {e}")))?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}
