//! The gRPC face of [`Jobs`]: request checks, status codes, and the two server streams.
//!
//! Status codes: NOT_FOUND for an unknown job key; INVALID_ARGUMENT for a malformed request;
//! RESOURCE_EXHAUSTED beyond the envelope (retryable: RUNTIME_FULL); FAILED_PRECONDITION for
//! a request of another contract version (naming both), an attempt key of another bundle, an attempt that can never fit the memory budget,
//! artifacts or an evaluation asked for before the job ended, and an evaluation asked for
//! after cleanup; UNAVAILABLE for a Watch cut by the agent stopping (watch again); INTERNAL
//! when the job table fails.

use std::pin::Pin;
use std::sync::Arc;

use casebatch_proto::runtime_v1 as pb;
use casebatch_proto::runtime_v1::runtime_server::Runtime;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::jobs::{JobError, Jobs};

pub(crate) struct RuntimeService {
    jobs: Arc<Jobs>,
}

impl RuntimeService {
    pub(crate) fn new(jobs: Arc<Jobs>) -> Self {
        Self { jobs }
    }
}

impl From<JobError> for Status {
    fn from(e: JobError) -> Self {
        let m = e.to_string();
        match e {
            JobError::NotFound(_) => Status::not_found(m),
            JobError::Invalid(_) => Status::invalid_argument(m),
            JobError::Full(_) => Status::resource_exhausted(m),
            JobError::Contract(_)
            | JobError::OtherBundle { .. }
            | JobError::NeverFits(_)
            | JobError::NotEnded(_)
            | JobError::Precondition(_) => Status::failed_precondition(m),
            JobError::Table(_) | JobError::Internal(_) => Status::internal(m),
        }
    }
}

fn job_key(req: &pb::JobRequest) -> Result<&str, Status> {
    if req.job_key.is_empty() {
        return Err(Status::invalid_argument(
            "job_key is empty: name the job as <batch_id>/<case_index>/<attempt>",
        ));
    }
    Ok(&req.job_key)
}

/// Resolves once the agent is stopping (the borrow it waits on is not held across awaits).
async fn stopped(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Runtime for RuntimeService {
    async fn submit(
        &self,
        request: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        Ok(Response::new(self.jobs.submit(request.into_inner()).await?))
    }

    type WatchStream = BoxStream<pb::Job>;

    async fn watch(
        &self,
        request: Request<pb::JobRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let key = job_key(request.get_ref())?.to_string();
        let (tx, rx) = mpsc::channel(4);
        match self.jobs.subscribe(&key).await? {
            Err(ended) => {
                let _ = tx.send(Ok(ended)).await;
            }
            Ok(mut changes) => {
                let mut stopping = self.jobs.stopping().subscribe();
                tokio::spawn(async move {
                    loop {
                        let job = changes.borrow_and_update().clone();
                        let ended = job.state == pb::JobState::Ended as i32;
                        if tx.send(Ok(job)).await.is_err() || ended {
                            return;
                        }
                        tokio::select! {
                            changed = changes.changed() => {
                                if changed.is_err() {
                                    // The job's entry is gone without an end (cannot
                                    // happen while the agent runs): say so, do not hang.
                                    let _ = tx.send(Err(Status::unavailable("the job's watch ended early; watch again"))).await;
                                    return;
                                }
                            }
                            _ = stopped(&mut stopping) => {
                                let _ = tx.send(Err(Status::unavailable("the agent is stopping; watch again when it is back"))).await;
                                return;
                            }
                            _ = tx.closed() => return,
                        }
                    }
                });
            }
        }
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get(&self, request: Request<pb::JobRequest>) -> Result<Response<pb::Job>, Status> {
        let key = job_key(request.get_ref())?;
        Ok(Response::new(self.jobs.get(key).await?))
    }

    async fn kill(
        &self,
        request: Request<pb::KillRequest>,
    ) -> Result<Response<pb::KillReply>, Status> {
        let killed_job_keys = match request.into_inner().target {
            Some(pb::kill_request::Target::JobKey(key)) if !key.is_empty() => {
                self.jobs.kill_job(&key).await?
            }
            Some(pb::kill_request::Target::BatchId(batch)) if !batch.is_empty() => {
                self.jobs.kill_batch(&batch)
            }
            _ => {
                return Err(Status::invalid_argument(
                    "name a job_key or a batch_id to kill",
                ));
            }
        };
        Ok(Response::new(pb::KillReply { killed_job_keys }))
    }

    async fn cleanup(
        &self,
        request: Request<pb::JobRequest>,
    ) -> Result<Response<pb::CleanupReceipt>, Status> {
        let key = job_key(request.get_ref())?;
        Ok(Response::new(self.jobs.cleanup(key).await?))
    }

    type FetchArtifactsStream = BoxStream<pb::ArtifactChunk>;

    async fn fetch_artifacts(
        &self,
        request: Request<pb::FetchRequest>,
    ) -> Result<Response<Self::FetchArtifactsStream>, Status> {
        let req = request.into_inner();
        let set = pb::ArtifactSet::try_from(req.set).map_err(|_| {
            Status::invalid_argument(format!(
                "set {} is not an artifact set: ask for ACTOR or EVALUATOR",
                req.set
            ))
        })?;
        let key = job_key(&pb::JobRequest {
            job_key: req.job_key,
        })?
        .to_string();
        let dir = self.jobs.artifacts_dir(&key).await?;
        let (tx, rx) = mpsc::channel(4);
        crate::artifacts::stream(dir, set, tx);
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn evaluate(
        &self,
        request: Request<pb::JobRequest>,
    ) -> Result<Response<pb::Evaluation>, Status> {
        let key = job_key(request.get_ref())?;
        Ok(Response::new(self.jobs.evaluate(key).await?))
    }

    async fn capacity(
        &self,
        _request: Request<pb::CapacityRequest>,
    ) -> Result<Response<pb::CapacityReply>, Status> {
        let envelope = self.jobs.envelope();
        let in_flight = self.jobs.in_flight().await?;
        Ok(Response::new(pb::CapacityReply {
            max_concurrent: envelope.max_concurrent,
            memory_budget_mb: envelope.memory_budget_mb.unwrap_or(0),
            in_flight: in_flight.jobs,
            memory_in_use_mb: in_flight.memory_mb,
        }))
    }

    async fn health(
        &self,
        _request: Request<pb::HealthRequest>,
    ) -> Result<Response<pb::HealthReply>, Status> {
        Ok(Response::new(pb::HealthReply {
            version: env!("CARGO_PKG_VERSION").to_string(),
            hostname: casebatch_attempt::hostname(),
            uptime_ms: self.jobs.uptime_ms(),
            reattached: self.jobs.reattached(),
            contract_version: pb::CONTRACT_VERSION,
        }))
    }
}
