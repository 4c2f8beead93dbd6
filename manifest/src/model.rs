//! The validated domain model every manifest shape resolves into, and the plan built from it.
//!
//! These types are the contract between `casebatch-manifest` (which produces them) and the
//! engine (which reads `batch_plan.json`). The JSON Schema printed by
//! `casebatch config schema --kind batch` is generated from [`BatchManifest`].

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod inputs;
pub use inputs::Inputs;

/// Version tag written into `batch_plan.json`.
pub const PLAN_SCHEMA_VERSION: &str = "batch_plan_v1";
/// Bounds (all of them live in [`crate::limits`]).
pub use crate::limits::{CONCURRENCY_RANGE, MAX_RETRIES_RANGE};
pub const DEFAULT_CONCURRENCY: u32 = 2;
pub const DEFAULT_MAX_RETRIES: u32 = 1;
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 600;

/// A YAML or JSON batch manifest: defaults plus tasks.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchManifest {
    /// Stable identity within the output root; change it for a new workload.
    /// Letters, digits, `.`, `_`, `-`; not starting with `.` (it names a directory); at most
    /// 128 characters.
    #[schemars(length(min = 1, max = crate::limits::MAX_BATCH_ID_LEN), pattern(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$"))]
    pub batch_id: String,
    #[serde(default)]
    pub defaults: Defaults,
    #[schemars(length(min = 1))]
    pub tasks: Vec<Task>,
    #[serde(default)]
    pub summary: Option<SummarySpec>,
    /// Named runtimes the cases can choose with `runtime: NAME` (besides the built-in
    /// `local-process` and `fake`). Names are `[a-z0-9][a-z0-9_-]*`, at most 63 characters,
    /// and may not be a built-in name. `--runtimes FILE` adds more; a name may be declared
    /// only once across both.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("propertyNames" = {"pattern": "^[a-z0-9][a-z0-9_-]*$", "maxLength": 63}))]
    pub runtimes: BTreeMap<String, RuntimeSpec>,
}

