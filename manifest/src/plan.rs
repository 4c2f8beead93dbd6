//! From a loaded manifest (any shape) to the materialized [`Plan`]: defaults layered, every
//! case fully resolved, ids checked for uniqueness, directories named, fingerprint taken.
//!
//! Precedence, lowest first: built-in defaults < defaults file < manifest `defaults` <
//! command-line flags < the case's own fields. Object-valued settings (`sandbox`,
//! `resources`, `fake`) are replaced whole by a more specific layer, never merged field by
//! field: a sandbox is only meaningful as a complete description. The environment (`env`,
//! `pass_env`) is the exception: it merges by variable name (see [`merge_environment`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::case_dir::case_dir_name;
use crate::decl::{CaseDecl, FileDefaults, LoadOptions, Loaded};
use crate::limits::EPOCHS_RANGE;
use crate::model::{
    BatchSettings, CaseSource, CommandSpec, DEFAULT_CONCURRENCY, DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT_SECONDS, Defaults, Epoch, FakeScript, Inputs, ManifestFormat,
    PLAN_SCHEMA_VERSION, Plan, PlannedCase, Provenance, Resources, RunSpec, RuntimeChoice,
    RuntimeKind, Sandbox, SpreadWeights,
};
use crate::programs;
use crate::report::{FieldPath, Report};
use crate::runtimes::{self, Lookup, Table};
use crate::source::sha256_hex;
use crate::validate::batch_id_error;

/// Everything besides the loaded manifest that the plan depends on.
pub(crate) struct PlanInput<'a> {
    pub(crate) manifest: &'a Path,
    pub(crate) bytes: &'a [u8],
    pub(crate) opts: &'a LoadOptions,
    pub(crate) file_defaults: FileDefaults,
    /// The `--runtimes` file's table, and the file.
    pub(crate) runtimes_file: Option<(Table, &'a Path)>,
}

/// Resolve into a plan; `None` if any problem was found (here or earlier in `r`).
pub(crate) fn build(loaded: Loaded, input: &PlanInput<'_>, r: &mut Report) -> Option<Plan> {
    let batch_id = resolve_batch_id(&loaded, input, r);
    let runtimes = runtimes::merge(
        loaded.runtimes,
        input.runtimes_file.as_ref(),
        input.manifest,
        r,
    );
    check_layer_runtimes(&runtimes, &loaded.defaults, input, r);
    let origins = Origins::of(&loaded.defaults, input, r);
    let defaults = overlay(
        overlay(input.file_defaults.defaults.clone(), &loaded.defaults),
        &input.opts.overrides,
    );
    let decls = expand_epochs(loaded.cases, &defaults);
    check_duplicate_ids(&decls, r);

    let mut earlier = Earlier::default();
    let mut cases = Vec::with_capacity(decls.len());
    // The fingerprint covers the commands as written, so a manifest moved with its scripts
    // keeps its batch resumable; the plan records the programs they resolved to.
    let mut fingerprint = Fingerprint::new();
    for (index, decl) in decls.into_iter().enumerate() {
        let index = match u32::try_from(index) {
            Ok(index) if index < casebatch_proto::MAX_BATCH_CASES => index,
            _ => {
                r.at_line(
                    decl.line,
                    decl.path.to_string(),
                    format!(
                        "too many cases: a batch holds at most {} (what its workflow's state is \
                         proven to carry)",
                        casebatch_proto::MAX_BATCH_CASES
                    ),
                    "split the task list into several batches",
                );
                break;
            }
        };
        let resolved = resolve_case(index, decl, &defaults, &origins, &runtimes, &mut earlier, r);
        if let Some((mut case, [harness, evaluator])) = resolved {
            fingerprint.add(&case);
            case.harness = harness;
            case.evaluator = evaluator;
            cases.push(case);
        }
    }

    let mut warnings = Vec::new();
    if let Some(max) = input.opts.max_cases
        && cases.len() > max
    {
        warnings.push(format!(
            "the batch has {} cases, more than the --max-cases threshold of {max}",
            cases.len()
        ));
    }

    let prepare_ahead = defaults.prepare_ahead.unwrap_or(0);
    if prepare_ahead > 0 && cases.iter().any(|c| !c.runtime_spread.is_empty()) {
        warnings.push(format!(
            "prepare_ahead {prepare_ahead} is off: some cases are dealt from a runtime list, and \
             a case's runtime is picked only when it is dispatched"
        ));
    }

    let batch_id = batch_id?;
    if !r.is_clean() {
        return None;
    }
    let manifest_path = input
        .manifest
        .canonicalize()
        .or_else(|_| std::path::absolute(input.manifest))
        .unwrap_or_else(|_| input.manifest.to_path_buf());
    let fingerprint = fingerprint.finish();
    Some(Plan {
        schema_version: PLAN_SCHEMA_VERSION.to_string(),
        batch_id,
        provenance: Provenance {
            manifest_path: manifest_path.display().to_string(),
            manifest_sha256: sha256_hex(input.bytes),
            format: loaded.format,
        },
        settings: BatchSettings {
            concurrency: defaults.concurrency.unwrap_or(DEFAULT_CONCURRENCY),
            max_retries: defaults.max_retries.unwrap_or(DEFAULT_MAX_RETRIES),
            controller_url: defaults.controller_url,
            device_controller_url: defaults.device_controller_url,
            oom_auto_boost: defaults.oom_auto_boost.unwrap_or(false),
            prepare_ahead,
            heartbeat_every_seconds: defaults.heartbeat_every_seconds,
            budget: defaults.budget,
            max_rate_limit_retries: defaults.max_rate_limit_retries,
            rate: defaults.rate,
        },
        fingerprint,
        spread: None,
        summary: loaded.summary,
        runtimes: runtimes.specs(),
        cases,
        warnings,
    })
}

