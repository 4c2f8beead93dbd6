//! The runtimes table: `runtimes:` in a manifest or `--runtimes FILE`, `runtime: NAME` on
//! defaults, cases and the flag; what the plan records; and every refusal with its line.

mod common;

use std::path::Path;

use casebatch_manifest::{
    LoadOptions, ManifestError, Plan, RuntimeChoice, RuntimeKind, RuntimeSpec, SpreadWeights,
    load_plan,
};
use common::*;

const TWO_AGENTS: &str = r#"batch_id: agents
runtimes:
  box-a: {kind: agent, endpoint: "http://127.0.0.1:7301"}
  gpu:   {kind: agent, endpoint: "https://gpu-1.internal:7300", token_env: CASEBATCH_AGENT_TOKEN, tls_ca: certs/ca.pem}
defaults:
  runtime: box-a
  harness: ./run.sh
tasks:
  - {task_id: t1, runtime: gpu}
  - {task_id: t2}
  - {task_id: t3, runtime: local-process}
  - {task_id: t4, runtime: fake}
"#;

fn with_runtimes_file(manifest: &Path, runtimes: &Path) -> Result<Plan, ManifestError> {
    let opts = LoadOptions {
        runtimes_file: Some(runtimes.to_path_buf()),
        ..LoadOptions::default()
    };
    load_plan(manifest, &opts)
}

fn kinds(plan: &Plan) -> Vec<(RuntimeKind, Option<&str>)> {
    plan.cases
        .iter()
        .map(|c| (c.runtime, c.runtime_name.as_deref()))
        .collect()
}

#[test]
fn cases_carry_the_kind_and_the_table_name_and_built_ins_still_work() {
    let dir = workspace();
    let path = write(dir.path(), "m.yaml", TWO_AGENTS);
    let plan = load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        kinds(&plan),
        [
            (RuntimeKind::Agent, Some("gpu")),
            (RuntimeKind::Agent, Some("box-a")),
            (RuntimeKind::LocalProcess, None),
            (RuntimeKind::Fake, None),
        ]
    );
    let base = dir.path().canonicalize().unwrap();
    assert_eq!(
        plan.runtimes["gpu"],
        RuntimeSpec {
            kind: RuntimeKind::Agent,
            endpoint: Some("https://gpu-1.internal:7300".into()),
            token_env: Some("CASEBATCH_AGENT_TOKEN".into()),
            token_file: None,
            // Relative to the manifest's directory, stored absolute.
            tls_ca: Some(base.join("certs/ca.pem").display().to_string()),
            max_concurrent: None,
            memory_budget_mb: None,
            breaker_failures: None,
            breaker_cooldown_s: None,
            unreachable_grace_s: None,
            queue_limit: None,
            partition: None,
            account: None,
            qos: None,
            constraint: None,
            extra_args: Vec::new(),
        }
    );
    assert_eq!(plan.runtimes.len(), 2);
    // The plan round-trips through batch_plan.json.
    let json = serde_json::to_string(&plan).unwrap();
    assert_eq!(serde_json::from_str::<Plan>(&json).unwrap(), plan);
}

#[test]
fn a_plan_without_a_table_keeps_its_json_and_fingerprint() {
    // Pinned from the plan casebatch wrote before the runtimes table existed.
    let text = "batch_id: pin\ndefaults:\n  harness: ./run.sh\ntasks:\n  - task_id: a\n    query: q\n  - task_id: b\n    runtime: fake\n";
    let plan = accept("pin.yaml", text);
    assert_eq!(
        plan.fingerprint,
        "8ca730bf5bf002614ada5f8eb32897e3408b11793c0e178a9ab96624c58def63"
    );
    let json: serde_json::Value = serde_json::to_value(&plan).unwrap();
    assert!(json.get("runtimes").is_none(), "{json:#}");
    for case in json["cases"].as_array().unwrap() {
        assert!(case.get("runtime_name").is_none(), "{case:#}");
    }
}

