//! What Slurm knows of casebatch's jobs, read with one `squeue --json --states=all` for every
//! job a worker process watches: each wait asks for a snapshot no older than it needs, and
//! waits that ask together share one call. With 512 jobs in flight that is one `squeue` a
//! second, not 512.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use crate::commands::{self, Unanswered};
use crate::names::JOB_PREFIX;

/// One job as `squeue` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Job {
    pub(crate) id: String,
    pub(crate) name: String,
    /// Slurm's state (`PENDING`, `RUNNING`, `COMPLETED`, `OUT_OF_MEMORY`, ...).
    pub(crate) state: String,
    /// Why it is pending (`Priority`, `Resources`, `JobHeldUser`, ...), or `None`.
    pub(crate) reason: String,
    pub(crate) nodes: String,
    /// The batch script's exit status, as Slurm reports it.
    pub(crate) exit_code: Option<i64>,
    pub(crate) work_dir: String,
    /// casebatch's comment: `casebatch <marker> <attempt directory>`.
    pub(crate) comment: String,
    pub(crate) user_id: Option<u32>,
}

impl Job {
    /// The attempt's marker and directory, from the comment casebatch gave the job.
    pub(crate) fn attempt(&self) -> Option<(&str, &str)> {
        let rest = self.comment.strip_prefix("casebatch ")?;
        rest.split_once(' ')
    }

    /// Slurm will not run or change it again.
    pub(crate) fn has_ended(&self) -> bool {
        !matches!(
            self.state.as_str(),
            "PENDING"
                | "RUNNING"
                | "CONFIGURING"
                | "COMPLETING"
                | "SUSPENDED"
                | "REQUEUED"
                | "REQUEUE_FED"
                | "REQUEUE_HOLD"
                | "RESIZING"
                | "SIGNALING"
                | "STAGE_OUT"
                | "STOPPED"
                | "RESV_DEL_HOLD"
        )
    }

    pub(crate) fn is_pending(&self) -> bool {
        self.state == "PENDING"
    }
}

/// casebatch's jobs Slurm knows, by name.
#[derive(Debug, Default)]
pub(crate) struct Jobs {
    by_name: HashMap<String, Vec<Job>>,
}

impl Jobs {
    /// The jobs of that name, newest last.
    pub(crate) fn named(&self, name: &str) -> &[Job] {
        self.by_name.get(name).map_or(&[], Vec::as_slice)
    }

    /// The job of that name: the one with id `id` when given, else the newest.
    pub(crate) fn find(&self, name: &str, id: Option<&str>) -> Option<&Job> {
        let named = self.named(name);
        match id {
            Some(id) => named.iter().find(|j| j.id == id),
            None => named.last(),
        }
    }

    /// Every job, for a sweep.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Job> {
        self.by_name.values().flatten()
    }

    /// Reads `squeue --json`'s answer: casebatch's jobs only.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let doc: Value = serde_json::from_str(text)
            .map_err(|e| format!("squeue's JSON could not be read: {e}"))?;
        // `squeue --json` exits 0 when the controller does not answer, saying so here with
        // no jobs: no job may be taken as gone on such an answer.
        if let Some(errors) = doc.get("errors").and_then(Value::as_array)
            && !errors.is_empty()
        {
            let said: Vec<String> = errors
                .iter()
                .map(|e| {
                    let field = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default();
                    format!("{} ({})", field("description"), field("error"))
                })
                .collect();
            return Err(format!(
                "squeue could not list the jobs: {}",
                said.join("; ")
            ));
        }
        let jobs = doc
            .get("jobs")
            .and_then(Value::as_array)
            .ok_or("squeue's JSON has no `jobs` list")?;
        let mut by_name: HashMap<String, Vec<Job>> = HashMap::new();
        for j in jobs {
            let text = |key: &str| match j.get(key) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                // Newer releases give some fields as a list (`job_state: ["RUNNING"]`).
                Some(Value::Array(a)) => a
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(","),
                _ => String::new(),
            };
            let name = text("name");
            if !name.starts_with(JOB_PREFIX) {
                continue;
            }
            let job = Job {
                id: text("job_id"),
                state: text("job_state"),
                reason: text("state_reason"),
                nodes: text("nodes"),
                exit_code: exit_code(j.get("exit_code")),
                work_dir: text("current_working_directory"),
                comment: text("comment"),
                user_id: j.get("user_id").and_then(Value::as_u64).map(|u| u as u32),
                name: name.clone(),
            };
            by_name.entry(name).or_default().push(job);
        }
        for named in by_name.values_mut() {
            named.sort_by_key(|j| j.id.parse::<u64>().unwrap_or(0));
        }
        Ok(Self { by_name })
    }
}