/// `--batch-id` wins; then the manifest's own; JSONL and batch_v1 fall back to the file stem.
fn resolve_batch_id(loaded: &Loaded, input: &PlanInput<'_>, r: &mut Report) -> Option<String> {
    const SAFE: &str = "letters, digits, '.', '_' and '-', not starting with '.'";
    let (id, field, line, fix) = if let Some(id) = &input.opts.batch_id {
        (
            id.clone(),
            "batch_id (--batch-id)".to_string(),
            None,
            format!("pass a --batch-id made of {SAFE}"),
        )
    } else if let Some((id, path)) = &loaded.batch_id {
        (
            id.clone(),
            path.to_string(),
            r.line_of(path),
            format!("set batch_id to {SAFE}"),
        )
    } else if matches!(
        loaded.format,
        ManifestFormat::Jsonl | ManifestFormat::BatchV1
    ) {
        let stem = input
            .manifest
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let fix = format!("pass --batch-id (the default is the file name {stem:?}); use {SAFE}");
        (stem, "batch_id".to_string(), None, fix)
    } else {
        r.at(
            &FieldPath::root(),
            "missing required field `batch_id`",
            "add `batch_id: my-batch` (stable per workload) or pass --batch-id",
        );
        return None;
    };
    match batch_id_error(&id) {
        Some(message) => {
            r.at_line(line, field, message, fix);
            None
        }
        None => Some(id),
    }
}

/// Later layer wins field by field; object-valued fields are taken whole.
fn overlay(lower: Defaults, upper: &Defaults) -> Defaults {
    let u = upper.clone();
    let (env, pass_env) = merge_environment(
        (lower.env, lower.pass_env),
        (u.env.as_ref(), u.pass_env.as_deref()),
    );
    Defaults {
        concurrency: u.concurrency.or(lower.concurrency),
        max_retries: u.max_retries.or(lower.max_retries),
        max_rate_limit_retries: u.max_rate_limit_retries.or(lower.max_rate_limit_retries),
        timeout_seconds: u.timeout_seconds.or(lower.timeout_seconds),
        sandbox: u.sandbox.or(lower.sandbox),
        resources: u.resources.or(lower.resources),
        harness: u.harness.or(lower.harness),
        evaluator: u.evaluator.or(lower.evaluator),
        runtime: u.runtime.or(lower.runtime),
        controller_url: u.controller_url.or(lower.controller_url),
        device_controller_url: u.device_controller_url.or(lower.device_controller_url),
        fake: u.fake.or(lower.fake),
        oom_auto_boost: u.oom_auto_boost.or(lower.oom_auto_boost),
        prepare_ahead: u.prepare_ahead.or(lower.prepare_ahead),
        heartbeat_every_seconds: u.heartbeat_every_seconds.or(lower.heartbeat_every_seconds),
        epochs: u.epochs.or(lower.epochs),
        budget: u.budget.or(lower.budget),
        rate: u.rate.or(lower.rate),
        env,
        pass_env,
    }
}