#[test]
fn the_fingerprint_ignores_the_table_and_runtime_names() {
    let fp = |text: &str| accept("m.yaml", text).fingerprint;
    let first = fp(TWO_AGENTS);
    // The agent moved, got a token from a file instead, and was renamed: same cases.
    let moved = TWO_AGENTS
        .replace("http://127.0.0.1:7301", "https://box-a.internal:7400")
        .replace(
            "token_env: CASEBATCH_AGENT_TOKEN",
            "token_file: /etc/casebatch/token",
        )
        .replace("gpu", "gpu-2");
    assert_eq!(first, fp(&moved));
    // Spread differently over the two agents: still the same cases.
    assert_eq!(
        first,
        fp(&TWO_AGENTS.replace("{task_id: t1, runtime: gpu}", "{task_id: t1}"))
    );
    // Moving a case from the local host onto an agent keeps it too.
    assert_eq!(
        first,
        fp(&TWO_AGENTS.replace(
            "{task_id: t1, runtime: gpu}",
            "{task_id: t1, runtime: local-process}"
        ))
    );
    // What the case is still counts: a simulation is not a run.
    assert_ne!(
        first,
        fp(&TWO_AGENTS.replace(
            "{task_id: t3, runtime: local-process}",
            "{task_id: t3, runtime: fake}"
        ))
    );
}

#[test]
fn a_runtimes_file_serves_every_manifest_shape() {
    let dir = workspace();
    let conf = write(
        dir.path(),
        "conf/runtimes.yaml",
        "runtimes:\n  box-b:\n    kind: agent\n    endpoint: \"http://[::1]:7302\"\n    token_file: secrets/token\n",
    );
    let token = dir
        .path()
        .canonicalize()
        .unwrap()
        .join("conf/secrets/token")
        .display()
        .to_string();

    // YAML manifest with its own table: the two merge.
    let manifest = write(dir.path(), "m.yaml", TWO_AGENTS);
    let plan = with_runtimes_file(&manifest, &conf).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        plan.runtimes.keys().collect::<Vec<_>>(),
        ["box-a", "box-b", "gpu"]
    );
    // token_file resolves against the runtimes file's directory, not the manifest's.
    assert_eq!(plan.runtimes["box-b"].token_file.as_deref(), Some(&*token));

    // JSONL: a record names the runtime; the defaults file gives the harness.
    let jsonl = write(
        dir.path(),
        "tasks.jsonl",
        "{\"id\": \"a\", \"runtime\": \"box-b\"}\n{\"id\": \"b\"}\n",
    );
    let defaults = write(dir.path(), "d.yaml", "harness: ./run.sh\n");
    let opts = LoadOptions {
        runtimes_file: Some(conf.clone()),
        defaults_file: Some(defaults),
        ..LoadOptions::default()
    };
    let plan = load_plan(&jsonl, &opts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        kinds(&plan),
        [
            (RuntimeKind::Agent, Some("box-b")),
            (RuntimeKind::LocalProcess, None)
        ]
    );

    // batch_v1: the runspec names it.
    write(dir.path(), "v1/a.yaml", "query: q\nruntime: box-b\n");
    let v1 = write(
        dir.path(),
        "v1/batch.yaml",
        "schema_version: batch_v1\ndefaults: {harness: ./run.sh}\nbatch:\n  cases:\n    - {label: a, runspec: a.yaml}\n",
    );
    let plan = with_runtimes_file(&v1, &conf).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(kinds(&plan), [(RuntimeKind::Agent, Some("box-b"))]);
}

#[test]
fn the_runtime_flag_takes_a_table_name() {
    let dir = workspace();
    let path = write(dir.path(), "m.yaml", TWO_AGENTS);
    let mut opts = LoadOptions::default();
    opts.overrides.runtime = Some(RuntimeChoice::One("gpu".into()));
    let plan = load_plan(&path, &opts).unwrap_or_else(|e| panic!("{e}"));
    // The flag beats defaults.runtime; a case's own runtime beats the flag.
    assert_eq!(plan.cases[1].runtime_name.as_deref(), Some("gpu"));
    assert_eq!(plan.cases[2].runtime, RuntimeKind::LocalProcess);

    opts.overrides.runtime = Some(RuntimeChoice::One("gpv".into()));
    let err = load_plan(&path, &opts).unwrap_err();
    let p = says(&err, "flags.runtime (--runtime)", "unknown runtime `gpv`");
    assert!(p.fix.contains("use `gpu`"), "{err}");
}

