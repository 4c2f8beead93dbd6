//! The one edge where a planned case becomes a job: [`from_planned`] builds the
//! [`JobSpec`] (contract v2, `runtime.proto`) that the local-process machinery runs here and
//! that an agent is sent. Everything past this point reads the job, never the manifest.

use casebatch_manifest::model::{CommandSpec, PlannedCase};
use casebatch_proto::runtime_v1::{Command, JobSpec, Resources, Sandbox};

fn command(c: &CommandSpec) -> Command {
    match c {
        CommandSpec::Shell(script) => Command::shell(script),
        CommandSpec::Argv(argv) => Command { argv: argv.clone() },
    }
}

/// The job of a planned case: its harness and evaluator as argv, its environment (literals
/// and `pass_env` names), its task fields as JSON text, timeout and resources, and its
/// container when its `sandbox.provider` is `container` (`local` is what a job without a
/// sandbox means: the host's processes in the attempt's own cgroup). A sandbox `lifetime`
/// is a hard deadline, so it caps the timeout.
pub fn from_planned(case: &PlannedCase) -> JobSpec {
    JobSpec {
        case_index: case.index,
        case_id: case.case_id.clone(),
        case_dir: case.case_dir.clone(),
        harness: case.harness.as_ref().map(command),
        evaluator: case.evaluator.as_ref().map(command),
        env: case.env.clone().into_iter().collect(),
        pass_env: case.pass_env.clone(),
        input_json: serde_json::to_string(&case.input).expect("JSON values always serialize"),
        timeout_seconds: case
            .sandbox
            .as_ref()
            .and_then(|s| s.lifetime)
            .map_or(case.timeout_seconds, |l| l.min(case.timeout_seconds)),
        resources: Some(Resources {
            memory_mb: case.resources.memory_mb,
            cpu: case.resources.cpu,
            gpus: case.resources.gpus,
            log_mb: case.resources.log_mb,
        }),
        sandbox: case
            .sandbox
            .as_ref()
            .filter(|s| s.is_container())
            .map(container),
    }
}

fn container(s: &casebatch_manifest::model::Sandbox) -> Sandbox {
    let text = |v: &Option<String>| v.clone().unwrap_or_default();
    Sandbox {
        image: text(&s.template),
        network: text(&s.network),
        pull: text(&s.pull),
        user: text(&s.user),
        platform: text(&s.platform),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(harness: serde_json::Value, evaluator: serde_json::Value) -> PlannedCase {
        serde_json::from_value(serde_json::json!({
            "index": 7,
            "case_id": "web/7",
            "case_dir": "web_7",
            "runtime": "agent",
            "runtime_name": "gpu",
            "harness": harness,
            "evaluator": evaluator,
            "sandbox": {"provider": "local", "template": null, "platform": null, "lifetime": null},
            "resources": {"cpu": 1.5, "memory_mb": 768},
            "timeout_seconds": 45,
            "fake": null,
            "env": {"MODE": "fast", "PATH": "/opt/bin"},
            "pass_env": ["API_KEY"],
            "input": {"query": "find it", "max_steps": 12, "nested": {"a": [1, 2]}},
            "source": {"line": 3, "runspec": null},
        }))
        .unwrap()
    }

    #[test]
    fn a_planned_case_becomes_the_job_it_describes() {
        let job = from_planned(&case(
            serde_json::json!("echo hi > out"),
            serde_json::json!(["/bin/check", "--strict"]),
        ));
        assert_eq!(
            (job.case_index, job.case_id.as_str(), job.case_dir.as_str()),
            (7, "web/7", "web_7")
        );
        assert_eq!(
            job.harness.as_ref().unwrap().argv,
            ["sh", "-c", "echo hi > out"]
        );
        assert_eq!(
            job.evaluator.as_ref().unwrap().argv,
            ["/bin/check", "--strict"]
        );
        assert_eq!(job.env.len(), 2);
        assert_eq!(job.env["PATH"], "/opt/bin");
        assert_eq!(job.pass_env, ["API_KEY"]);
        assert_eq!(job.timeout_seconds, 45);
        assert_eq!(job.memory_mb(), Some(768));
        assert_eq!(job.resources.as_ref().unwrap().cpu, Some(1.5));
        assert_eq!(
            serde_json::Value::Object(job.input().unwrap()),
            serde_json::json!({"query": "find it", "max_steps": 12, "nested": {"a": [1, 2]}})
        );
        assert!(job.sandbox.is_none(), "provider local is no sandbox");
    }

    #[test]
    fn a_container_sandbox_becomes_the_jobs_container_and_its_lifetime_caps_the_timeout() {
        let mut planned = case(serde_json::json!("true"), serde_json::Value::Null);
        planned.sandbox = Some(casebatch_manifest::model::Sandbox {
            provider: "container".into(),
            template: Some("busybox:stable".into()),
            lifetime: Some(30),
            network: Some("none".into()),
            user: Some("1000".into()),
            ..casebatch_manifest::model::Sandbox::local()
        });
        let job = from_planned(&planned);
        let sandbox = job.sandbox.as_ref().expect("a container job");
        assert_eq!(sandbox.image, "busybox:stable");
        assert_eq!(sandbox.network, "none");
        assert_eq!((sandbox.pull.as_str(), sandbox.user.as_str()), ("", "1000"));
        assert_eq!(
            job.timeout_seconds, 30,
            "a lifetime of 30 s caps the 45 s timeout"
        );

        planned.sandbox.as_mut().unwrap().lifetime = Some(600);
        assert_eq!(from_planned(&planned).timeout_seconds, 45);
    }

    #[test]
    fn a_case_without_harness_or_evaluator_has_none() {
        let job = from_planned(&case(serde_json::Value::Null, serde_json::Value::Null));
        assert!(job.harness.is_none() && job.evaluator.is_none());
    }

    /// An agent's job table reads rows written by contract v1 (the planned case as JSON)
    /// with the frozen reader in casebatch-proto: it must see the job this edge builds.
    #[test]
    fn the_frozen_v1_reader_agrees_with_this_edge() {
        for (harness, evaluator) in [
            (serde_json::json!("exit 3"), serde_json::json!("true")),
            (
                serde_json::json!(["/bin/run", "a b"]),
                serde_json::Value::Null,
            ),
        ] {
            let case = case(harness, evaluator);
            let json = serde_json::to_vec(&case).unwrap();
            let v1 = casebatch_proto::planned_case_v1::job_spec(&json).unwrap();
            assert_eq!(v1, from_planned(&case));
        }
    }
}
