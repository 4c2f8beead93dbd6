//! Logs: `--log-format json` makes stderr one JSON object per line, with each attempt's span
//! (batch, case, attempt); text carries no colour codes off a terminal; `RUST_LOG` filters.

use serde_json::Value;

use crate::support::*;

const MANIFEST: &str = r#"batch_id: logged
defaults: {runtime: fake, concurrency: 2}
tasks: [{task_id: a}, {task_id: b}, {task_id: c}]
"#;

#[test]
fn json_logs_parse_line_by_line_and_name_each_attempt_and_the_outcome_is_json() {
    let sb = Sandbox::engine();
    let manifest = sb.write("logged.yaml", MANIFEST);
    let out = sb.out();
    let mut args = batch_run_args(&manifest, &out).to_vec();
    args.extend(["--log-format", "json", "--json"]);
    let o = sb.run_env(&args, &[("RUST_LOG", "warn,casebatch=info")]);
    assert_exit(&o, 0);
    // The outcome is one JSON object on stdout, apart from the logs.
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("the outcome is JSON");
    assert_eq!(outcome["end"], "completed", "{outcome:#}");
    assert_eq!(outcome["counts"]["succeeded"], 3, "{outcome:#}");
    assert_eq!(outcome["simulated"], true, "{outcome:#}");
    let lines: Vec<Value> = stderr(&o)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let closed: Vec<&Value> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "attempt closed")
        .collect();
    let mut cases: Vec<&str> = closed
        .iter()
        .map(|l| {
            assert_eq!(l["span"]["batch"], "logged", "{l}");
            assert_eq!(l["span"]["attempt"], 1, "{l}");
            assert_eq!(l["level"], "INFO", "{l}");
            l["span"]["case"].as_str().unwrap()
        })
        .collect();
    cases.sort_unstable();
    assert_eq!(cases, ["a", "b", "c"], "one closed attempt per case");
    assert!(
        lines.iter().any(|l| l["target"] == "casebatch::progress"),
        "progress is logged as JSON too"
    );
}

#[test]
fn text_logs_carry_no_colour_codes_off_a_terminal() {
    let sb = Sandbox::engine();
    let manifest = sb.write("logged.yaml", MANIFEST);
    let out = sb.out();
    let o = sb.run_env(
        &batch_run_args(&manifest, &out),
        &[("RUST_LOG", "casebatch=info")],
    );
    assert_exit(&o, 0);
    let err = stderr(&o);
    assert!(err.contains("attempt closed"), "{err}");
    assert!(!err.contains('\u{1b}'), "ANSI escapes in a pipe: {err:?}");
}