#[test]
fn a_name_in_both_tables_is_refused_naming_both_files() {
    let dir = workspace();
    let conf = write(
        dir.path(),
        "runtimes.yaml",
        "runtimes:\n  other: {kind: fake}\n  gpu: {kind: agent, endpoint: \"https://h:1\"}\n",
    );
    let manifest = write(dir.path(), "m.yaml", TWO_AGENTS);
    let err = with_runtimes_file(&manifest, &conf).unwrap_err();
    let p = says(&err, "runtimes.gpu", "declared both in the manifest");
    assert_eq!(p.line, Some(4));
    assert!(p.message.contains("m.yaml line 4"), "{err}");
    assert!(p.message.contains("runtimes.yaml line 3"), "{err}");
    // The clash is reported once; the cases naming it add nothing.
    assert_eq!(err.problems.len(), 1, "{err}");
}

#[test]
fn an_unknown_runtime_name_suggests_the_closest_and_lists_the_declared() {
    let err = refuse(
        "m.yaml",
        &TWO_AGENTS
            .replace("{task_id: t1, runtime: gpu}", "{task_id: t1, runtime: gpv}")
            .replace("{task_id: t2}", "{task_id: t2, runtime: agent}"),
    );
    let p = says(&err, "tasks[0].runtime", "unknown runtime `gpv`");
    assert_eq!(p.line, Some(9));
    assert!(p.message.contains("declared: box-a, gpu"), "{err}");
    assert_eq!(p.fix, "use `gpu`");
    let p = says(&err, "tasks[1].runtime", "unknown runtime `agent`");
    assert!(p.fix.contains("`agent` is a kind, not a name"), "{err}");
    assert_eq!(err.problems.len(), 2, "{err}");

    // Inherited from the defaults: reported once, at the defaults.
    let err = refuse(
        "m.yaml",
        "batch_id: t\ndefaults:\n  harness: x\n  runtime: docker\ntasks:\n  - task_id: a\n  - task_id: b\n",
    );
    let p = says(&err, "defaults.runtime", "no runtimes are declared");
    assert_eq!(p.line, Some(4));
    assert_eq!(err.problems.len(), 1, "{err}");
}

#[test]
fn an_unknown_runtime_in_a_defaults_file_or_runspec_names_that_file() {
    let dir = workspace();
    let jsonl = write(dir.path(), "tasks.jsonl", "{\"id\": \"a\"}\n");
    let defaults = write(dir.path(), "d.yaml", "harness: ./run.sh\nruntime: box\n");
    let opts = LoadOptions {
        defaults_file: Some(defaults),
        ..LoadOptions::default()
    };
    let err = load_plan(&jsonl, &opts).unwrap_err();
    let p = says(&err, "defaults.runtime", "unknown runtime `box`");
    assert!(p.message.contains("d.yaml line 2"), "{err}");

    write(dir.path(), "v1/a.yaml", "query: q\nruntime: box\n");
    let v1 = write(
        dir.path(),
        "v1/batch.yaml",
        "schema_version: batch_v1\ndefaults: {harness: ./run.sh}\nbatch:\n  cases:\n    - {label: a, runspec: a.yaml}\n",
    );
    let err = load(&v1).unwrap_err();
    let p = says(
        &err,
        "batch.cases[0].runspec.runtime",
        "unknown runtime `box`",
    );
    assert!(p.message.contains("a.yaml"), "{err}");
    assert_eq!(p.line, Some(5));
}

