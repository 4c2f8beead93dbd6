//! Planning: from the declarations of any manifest shape ([`crate::decl`]) to the
//! materialized [`Plan`](crate::Plan) that becomes `batch_plan.json`.
//!
//! `build` is the entry. Each step it takes has a file of its own, so it reads without the
//! others, and imports only the steps it calls, never the entry: `layers` merges settings by
//! precedence, `runtime_choice` decides where each case runs, `program_origins` resolves the
//! programs commands name against the file that wrote them, `case` turns one declaration into
//! one planned case, and `fingerprint` is what a resumed batch must match.

mod build;
mod case;
mod fingerprint;
mod layers;
mod program_origins;
mod runtime_choice;

pub(crate) use build::build;