/// Settings every task inherits unless it overrides them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    /// Active case limit (1..=512).
    #[schemars(range(min = 1, max = 512))]
    pub concurrency: Option<u32>,
    /// Extra whole-case attempts after a retryable failure (0..=5).
    #[schemars(range(max = 5))]
    pub max_retries: Option<u32>,
    /// Attempts a harness declared `RATE_LIMITED` (class infra, retryable) that are retried
    /// after a wait without spending `max_retries` (0..=100, default 10).
    #[schemars(range(max = 100))]
    pub max_rate_limit_retries: Option<u32>,
    /// Wall-clock limit for one attempt of the actor, in seconds: 1 to 604800 (7 days).
    #[schemars(range(min = 1, max = crate::limits::MAX_TIMEOUT_SECONDS))]
    pub timeout_seconds: Option<u64>,
    pub sandbox: Option<Sandbox>,
    pub resources: Option<Resources>,
    /// The actor command (see the harness contract, docs/harness.md).
    pub harness: Option<CommandSpec>,
    /// Optional evaluator command; writes `{"verdict": "pass"|"fail"}`.
    pub evaluator: Option<CommandSpec>,
    /// A verdict from a score, without an evaluator process: a case whose harness finished
    /// passes when its result's score reaches the threshold, and fails otherwise. A case has
    /// an `evaluator` or a `pass_when`, not both. A task's `pass_when` replaces this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_when: Option<PassWhen>,
    /// Where cases run: `local-process` (the default when a harness is set), `fake` (a
    /// simulation), the name of an entry of `runtimes:`, or a list of those names to spread
    /// the cases over.
    pub runtime: Option<RuntimeChoice>,
    /// Endpoint used by the batch submitter (passed to harnesses as `CASEBATCH_CONTROLLER_URL`).
    pub controller_url: Option<String>,
    /// Optional worker-facing endpoint; leave empty for local use.
    pub device_controller_url: Option<String>,
    /// Scripted outcome for the `fake` runtime (a simulation).
    pub fake: Option<FakeScript>,
    /// Re-run an `OOM_KILLED` case inside the batch with its memory doubled for that job
    /// only (compounding, up to 16 GB). Off by default: every boost re-runs the case.
    pub oom_auto_boost: Option<bool>,
    /// Environments provisioned ahead of need (0..=64, default 0): while cases run, up to this
    /// many of the next queued cases get their environment provisioned, so a freed slot starts
    /// its next case at once. Worth it where provisioning is slow (a remote sandbox); a drained
    /// or cancelled batch cleans up the ones it will not use. Off in a batch with cases dealt
    /// from a `runtime:` list (a case's runtime is picked only when it is dispatched).
    #[schemars(range(max = crate::limits::MAX_PREPARE_AHEAD))]
    pub prepare_ahead: Option<u32>,
    /// Where batches share a runtime (an agent every batch reaches at the same endpoint),
    /// this batch's priority level, 1 to 5 (default 3): a waiting case of a higher level
    /// always gets the next free slot; slots already held are not taken back.
    #[schemars(range(min = 1, max = 5))]
    pub priority: Option<u32>,
    /// This batch's weight within its priority level, 1 to 100 (default 1): a shared
    /// runtime's slots are split between users by weight, then between a user's batches.
    #[schemars(range(min = 1, max = 100))]
    pub weight: Option<u32>,
    /// How often a working stage heartbeats to Temporal, in seconds: 1 to 60 (default 4).
    /// Each heartbeat is a Temporal action (metered on Temporal Cloud); a stage whose worker
    /// died is taken over a quarter more than this after its last heartbeat, so a longer
    /// cadence costs fewer actions and a slower takeover after a crash.
    #[schemars(range(min = 1, max = crate::limits::MAX_HEARTBEAT_EVERY_SECONDS))]
    pub heartbeat_every_seconds: Option<u64>,
    /// How many times each task runs (1..=100, default 1): every run is a case of its own,
    /// `<task_id>#<epoch>`, planned, resumed and retried like any case, and the report gives
    /// each task's pass@k. A task's `epochs` replaces this one.
    #[schemars(range(min = 1, max = 100))]
    pub epochs: Option<u32>,
    /// What the batch may spend, over the `usage` its harnesses report: admissions stop once
    /// what is spent plus what is in flight (each running case reserved at the p90 of what
    /// finished cases spent) would pass a limit; running cases finish and the batch ends
    /// `budget_exhausted` (exit 1), for `batch resume --budget` to continue.
    pub budget: Option<BudgetSpec>,
    /// How fast cases may start: `starts_per_minute` paces admissions (bursts of at most a
    /// second's worth), and a `rate_key` shares one pace with every batch and worker replica
    /// naming the same key on the namespace (two teams' batches against one API key).
    pub rate: Option<RateSpec>,
    /// Extra environment variables for the harness and evaluator, as literal values (they are
    /// in the plan: put secrets in `pass_env`, not here). Names are `[A-Za-z_][A-Za-z0-9_]*`
    /// and may not start with `CASEBATCH_`. A task's `env` is merged over the defaults' by name.
    pub env: Option<BTreeMap<String, String>>,
    /// Names of variables copied from the worker's environment when the attempt starts (only
    /// the names are in the plan; a name that is unset there fails the attempt as `config`).
    /// Merged with the defaults' list; for one name, the more specific layer's `env` or
    /// `pass_env` wins.
    pub pass_env: Option<Vec<String>>,
}

/// `pass_when`: the case passes when its harness's result reports `score` as a number at least
/// `at_least`, and fails (an `agent` failure, `VERDICT_FAIL`) when it is below. A result
/// without the score as a number is the harness's failure (`HARNESS_BAD_RESULT`), not a verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PassWhen {
    /// The name of a score in the harness's result (`scores`).
    #[schemars(length(min = 1))]
    pub score: String,
    /// The least value that passes.
    pub at_least: f64,
}

/// Where and how an attempt's environment is provisioned. A task's `sandbox` replaces the
/// default one whole; it is never merged field by field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Sandbox {
    /// Where the attempt's processes live: `local` (the host's processes, in the attempt's
    /// own cgroup) or `container` (one OCI container per attempt, through the Docker Engine
    /// API of `DOCKER_HOST` or the default socket).
    #[schemars(extend("enum" = crate::limits::SANDBOX_PROVIDERS))]
    pub provider: String,
    /// The container's image (`container`: required; `local`: not used).
    pub template: Option<String>,
    /// The image's platform, passed to the engine as is (`linux/amd64`).
    pub platform: Option<String>,
    /// Attempt lifetime in seconds: 1 to 604800 (7 days). A container is killed this long
    /// after it started, whatever its timeout says.
    #[schemars(range(min = 1, max = crate::limits::MAX_SANDBOX_LIFETIME_SECONDS))]
    pub lifetime: Option<u64>,
    /// `container` only: `none` gives the container no network but its own loopback;
    /// `default` (the default) is the engine's default network.
    #[schemars(extend("enum" = crate::limits::SANDBOX_NETWORKS))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// `container` only: `if-missing` (the default) pulls an image the engine lacks,
    /// `always` pulls before every attempt, `never` fails an attempt whose image is missing.
    #[schemars(extend("enum" = crate::limits::SANDBOX_PULLS))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull: Option<String>,
    /// `container` only: the user the harness runs as (`1000`, `1000:1000`, a name the
    /// image knows); the image's own user when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl Sandbox {
    /// `provider: local` and nothing else: the host's processes.
    pub fn local() -> Self {
        Self {
            provider: "local".into(),
            template: None,
            platform: None,
            lifetime: None,
            network: None,
            pull: None,
            user: None,
        }
    }

    /// One container per attempt.
    pub fn is_container(&self) -> bool {
        self.provider == "container"
    }
}

