//! The harness preflight (issue 32): a harness or evaluator program written as a path is
//! resolved against the manifest's directory, `validate` refuses one that does not exist or
//! cannot be executed, and a program the shell still cannot run at attempt time fails the case
//! as a config problem rather than the harness's.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::support::*;

fn executable(path: &Path, yes: bool) {
    let mode = if yes { 0o755 } else { 0o644 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn validate_refuses_programs_that_cannot_run_naming_file_line_and_field() {
    let sb = Sandbox::new();
    let out = sb.out().display().to_string();
    // The manifest lives in m/, the commands run from the sandbox: the programs that exist
    // exist only next to the manifest.
    let noexec = sb.write("m/bin/noexec.sh", "#!/bin/sh\n");
    executable(&noexec, false);
    let eval = sb.write("m/eval", "#!/bin/sh\n");
    executable(&eval, true);
    let manifest = sb.write(
        "m/batch.yaml",
        r#"batch_id: pre
defaults:
  harness: ./missing.sh --fast
tasks:
  - task_id: a
  - task_id: b
    harness: bin/noexec.sh
  - task_id: c
    harness: printf '{}' > "$CASEBATCH_RESULT"
    evaluator: [./eval, --strict]
  - task_id: d
    sandbox: {provider: container, template: busybox}
    harness: ./only-in-the-image.sh
"#,
    );
    let m = manifest.to_str().unwrap();
    for args in [
        vec!["batch", "validate", "--manifest", m],
        vec!["batch", "plan", "--manifest", m, "--output-dir", &out],
    ] {
        let o = sb.run(&args);
        assert_exit(&o, 2);
        let err = stderr(&o);
        let root = sb.path("m").canonicalize().unwrap();
        let missing = format!(
            "{m}:3: defaults.harness: program ./missing.sh ({}/missing.sh) does not exist",
            root.display()
        );
        let not_executable = format!(
            "{m}:7: tasks[1].harness: program bin/noexec.sh ({}/bin/noexec.sh) is not \
             executable (mode 644) (fix: make it executable: chmod +x",
            root.display()
        );
        assert!(err.contains(&missing), "{err}");
        assert!(err.contains(&not_executable), "{err}");
        // Once for the default (not per case that inherits it), nothing about the shell
        // command, the evaluator that exists, or the container's own path.
        assert!(err.contains("2 problem(s)"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    assert!(!sb.out().exists(), "a refused manifest writes nothing");

    // Fixed: the plan records the programs resolved against the manifest's directory.
    sb.write("m/missing.sh", "#!/bin/sh\n");
    executable(&sb.path("m/missing.sh"), true);
    executable(&noexec, true);
    assert_exit(&sb.validate(&manifest), 0);
    let o = sb.run(&["batch", "plan", "--manifest", m, "--output-dir", &out]);
    assert_exit(&o, 0);
    let plan = sb.json(&sb.bundle("pre").join("batch_plan.json"));
    let root = sb.path("m").canonicalize().unwrap().display().to_string();
    let cases = &plan["cases"];
    assert_eq!(cases[0]["harness"], format!("{root}/missing.sh --fast"));
    assert_eq!(cases[1]["harness"], format!("{root}/bin/noexec.sh"));
    assert_eq!(cases[2]["evaluator"][0], format!("{root}/eval"));
    assert_eq!(cases[3]["harness"], "./only-in-the-image.sh");

    // A `--harness` flag is typed in a shell: relative to the directory it is typed in.
    let flag = sb.write("flag.sh", "#!/bin/sh\n");
    executable(&flag, true);
    let tasks = sb.write("m/tasks.jsonl", "{\"id\": \"a\"}\n");
    let args = |harness: &str| {
        sb.run(&[
            "batch",
            "plan",
            "--manifest",
            tasks.to_str().unwrap(),
            "--harness",
            harness,
            "--output-dir",
            &out,
        ])
    };
    let o = args("./flag.sh --quick");
    assert_exit(&o, 0);
    let plan = sb.json(&sb.bundle("tasks").join("batch_plan.json"));
    let cwd = sb.path("").canonicalize().unwrap();
    assert_eq!(
        plan["cases"][0]["harness"],
        format!("{}/flag.sh --quick", cwd.display())
    );
    let o = args("./m/flag.sh");
    assert_exit(&o, 2);
    assert!(
        stderr(&o).contains("flags.harness (--harness): program ./m/flag.sh ("),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_relative_harness_runs_and_one_the_shell_cannot_run_is_a_config_failure() {
    let sb = Sandbox::engine();
    let run = sb.write(
        "m/run.sh",
        "#!/bin/sh\nprintf '{\"outputs\": {\"ran\": true}}' > \"$CASEBATCH_RESULT\"\n",
    );
    executable(&run, true);
    // Written as variables, so validate cannot know them: only the attempt finds out.
    let noexec = sb.write("noexec.sh", "#!/bin/sh\n");
    executable(&noexec, false);
    let manifest = sb.write(
        "m/batch.yaml",
        r#"batch_id: paths
defaults:
  runtime: local-process
  max_retries: 2
  concurrency: 3
  pass_env: [SANDBOX]
  harness: ./run.sh
tasks:
  - task_id: relative
  - task_id: not-executable
    harness: '"$SANDBOX/noexec.sh"'
  - task_id: not-found
    harness: '"$SANDBOX/missing.sh"'
  - task_id: plain-not-found
    harness: no-such-harness-on-path --flag
"#,
    );
    let o = sb.run_batch(&manifest);
    assert_exit(&o, 4);

    let relative = sb.case_result("paths", "relative");
    assert_eq!(relative["state"], "succeeded", "{relative:#}");
    assert_eq!(relative["outputs"]["ran"], true, "{relative:#}");

    // What the shell said names the file (dash: `sh: 1: …/missing.sh: not found`); a plain
    // command is looked for by the wrapper's own shell, which says the same.
    for (case, code, exit, said) in [
        ("not-executable", "HARNESS_NOT_EXECUTABLE", 126, "noexec.sh"),
        ("not-found", "HARNESS_NOT_FOUND", 127, "missing.sh"),
        (
            "plain-not-found",
            "HARNESS_NOT_FOUND",
            127,
            "no-such-harness-on-path: not found",
        ),
    ] {
        let r = sb.case_result("paths", case);
        assert_eq!(r["state"], "failed", "{r:#}");
        assert_eq!(r["failure"]["class"], "config", "{r:#}");
        assert_eq!(r["failure"]["code"], code, "{r:#}");
        assert_eq!(r["exit_code"], exit, "{r:#}");
        assert_eq!(r["attempts"], 1, "a setup problem is not retried: {r:#}");
        let message = r["failure"]["message"].as_str().unwrap();
        assert!(message.contains(said), "stderr's first line: {message}");
    }
}
