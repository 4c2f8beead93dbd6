//! One declared case resolved into a [`PlannedCase`]: its runtime chosen, its own settings laid
//! over the layered defaults, its programs resolved, its directory named and its input
//! assembled, with the checks that need the whole case (something to run it, a container
//! only where one can run, memory within its runtime's budget).

use std::collections::HashSet;

use serde_json::Value;

use crate::case_dir::case_dir_name;
use crate::decl::CaseDecl;
use crate::model::{
    CaseSource, CommandSpec, DEFAULT_TIMEOUT_SECONDS, Defaults, Inputs, PlannedCase, Resources,
    RuntimeChoice, RuntimeKind,
};
use crate::report::{FieldPath, Report};
use crate::runtimes::Table;

use super::layers::merge_environment;
use super::program_origins::{Origins, Role, resolve_programs};
use super::runtime_choice::{Dealer, case_runtimes};

/// What resolving earlier cases settled for the later ones.
#[derive(Default)]
pub(super) struct Earlier {
    /// Case directory names already given out.
    case_dirs: HashSet<String>,
    /// Turns taken on each `runtime:` list.
    dealer: Dealer,
    /// A missing default harness is reported once, not per case.
    default_harness_reported: bool,
    /// So is a default container sandbox on a runtime that cannot provide it.
    default_sandbox_reported: bool,
    /// And a default harness or evaluator whose program cannot run.
    default_program_reported: HashSet<Role>,
    /// And an evaluator and a `pass_when` both inherited from the defaults.
    default_verdict_reported: bool,
}

/// A planned case (its commands as written), and its harness and evaluator with their
/// programs resolved (see [`resolve_programs`]).
type ResolvedCase = (PlannedCase, [Option<CommandSpec>; 2]);

pub(super) fn resolve_case(
    index: u32,
    decl: CaseDecl,
    defaults: &Defaults,
    origins: &Origins,
    runtimes: &Table,
    earlier: &mut Earlier,
    r: &mut Report,
) -> Option<ResolvedCase> {
    let spec = &decl.spec;
    let harness = spec.harness.clone().or_else(|| defaults.harness.clone());
    // A runtime that resolves nowhere is already reported; whether it would need a harness
    // is unknown, so nothing more is said about this case.
    let named = case_runtimes(&decl, defaults, runtimes, r).ok()?;
    let mut runtime_spread = Vec::new();
    let mut kinds = Vec::new();
    let (runtime, runtime_name) = match named {
        Some((choice, mut found)) => {
            kinds = found.iter().map(|(kind, _)| *kind).collect();
            let share = match choice {
                RuntimeChoice::One(_) => 0,
                RuntimeChoice::Spread(names) => {
                    let share = earlier.dealer.deal(&names);
                    runtime_spread = names;
                    share
                }
            };
            let (kind, name) = found.swap_remove(share);
            (Some(kind), name)
        }
        None => (harness.as_ref().map(|_| RuntimeKind::LocalProcess), None),
    };
    let missing = match (runtime, &runtime_name) {
        (None, _) => {
            Some("no harness command and no runtime, so nothing would run this case".to_string())
        }
        (Some(RuntimeKind::LocalProcess), None) if harness.is_none() => {
            Some("runtime local-process needs a harness command".to_string())
        }
        (
            Some(kind @ (RuntimeKind::LocalProcess | RuntimeKind::Agent | RuntimeKind::Slurm)),
            Some(name),
        ) if harness.is_none() => Some(format!(
            "runtime `{name}` ({}) needs a harness command",
            kind.as_str()
        )),
        _ => None,
    };
    if let Some(message) = missing {
        let fix = "set defaults.harness to the command that runs one case (or pass --harness), \
                   or use runtime: fake for a simulation";
        // Report once at the defaults when the case only inherits; per case when it chose.
        if spec.runtime.is_some() || spec.harness.is_some() {
            let p = decl.spec_path.key("harness");
            let line = r.line_of(&p).or(decl.line);
            r.at_line(line, p.to_string(), message, fix);
        } else if !earlier.default_harness_reported {
            earlier.default_harness_reported = true;
            r.at(
                &FieldPath::root().key("defaults").key("harness"),
                message,
                fix,
            );
        }
    }
    if kinds.is_empty() {
        kinds.extend(runtime);
    }
    check_sandbox_runtime(&decl, defaults, &kinds, earlier, r);
    let commands = resolve_programs(
        &decl,
        defaults,
        origins,
        &kinds,
        &mut earlier.default_program_reported,
        r,
    );
    let input = case_input(&decl, r);
    let case_dir = case_dir_name(&decl.id, &mut earlier.case_dirs);
    let resources = spec
        .resources
        .clone()
        .or_else(|| defaults.resources.clone())
        .unwrap_or_default();
    check_fits_budget(&decl, runtime_name.as_deref(), &resources, runtimes, r);
    let evaluator = decl
        .spec
        .evaluator
        .clone()
        .or_else(|| defaults.evaluator.clone());
    let pass_when = decl
        .spec
        .pass_when
        .clone()
        .or_else(|| defaults.pass_when.clone());
    if evaluator.is_some() && pass_when.is_some() {
        check_one_verdict(&decl, earlier, r);
    }
    let mut spec = decl.spec;
    let (env, pass_env) = merge_environment(
        (defaults.env.clone(), defaults.pass_env.clone()),
        (spec.env.take().as_ref(), spec.pass_env.take().as_deref()),
    );
    let case = PlannedCase {
        index,
        case_id: decl.id,
        epoch: decl.epoch,
        case_dir,
        runtime: runtime?,
        runtime_name,
        runtime_spread,
        harness,
        evaluator,
        pass_when,
        sandbox: spec.sandbox.or_else(|| defaults.sandbox.clone()),
        resources,
        timeout_seconds: spec
            .timeout_seconds
            .or(defaults.timeout_seconds)
            .unwrap_or(DEFAULT_TIMEOUT_SECONDS),
        fake: spec.fake.or_else(|| defaults.fake.clone()),
        env: env.unwrap_or_default(),
        pass_env: pass_env.unwrap_or_default(),
        input,
        source: CaseSource {
            line: decl.line,
            runspec: decl.runspec,
        },
    };
    Some((case, commands))
}