/// A layer's `env` and `pass_env`.
type Environment = (Option<BTreeMap<String, String>>, Option<Vec<String>>);

/// Unlike the object-valued settings, environments merge by name: a more specific layer
/// adds variables, and for a name it sets (as a literal in `env` or copied by `pass_env`)
/// its setting replaces the lower layer's.
fn merge_environment(
    (lower_env, lower_pass): Environment,
    (upper_env, upper_pass): (Option<&BTreeMap<String, String>>, Option<&[String]>),
) -> Environment {
    if upper_env.is_none() && upper_pass.is_none() {
        return (lower_env, lower_pass);
    }
    let upper_names = |name: &String| {
        upper_env.is_some_and(|e| e.contains_key(name))
            || upper_pass.is_some_and(|p| p.contains(name))
    };
    let mut env: BTreeMap<String, String> = lower_env
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| !upper_names(k))
        .collect();
    env.extend(
        upper_env
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    let mut pass: Vec<String> = lower_pass
        .unwrap_or_default()
        .into_iter()
        .filter(|k| !upper_names(k))
        .collect();
    pass.extend(upper_pass.into_iter().flatten().cloned());
    (Some(env), Some(pass))
}

/// A task that runs several times (`epochs`) becomes one case per run, `<task_id>#<epoch>`,
/// each told its task and run in `CASEBATCH_TASK_ID` and `CASEBATCH_EPOCH`. A task that runs
/// once keeps its id, so a batch without epochs plans as it always did. An out-of-range
/// count is reported by validation; it plans as one run here.
fn expand_epochs(decls: Vec<CaseDecl>, defaults: &Defaults) -> Vec<CaseDecl> {
    let runs = |decl: &CaseDecl| {
        let of = decl.spec.epochs.or(defaults.epochs).unwrap_or(1);
        if EPOCHS_RANGE.contains(&of) { of } else { 1 }
    };
    // The common case keeps its list: a copy would hold two of them at once.
    if decls.iter().all(|d| runs(d) == 1) {
        return decls;
    }
    let mut out = Vec::with_capacity(decls.iter().map(|d| runs(d) as usize).sum());
    for decl in decls {
        let of = runs(&decl);
        if of == 1 {
            out.push(decl);
            continue;
        }
        for epoch in 1..=of {
            let mut run = decl.clone();
            run.id = format!("{}#{epoch}", decl.id);
            let env = run.spec.env.get_or_insert_with(BTreeMap::new);
            env.insert("CASEBATCH_TASK_ID".into(), decl.id.clone());
            env.insert("CASEBATCH_EPOCH".into(), epoch.to_string());
            run.epoch = Some(Epoch {
                task_id: decl.id.clone(),
                epoch,
                of,
            });
            out.push(run);
        }
    }
    out
}

/// The task a case runs: itself, or the task it is a run of.
fn task_id(decl: &CaseDecl) -> &str {
    decl.epoch.as_ref().map_or(&decl.id, |e| &e.task_id)
}

fn case_line(decl: &CaseDecl, r: &Report) -> Option<usize> {
    r.line_of(&decl.id_path).or(decl.line)
}

/// Ids are how resume recognises a case, so two cases may never share one.
fn check_duplicate_ids(cases: &[CaseDecl], r: &mut Report) {
    let mut first: HashMap<&str, &CaseDecl> = HashMap::new();
    for decl in cases {
        let Some(prev) = first.get(decl.id.as_str()) else {
            first.insert(&decl.id, decl);
            continue;
        };
        let prev_at = match case_line(prev, r) {
            Some(l) => format!("line {l} ({})", prev.id_path),
            None => prev.id_path.to_string(),
        };
        let line = case_line(decl, r);
        r.at_line(
            line,
            decl.id_path.to_string(),
            format!(
                "duplicate case id {:?}, first declared at {prev_at}",
                decl.id
            ),
            "give every case a unique id (a new task list belongs in a new batch)",
        );
    }
}

