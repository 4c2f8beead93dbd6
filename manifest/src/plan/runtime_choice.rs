//! Where each case runs. A `runtime:` value (one name, or a list) is checked against the
//! runtimes table at every layer that writes it, each problem reported where it is written;
//! the cases naming a list are dealt out among its runtimes in plan order, and
//! [`Plan::deal_spread`] deals them again by the weights the run history gives.

use std::collections::{BTreeMap, HashMap};

use crate::decl::{CaseDecl, PlanInput};
use crate::model::{Defaults, Plan, RuntimeChoice, RuntimeKind, SpreadWeights};
use crate::report::{FieldPath, Report};
use crate::runtimes::{Lookup, Table};

/// `runtime:` names written in the layers below the cases (defaults file, manifest defaults,
/// `--runtime`) must exist, each reported where it is written, whether or not a more specific
/// layer overrides it: a name that resolves nowhere is a typo.
pub(super) fn check_layer_runtimes(
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
pub(super) fn case_runtimes(
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
pub(super) struct Dealer {
    /// Per runtime name; a runtime not named weighs [`SpreadWeights::EVEN`].
    weights: BTreeMap<String, u32>,
    /// Per list, each runtime's current weight.
    current: HashMap<Vec<String>, Vec<i64>>,
}

impl Dealer {
    /// The index, in `names`, of the runtime that takes the next case.
    pub(super) fn deal(&mut self, names: &[String]) -> usize {
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
