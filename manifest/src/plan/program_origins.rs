//! Where each harness and evaluator command was written, so that a program written as a path
//! is resolved against the directory of that file (the manifest, the defaults file, a runspec,
//! or the current directory for a flag) and, where the case runs on a worker's host, checked
//! before anything runs. What counts as a program path is [`crate::programs`]' rule.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::decl::{CaseDecl, PlanInput};
use crate::model::{CommandSpec, Defaults, RunSpec, RuntimeKind, Sandbox};
use crate::programs;
use crate::report::{FieldPath, Report};
use crate::runtimes;

/// The two commands whose program may be a path (the discriminant indexes
/// [`Origins::defaults`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Role {
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
pub(super) struct Origins {
    /// The manifest's directory: the base of the commands the manifest writes.
    manifest: PathBuf,
    /// The defaults' harness and evaluator, from the layer that wins the overlay.
    defaults: [Option<Origin>; 2],
}

impl Origins {
    pub(super) fn of(manifest_defaults: &Defaults, input: &PlanInput<'_>, r: &Report) -> Self {
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
pub(super) fn resolve_programs(
    decl: &CaseDecl,
    defaults: &Defaults,
    origins: &Origins,
    kinds: &[RuntimeKind],
    default_reported: &mut HashSet<Role>,
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
            && (own.is_some() || default_reported.insert(role))
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
