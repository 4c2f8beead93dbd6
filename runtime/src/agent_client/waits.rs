//! The two loops every waiting call to an agent shares: [`Outage`] (retry while the agent is
//! unreachable, up to a grace) and [`beating`] (heartbeat the job while a call runs, and
//! notice a cancel).

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use casebatch_attempt::Liveness;
use casebatch_proto::JobRef;
use tokio::time::Instant;

use super::error::AgentError;

const FIRST_PAUSE: Duration = Duration::from_millis(200);

/// Tracks one stretch of unreachability: pauses with backoff between tries, and gives up once
/// the agent has been unreachable (or failing) for `grace` without a break.
pub(crate) struct Outage {
    grace: Duration,
    max_pause: Duration,
    since: Option<Instant>,
    pause: Duration,
}

impl Outage {
    pub fn new(grace: Duration, max_pause: Duration) -> Self {
        Self {
            grace,
            max_pause,
            since: None,
            pause: FIRST_PAUSE.min(max_pause),
        }
    }

    /// The agent answered: a later failure starts a new outage.
    pub fn reached(&mut self) {
        self.since = None;
        self.pause = FIRST_PAUSE.min(self.max_pause);
    }

    /// After `err`: `Ok` once it is worth trying again (having paused), `Err` when it is not
    /// (not transient, or past the grace).
    pub async fn next(&mut self, err: AgentError) -> Result<(), AgentError> {
        if !err.is_transient() {
            return Err(err);
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() >= self.grace {
            let note = format!("; no answer for {}", span(self.grace));
            return Err(match err {
                AgentError::Unreachable(m) => AgentError::Unreachable(m + &note),
                AgentError::NoConnection(m) => AgentError::NoConnection(m + &note),
                AgentError::Failed(m) => AgentError::Failed(m + &note),
                other => other,
            });
        }
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(self.max_pause);
        Ok(())
    }
}

/// `60 s`, or `300 ms` under a second.
fn span(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// Runs `work` while heartbeating the job (`job` is updated as the agent names its process)
/// every `every`. `None` when `stop_on_cancel` and the activity was cancelled: the engine's
/// answer to a heartbeat brings the cancel, so it is checked after each one.
pub(crate) async fn beating<T>(
    live: &dyn Liveness,
    job: &Mutex<JobRef>,
    every: Duration,
    stop_on_cancel: bool,
    work: impl Future<Output = T>,
) -> Option<T> {
    tokio::pin!(work);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            out = &mut work => return Some(out),
            _ = tick.tick() => {
                let current = job.lock().expect("lock").clone();
                live.heartbeat(&current).await;
                if stop_on_cancel && live.is_cancelled() {
                    return None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_outage_backs_off_then_gives_up_after_its_grace() {
        let grace = Duration::from_millis(300);
        let mut outage = Outage::new(grace, Duration::from_millis(50));
        let down = || AgentError::Unreachable("runtime `a` at http://127.0.0.1:1 is down".into());
        let start = Instant::now();
        let mut tries = 0;
        let err = loop {
            match outage.next(down()).await {
                Ok(()) => tries += 1,
                Err(e) => break e,
            }
        };
        assert!(tries >= 3, "retried {tries} times within the grace");
        assert!(start.elapsed() >= grace);
        assert!(err.message().ends_with("no answer for 300 ms"), "{err}");
        assert!(matches!(err, AgentError::Unreachable(_)));

        // An answer ends the outage: the grace starts again.
        outage.reached();
        assert!(outage.next(down()).await.is_ok());
        // A refusal is never retried.
        let auth = AgentError::Auth("refused".into());
        assert_eq!(outage.next(auth.clone()).await, Err(auth));
    }
}