/// `defaults.rate`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateSpec {
    /// Case starts per minute, 1 to 60000: starts are spaced `60 / n` seconds apart, with
    /// bursts of up to `n / 60` starts when the batch has waited.
    #[schemars(range(min = 1, max = crate::limits::MAX_STARTS_PER_MINUTE))]
    pub starts_per_minute: u32,
    /// Shares this pace with every batch that names the same key on the namespace (one
    /// long-lived `RatePacer` workflow per key): `[A-Za-z0-9._-]`, 1 to 64 characters.
    #[schemars(regex(pattern = r"^[A-Za-z0-9._-]{1,64}$"))]
    pub rate_key: Option<String>,
}

impl From<RateSpec> for casebatch_proto::Pace {
    fn from(r: RateSpec) -> Self {
        Self {
            starts_per_minute: r.starts_per_minute,
            key: r.rate_key,
        }
    }
}

/// `defaults.budget`: one limit or both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetSpec {
    /// US dollars, summed over the results' `usage.cost_usd`: a positive number.
    pub cost_usd: Option<f64>,
    /// Tokens, summed over the results' `usage.input_tokens` plus `usage.output_tokens`.
    #[schemars(range(min = 1))]
    pub tokens: Option<u64>,
}

impl From<BudgetSpec> for casebatch_proto::Budget {
    fn from(b: BudgetSpec) -> Self {
        Self {
            cost_usd: b.cost_usd,
            tokens: b.tokens,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// CPUs: a positive number up to 1024.
    #[schemars(range(max = crate::limits::MAX_CPU))]
    pub cpu: Option<f64>,
    /// Memory limit in MiB enforced by the runtime, 1 to 1048576 (1 TiB); a kill by this
    /// limit is `infra/OOM_KILLED`.
    #[schemars(range(min = 1, max = crate::limits::MAX_MEMORY_MB))]
    pub memory_mb: Option<u64>,
    /// GPUs the case needs, 1 to 64: a `slurm` runtime asks for them (`--gres=gpu:N`);
    /// other runtimes do not allocate GPUs.
    #[schemars(range(min = 1, max = crate::limits::MAX_GPUS))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// The most each of an attempt's `stdout.log` and `stderr.log` keeps, in MiB: 1 to 65536,
    /// default 64. Past it the middle of the log is dropped, its first and last halves kept
    /// around a line saying how much went, and the attempt record says so.
    #[schemars(range(min = 1, max = 65536))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_mb: Option<u64>,
}

/// A command: a string run by `sh -c`, or an argv list run as is. A program written as a path
/// (a list's first element, or a string's plain first word, containing `/`) is resolved
/// against the directory of the file that writes it and must exist and be executable where
/// the case runs on a worker's host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum CommandSpec {
    Shell(String),
    Argv(Vec<String>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RuntimeKind {
    /// A fresh child process per attempt on the worker's host.
    LocalProcess,
    /// A simulation with scripted outcomes and durations; runs nothing.
    Fake,
    /// A `casebatch agent` reached over gRPC: jobs run on its host and outlive workers.
    Agent,
    /// A Slurm cluster the worker submits to (`sbatch`): one Slurm job per attempt.
    Slurm,
}

impl RuntimeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::LocalProcess => "local-process",
            RuntimeKind::Fake => "fake",
            RuntimeKind::Agent => "agent",
            RuntimeKind::Slurm => "slurm",
        }
    }
}