/// `runtime:` names written in the layers below the cases (defaults file, manifest defaults,
/// `--runtime`) must exist, each reported where it is written, whether or not a more specific
/// layer overrides it: a name that resolves nowhere is a typo.
fn check_layer_runtimes(
    runtimes: &Table,
    manifest_defaults: &Defaults,
    input: &PlanInput<'_>,
    r: &mut Report,
) {
    let file = &input.file_defaults;
    if let Some(choice) = &file.defaults.runtime {
        for (_, message, fix) in choice_problems(runtimes, choice) {
            let place = match file.runtime_line {
                Some(line) => format!("in defaults file {} line {line}", file.file.display()),
                None => format!("in defaults file {}", file.file.display()),
            };
            r.at_line(None, "defaults.runtime", format!("{place}: {message}"), fix);
        }
    }
    if let Some(choice) = &manifest_defaults.runtime {
        let path = FieldPath::root().key("defaults").key("runtime");
        for (at, message, fix) in choice_problems(runtimes, choice) {
            r.at(&element(&path, choice, at), message, fix);
        }
    }
    if let Some(choice) = &input.opts.overrides.runtime {
        for (_, message, fix) in choice_problems(runtimes, choice) {
            r.at_line(None, "flags.runtime (--runtime)", message, fix);
        }
    }
}

/// The path of a choice's `at`th name: the field itself for one name, `field[at]` in a list.
fn element(path: &FieldPath, choice: &RuntimeChoice, at: Option<usize>) -> FieldPath {
    match (choice, at) {
        (RuntimeChoice::Spread(_), Some(i)) => path.index(i),
        _ => path.clone(),
    }
}

/// What is wrong with a `runtime:` value: an empty list, a name listed twice, names that
/// resolve nowhere (each with its position in the list). `Reported` lookups say nothing more.
fn choice_problems(
    runtimes: &Table,
    choice: &RuntimeChoice,
) -> Vec<(Option<usize>, String, String)> {
    let names = choice.names();
    if names.is_empty() {
        return vec![(
            None,
            "the list names no runtime".into(),
            "list at least one runtime, or remove `runtime:` to inherit one".into(),
        )];
    }
    let mut problems = Vec::new();
    for (i, name) in names.iter().enumerate() {
        if names[..i].contains(name) {
            problems.push((
                Some(i),
                format!("`{name}` is listed twice"),
                "list each runtime once (every runtime takes the same share)".into(),
            ));
        } else if let Lookup::Unknown(message, fix) = runtimes.lookup(name) {
            problems.push((Some(i), message, fix));
        }
    }
    problems
}

/// A runtime name resolved: its kind, and its runtimes-table entry (`None` for a built-in).
type Resolved = (RuntimeKind, Option<String>);

/// The runtimes a case may run on: (kind, table name) for each name of its `runtime:`,
/// `Ok(None)` when nothing names one, `Err` when a name resolves nowhere (reported here if
/// the case itself wrote it).
fn case_runtimes(
    decl: &CaseDecl,
    defaults: &Defaults,
    runtimes: &Table,
    r: &mut Report,
) -> Result<Option<(RuntimeChoice, Vec<Resolved>)>, ()> {
    let Some(choice) = decl.spec.runtime.as_ref().or(defaults.runtime.as_ref()) else {
        return Ok(None);
    };
    let problems = choice_problems(runtimes, choice);
    if !problems.is_empty() {
        // Inherited names were reported once, at the layer that wrote them.
        if decl.spec.runtime.is_some() {
            let p = decl.spec_path.key("runtime");
            for (at, message, fix) in problems {
                let p = element(&p, choice, at);
                let line = r.line_of(&p).or(decl.line);
                let message = match &decl.runspec {
                    Some(file) => format!("in {file}: {message}"),
                    None => message,
                };
                r.at_line(line, p.to_string(), message, fix);
            }
        }
        return Err(());
    }
    let mut found = Vec::with_capacity(choice.names().len());
    for name in choice.names() {
        match runtimes.lookup(name) {
            Lookup::Found(kind, table_name) => found.push((kind, table_name)),
            Lookup::Reported | Lookup::Unknown(..) => return Err(()),
        }
    }
    Ok(Some((choice.clone(), found)))
}

