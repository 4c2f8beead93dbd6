//! Bad input: a clear error naming the problem, exit 2, and nothing written.

use crate::support::*;

/// `casebatch batch <verb>` on a bad manifest exits 2 with an error naming the file and the
/// problem (`needle`); returns that error.
fn assert_refused(
    sb: &Sandbox,
    verb: &str,
    manifest: &std::path::Path,
    out: &str,
    name: &str,
    needle: &str,
) -> String {
    let mut args = vec!["batch", verb, "--manifest", manifest.to_str().unwrap()];
    if verb != "validate" {
        args.extend(["--output-dir", out]);
    }
    let o = sb.run(&args);
    assert_exit(&o, 2);
    let err = stderr(&o);
    assert!(
        err.contains(name) && err.contains(needle),
        "{verb} {name}: {err}"
    );
    err
}

#[test]
fn malformed_manifests_are_refused_with_exit_2_and_leave_no_bundle() {
    let sb = Sandbox::new();
    let out = sb.out().display().to_string();
    let cases = [
        (
            "dup.yaml",
            "batch_id: b\ndefaults: {runtime: fake}\ntasks:\n  - task_id: x\n  - task_id: x\n",
            "duplicate",
        ),
        (
            "unknown.yaml",
            "batch_id: b\ndefaults: {runtime: fake}\ntasks:\n  - task_id: x\n    colour: red\n",
            "colour",
        ),
        (
            "missing.yaml",
            "batch_id: b\ndefaults: {runtime: fake}\ntasks:\n  - query: hi\n",
            "task_id",
        ),
        ("broken.yaml", "batch_id: b\ntasks: [\n", "syntax"),
        (
            "conc.yaml",
            "batch_id: b\ndefaults: {runtime: fake, concurrency: 0}\ntasks:\n  - task_id: x\n",
            "concurrency",
        ),
    ];
    for (name, text, needle) in cases {
        let m = sb.write(name, text);
        for verb in ["validate", "plan", "run"] {
            let err = assert_refused(&sb, verb, &m, &out, name, needle);
            assert!(!err.contains("panicked"), "{err}");
        }
    }
    assert!(!sb.out().exists(), "a refused manifest writes nothing");
}

#[test]
fn the_webvoyager_task_list_plans_to_643_distinct_case_directories() {
    let sb = Sandbox::new();
    let out = sb.out().display().to_string();
    let data = format!(
        "{}/../../shared/datasets/webvoyager/WebVoyager_data.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    let o = sb.run(&[
        "batch",
        "run",
        "--dry-run",
        "--manifest",
        &data,
        "--batch-id",
        "webvoyager",
        "--harness",
        "true",
        "--output-dir",
        &out,
        "--max-cases",
        "601",
    ]);
    assert_exit(&o, 0);
    assert!(
        stderr(&o).contains("warning"),
        "warns past --max-cases: {}",
        stderr(&o)
    );
    let plan = sb.json(&sb.bundle("webvoyager").join("batch_plan.json"));
    let cases = plan["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 643);
    let dirs: std::collections::HashSet<&str> = cases
        .iter()
        .map(|c| c["case_dir"].as_str().unwrap())
        .collect();
    assert_eq!(dirs.len(), 643, "directory names are collision-free");
    assert!(
        plan["provenance"]["manifest_sha256"]
            .as_str()
            .unwrap()
            .len()
            == 64
    );
    assert!(
        !sb.bundle("webvoyager").join("cases").exists(),
        "a dry run executes nothing"
    );
}

#[test]
fn config_schema_is_json_schema_of_the_manifest() {
    let sb = Sandbox::new();
    let o = sb.run(&["config", "schema", "--kind", "batch"]);
    assert_exit(&o, 0);
    let schema: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(schema["properties"]["tasks"].is_object(), "{schema:#}");
    assert!(schema["properties"]["defaults"].is_object());
}

#[test]
fn operating_an_unknown_batch_is_a_usage_error() {
    let sb = Sandbox::new();
    let out = sb.out().display().to_string();
    for verb in ["status", "report", "drain", "resume"] {
        let o = sb.run(&["batch", verb, "--batch-id", "nope", "--output-dir", &out]);
        assert_exit(&o, 2);
        assert!(stderr(&o).contains("nope"), "{verb}: {}", stderr(&o));
    }
    let o = sb.run(&[
        "batch",
        "status",
        "--batch-id",
        "../etc",
        "--output-dir",
        &out,
    ]);
    assert_exit(&o, 2);
}