/// Runtime names that need no table entry: `runtime: NAME` finds these before the table, and
/// a table entry may not reuse them.
pub(crate) const BUILT_IN: &[(&str, RuntimeKind)] = &[
    ("local-process", RuntimeKind::LocalProcess),
    ("fake", RuntimeKind::Fake),
];

/// One entry of the runtimes table (`runtimes:` in a manifest, or `--runtimes FILE`): where
/// the cases that name it run. Holds where a secret is read from, never the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSpec {
    pub kind: RuntimeKind,
    /// `agent` only, and required there: `https://HOST:PORT`, or `http://HOST:PORT` with a
    /// loopback host (127.0.0.0/8, `::1`, `localhost`): plaintext is refused off loopback.
    #[schemars(pattern(r"^https?://[^/@?#]+:[0-9]{1,5}$"))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// `agent` only: the environment variable (on the worker) holding the bearer token. At
    /// most one of `token_env` and `token_file`.
    #[schemars(pattern(r"^[A-Za-z_][A-Za-z0-9_]*$"))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_env: Option<String>,
    /// `agent` only: a file (on the worker) holding the bearer token; a relative path is
    /// resolved against the directory of the file that declares it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// `agent` with `https://` only: PEM file of the CA that signed the agent's TLS
    /// certificate (default: the system's roots); a relative path is resolved against the
    /// directory of the file that declares it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<String>,
    /// The runtime's envelope: most of a batch's cases in flight on it at once (1..=512). The
    /// batch queues the rest instead of over-committing the runtime.
    #[schemars(range(min = 1, max = 512))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
    /// The runtime's envelope: the most declared `resources.memory_mb` of a batch's cases in
    /// flight on it at once (1 to 1048576). Cases declaring no memory are admitted outside it;
    /// a case declaring more than the whole budget is refused when the batch is planned.
    #[schemars(range(min = 1, max = crate::limits::MAX_MEMORY_MB))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_budget_mb: Option<u64>,
    /// Consecutive infra dispatch failures that open the runtime's circuit, for cases dealt
    /// from a `runtime:` list (1..=100, default 3). The circuit is shared by every batch.
    #[schemars(range(min = 1, max = 100))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker_failures: Option<u32>,
    /// Seconds an open circuit refuses dispatches before one probe goes through (1..=3600,
    /// default 30).
    #[schemars(range(min = 1, max = 3600))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker_cooldown_s: Option<u64>,
    /// `agent` only: seconds a worker keeps retrying an unreachable agent (submit, watch,
    /// cleanup) before the attempt fails as `RUNTIME_UNREACHABLE` (1..=600; default 20 to
    /// submit, 60 to watch a job, 40 to clean up). Lower it where a list gives cases
    /// somewhere else to go.
    #[schemars(range(min = 1, max = 600))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreachable_grace_s: Option<u64>,
    /// `agent` only: a new batch waits to be admitted (it is not refused) while this many
    /// cases or more, of every batch, wait for the agent's slots (1..=100000; default: no
    /// limit).
    #[schemars(range(min = 1, max = 100000))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_limit: Option<u32>,
    /// `slurm` only: the partition jobs are submitted to (default: the cluster's default).
    #[schemars(pattern(r"^[A-Za-z0-9_.-]+$"))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// `slurm` only: the account jobs are charged to.
    #[schemars(pattern(r"^[A-Za-z0-9_.-]+$"))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// `slurm` only: the quality of service jobs ask for.
    #[schemars(pattern(r"^[A-Za-z0-9_.-]+$"))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    /// `slurm` only: the node features jobs need (`--constraint`, Slurm's expression syntax).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<String>,
    /// `slurm` only: more `sbatch` options, each `--name=value` or `--name`, from a set that
    /// cannot change what casebatch relies on (`--nice`, `--exclusive`, `--reservation`,
    /// `--licenses`, `--tmp`, `--nodelist`, `--exclude`, `--hint`, `--wckey`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
}

impl RuntimeSpec {
    /// The breaker settings of this runtime.
    pub fn breaker(&self) -> casebatch_proto::BreakerSettings {
        let default = casebatch_proto::BreakerSettings::default();
        casebatch_proto::BreakerSettings {
            failures: self.breaker_failures.unwrap_or(default.failures),
            cooldown_s: self.breaker_cooldown_s.unwrap_or(default.cooldown_s),
        }
    }
}

