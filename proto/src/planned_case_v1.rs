//! Contract v1's description of a job, frozen: the manifest's planned case as JSON
//! (`SubmitRequest.planned_case_json`), read into a [`JobSpec`]. Only an agent's job table
//! needs it, to carry rows written before contract v2 across the upgrade (their jobs are
//! still awaited, harvested and evaluated); no request of that shape is accepted any more.
//!
//! It reads only the fields the job used then, with the serde shapes they had, so the agent
//! needs no manifest types: `casebatch_runtime::job_spec` checks that it agrees with the
//! worker's conversion of today's planned case.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::runtime_v1::{Command, JobSpec, Resources};

#[derive(Deserialize)]
struct PlannedCaseV1 {
    index: u32,
    case_id: String,
    case_dir: String,
    harness: Option<CommandV1>,
    evaluator: Option<CommandV1>,
    #[serde(default)]
    resources: ResourcesV1,
    timeout_seconds: u64,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    pass_env: Vec<String>,
    input: serde_json::Map<String, serde_json::Value>,
}

/// A string run by `sh -c`, or an argv list run as is.
#[derive(Deserialize)]
#[serde(untagged)]
enum CommandV1 {
    Shell(String),
    Argv(Vec<String>),
}

#[derive(Deserialize, Default)]
struct ResourcesV1 {
    cpu: Option<f64>,
    memory_mb: Option<u64>,
}

impl From<CommandV1> for Command {
    fn from(c: CommandV1) -> Self {
        match c {
            CommandV1::Shell(script) => Command::shell(&script),
            CommandV1::Argv(argv) => Command { argv },
        }
    }
}

/// The job a v1 planned case described. `Err` says why the text is not one.
pub fn job_spec(planned_case_json: &[u8]) -> Result<JobSpec, String> {
    let case: PlannedCaseV1 = serde_json::from_slice(planned_case_json)
        .map_err(|e| format!("not a contract v1 planned case: {e}"))?;
    Ok(JobSpec {
        case_index: case.index,
        case_id: case.case_id,
        case_dir: case.case_dir,
        harness: case.harness.map(Into::into),
        evaluator: case.evaluator.map(Into::into),
        env: case.env.into_iter().collect(),
        pass_env: case.pass_env,
        input_json: serde_json::Value::Object(case.input).to_string(),
        timeout_seconds: case.timeout_seconds,
        resources: Some(Resources {
            memory_mb: case.resources.memory_mb,
            cpu: case.resources.cpu,
            gpus: None,
            log_mb: None,
        }),
        // v1 knew only `sandbox.provider: local`: the host's processes, as v2 without one.
        sandbox: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_v1_planned_case_reads_as_the_job_it_described() {
        let json = br#"{"index":3,"case_id":"c-3","case_dir":"c-3","runtime":"agent",
            "runtime_name":"gpu","harness":"echo hi","evaluator":["/bin/check","--strict"],
            "sandbox":{"provider":"local","template":null,"platform":null,"lifetime":null},
            "resources":{"cpu":2.0,"memory_mb":512},"timeout_seconds":90,"fake":null,
            "env":{"MODE":"fast"},"pass_env":["API_KEY"],"input":{"query":"q","max_steps":4},
            "source":{"line":7,"runspec":null}}"#;
        let spec = job_spec(json).unwrap();
        assert_eq!((spec.case_index, spec.case_id.as_str()), (3, "c-3"));
        assert_eq!(spec.harness.unwrap().argv, ["sh", "-c", "echo hi"]);
        assert_eq!(spec.evaluator.unwrap().argv, ["/bin/check", "--strict"]);
        assert_eq!(spec.env["MODE"], "fast");
        assert_eq!(spec.pass_env, ["API_KEY"]);
        assert_eq!(spec.timeout_seconds, 90);
        let resources = spec.resources.unwrap();
        assert_eq!((resources.memory_mb, resources.cpu), (Some(512), Some(2.0)));
        let input: serde_json::Value = serde_json::from_str(&spec.input_json).unwrap();
        assert_eq!(input, serde_json::json!({"query": "q", "max_steps": 4}));
        assert!(spec.sandbox.is_none());
    }

    #[test]
    fn what_is_not_a_planned_case_says_so() {
        let err = job_spec(br#"{"index":0}"#).unwrap_err();
        assert!(err.contains("not a contract v1 planned case"), "{err}");
    }
}