/// A case's verdict comes from its evaluator or from its `pass_when`, never both: which one
/// decided would otherwise be a guess. Reported at the case when it set either, else once at
/// the defaults.
fn check_one_verdict(decl: &CaseDecl, earlier: &mut Earlier, r: &mut Report) {
    let message = "this case has both an evaluator and a pass_when: its verdict would come \
                   from two places";
    let fix = "keep one: the evaluator, or pass_when to decide from the harness's score \
               without an evaluator process";
    let spec = &decl.spec;
    if spec.pass_when.is_some() || spec.evaluator.is_some() {
        let field = if spec.pass_when.is_some() {
            "pass_when"
        } else {
            "evaluator"
        };
        let p = decl.spec_path.key(field);
        let line = r.line_of(&p).or(decl.line);
        r.at_line(line, p.to_string(), message, fix);
    } else if !std::mem::replace(&mut earlier.default_verdict_reported, true) {
        r.at(
            &FieldPath::root().key("defaults").key("pass_when"),
            message,
            fix,
        );
    }
}

/// Containers run on a worker's own host: a case whose runtime (or any runtime of its list)
/// is an agent or the simulation would get no container, so it is refused at plan time.
fn check_sandbox_runtime(
    decl: &CaseDecl,
    defaults: &Defaults,
    kinds: &[RuntimeKind],
    earlier: &mut Earlier,
    r: &mut Report,
) {
    let spec = &decl.spec;
    let Some(sandbox) = spec.sandbox.as_ref().or(defaults.sandbox.as_ref()) else {
        return;
    };
    // A worker's host and an agent (started with `--sandbox container`) run containers.
    let Some(other) = kinds
        .iter()
        .find(|k| !matches!(k, RuntimeKind::LocalProcess | RuntimeKind::Agent))
    else {
        return;
    };
    if !sandbox.is_container() {
        return;
    }
    let message = format!(
        "sandbox provider `container` runs containers on a worker's own host or on an agent, \
         but this case runs on runtime {}, which provides no container",
        other.as_str()
    );
    let fix = "use runtime local-process or an agent started with `--sandbox container` for \
               containerised cases, or set sandbox.provider to `local`";
    if spec.sandbox.is_some() || spec.runtime.is_some() {
        let p = decl.spec_path.key("sandbox").key("provider");
        let line = r.line_of(&p).or(decl.line);
        r.at_line(line, p.to_string(), message, fix);
    } else if !earlier.default_sandbox_reported {
        earlier.default_sandbox_reported = true;
        let p = FieldPath::root()
            .key("defaults")
            .key("sandbox")
            .key("provider");
        r.at(&p, message, fix);
    }
}

/// A case declaring more memory than its runtime's whole budget could never be admitted there.
fn check_fits_budget(
    decl: &CaseDecl,
    runtime_name: Option<&str>,
    resources: &Resources,
    runtimes: &Table,
    r: &mut Report,
) {
    let Some(name) = runtime_name else { return };
    let (Some(memory), Some(budget)) = (
        resources.memory_mb,
        runtimes.spec(name).and_then(|s| s.memory_budget_mb),
    ) else {
        return;
    };
    if memory > budget {
        let p = decl.spec_path.key("resources").key("memory_mb");
        let line = r.line_of(&p).or(decl.line);
        r.at_line(
            line,
            p.to_string(),
            format!(
                "case `{}` declares {memory} MB, more than runtime `{name}`'s whole memory \
                 budget ({budget} MB): it could never be admitted there",
                decl.id
            ),
            format!("lower its memory_mb, or raise runtimes.{name}.memory_budget_mb"),
        );
    }
}

/// The harness's `CASEBATCH_INPUT`: task fields that are set, free-form inputs, the id.
/// A free-form input may not silently shadow a task field.
fn case_input(decl: &CaseDecl, r: &mut Report) -> Inputs {
    let spec = &decl.spec;
    let mut input = spec.inputs.clone();
    let fields = [
        ("query", spec.query.clone().map(Value::from)),
        ("url", spec.url.clone().map(Value::from)),
        ("max_steps", spec.max_steps.map(Value::from)),
        ("agent_kind", spec.agent_kind.clone().map(Value::from)),
        // The task's own id: every run of a task has the same input.
        ("task_id", Some(Value::from(task_id(decl)))),
    ];
    for (key, value) in fields {
        let Some(value) = value else { continue };
        if input.contains_key(key) {
            let p = decl.spec_path.key("inputs").key(key);
            let line = r.line_of(&p).or(decl.line);
            r.at_line(
                line,
                p.to_string(),
                format!("input `{key}` collides with the task field `{key}` given to the harness"),
                format!("rename the input or drop it; `{key}` is set from the task"),
            );
        }
        input.insert(key.to_string(), value);
    }
    input.into()
}

/// The task a case runs: itself, or the task it is a run of.
fn task_id(decl: &CaseDecl) -> &str {
    decl.epoch.as_ref().map_or(&decl.id, |e| &e.task_id)
}