/// What the `fake` runtime pretends happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FakeScript {
    /// Simulated duration of an attempt, in milliseconds: 0 to 604800000 (7 days).
    #[serde(default)]
    #[schemars(range(max = crate::limits::MAX_FAKE_DURATION_MS))]
    pub duration_ms: u64,
    #[serde(default)]
    pub outcome: FakeOutcome,
    /// The first N attempts fail with a retryable infra error before `outcome` applies
    /// (0 to 1000).
    #[serde(default)]
    #[schemars(range(max = crate::limits::MAX_FAKE_INFRA_FAILURES))]
    pub infra_failures_first: u32,
    /// Simulated provisioning time of an attempt's environment, in milliseconds: 0 to
    /// 604800000 (7 days). Paid ahead when `prepare_ahead` is set.
    #[serde(default, skip_serializing_if = "is_zero_ms")]
    #[schemars(range(max = crate::limits::MAX_FAKE_DURATION_MS))]
    pub provision_ms: u64,
}

fn is_zero_ms(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FakeOutcome {
    #[default]
    Pass,
    Fail,
    HarnessError,
    InfraError,
    OomKilled,
}

/// One task of a YAML/JSON manifest (or one JSONL line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// Unique stable identity, used by resume. Any text without control characters (no NUL,
    /// newline or tab).
    #[schemars(length(min = 1), pattern(r"^[^\x00-\x1f\x7f-\x9f]+$"))]
    pub task_id: String,
    pub agent_kind: Option<String>,
    pub query: Option<String>,
    pub url: Option<String>,
    /// Actor step budget, independent of evaluator and infra timeouts.
    pub max_steps: Option<u32>,
    /// Complete per-task sandbox; replaces `defaults.sandbox` whole.
    pub sandbox: Option<Sandbox>,
    pub resources: Option<Resources>,
    /// Wall-clock limit for one attempt, in seconds: 1 to 604800 (7 days).
    #[schemars(range(min = 1, max = crate::limits::MAX_TIMEOUT_SECONDS))]
    pub timeout_seconds: Option<u64>,
    pub fake: Option<FakeScript>,
    /// How many times this task runs (1..=100; replaces `defaults.epochs`).
    #[schemars(range(min = 1, max = 100))]
    pub epochs: Option<u32>,
    /// This task's own actor command (replaces `defaults.harness`).
    pub harness: Option<CommandSpec>,
    /// This task's own evaluator command (replaces `defaults.evaluator`).
    pub evaluator: Option<CommandSpec>,
    /// This task's verdict from a score (replaces `defaults.pass_when`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_when: Option<PassWhen>,
    /// This task's runtime (replaces `defaults.runtime`): `local-process`, `fake`, the name
    /// of an entry of `runtimes:`, or a list of those names.
    pub runtime: Option<RuntimeChoice>,
    /// Extra environment variables for the harness and evaluator, as literal values (they are
    /// in the plan: put secrets in `pass_env`, not here). Names are `[A-Za-z_][A-Za-z0-9_]*`
    /// and may not start with `CASEBATCH_`. Merged over `defaults.env` by name.
    pub env: Option<BTreeMap<String, String>>,
    /// Names of variables copied from the worker's environment when the attempt starts (only
    /// the names are in the plan; a name that is unset there fails the attempt as `config`).
    /// Merged with `defaults.pass_env`; for one name, the more specific layer's `env` or
    /// `pass_env` wins.
    pub pass_env: Option<Vec<String>>,
    /// Free-form task fields handed to the harness in `CASEBATCH_INPUT`.
    #[serde(default)]
    pub inputs: BTreeMap<String, serde_json::Value>,
}

/// `summary:`: which result fields make the one-row-per-case summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SummarySpec {
    /// Dotted paths into each case's result (e.g. `scores.accuracy`).
    #[serde(default)]
    #[schemars(inner(length(min = 1)))]
    pub fields: Vec<String>,
    #[serde(default)]
    pub write_csv: bool,
}

/// A `schema_version: batch_v1` manifest: an explicit list of independently authored
/// single-run specs, each referenced by path relative to the manifest.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchV1Manifest {
    /// Always `batch_v1`.
    #[schemars(pattern(r"^batch_v1$"))]
    pub schema_version: String,
    /// Optional here: `--batch-id` or the manifest's file stem is used when absent.
    #[serde(default)]
    #[schemars(
        length(min = 1, max = crate::limits::MAX_BATCH_ID_LEN),
        pattern(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")
    )]
    pub batch_id: Option<String>,
    #[serde(default)]
    pub defaults: Defaults,
    pub batch: BatchV1,
    /// Named runtimes, as in the tasks manifest's `runtimes:`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("propertyNames" = {"pattern": "^[a-z0-9][a-z0-9_-]*$", "maxLength": 63}))]
    pub runtimes: BTreeMap<String, RuntimeSpec>,
}

