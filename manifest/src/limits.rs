//! Every bound a manifest is checked against, in one place.
//!
//! A value outside these bounds is refused by `validate` (exit 2) instead of failing, or
//! hanging, at run time: the engine adds, multiplies and converts these numbers (durations
//! into Temporal timeouts, MiB into bytes, doubling on OOM boosts), and each bound leaves room
//! for that arithmetic. The limits table of docs/manifest.md and the JSON Schema descriptions
//! (`casebatch config schema`) quote the same numbers; a unit test keeps the schema in step.

use std::ops::RangeInclusive;

/// Active case limit (the running batch's `set_concurrency` accepts the same).
pub use casebatch_proto::CONCURRENCY_RANGE;
pub use casebatch_proto::share::{DEFAULT_PRIORITY, DEFAULT_WEIGHT, PRIORITY_RANGE, WEIGHT_RANGE};
/// Extra whole-case attempts after a retryable failure.
pub const MAX_RETRIES_RANGE: RangeInclusive<u32> = 0..=5;

/// Longest wall-clock limit of one attempt: 7 days. Temporal timeouts are built from it (plus
/// slack), so it must stay far below what a duration can hold.
pub const MAX_TIMEOUT_SECONDS: u64 = 7 * 24 * 60 * 60;
/// Accepted `timeout_seconds`.
pub const TIMEOUT_SECONDS_RANGE: RangeInclusive<u64> = 1..=MAX_TIMEOUT_SECONDS;
/// The `sandbox.provider`s a runtime provides. `local` is the host's processes in the
/// attempt's cgroup; `container` is one OCI container per attempt (Docker Engine API). Any
/// other name would be copied into the plan and then ignored, the harness running on the
/// host, so it is refused.
pub const SANDBOX_PROVIDERS: &[&str] = &["local", "container"];
/// A container's `sandbox.network`: `none` (loopback only) or `default` (the engine's).
pub const SANDBOX_NETWORKS: &[&str] = &["none", "default"];
/// A container's `sandbox.pull`: when the image is fetched from its registry.
pub const SANDBOX_PULLS: &[&str] = &["if-missing", "always", "never"];
/// Longest sandbox `lifetime`, in seconds (the same 7 days).
pub const MAX_SANDBOX_LIFETIME_SECONDS: u64 = MAX_TIMEOUT_SECONDS;
/// Longest scripted duration of a `fake` attempt, in milliseconds (the same 7 days).
pub const MAX_FAKE_DURATION_MS: u64 = MAX_TIMEOUT_SECONDS * 1000;
/// Most environments a batch provisions ahead of need: each holds a sandbox nothing runs in yet.
pub const MAX_PREPARE_AHEAD: u32 = 64;
/// Most rate-limited attempts of one case retried on their own cap.
pub const MAX_RATE_LIMIT_RETRIES: u32 = 100;
/// `defaults.rate.starts_per_minute`: up to 1,000 starts a second.
pub const MAX_STARTS_PER_MINUTE: u32 = 60_000;

/// The slowest heartbeat cadence, in seconds: a dead worker's stage is taken over within a
/// quarter more than this.
pub const MAX_HEARTBEAT_EVERY_SECONDS: u64 = 60;
/// Most scripted infra failures of a `fake` case.
pub const MAX_FAKE_INFRA_FAILURES: u32 = 1000;

/// A runtime's `breaker_failures`: consecutive infra failures that open its circuit.
pub const BREAKER_FAILURES_RANGE: RangeInclusive<u64> = 1..=100;
/// A runtime's `breaker_cooldown_s`: how long an open circuit refuses dispatches.
pub const BREAKER_COOLDOWN_S_RANGE: RangeInclusive<u64> = 1..=3600;
/// An agent's `unreachable_grace_s`: how long a worker retries it while it is unreachable.
pub const UNREACHABLE_GRACE_S_RANGE: RangeInclusive<u64> = 1..=600;
/// An agent's `queue_limit`: cases waiting for its slots past which new batches wait.
pub const QUEUE_LIMIT_RANGE: RangeInclusive<u64> = 1..=100_000;