/// Deals the cases naming one list of runtimes to its runtimes, in plan order: a smooth
/// weighted round-robin (nginx's). Without weights every runtime weighs the same, so each
/// takes the next case in turn and the shares never differ by more than one; with weights
/// (from the run history, [`Plan::deal_spread`]) each takes cases in proportion, evenly
/// interleaved.
#[derive(Default)]
struct Dealer {
    /// Per runtime name; a runtime not named weighs [`SpreadWeights::EVEN`].
    weights: BTreeMap<String, u32>,
    /// Per list, each runtime's current weight.
    current: HashMap<Vec<String>, Vec<i64>>,
}

impl Dealer {
    /// The index, in `names`, of the runtime that takes the next case.
    fn deal(&mut self, names: &[String]) -> usize {
        let weights: Vec<i64> = names
            .iter()
            .map(|n| i64::from(*self.weights.get(n).unwrap_or(&SpreadWeights::EVEN)))
            .collect();
        let total: i64 = weights.iter().sum();
        let current = self
            .current
            .entry(names.to_vec())
            .or_insert_with(|| vec![0; names.len()]);
        for (c, w) in current.iter_mut().zip(&weights) {
            *c += w;
        }
        // The first of the heaviest, so ties go in the order written.
        let pick = (0..current.len())
            .rev()
            .max_by_key(|&i| current[i])
            .unwrap_or(0);
        current[pick] -= total;
        pick
    }
}

impl Plan {
    /// Deals the cases of every `runtime:` list again, by `weights`, and records them. The
    /// deal is the same smooth weighted round-robin in plan order, so the same weights always
    /// give the same split; the fingerprint does not cover where a case runs, so it stays.
    pub fn deal_spread(&mut self, weights: SpreadWeights) {
        let mut dealer = Dealer {
            weights: weights.weights.clone(),
            current: HashMap::new(),
        };
        for i in 0..self.cases.len() {
            if self.cases[i].runtime_spread.is_empty() {
                continue;
            }
            let share = dealer.deal(&self.cases[i].runtime_spread);
            let name = self.cases[i].runtime_spread[share].clone();
            // Every name of a list resolved when the plan was made.
            if let Some((kind, spec)) = self.runtime_named(&name) {
                let table_name = spec.map(|_| name);
                let case = &mut self.cases[i];
                case.runtime = kind;
                case.runtime_name = table_name;
            }
        }
        self.spread = Some(weights);
    }
}

/// What resolving earlier cases settled for the later ones.
#[derive(Default)]
struct Earlier {
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
}

/// A planned case (its commands as written), and its harness and evaluator with their
/// programs resolved (see [`resolve_programs`]).
type ResolvedCase = (PlannedCase, [Option<CommandSpec>; 2]);

fn resolve_case(
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
        (Some(kind @ (RuntimeKind::LocalProcess | RuntimeKind::Agent)), Some(name))
            if harness.is_none() =>
        {
            Some(format!(
                "runtime `{name}` ({}) needs a harness command",
                kind.as_str()
            ))
        }
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
    let commands = resolve_programs(&decl, defaults, origins, &kinds, earlier, r);
    let input = case_input(&decl, r);
    let case_dir = case_dir_name(&decl.id, &mut earlier.case_dirs);
    let resources = spec
        .resources
        .clone()
        .or_else(|| defaults.resources.clone())
        .unwrap_or_default();
    check_fits_budget(&decl, runtime_name.as_deref(), &resources, runtimes, r);
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
        evaluator: spec.evaluator.or_else(|| defaults.evaluator.clone()),
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

/// The two commands whose program may be a path (the discriminant indexes
/// [`Origins::defaults`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Role {
    Harness = 0,
    Evaluator = 1,
}

impl Role {
    const BOTH: [Role; 2] = [Role::Harness, Role::Evaluator];

    fn name(self) -> &'static str {
        match self {
            Role::Harness => "harness",
            Role::Evaluator => "evaluator",
        }
    }

    fn of(self, d: &Defaults) -> Option<&CommandSpec> {
        match self {
            Role::Harness => d.harness.as_ref(),
            Role::Evaluator => d.evaluator.as_ref(),
        }
    }

    fn of_spec(self, s: &RunSpec) -> Option<&CommandSpec> {
        match self {
            Role::Harness => s.harness.as_ref(),
            Role::Evaluator => s.evaluator.as_ref(),
        }
    }
}