/// The `batch:` block of a batch_v1 manifest.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchV1 {
    #[schemars(length(min = 1))]
    pub cases: Vec<BatchV1Case>,
    #[serde(default)]
    pub summary: Option<SummarySpec>,
}

/// One batch_v1 case: a unique label (the case id) and the path of its run spec.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchV1Case {
    /// The case id: unique within the batch; no control characters.
    #[schemars(length(min = 1), pattern(r"^[^\x00-\x1f\x7f-\x9f]+$"))]
    pub label: String,
    /// Relative to the manifest's directory; must stay inside it.
    pub runspec: String,
}

/// A single-run spec referenced by a batch_v1 case: one task without its id (the case label
/// is the id), optionally with its own harness, evaluator and runtime. Sweeps are refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    pub agent_kind: Option<String>,
    pub query: Option<String>,
    pub url: Option<String>,
    pub max_steps: Option<u32>,
    /// Complete sandbox for this case; replaces `defaults.sandbox` whole.
    pub sandbox: Option<Sandbox>,
    pub resources: Option<Resources>,
    /// Wall-clock limit for one attempt, in seconds: 1 to 604800 (7 days).
    #[schemars(range(min = 1, max = crate::limits::MAX_TIMEOUT_SECONDS))]
    pub timeout_seconds: Option<u64>,
    pub fake: Option<FakeScript>,
    /// How many times this case runs (1..=100; replaces `defaults.epochs`).
    #[schemars(range(min = 1, max = 100))]
    pub epochs: Option<u32>,
    #[serde(default)]
    pub inputs: BTreeMap<String, serde_json::Value>,
    pub harness: Option<CommandSpec>,
    pub evaluator: Option<CommandSpec>,
    /// This case's verdict from a score (replaces `defaults.pass_when`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_when: Option<PassWhen>,
    /// This case's runtime: `local-process`, `fake`, the name of an entry of the runtimes
    /// table (`runtimes:` in the batch manifest, or `--runtimes FILE`), or a list of those.
    pub runtime: Option<RuntimeChoice>,
    /// Extra environment variables for the harness and evaluator, as literal values (they are
    /// in the plan: put secrets in `pass_env`, not here). Names are `[A-Za-z_][A-Za-z0-9_]*`
    /// and may not start with `CASEBATCH_`. Merged over `defaults.env` by name.
    pub env: Option<BTreeMap<String, String>>,
    /// Names of variables copied from the worker's environment when the attempt starts (only
    /// the names are in the plan; a name that is unset there fails the attempt as `config`).
    /// Merged with `defaults.pass_env`; for one name, the more specific layer's `env` or
    /// `pass_env` wins.
    pub pass_env: Option<Vec<String>>,
}

/// Which of the three manifest shapes a file was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ManifestFormat {
    Yaml,
    Json,
    Jsonl,
    BatchV1,
}

/// Settings that apply to the whole batch after defaults and flags are resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchSettings {
    pub concurrency: u32,
    pub max_retries: u32,
    pub controller_url: Option<String>,
    pub device_controller_url: Option<String>,
    #[serde(default)]
    pub oom_auto_boost: bool,
    /// Queued cases whose environment is provisioned while others run (0: off).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub prepare_ahead: u32,
    /// The stages' heartbeat cadence in seconds (`None`: the default, 4 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_every_seconds: Option<u64>,
    /// What the batch may spend (`None`: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetSpec>,
    /// Rate-limited attempts retried on their own cap (`None`: the default, 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rate_limit_retries: Option<u32>,
    /// How fast cases may start (`None`: as fast as the other limits allow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateSpec>,
    /// Priority level and weight on shared runtimes (`None`: the defaults, 3 and 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Where the plan came from: enough to prove which input produced it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// Absolute path of the manifest.
    pub manifest_path: String,
    pub manifest_sha256: String,
    pub format: ManifestFormat,
}