#[test]
fn values_that_cannot_run_are_refused_with_exit_2() {
    let sb = Sandbox::new();
    let out = sb.out().display().to_string();
    let deep = format!(
        "batch_id: b\ndefaults: {{runtime: fake}}\ntasks:\n  - task_id: x\n    inputs: {{k: {}{}}}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let cases = [
        (
            "huge-timeout.yaml",
            "batch_id: b\ndefaults: {runtime: fake, timeout_seconds: 18446744073709551615}\ntasks:\n  - task_id: x\n".to_string(),
            "maximum of 604800",
        ),
        (
            "nul-id.yaml",
            "batch_id: b\ndefaults: {runtime: fake}\ntasks:\n  - task_id: \"x\\0y\"\n".to_string(),
            "control character",
        ),
        (
            "env-name.yaml",
            "batch_id: b\ndefaults: {runtime: fake, env: {CASEBATCH_RESULT: x}}\ntasks:\n  - task_id: x\n".to_string(),
            "harness contract",
        ),
        ("deep.yaml", deep, "nested more than 64 levels"),
    ];
    for (name, text, needle) in cases {
        let m = sb.write(name, &text);
        for verb in ["validate", "run"] {
            assert_refused(&sb, verb, &m, &out, name, needle);
        }
    }
    assert!(!sb.out().exists(), "a refused manifest writes nothing");
}

#[test]
fn runtimes_flags_reach_the_plan_and_a_bad_table_writes_nothing() {
    let sb = Sandbox::new();
    let out = sb.out().display().to_string();
    let tasks = sb.write(
        "tasks.jsonl",
        "{\"id\": \"a\"}\n{\"id\": \"b\", \"runtime\": \"fake\"}\n",
    );
    let args = |runtimes: &str| {
        [
            "batch",
            "plan",
            "--manifest",
            tasks.to_str().unwrap(),
            "--runtimes",
            runtimes,
            "--runtime",
            "box",
            "--harness",
            "./run.sh",
            "--output-dir",
            &out,
        ]
        .map(str::to_string)
    };
    let run = |a: [String; 12]| sb.run(&a.iter().map(String::as_str).collect::<Vec<_>>());

    let bad = sb.write(
        "bad.yaml",
        "runtimes:\n  box: {kind: agent, endpoint: \"http://10.9.8.7:7300\"}\n",
    );
    let o = run(args(bad.to_str().unwrap()));
    assert_exit(&o, 2);
    let err = stderr(&o);
    assert!(
        err.contains("runtimes.box.endpoint")
            && err.contains("runtimes file")
            && err.contains("line 2")
            && err.contains("plaintext is refused off loopback"),
        "{err}"
    );
    assert!(!sb.out().exists(), "a refused table writes nothing");

    let good = sb.write(
        "conf/runtimes.yaml",
        "runtimes:\n  box: {kind: agent, endpoint: \"http://127.0.0.1:7300\", token_file: token}\n",
    );
    let o = run(args(good.to_str().unwrap()));
    assert_exit(&o, 0);
    let plan = sb.json(&sb.bundle("tasks").join("batch_plan.json"));
    assert_eq!(plan["cases"][0]["runtime"], "agent");
    assert_eq!(plan["cases"][0]["runtime_name"], "box");
    assert_eq!(plan["cases"][1]["runtime"], "fake");
    assert!(plan["cases"][1].get("runtime_name").is_none(), "{plan:#}");
    let token = plan["runtimes"]["box"]["token_file"].as_str().unwrap();
    assert!(
        token.ends_with("/conf/token") && token.starts_with('/'),
        "{token}"
    );
}

#[test]
fn validate_and_plan_answer_in_json_when_asked() {
    let sb = Sandbox::new();
    let out = sb.out().display().to_string();
    let good = sb.write(
        "good.yaml",
        "batch_id: j\ndefaults: {runtime: fake}\ntasks: [{task_id: a}, {task_id: b}]\n",
    );
    let o = sb.run(&[
        "batch",
        "validate",
        "--manifest",
        good.to_str().unwrap(),
        "--json",
    ]);
    assert_exit(&o, 0);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["valid"].clone(), v["cases"].clone()),
        (true.into(), 2.into()),
        "{v}"
    );

    // Refused: still JSON on stdout, every problem with its line and field; exit 2.
    let bad = sb.write(
        "bad.yaml",
        "batch_id: j\ndefaults: {runtime: fake, concurrency: 0}\ntasks:\n  - task_id: a\n  - task_id: a\n",
    );
    let o = sb.run(&[
        "batch",
        "validate",
        "--manifest",
        bad.to_str().unwrap(),
        "--json",
    ]);
    assert_exit(&o, 2);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["valid"], false, "{v}");
    let fields: Vec<&str> = v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["field"].as_str().unwrap())
        .collect();
    assert!(fields.contains(&"defaults.concurrency"), "{v}");
    assert!(
        v["problems"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["line"].is_u64()),
        "{v}"
    );

    let o = sb.run(&[
        "batch",
        "plan",
        "--manifest",
        good.to_str().unwrap(),
        "--output-dir",
        &out,
        "--json",
    ]);
    assert_exit(&o, 0);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["cases"], 2, "{v}");
    assert!(
        std::path::Path::new(v["plan"].as_str().unwrap()).exists(),
        "{v}"
    );
}