/// `exit_code` is a number up to 22.05, an object (`{"return_code": {"number": N}}`) later.
fn exit_code(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Number(n) => n.as_i64(),
        Value::Object(o) => {
            let rc = o.get("return_code")?;
            rc.as_i64().or_else(|| rc.get("number")?.as_i64())
        }
        _ => None,
    }
}

/// The last snapshot, shared by every wait of this process.
#[derive(Default)]
pub(crate) struct Queue {
    last: tokio::sync::Mutex<Option<(Instant, Arc<Jobs>)>>,
}

impl Queue {
    /// Slurm's jobs as a call made at `not_before` or later saw them: the last snapshot, or a
    /// new one. One call at a time: waits that ask meanwhile get the snapshot it takes. A
    /// job submitted before `not_before` is in it, unless Slurm has forgotten it.
    pub(crate) async fn snapshot(&self, not_before: Instant) -> Result<Arc<Jobs>, String> {
        let mut last = self.last.lock().await;
        if let Some((at, jobs)) = last.as_ref()
            && *at >= not_before
        {
            return Ok(jobs.clone());
        }
        let asked = Instant::now();
        let args = ["--json", "--states=all"].map(String::from);
        let said = match commands::run("squeue", &args, None, None).await {
            Ok(said) => said,
            Err(Unanswered::NotRun(why)) => return Err(why),
            Err(Unanswered::TimedOut) => {
                return Err(format!(
                    "squeue did not answer within {} s",
                    commands::CALL_TIMEOUT.as_secs()
                ));
            }
        };
        if !said.ok {
            return Err(format!("squeue failed: {}", said.complaint()));
        }
        let jobs = Arc::new(Jobs::parse(&said.stdout)?);
        *last = Some((asked, jobs.clone()));
        Ok(jobs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squeue_json_reads_as_casebatch_jobs_by_name_newest_last() {
        let text = r#"{"jobs": [
            {"job_id": 12, "name": "casebatch-b_0_1-00ab", "job_state": "COMPLETED",
             "state_reason": "None", "nodes": "n1", "exit_code": 0,
             "current_working_directory": "/out/b/cases/c/attempts/1/work"},
            {"job_id": 9, "name": "casebatch-b_0_1-00ab", "job_state": "CANCELLED",
             "state_reason": "None", "nodes": "", "exit_code": {"return_code": {"number": 15}},
             "current_working_directory": "/x"},
            {"job_id": 13, "name": "someone-elses", "job_state": "RUNNING"},
            {"job_id": 14, "name": "casebatch-b_1_1-00cd", "job_state": ["PENDING"],
             "state_reason": "Priority", "nodes": "", "exit_code": 0}
        ]}"#;
        let jobs = Jobs::parse(text).unwrap();
        let named = jobs.named("casebatch-b_0_1-00ab");
        assert_eq!(
            named.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
            ["9", "12"]
        );
        assert_eq!(named[0].exit_code, Some(15));
        let newest = jobs.find("casebatch-b_0_1-00ab", None).unwrap();
        assert!(newest.has_ended() && newest.nodes == "n1");
        assert_eq!(
            jobs.find("casebatch-b_0_1-00ab", Some("9")).unwrap().state,
            "CANCELLED"
        );
        let pending = jobs.find("casebatch-b_1_1-00cd", None).unwrap();
        assert!(pending.is_pending() && !pending.has_ended());
        assert_eq!(pending.reason, "Priority");
        assert_eq!(
            jobs.all().count(),
            3,
            "someone else's job is not casebatch's"
        );
        assert!(Jobs::parse("not json").is_err());
        // What 22.05 answers, exiting 0, while its controller is down.
        let down = r#"{"errors": [{"description": "Failed while looking for jobs",
            "error_number": -1, "error": "Unspecified error", "source": "slurm_load_jobs"}],
            "jobs": []}"#;
        let err = Jobs::parse(down).unwrap_err();
        assert!(err.contains("Failed while looking for jobs"), "{err}");
    }
}