/// A manifest whose table is `entries` (indented two spaces), with one case per entry.
fn table(entries: &str) -> ManifestError {
    refuse(
        "m.yaml",
        &format!(
            "batch_id: t\ndefaults:\n  harness: ./run.sh\nruntimes:\n{entries}tasks:\n  - task_id: a\n"
        ),
    )
}

#[test]
fn agent_entries_are_checked_field_by_field() {
    let err = table(
        "  \
  no-endpoint: {kind: agent}
  bad-form: {kind: agent, endpoint: \"127.0.0.1:7300\"}
  with-path: {kind: agent, endpoint: \"https://h:7300/v1\"}
  open: {kind: agent, endpoint: \"http://10.1.2.3:7300\"}
  two-tokens: {kind: agent, endpoint: \"https://h:1\", token_env: TOKEN, token_file: t}
  bad-var: {kind: agent, endpoint: \"https://h:1\", token_env: \"MY-TOKEN\"}
  plain-ca: {kind: agent, endpoint: \"http://localhost:1\", tls_ca: ca.pem}
  typo: {kind: agent, endpoint: \"https://h:1\", tokn_env: T}
  no-kind: {endpoint: \"https://h:1\"}
  bad-kind: {kind: docker}
",
    );
    let p = says(&err, "runtimes.no-endpoint", "needs an `endpoint`");
    assert_eq!(p.line, Some(5));
    let p = says(
        &err,
        "runtimes.bad-form.endpoint",
        "is not http://HOST:PORT or https://HOST:PORT",
    );
    assert_eq!(p.line, Some(6));
    says(&err, "runtimes.with-path.endpoint", "no path");
    let p = says(
        &err,
        "runtimes.open.endpoint",
        "plaintext is refused off loopback: use https:// (and tls_ca if the agent's certificate is not signed by a system root)",
    );
    assert_eq!(p.line, Some(8));
    assert!(p.fix.contains("https://10.1.2.3:7300"), "{err}");
    let p = says(
        &err,
        "runtimes.two-tokens.token_file",
        "both `token_env` and `token_file`",
    );
    assert_eq!(p.line, Some(9));
    says(
        &err,
        "runtimes.bad-var.token_env",
        "not a valid environment variable name",
    );
    says(&err, "runtimes.plain-ca.tls_ca", "plaintext http://");
    let p = says(&err, "runtimes.typo.tokn_env", "unknown field `tokn_env`");
    assert!(p.fix.contains("`token_env`"), "{err}");
    says(&err, "runtimes.no-kind", "missing required field `kind`");
    says(
        &err,
        "runtimes.bad-kind.kind",
        "`local-process`, `fake` or `agent`",
    );
    assert_eq!(err.problems.len(), 10, "{err}");
}

#[test]
fn local_entries_take_no_agent_fields_and_names_are_checked() {
    let err = table(
        "  \
  here: {kind: local-process, endpoint: \"http://127.0.0.1:1\", token_env: T}
  sim: {kind: fake, tls_ca: ca.pem, token_file: t}
  Box-A: {kind: fake}
  local-process: {kind: local-process}
  \"-x\": {kind: fake}
",
    );
    for field in [
        "runtimes.here.endpoint",
        "runtimes.here.token_env",
        "runtimes.sim.tls_ca",
        "runtimes.sim.token_file",
    ] {
        let p = says(&err, field, "applies to `kind: agent` only");
        assert!(p.line.is_some(), "{err}");
    }
    let p = says(&err, "runtimes.Box-A", "is not lowercase letters, digits");
    assert_eq!(p.line, Some(7));
    says(&err, "runtimes.local-process", "is a built-in runtime");
    says(&err, "runtimes.-x", "is not lowercase letters");
    let long = format!("  {}: {{kind: fake}}\n", "a".repeat(64));
    says(
        &table(&long),
        &format!("runtimes.{}", "a".repeat(64)),
        "at most 63",
    );
    says(
        &table("  - box\n"),
        "runtimes",
        "expected a mapping of runtime names",
    );
}

#[test]
fn an_agent_case_needs_a_harness() {
    let err = refuse(
        "m.yaml",
        "batch_id: t\nruntimes:\n  box: {kind: agent, endpoint: \"http://127.0.0.1:7301\"}\ntasks:\n  - task_id: a\n    runtime: box\n  - task_id: b\n    runtime: box\n    harness: ./run.sh\n",
    );
    let p = says(
        &err,
        "tasks[0].harness",
        "runtime `box` (agent) needs a harness command",
    );
    assert_eq!(p.line, Some(5));
    assert_eq!(err.problems.len(), 1, "{err}");
}

#[test]
fn a_broken_runtimes_file_names_the_file_line_and_field() {
    let dir = workspace();
    let manifest = write(dir.path(), "m.yaml", TWO_AGENTS);
    let conf = write(
        dir.path(),
        "r.yaml",
        "runtimes:\n  far: {kind: agent, endpoint: \"http://gpu-1.internal:7300\"}\nruntime: {}\n",
    );
    let err = with_runtimes_file(&manifest, &conf).unwrap_err();
    let p = says(
        &err,
        "runtimes.far.endpoint",
        "plaintext is refused off loopback",
    );
    assert!(
        p.message
            .starts_with(&format!("in runtimes file {} line 2: ", conf.display())),
        "{err}"
    );
    let p = says(&err, "runtime", "unknown field `runtime`");
    assert!(p.fix.contains("`runtimes`"), "{err}");

    let conf = write(dir.path(), "empty.yaml", "{}\n");
    let err = with_runtimes_file(&manifest, &conf).unwrap_err();
    says(&err, "(document)", "missing required field `runtimes`");

    let err = with_runtimes_file(&manifest, &dir.path().join("absent.yaml")).unwrap_err();
    let p = says(&err, "(file)", "cannot read the runtimes file");
    assert!(p.message.contains("absent.yaml"), "{err}");
    // The unreadable table may hold the names the cases use: only the file is reported.
    assert_eq!(err.problems.len(), 1, "{err}");
}

#[test]
fn json_manifests_take_a_table_too() {
    let plan = accept(
        "m.json",
        r#"{"batch_id": "j",
  "runtimes": {"box": {"kind": "agent", "endpoint": "http://localhost:7301"}},
  "defaults": {"runtime": "box", "harness": ["./run"]},
  "tasks": [{"task_id": "a"}]}"#,
    );
    assert_eq!(kinds(&plan), [(RuntimeKind::Agent, Some("box"))]);
    let err = refuse(
        "m.json",
        r#"{"batch_id": "j",
  "runtimes": {"box": {"kind": "agent"}},
  "defaults": {"runtime": "box", "harness": ["./run"]},
  "tasks": [{"task_id": "a"}]}"#,
    );
    let p = says(&err, "runtimes.box", "needs an `endpoint`");
    assert_eq!(p.line, Some(2));
}

const SPREAD: &str = r#"batch_id: spread
runtimes:
  box-a: {kind: agent, endpoint: "http://127.0.0.1:7301"}
  box-b: {kind: agent, endpoint: "http://127.0.0.1:7302"}
  box-c: {kind: agent, endpoint: "http://127.0.0.1:7303"}
defaults:
  runtime: [box-a, box-b]
  harness: ./run.sh
tasks:
  - {task_id: t1}
  - {task_id: t2}
  - {task_id: t3, runtime: box-c}
  - {task_id: t4}
  - {task_id: t5, runtime: [box-c, box-a, box-b]}
  - {task_id: t6}
  - {task_id: t7, runtime: [box-c, box-a, box-b]}
"#;

/// The runtime each case was dealt to, in plan order.
fn dealt_to(plan: &Plan) -> Vec<&str> {
    plan.cases
        .iter()
        .map(|c| c.runtime_name.as_deref().unwrap())
        .collect()
}

#[test]
fn a_list_of_runtimes_deals_its_cases_to_them_in_turn_and_records_the_list() {
    let dir = workspace();
    let plan = load(&write(dir.path(), "m.yaml", SPREAD)).unwrap_or_else(|e| panic!("{e}"));
    let names = dealt_to(&plan);
    // The defaults' list deals t1 t2 t4 t6 alternately; t3 names one runtime and takes no
    // turn; the three-runtime list deals its own cases from its first runtime.
    assert_eq!(
        names,
        [
            "box-a", "box-b", "box-c", "box-a", "box-c", "box-b", "box-a"
        ]
    );
    assert_eq!(plan.cases[0].runtime_spread, ["box-a", "box-b"]);
    assert!(plan.cases[2].runtime_spread.is_empty());
    assert_eq!(plan.cases[4].runtime_spread, ["box-c", "box-a", "box-b"]);

    // Where the cases run is not what they are: spreading them keeps the fingerprint.
    let one = load(&write(
        dir.path(),
        "one.yaml",
        &SPREAD.replace("runtime: [box-a, box-b]", "runtime: box-a"),
    ))
    .unwrap();
    assert_eq!(plan.fingerprint, one.fingerprint);

    // The flag spreads too: `--runtime box-b,box-a`.
    let mut opts = LoadOptions::default();
    opts.overrides.runtime = Some(RuntimeChoice::Spread(vec!["box-b".into(), "box-a".into()]));
    let flagged = load_plan(&write(dir.path(), "f.yaml", SPREAD), &opts).unwrap();
    assert_eq!(flagged.cases[0].runtime_name.as_deref(), Some("box-b"));
    assert_eq!(flagged.cases[1].runtime_name.as_deref(), Some("box-a"));
}

#[test]
fn weights_deal_a_list_in_proportion_evenly_interleaved_and_keep_the_fingerprint() {
    let dir = workspace();
    let eight: String = (1..=8)
        .map(|i| format!("  - {{task_id: w{i}}}\n"))
        .collect();
    let text = format!(
        "batch_id: weighted\nruntimes:\n  fast: {{kind: agent, endpoint: \"http://127.0.0.1:7301\"}}\n  \
         slow: {{kind: agent, endpoint: \"http://127.0.0.1:7302\"}}\ndefaults:\n  runtime: [slow, fast]\n  \
         harness: ./run.sh\ntasks:\n{eight}"
    );
    let even = load(&write(dir.path(), "w.yaml", &text)).unwrap_or_else(|e| panic!("{e}"));
    let on = |plan: &Plan, name: &str| {
        plan.cases
            .iter()
            .filter(|c| c.runtime_name.as_deref() == Some(name))
            .count()
    };
    assert_eq!((on(&even, "fast"), on(&even, "slow")), (4, 4));

    // A 3×-slower runtime weighs a third: 6 of 8 cases go to the fast one.
    let mut weighted = even.clone();
    weighted.deal_spread(SpreadWeights {
        weights: [("fast".to_string(), 200), ("slow".to_string(), 67)].into(),
        source: "run history: 1 batch".into(),
    });
    assert_eq!((on(&weighted, "fast"), on(&weighted, "slow")), (6, 2));
    assert_eq!(
        dealt_to(&weighted),
        [
            "fast", "slow", "fast", "fast", "fast", "slow", "fast", "fast"
        ],
        "interleaved, not 6 then 2"
    );
    assert_eq!(weighted.fingerprint, even.fingerprint);
    assert_eq!(
        weighted.spread.as_ref().unwrap().source,
        "run history: 1 batch"
    );
    // Even weights give the plan's own deal back.
    let mut again = weighted.clone();
    again.deal_spread(SpreadWeights {
        weights: Default::default(),
        source: "even".into(),
    });
    let before: Vec<_> = even.cases.iter().map(|c| c.runtime_name.clone()).collect();
    let after: Vec<_> = again.cases.iter().map(|c| c.runtime_name.clone()).collect();
    assert_eq!(before, after);
}

#[test]
fn a_list_with_an_unknown_a_repeated_or_no_runtime_is_refused_where_written() {
    let err = refuse(
        "m.yaml",
        &SPREAD
            .replace("runtime: [box-a, box-b]", "runtime: [box-a, box-q]")
            .replace(
                "{task_id: t5, runtime: [box-c, box-a, box-b]}",
                "{task_id: t5, runtime: [box-c, box-c]}",
            )
            .replace(
                "{task_id: t7, runtime: [box-c, box-a, box-b]}",
                "{task_id: t7, runtime: []}",
            ),
    );
    let p = says(&err, "defaults.runtime[1]", "unknown runtime `box-q`");
    assert_eq!(p.line, Some(7));
    let p = says(&err, "tasks[4].runtime[1]", "`box-c` is listed twice");
    assert_eq!(p.line, Some(14));
    says(&err, "tasks[6].runtime", "the list names no runtime");
    // The defaults' typo is reported once, not again for each case inheriting it.
    assert_eq!(err.problems.len(), 3, "{err}");
}

#[test]
fn envelopes_are_checked_and_a_case_that_could_never_fit_is_refused() {
    let dir = workspace();
    let text = SPREAD.replace(
        r#"box-a: {kind: agent, endpoint: "http://127.0.0.1:7301"}"#,
        r#"box-a: {kind: agent, endpoint: "http://127.0.0.1:7301", max_concurrent: 2, memory_budget_mb: 600}"#,
    );
    let plan = load(&write(dir.path(), "m.yaml", &text)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plan.runtimes["box-a"].max_concurrent, Some(2));
    assert_eq!(plan.runtimes["box-a"].memory_budget_mb, Some(600));

    let err = refuse(
        "m.yaml",
        &text.replace("max_concurrent: 2", "max_concurrent: 0"),
    );
    says(&err, "runtimes.box-a.max_concurrent", "outside 1..=512");

    // t4 is dealt to box-a, whose whole budget is 600 MB.
    let err = refuse(
        "m.yaml",
        &text.replace(
            "{task_id: t4}",
            "{task_id: t4, resources: {memory_mb: 1024}}",
        ),
    );
    let p = says(
        &err,
        "tasks[3].resources.memory_mb",
        "more than runtime `box-a`'s whole",
    );
    assert_eq!(p.line, Some(13));
    assert_eq!(err.problems.len(), 1, "{err}");
}

#[test]
fn breaker_settings_the_unreachable_grace_and_the_queue_limit_are_checked() {
    let dir = workspace();
    let text = SPREAD.replace(
        r#"box-a: {kind: agent, endpoint: "http://127.0.0.1:7301"}"#,
        r#"box-a: {kind: agent, endpoint: "http://127.0.0.1:7301", breaker_failures: 5, breaker_cooldown_s: 60, unreachable_grace_s: 4, queue_limit: 500}"#,
    );
    let plan = load(&write(dir.path(), "m.yaml", &text)).unwrap_or_else(|e| panic!("{e}"));
    let spec = &plan.runtimes["box-a"];
    assert_eq!(spec.breaker().failures, 5);
    assert_eq!(spec.breaker().cooldown_s, 60);
    assert_eq!(spec.unreachable_grace_s, Some(4));
    assert_eq!(spec.queue_limit, Some(500));
    // Unset: the defaults docs/runtimes.md names.
    assert_eq!(plan.runtimes["box-b"].breaker().failures, 3);
    assert_eq!(plan.runtimes["box-b"].breaker().cooldown_s, 30);

    for (from, to, field, says_what) in [
        (
            "breaker_failures: 5",
            "breaker_failures: 0",
            "breaker_failures",
            "outside 1..=100",
        ),
        (
            "breaker_cooldown_s: 60",
            "breaker_cooldown_s: 0",
            "breaker_cooldown_s",
            "outside 1..=3600",
        ),
        (
            "unreachable_grace_s: 4",
            "unreachable_grace_s: 601",
            "unreachable_grace_s",
            "outside 1..=600",
        ),
        (
            "queue_limit: 500",
            "queue_limit: 0",
            "queue_limit",
            "outside 1..=100000",
        ),
    ] {
        let err = refuse("m.yaml", &text.replace(from, to));
        says(&err, &format!("runtimes.box-a.{field}"), says_what);
    }
}