/// Where a command was written: the directory its relative program resolves against, and
/// where a problem with it is reported.
#[derive(Debug, Clone)]
struct Origin {
    base: PathBuf,
    field: String,
    line: Option<usize>,
    /// Another file than the manifest (a defaults file, a runspec), named in the message.
    place: Option<String>,
}

/// The origins of the commands the cases may inherit, decided once.
struct Origins {
    /// The manifest's directory: the base of the commands the manifest writes.
    manifest: PathBuf,
    /// The defaults' harness and evaluator, from the layer that wins the overlay.
    defaults: [Option<Origin>; 2],
}

impl Origins {
    fn of(manifest_defaults: &Defaults, input: &PlanInput<'_>, r: &Report) -> Self {
        let manifest = runtimes::base_dir(input.manifest);
        let file = &input.file_defaults;
        let origin = |role: Role| {
            let name = role.name();
            if role.of(&input.opts.overrides).is_some() {
                // Typed in a shell: relative to where it was typed.
                let base = std::env::current_dir().unwrap_or_else(|_| manifest.clone());
                return Some(Origin {
                    base,
                    field: format!("flags.{name} (--{name})"),
                    line: None,
                    place: None,
                });
            }
            if role.of(manifest_defaults).is_some() {
                let path = FieldPath::root().key("defaults").key(name);
                return Some(Origin {
                    base: manifest.clone(),
                    field: path.to_string(),
                    line: r.line_of(&path),
                    place: None,
                });
            }
            role.of(&file.defaults)?;
            let line = match role {
                Role::Harness => file.harness_line,
                Role::Evaluator => file.evaluator_line,
            };
            let place = match line {
                Some(line) => format!("in defaults file {} line {line}", file.file.display()),
                None => format!("in defaults file {}", file.file.display()),
            };
            Some(Origin {
                base: runtimes::base_dir(&file.file),
                field: format!("defaults.{name}"),
                line: None,
                place: Some(place),
            })
        };
        Origins {
            defaults: Role::BOTH.map(origin),
            manifest,
        }
    }

    /// A case's own command: written in the manifest, or in its runspec.
    fn of_case(&self, decl: &CaseDecl, role: Role, r: &Report) -> Origin {
        let path = decl.spec_path.key(role.name());
        let base = match &decl.runspec {
            Some(file) => runtimes::base_dir(Path::new(file)),
            None => self.manifest.clone(),
        };
        Origin {
            base,
            field: path.to_string(),
            line: r.line_of(&path).or(decl.line),
            place: decl.runspec.as_ref().map(|f| format!("in {f}")),
        }
    }
}

/// A case's harness and evaluator with a relative program made absolute against the
/// directory of the file that wrote it (an attempt runs in a fresh directory of its own).
/// Where the case runs on a worker's host (`local-process`, outside a container), a program
/// that does not exist or cannot be executed is refused now rather than failing every
/// attempt: at the case's own field, or once at the default it inherits. A container runs the
/// command inside its image, and an agent on its own host: neither is resolved there (a
/// container) or checked here.
fn resolve_programs(
    decl: &CaseDecl,
    defaults: &Defaults,
    origins: &Origins,
    kinds: &[RuntimeKind],
    earlier: &mut Earlier,
    r: &mut Report,
) -> [Option<CommandSpec>; 2] {
    let in_container = decl
        .spec
        .sandbox
        .as_ref()
        .or(defaults.sandbox.as_ref())
        .is_some_and(Sandbox::is_container);
    let on_this_host = !in_container && kinds.contains(&RuntimeKind::LocalProcess);
    Role::BOTH.map(|role| {
        let own = role.of_spec(&decl.spec);
        let (command, origin) = match own {
            Some(command) => (command, origins.of_case(decl, role, r)),
            None => match (role.of(defaults), &origins.defaults[role as usize]) {
                (Some(command), Some(origin)) => (command, origin.clone()),
                (command, _) => return command.cloned(),
            },
        };
        if in_container {
            return Some(command.clone());
        }
        let problem = programs::program(command, &origin.base)
            .filter(|_| on_this_host)
            .and_then(|program| programs::check(&program));
        if let Some((message, fix)) = problem
            && (own.is_some() || earlier.default_program_reported.insert(role))
        {
            let message = match &origin.place {
                Some(place) => format!("{place}: {message}"),
                None => message,
            };
            r.at_line(origin.line, origin.field.clone(), message, fix);
        }
        Some(programs::resolve(command, &origin.base))
    })
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

/// What the fingerprint covers for one case: its identity and everything that decides how it
/// runs, but not where it was written (lines, absolute paths) or batch-wide knobs
/// (concurrency, retries), so reformatting or moving a manifest keeps resume possible. Whether
/// the case really runs is covered (a simulation is not a run), but not where: `agent` counts
/// as `local-process` (both run the harness as a process), and the table name and the table
/// are left out, so a batch may move onto agents, and an agent may move or be renamed.
#[derive(Serialize)]
struct FingerprintCase<'a> {
    case_id: &'a str,
    runtime: RuntimeKind,
    harness: &'a Option<CommandSpec>,
    evaluator: &'a Option<CommandSpec>,
    sandbox: &'a Option<Sandbox>,
    resources: &'a Resources,
    timeout_seconds: u64,
    fake: &'a Option<FakeScript>,
    input: &'a Inputs,
    /// Skipped when empty, so plans made before `env` existed keep their fingerprint.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    env: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pass_env: &'a [String],
}