/// Largest `resources.memory_mb`: 1 TiB. Converted to bytes (`* 1024 * 1024`) and doubled by
/// OOM boosts, which must not overflow.
pub const MAX_MEMORY_MB: u64 = 1024 * 1024;
/// Largest `resources.cpu`.
pub const MAX_CPU: f64 = 1024.0;
/// The most GPUs a case may ask for (`resources.gpus`).
pub const MAX_GPUS: u32 = 64;
/// `resources.log_mb`: what each of an attempt's logs may keep, 1 MiB to 64 GiB.
pub const LOG_MB_RANGE: RangeInclusive<u64> = 1..=64 * 1024;

/// Longest accepted batch id; it becomes a directory name.
pub const MAX_BATCH_ID_LEN: usize = 128;
/// Longest runtime name (a DNS label's length: names end up in labels and metric tags).
pub const MAX_RUNTIME_NAME_LEN: usize = 63;

/// Largest manifest (and defaults file, and batch_v1 runspec) read, in bytes: 64 MiB. Checked
/// from the file's metadata before reading, and enforced while reading.
pub const MAX_MANIFEST_BYTES: u64 = 64 * 1024 * 1024;
/// Deepest nesting of mappings and lists in a manifest document. A real manifest needs about
/// six levels; deeper input is refused before it costs time or stack: YAML parsing stops at the
/// first level too many, JSON brackets are counted before serde_json reads them.
pub const MAX_NESTING_DEPTH: usize = 64;

/// Aliases (`*name`) may copy at most this many nodes for every parser event read so far (the
/// ratio serde_yaml allowed): far more than any reuse of defaults needs, and it refuses
/// "billion laughs" documents, a few lines of nested aliases that would expand into gigabytes.
pub const MAX_ALIAS_EXPANSION: usize = 100;

/// How many times a task may run (`epochs`): each run is a case of its own.
pub const EPOCHS_RANGE: RangeInclusive<u32> = 1..=100;

/// Prefix of the harness contract's variables: `env`/`pass_env` may not set these.
pub const RESERVED_ENV_PREFIX: &str = "CASEBATCH_";

/// What a numeric field accepts, in the words a type error quotes: the field's own bounds
/// (`concurrency` takes 1 to 512), not its type's (a `u32` would take 0 to 4294967295).
/// `None` for a field with no bounds of its own. Keyed by the field's name, which is unique
/// across the manifest's structs for every bounded field.
pub(crate) fn expected_of_field(field: &str) -> Option<String> {
    fn whole<T: std::fmt::Display>(r: &RangeInclusive<T>, unit: &str) -> String {
        format!("a whole number{unit} from {} to {}", r.start(), r.end())
    }
    let seconds = |max: u64| format!("a whole number of seconds from 1 to {max} (7 days)");
    Some(match field {
        "concurrency" | "max_concurrent" => whole(&CONCURRENCY_RANGE, ""),
        "max_retries" => whole(&MAX_RETRIES_RANGE, ""),
        "timeout_seconds" => seconds(MAX_TIMEOUT_SECONDS),
        "lifetime" => seconds(MAX_SANDBOX_LIFETIME_SECONDS),
        "prepare_ahead" => whole(&(0..=MAX_PREPARE_AHEAD), ""),
        "priority" => whole(&PRIORITY_RANGE, " (a higher level goes first)"),
        "weight" => whole(&WEIGHT_RANGE, ""),
        "max_rate_limit_retries" => whole(&(0..=MAX_RATE_LIMIT_RETRIES), ""),
        "starts_per_minute" => whole(&(1..=MAX_STARTS_PER_MINUTE), ""),
        "epochs" => whole(&EPOCHS_RANGE, ""),
        "memory_mb" | "memory_budget_mb" => whole(&(1..=MAX_MEMORY_MB), " of MiB"),
        "cpu" => format!("a number more than 0, up to {MAX_CPU}"),
        "gpus" => whole(&(1..=MAX_GPUS), ""),
        "log_mb" => whole(&LOG_MB_RANGE, " of MiB"),
        "duration_ms" | "provision_ms" => whole(&(0..=MAX_FAKE_DURATION_MS), " of milliseconds"),
        "infra_failures_first" => whole(&(0..=MAX_FAKE_INFRA_FAILURES), ""),
        "breaker_failures" => whole(&BREAKER_FAILURES_RANGE, ""),
        "breaker_cooldown_s" => whole(&BREAKER_COOLDOWN_S_RANGE, " of seconds"),
        "unreachable_grace_s" => whole(&UNREACHABLE_GRACE_S_RANGE, " of seconds"),
        "queue_limit" => whole(&QUEUE_LIMIT_RANGE, " of waiting cases"),
        _ => return None,
    })
}