/// The materialized batch: what `batch_plan.json` holds and what the engine executes.
///
/// `C` is what is held of each case: the whole [`PlannedCase`], or, where a 100,000-case plan
/// need not be held whole, its [`CaseHead`] ([`PlanHead`]) or where it lies in the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan<C = PlannedCase> {
    pub schema_version: String,
    pub batch_id: String,
    pub provenance: Provenance,
    pub settings: BatchSettings,
    /// sha256 over the case ids and their specs: a batch id may only ever run one task list.
    pub fingerprint: String,
    pub summary: SummarySpec,
    /// The runtimes table, by name. Not part of the fingerprint: where a case runs is not
    /// what it is, so an agent may move between runs of one batch.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub runtimes: BTreeMap<String, RuntimeSpec>,
    pub cases: Vec<C>,
    /// Non-fatal notes (for example `--max-cases` exceeded).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// The weights the cases of `runtime:` lists were dealt by; `None`: evenly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<SpreadWeights>,
}

/// Per-runtime weights for dealing the cases of `runtime:` lists, and where they came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SpreadWeights {
    /// By runtime name: cases are dealt in proportion to the weight.
    pub weights: BTreeMap<String, u32>,
    /// Where the weights came from, for people (`run history: 2 batches`).
    pub source: String,
}

impl SpreadWeights {
    /// What every runtime weighs when nothing says otherwise.
    pub const EVEN: u32 = 100;
}

/// `runtime:`: one runtime, or a list of runtimes that the cases naming it are spread over.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum RuntimeChoice {
    /// `local-process`, `fake`, or the name of an entry of the runtimes table.
    One(#[schemars(length(min = 1, max = 63), pattern(r"^[a-z0-9][a-z0-9_-]*$"))] String),
    /// Runtimes the cases naming this list are dealt to in turn, in plan order (a smooth
    /// weighted round-robin, every runtime weighing the same).
    Spread(
        #[schemars(
            length(min = 1, max = 64),
            inner(length(min = 1, max = 63), pattern(r"^[a-z0-9][a-z0-9_-]*$"))
        )]
        Vec<String>,
    ),
}

impl RuntimeChoice {
    /// The names, in the order written.
    pub fn names(&self) -> &[String] {
        match self {
            RuntimeChoice::One(name) => std::slice::from_ref(name),
            RuntimeChoice::Spread(names) => names,
        }
    }
}

/// A plan with what status, control and the run's views need of each case, not its spec:
/// read from `batch_plan.json` in under half the time and a small share of the memory.
pub type PlanHead = Plan<CaseHead>;

/// What a case is called and where it runs: a [`PlannedCase`] without its spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaseHead {
    pub case_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<Epoch>,
    pub case_dir: String,
    pub runtime: RuntimeKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runtime_spread: Vec<String>,
}

impl CaseHead {
    pub fn of(case: &PlannedCase) -> Self {
        Self {
            case_id: case.case_id.clone(),
            epoch: case.epoch.clone(),
            case_dir: case.case_dir.clone(),
            runtime: case.runtime,
            runtime_name: case.runtime_name.clone(),
            runtime_spread: case.runtime_spread.clone(),
        }
    }

    /// Where the case runs, as people name it: its runtimes-table entry, else the built-in.
    pub fn runtime_label(&self) -> &str {
        self.runtime_name
            .as_deref()
            .unwrap_or_else(|| self.runtime.as_str())
    }
}

/// What every form of a plan's case tells: its id, its run of its task, its directory and
/// what runs it.
pub trait CaseIdentity {
    fn case_id(&self) -> &str;
    fn epoch(&self) -> Option<&Epoch>;
    fn case_dir(&self) -> &str;
    fn runtime(&self) -> RuntimeKind;
}

macro_rules! case_identity {
    ($case:ty) => {
        impl CaseIdentity for $case {
            fn case_id(&self) -> &str {
                &self.case_id
            }
            fn epoch(&self) -> Option<&Epoch> {
                self.epoch.as_ref()
            }
            fn case_dir(&self) -> &str {
                &self.case_dir
            }
            fn runtime(&self) -> RuntimeKind {
                self.runtime
            }
        }
    };
}
case_identity!(PlannedCase);
case_identity!(CaseHead);

impl<C: CaseIdentity> Plan<C> {
    /// Whether any case runs on the simulation (`fake`), which every output says.
    pub fn simulated(&self) -> bool {
        self.cases.iter().any(|c| c.runtime() == RuntimeKind::Fake)
    }

    /// A case's id by its index (the workflow and its history name cases by index).
    pub fn case_id(&self, index: u32) -> Option<&str> {
        self.cases.get(index as usize).map(|c| c.case_id())
    }
}

impl Plan {
    /// The plan without its cases' specs.
    pub fn head(&self) -> PlanHead {
        self.with_cases(self.cases.iter().map(CaseHead::of).collect())
    }
}