/// sha256 over the canonical JSON (sorted keys, no whitespace) of the cases, in order.
/// Hashed case by case: the same bytes as the canonical JSON of the whole list, without
/// holding every case as a JSON tree at once (250 MB for 100,000 cases), and as each case is
/// planned, so its commands as written need not be kept beside the resolved ones.
pub(crate) struct Fingerprint {
    hash: Sha256,
    text: String,
    first: bool,
}

impl Fingerprint {
    pub(crate) fn new() -> Self {
        let mut hash = Sha256::new();
        hash.update(b"casebatch-fingerprint-v1\n[");
        Self {
            hash,
            text: String::new(),
            first: true,
        }
    }

    /// Adds the next case, with its commands as written.
    pub(crate) fn add(&mut self, c: &PlannedCase) {
        if !std::mem::take(&mut self.first) {
            self.text.push(',');
        }
        let view = FingerprintCase {
            case_id: &c.case_id,
            runtime: match c.runtime {
                RuntimeKind::Agent => RuntimeKind::LocalProcess,
                kind => kind,
            },
            harness: &c.harness,
            evaluator: &c.evaluator,
            sandbox: &c.sandbox,
            resources: &c.resources,
            timeout_seconds: c.timeout_seconds,
            fake: &c.fake,
            input: &c.input,
            env: &c.env,
            pass_env: &c.pass_env,
        };
        canonical_json(
            &serde_json::to_value(view).unwrap_or(Value::Null),
            &mut self.text,
        );
        self.hash.update(self.text.as_bytes());
        self.text.clear();
    }

    pub(crate) fn finish(mut self) -> String {
        self.hash.update(b"]");
        hex::encode(self.hash.finalize())
    }
}

/// JSON with object keys sorted, whatever map type serde_json was built with.
fn canonical_json(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::from(k.as_str()).to_string());
                out.push(':');
                canonical_json(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_sorts_keys() {
        let v: Value =
            serde_json::from_str(r#"{"b": 1, "a": {"d": [1, "x"], "c": null}}"#).unwrap();
        let mut out = String::new();
        canonical_json(&v, &mut out);
        assert_eq!(out, r#"{"a":{"c":null,"d":[1,"x"]},"b":1}"#);
    }

    #[test]
    fn overlay_replaces_objects_whole() {
        let lower = Defaults {
            concurrency: Some(3),
            sandbox: Some(Sandbox {
                provider: "a".into(),
                template: Some("t".into()),
                platform: None,
                lifetime: Some(60),
                ..Sandbox::local()
            }),
            ..Defaults::default()
        };
        let upper = Defaults {
            sandbox: Some(Sandbox {
                provider: "b".into(),
                template: None,
                platform: None,
                lifetime: None,
                ..Sandbox::local()
            }),
            ..Defaults::default()
        };
        let merged = overlay(lower, &upper);
        assert_eq!(merged.concurrency, Some(3));
        assert_eq!(merged.sandbox.unwrap().template, None);
    }
}