#[test]
fn completions_and_a_man_page_are_generated() {
    let sb = Sandbox::new();
    for shell in ["bash", "zsh", "fish"] {
        let o = sb.run(&["completions", shell]);
        assert_exit(&o, 0);
        let script = stdout(&o);
        // Every subcommand group and a nested command's flag are completed; hidden ones
        // (`--history-budget`, `engine keep`'s `--state-dir`) are not.
        for word in ["batch", "worker", "retry-failed", "--metrics-bind"] {
            assert!(script.contains(word), "{shell} completion lacks {word}");
        }
        for hidden in ["history-budget", "state-dir"] {
            assert!(
                !script.contains(hidden),
                "{shell} completion offers {hidden}"
            );
        }
    }
    let o = sb.run(&["man"]);
    assert_exit(&o, 0);
    let page = stdout(&o);
    assert!(
        page.starts_with(".ie") || page.contains(".TH casebatch"),
        "{page}"
    );
    assert!(page.contains("completions"), "{page}");
    assert!(page.contains(".SH \"EXIT STATUS\""), "{page}");

    // One page per command: every page a SUBCOMMANDS section names is there, and each says
    // every exit status its command can give: all of them, but `batch report`'s (a report
    // exits 0 whatever the batch's outcome).
    let dir = sb.path("man");
    let o = sb.run(&["man", "--dir", dir.to_str().unwrap()]);
    assert_exit(&o, 0);
    let pages: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(pages.len() > 30, "{pages:?}");
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        let name = page.file_name().unwrap().to_str().unwrap();
        assert!(text.contains(".SH \"EXIT STATUS\""), "{name}: {text}");
        let codes: &[u8] = if name == "casebatch-batch-report.1" {
            &[0, 2, 5]
        } else {
            &[0, 1, 2, 3, 4, 5, 6]
        };
        for code in 0..=6 {
            assert_eq!(
                text.contains(&format!(".TP\n{code}\n")),
                codes.contains(&code),
                "{name}: exit {code}: {text}"
            );
        }
        for reference in text.split_whitespace().filter(|w| w.ends_with("(1)")) {
            // roff writes `-` as `\-`.
            let name = reference.trim_end_matches("(1)").replace("\\-", "-");
            let target = dir.join(format!("{name}.1"));
            assert!(
                target.exists(),
                "{name} names {reference}: no {}",
                target.display()
            );
        }
    }
    assert!(dir.join("casebatch-batch-run.1").exists());
    assert!(!dir.join("casebatch-engine-keep.1").exists(), "hidden");
    // What man(1) shows of one, where groff is installed.
    if let Ok(shown) = std::process::Command::new("groff")
        .args(["-man", "-Tutf8", "-P", "-cbu"])
        .arg(dir.join("casebatch-batch-run.1"))
        .output()
    {
        let shown = String::from_utf8_lossy(&shown.stdout);
        assert!(shown.contains("EXIT STATUS"), "{shown}");
        assert!(shown.contains("terminated"), "{shown}");
    }

    // `--help` of a nested command lists every exit code too.
    let o = sb.run(&["batch", "run", "--help"]);
    assert_exit(&o, 0);
    let help = stdout(&o);
    let codes = help.split_once("Exit codes:").map_or("", |(_, c)| c);
    for code in 0..=6 {
        assert!(codes.contains(&format!("\n  {code}  ")), "{help}");
    }
}

/// `--ui` serves the embedded engine's Web UI: asked for with a cluster, it is a usage error
/// before anything is written.
#[test]
fn the_web_ui_is_refused_for_a_cluster() {
    let sb = Sandbox::new();
    let out = sb.out().display().to_string();
    let m = sb.write(
        "m.yaml",
        "batch_id: c\ndefaults: {runtime: fake}\ntasks:\n  - task_id: a\n",
    );
    let o = sb.run(&[
        "batch",
        "run",
        "--manifest",
        m.to_str().unwrap(),
        "--output-dir",
        &out,
        "--address",
        "127.0.0.1:1",
        "--ui",
    ]);
    assert_exit(&o, 2);
    assert!(
        stderr(&o).contains("--ui serves the Web UI of the embedded engine only"),
        "{}",
        stderr(&o)
    );
    assert!(!sb.bundle("c").join("batch_plan.json").exists());
}