impl<C> Plan<C> {
    /// The same plan holding `cases` (in plan order) instead of its own.
    pub fn with_cases<D>(&self, cases: Vec<D>) -> Plan<D> {
        Plan {
            schema_version: self.schema_version.clone(),
            batch_id: self.batch_id.clone(),
            provenance: self.provenance.clone(),
            settings: self.settings.clone(),
            fingerprint: self.fingerprint.clone(),
            summary: self.summary.clone(),
            runtimes: self.runtimes.clone(),
            cases,
            warnings: self.warnings.clone(),
            spread: self.spread.clone(),
        }
    }

    /// A runtime by the name a `runtime:` list gives it: a built-in (`local-process`,
    /// `fake`) or an entry of the runtimes table, as its kind and table name.
    pub fn runtime_named(&self, name: &str) -> Option<(RuntimeKind, Option<&RuntimeSpec>)> {
        if let Some((_, kind)) = BUILT_IN.iter().find(|(n, _)| *n == name) {
            return Some((*kind, None));
        }
        self.runtimes.get(name).map(|spec| (spec.kind, Some(spec)))
    }

    /// The workflow id of the circuit breaker of the runtime `name` (`None`: no such runtime).
    /// Named by where the runtime is: an agent's endpoint, `host` for `local-process` (which
    /// runs on the worker's host), nothing for the `fake` simulation.
    pub fn breaker_id(&self, name: &str, host: &str) -> Option<String> {
        let (kind, spec) = self.runtime_named(name)?;
        let location = match kind {
            RuntimeKind::LocalProcess => host,
            RuntimeKind::Agent => spec.and_then(|s| s.endpoint.as_deref()).unwrap_or(""),
            RuntimeKind::Slurm => spec.and_then(|s| s.partition.as_deref()).unwrap_or(""),
            RuntimeKind::Fake => "",
        };
        Some(casebatch_proto::breaker::breaker_workflow_id(
            name, location,
        ))
    }
}

impl PlannedCase {
    /// Where the case runs, as people name it: its runtimes-table entry, else the built-in.
    pub fn runtime_label(&self) -> &str {
        self.runtime_name
            .as_deref()
            .unwrap_or_else(|| self.runtime.as_str())
    }
}

impl From<String> for RuntimeChoice {
    fn from(name: String) -> Self {
        RuntimeChoice::One(name)
    }
}

/// One case, fully resolved: nothing about it depends on defaults any more.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedCase {
    /// Position in the batch; the workflow refers to cases by index.
    pub index: u32,
    pub case_id: String,
    /// The run of a task that runs several times (`epochs`): its task and which run, from
    /// 1. `None` for a task that runs once (its case id is its task id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<Epoch>,
    /// Filesystem-safe, collision-free directory name under `cases/`.
    pub case_dir: String,
    pub runtime: RuntimeKind,
    /// The runtimes-table entry the case runs on (`Plan::runtimes`); `None` for the built-in
    /// `local-process` and `fake`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_name: Option<String>,
    /// The list this case was dealt from (`runtime: [a, b]`), in the order written; empty when
    /// it named one runtime. `runtime` and `runtime_name` are its share.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runtime_spread: Vec<String>,
    pub harness: Option<CommandSpec>,
    pub evaluator: Option<CommandSpec>,
    /// The verdict from a score, where no evaluator runs (`None`: the actor's outcome, or
    /// the evaluator's verdict, decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_when: Option<PassWhen>,
    pub sandbox: Option<Sandbox>,
    pub resources: Resources,
    pub timeout_seconds: u64,
    pub fake: Option<FakeScript>,
    /// Literal environment variables for the harness and evaluator (defaults and case merged).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Names copied from the worker's environment at spawn time; never their values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pass_env: Vec<String>,
    /// The task fields handed to the harness (`query`, `url`, `max_steps`, `agent_kind`,
    /// plus free-form inputs), as written to `CASEBATCH_INPUT`.
    pub input: Inputs,
    pub source: CaseSource,
}

/// One run of a task that runs several times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Epoch {
    pub task_id: String,
    /// 1..=epochs.
    pub epoch: u32,
    /// How many runs the task has.
    pub of: u32,
}

/// Where a case was declared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseSource {
    /// 1-based line in the manifest, where known.
    pub line: Option<usize>,
    /// For batch_v1: the resolved absolute path of the referenced runspec.
    pub runspec: Option<String>,
}
