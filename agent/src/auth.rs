//! The bearer-token check every RPC passes through when the agent has a token: metadata
//! `authorization: Bearer <token>`, compared in constant time (as SHA-256 digests, so neither
//! the length nor the position of a difference shows in the timing).

use sha2::{Digest, Sha256};
use tonic::service::Interceptor;
use tonic::{Request, Status};

pub(crate) fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

/// Equal digests, examining every byte whatever the first difference.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Passes every call when no token is configured.
#[derive(Clone)]
pub(crate) struct BearerAuth {
    expected: Option<[u8; 32]>,
}

impl BearerAuth {
    pub(crate) fn new(expected: Option<[u8; 32]>) -> Self {
        Self { expected }
    }
}

impl Interceptor for BearerAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.expected else {
            return Ok(request);
        };
        let Some(value) = request.metadata().get("authorization") else {
            return Err(Status::unauthenticated("missing bearer token"));
        };
        let presented = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|t| digest(t.trim().as_bytes()));
        match presented {
            Some(d) if same(&d, expected) => Ok(request),
            _ => Err(Status::unauthenticated("wrong bearer token")),
        }
    }
}
