//! The command-line surface (clap), and the conversion of flags into the library's inputs.

use std::path::PathBuf;

use casebatch_control::{BatchLocation, EngineChoice, ManifestInput};
use casebatch_manifest::{CommandSpec, Defaults, LoadOptions, RuntimeChoice};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::exit::{CliError, CliResult};

/// Durable batch runner for evaluation cases, on Temporal.
///
/// Each batch is a Temporal workflow: finished results are never lost or re-run, unfinished
/// cases are always re-runnable. With no Temporal address configured, casebatch starts a
/// local Temporal dev server under the output directory and runs an in-process worker.
#[derive(Debug, Parser)]
#[command(
    name = "casebatch",
    version,
    propagate_version = true,
    after_help = crate::exit::help()
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// How stderr is written: `text`, or `json` (one object per line, progress included).
    /// What is logged follows RUST_LOG.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t,
        env = "CASEBATCH_LOG_FORMAT"
    )]
    pub log_format: crate::logs::LogFormat,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Configuration reference.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Validate, plan, run and operate batches.
    #[command(subcommand)]
    Batch(BatchCommand),
    /// Run one case of a manifest on its own, as durably as a batch (a one-case batch with
    /// id `<batch_id>--<case_dir>`): after a crash, `casebatch run` again adopts its job.
    Run(SingleRunArgs),
    /// Run a standalone worker (one replica) against the engine.
    Worker(WorkerArgs),
    /// Run a runtime agent: a gRPC service whose jobs outlive the workers that submit them.
    Agent(AgentArgs),
    /// Probe a worker's or an agent's `/healthz` (or `/readyz`): exit 0 when it answers 200,
    /// 1 when not (a container HEALTHCHECK).
    Health(HealthArgs),
    /// The local web demo: three real web tasks on a fixture, run end to end in one command.
    /// `demo serve` runs only the fixture (for the three-terminal tutorial).
    Demo(DemoArgs),
    /// Built-in harness commands (they follow the harness contract).
    #[command(subcommand)]
    Harness(HarnessCommand),
    /// The run-history index: per harness and runtime, the median duration of attempts that
    /// ran to their end, from the bundles under an output directory. Runs use it to deal
    /// `runtime:` lists by speed and to seed tail speculation.
    History(HistoryArgs),
    /// The embedded engine of an output directory (the local Temporal dev server that
    /// commands start when no cluster is named): whether it runs, who uses it, stopping it.
    #[command(subcommand)]
    Engine(EngineCommand),
    /// The containers of `sandbox.provider: container` on this host's engine.
    #[command(subcommand)]
    Sandbox(SandboxCommand),
    /// Print a shell completion script (e.g. `casebatch completions bash >
    /// /etc/bash_completion.d/casebatch`).
    Completions {
        /// The shell to complete in.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), e.g. `casebatch man > casebatch.1`; with `--dir`, write
    /// one page per command there (`casebatch.1`, `casebatch-batch-run.1`, ...).
    Man {
        /// Write every command's page into this directory instead of printing the top one.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum SandboxCommand {
    /// List the containers casebatch labelled on the engine at `DOCKER_HOST` (or the default
    /// socket), or with `--slurm` its jobs in the Slurm cluster (`SLURM_CONF`), and which are
    /// garbage: their bundle is gone, or their attempt is closed (its cleanup ran). A dry run
    /// unless `--apply`, which removes (or cancels) the garbage; another user's are listed and
    /// never touched.
    Gc {
        /// Remove the garbage (without it, only list).
        #[arg(long)]
        apply: bool,
        /// Only the containers (or jobs) of this batch.
        #[arg(long, value_name = "ID")]
        batch_id: Option<String>,
        /// casebatch's Slurm jobs instead of its containers.
        #[arg(long)]
        slurm: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum EngineCommand {
    /// Whether the embedded engine runs, where, and which casebatch processes use it.
    Status {
        /// Root of result bundles whose engine is shown.
        /// Root of result bundles holding the batches.
        #[arg(long, default_value = "logs/batch")]
        output_dir: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Stop the embedded engine (refused while a casebatch process uses it: the last one to
    /// finish stops it anyway).
    Stop {
        /// Root of result bundles whose engine is stopped.
        #[arg(long, default_value = "logs/batch")]
        output_dir: PathBuf,
    },
    /// Serve the embedded engine's Temporal Web UI on a loopback port and print its address;
    /// holds the engine (starting it if needed, restarting a headless one with its UI) until
    /// Ctrl-C or SIGTERM. The last casebatch process using the engine stops it.
    Ui {
        /// Root of result bundles whose engine is shown.
        #[arg(long, default_value = "logs/batch")]
        output_dir: PathBuf,
    },
    /// Internal: the keeper of an embedded engine, started by casebatch itself.
    #[command(hide = true)]
    Keep {
        /// The engine's state directory (`<output-dir>/.casebatch-engine`).
        #[arg(long)]
        state_dir: PathBuf,
        /// The dev server's port.
        #[arg(long)]
        port: u16,
        /// Seconds with no casebatch process using the engine before it is stopped.
        #[arg(long)]
        idle_secs: u64,
        /// The port of the server's Web UI (headless without it).
        #[arg(long)]
        ui_port: Option<u16>,
    },
}

#[derive(Debug, Clone, Args)]
pub struct HistoryArgs {
    #[command(subcommand)]
    pub command: Option<HistoryCommand>,
    /// Root of result bundles whose finished batches are indexed.
    #[arg(long, global = true, default_value = "logs/batch")]
    pub output_dir: PathBuf,
    /// The index file (default: `CASEBATCH_HISTORY_DB`, else
    /// `<output-dir>/.casebatch-history.sqlite`).
    #[arg(long, global = true)]
    pub history_db: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Clone, Subcommand)]
pub enum HistoryCommand {
    /// Forget the index and build it again from the bundles (it is never the source of truth).
    Rebuild,
}

#[derive(Debug, Clone, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DemoArgs {
    #[command(subcommand)]
    pub serve: Option<DemoCommand>,
    /// Fixture directory (batch.yaml and events.jsonl land here).
    #[arg(long, default_value = "logs/demo")]
    pub directory: PathBuf,
    /// Seconds each fixture page takes to load.
    #[arg(long, default_value_t = 0.0)]
    pub response_delay: f64,
    /// Cases in flight (default: the manifest's 2).
    #[arg(long)]
    pub parallelism: Option<u32>,
    /// Which web actor the tasks use: a headless Chromium per attempt (`browser`), a plain
    /// HTTP client (`http`), or the browser when one is found, else HTTP (`auto`).
    #[arg(long, value_enum, default_value_t = ActorChoice::Auto)]
    pub actor: ActorChoice,
}

/// The demo's web actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ActorChoice {
    /// The browser when one is found (CASEBATCH_BROWSER, chromium, chromium-browser or
    /// google-chrome on PATH), else the HTTP client.
    Auto,
    /// A headless Chromium per attempt; an error when none is found.
    Browser,
    /// A plain HTTP client.
    Http,
}

#[derive(Debug, Clone, Subcommand)]
pub enum DemoCommand {
    /// Serve the fixture web app on loopback and write <directory>/batch.yaml; prints
    /// `ready: true` once it listens. Runs until Ctrl-C.
    Serve {
        /// Fixture directory (batch.yaml and events.jsonl land here).
        #[arg(long)]
        directory: PathBuf,
        /// Seconds each fixture page takes to load.
        #[arg(long, default_value_t = 0.0)]
        response_delay: f64,
        /// Port on 127.0.0.1 (default: a free one, or the one this directory used before).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Which web actor the tasks use: a headless Chromium per attempt (`browser`), a plain
        /// HTTP client (`http`), or the browser when one is found, else HTTP (`auto`).
        #[arg(long, value_enum, default_value_t = ActorChoice::Auto)]
        actor: ActorChoice,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum HarnessCommand {
    /// The demo's web actor: opens its task page, writes a note, clicks.
    WebDemo {
        /// Drive a headless Chromium (this binary, or the one found on PATH when no path is
        /// given) instead of a plain HTTP client.
        #[arg(long, value_name = "PATH", num_args = 0..=1)]
        browser: Option<Option<PathBuf>>,
    },
    /// The demo's evaluator: passes only if its own attempt's receipts exist.
    WebDemoEval,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print a JSON Schema: of the batch manifest (default), of the result file a harness or
    /// an evaluator writes, or of a command's `--json` output.
    Schema {
        /// The batch manifest (`batch`), a harness's result file (`result`), an evaluator's
        /// (`evaluator-result`), or the `--json` view of a command.
        #[arg(long, value_enum, default_value = "batch")]
        kind: casebatch_views::ViewKind,
    },
}

#[derive(Debug, Subcommand)]
pub enum BatchCommand {
    /// Check a manifest and report every problem at once (exit 2 if any).
    Validate {
        #[command(flatten)]
        manifest: ManifestArgs,
        /// Print JSON: `{"valid": true, …}`, or `{"valid": false, "problems": […]}` (exit 2).
        #[arg(long)]
        json: bool,
    },
    /// Materialize every case into batch_plan.json without executing anything.
    Plan {
        #[command(flatten)]
        manifest: ManifestArgs,
        /// Root of result bundles (`<output-dir>/<batch_id>/`).
        /// Root of result bundles holding the batches.
        #[arg(long, default_value = "logs/batch")]
        output_dir: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Plan the batch and write its bundle as `run` does, then print its next run as a start
    /// request (JSON: workflow id and type, task queue, memo, search attributes, input) for any
    /// Temporal SDK to send; the run so started is a normal batch. Refused while it runs.
    Prepare {
        #[command(flatten)]
        manifest: ManifestArgs,
        /// Root of result bundles (`<output-dir>/<batch_id>/`).
        #[arg(long, default_value = "logs/batch")]
        output_dir: PathBuf,
        /// Print JSON: what it prints in any case (the start request), taken as every other
        /// command takes it, so scripts may pass it to each.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Run a batch to the end (or until drained), writing the result bundle as cases finish.
    Run(RunArgs),
    /// Continue a drained, paused or interrupted batch; a completed batch is left as is.
    Resume(ResumeArgs),
    /// Make new attempts inside a finished batch without discarding earlier evidence (the
    /// attempt history keeps them all). Needs an explicit selection.
    Rerun(RerunArgs),
    /// Per-state counts, in-flight cases and the progress timeline.
    Status(BatchRef),
    /// Summary and failure breakdown (stage × class); actor, verdict and cleanup apart.
    Report {
        #[command(flatten)]
        batch: BatchRef,
        /// Also write the report as one self-contained HTML file (plots inline, nothing
        /// fetched) to open in a browser.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
    },
    /// Print one attempt's logs from the bundle (by default the case's latest attempt): the
    /// harness's stdout to stdout and its stderr to stderr, as written. With --follow, print
    /// what is written until the attempt's job ends (waiting for its first attempt if the
    /// case has not started). An agent's or a container's logs arrive when the attempt settles.
    Logs(LogsArgs),
    /// Admit nothing new; admitted cases finish; the runner exits 1 with queued work left.
    Drain(BatchRef),
    /// Stop admissions; the runner keeps waiting.
    Pause(BatchRef),
    /// Restart admissions after `pause`.
    Unpause(BatchRef),
    /// Cancel in-flight cases (their cleanup still runs) and end the batch as cancelled.
    Cancel(BatchRef),
    /// Stop the batch's admissions and kill its running jobs on every runtime at once; it
    /// ends as superseded, its finished results kept and its killed cases queued again.
    Supersede(BatchRef),
    /// Change the active case limit of a running batch, at once. Lowering it never cancels
    /// running cases: admissions wait until fewer run. Kept across continue-as-new; a later
    /// `resume` runs at the plan's limit again.
    SetConcurrency {
        #[command(flatten)]
        batch: BatchRef,
        /// The new limit, 1..=512 (the batch's validator refuses others).
        limit: u32,
    },
    /// Change the priority and weight of a running batch on the runtimes it shares with other
    /// batches (agents): its cases that ask for a slot from then on are queued by them. Kept
    /// across continue-as-new; a later `resume` shares at the plan's again.
    SetShare {
        #[command(flatten)]
        batch: BatchRef,
        /// Priority level, 1..=5: a waiting case of a higher level gets the next free slot.
        #[arg(long)]
        priority: u32,
        /// Weight within the level, 1..=100: slots are split between users, then a user's
        /// batches, by weight.
        #[arg(long)]
        weight: u32,
    },
    /// Re-run a finished batch's failed cases in a new batch. Passing results (and, with
    /// --class, failures of other classes) are carried over verbatim with `retry_of` lineage;
    /// the source batch is never changed. OOM-killed cases get their memory doubled for that
    /// job only, compounding over retries up to 16 GB.
    RetryFailed(RetryArgs),
    /// Line up two batches of an output directory by case id (a batch and its retry-failed
    /// child, or any two runs): cases that flipped, pass-rate and score deltas. Reads the
    /// bundles only.
    Diff {
        /// The batch compared from.
        a: String,
        /// The batch compared to.
        b: String,
        /// Root of result bundles holding the batches.
        #[arg(long, default_value = "logs/batch")]
        output_dir: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The batches of an output directory with their case counts and outcome.
    List {
        /// Root of result bundles holding the batches.
        #[arg(long, default_value = "logs/batch")]
        output_dir: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Export a run's workflow history as JSON (for replay tests and bug reports).
    History {
        #[command(flatten)]
        batch: BatchRef,
        /// The run to export (default: the latest).
        #[arg(long)]
        run_id: Option<String>,
        /// The history of this runtime's circuit breaker (a runtime of the batch's plan)
        /// instead of the batch's.
        #[arg(long)]
        breaker: Option<String>,
        /// The history of the shared pace the batch's plan names (`defaults.rate.rate_key`)
        /// instead of the batch's.
        #[arg(long, conflicts_with = "breaker")]
        pace: bool,
        /// The history of the slots of this shared runtime (an agent of the batch's plan)
        /// instead of the batch's.
        #[arg(long, conflicts_with_all = ["breaker", "pace"])]
        slots: Option<String>,
        /// Where to write the history.
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Debug, Clone, Args)]
pub struct ManifestArgs {
    /// A YAML/JSON manifest, a JSONL task list (one task per line), or a batch_v1 manifest.
    #[arg(long)]
    pub manifest: PathBuf,
    /// Batch id (required for JSONL/batch_v1 when the file name is not a good id).
    #[arg(long)]
    pub batch_id: Option<String>,
    /// Active case limit, 1..=512 (overrides defaults.concurrency).
    #[arg(long, alias = "concurrency")]
    pub parallelism: Option<u32>,
    /// Extra whole-case attempts after retryable infra failures, 0..=5.
    #[arg(long)]
    pub max_retries: Option<u32>,
    /// Runtime for every case that names none itself: local-process, fake (a simulation),
    /// or a name from the runtimes table; `a,b` spreads the cases over several.
    #[arg(long, value_name = "NAME[,NAME...]")]
    pub runtime: Option<String>,
    /// YAML/JSON file whose only key is `runtimes:` (name → kind, endpoint, token source,
    /// TLS CA), merged with the manifest's own table.
    #[arg(long, value_name = "FILE")]
    pub runtimes: Option<PathBuf>,
    /// Harness command for every case (run by `sh -c`; a program path such as `./run.sh`
    /// is resolved against the current directory).
    #[arg(long)]
    pub harness: Option<String>,
    /// Evaluator command for every case (run by `sh -c`; a program path is resolved against
    /// the current directory).
    #[arg(long)]
    pub evaluator: Option<String>,
    /// YAML/JSON file of settings for every case (what a JSONL task list has no place for):
    /// written as in a manifest, a `defaults:` object and optionally `summary:`, or the
    /// defaults' fields alone at its top level. The manifest's own settings win over it.
    #[arg(long, value_name = "FILE")]
    pub defaults: Option<PathBuf>,
    /// Warn when the batch has more cases than this.
    #[arg(long)]
    pub max_cases: Option<usize>,
}

#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// Temporal frontend address (host:port). Default: TEMPORAL_ADDRESS, a temporal.toml
    /// profile, or else the embedded dev server under the output directory.
    #[arg(long)]
    pub address: Option<String>,
    /// Temporal namespace (default: TEMPORAL_NAMESPACE or "default").
    #[arg(long)]
    pub namespace: Option<String>,
    /// Profile of temporal.toml to use.
    #[arg(long)]
    pub profile: Option<String>,
}

/// Where a worker or an agent serves its metrics and probes.
#[derive(Debug, Clone, Args)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics at `/metrics` (a worker: the Temporal SDK's worker metrics
    /// and casebatch's own; an agent: its jobs by state and envelope use), and `/healthz` and
    /// `/readyz` for probes, on this address (e.g. 127.0.0.1:9464). Unauthenticated: a
    /// non-loopback address also needs --metrics-public.
    #[arg(long, value_name = "ADDR")]
    pub metrics_bind: Option<std::net::SocketAddr>,
    /// Allow --metrics-bind on a non-loopback address (a pod IP that Prometheus and the
    /// kubelet reach). The endpoints carry counts and timings, never a secret.
    #[arg(long, requires = "metrics_bind")]
    pub metrics_public: bool,
    /// Write the address the listener bound to this file once it listens, for `casebatch
    /// health --address-file`: with port 0, replicas that share a network namespace each get
    /// their own port, and their health check still finds it.
    #[arg(long, value_name = "FILE", requires = "metrics_bind")]
    pub metrics_address_file: Option<PathBuf>,
}

impl MetricsArgs {
    /// Where to serve, refused off loopback unless asked for on purpose.
    pub fn listen(&self) -> Result<Option<casebatch_telemetry::Listen>, CliError> {
        match self.metrics_bind {
            Some(addr) if !addr.ip().is_loopback() && !self.metrics_public => {
                Err(CliError::usage(format!(
                    "--metrics-bind {addr} is not a loopback address and the endpoint is \
                     unauthenticated: add --metrics-public to serve it there on purpose, or \
                     bind 127.0.0.1"
                )))
            }
            Some(bind) => Ok(Some(casebatch_telemetry::Listen {
                bind,
                address_file: self.metrics_address_file.clone(),
            })),
            None => Ok(None),
        }
    }
}

/// `casebatch health`: one probe of a worker's or an agent's listener, for a container's
/// HEALTHCHECK (the images have no curl).
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["address", "address_file"])))]
pub struct HealthArgs {
    /// The listener's address (the worker's or agent's `--metrics-bind`), e.g. 127.0.0.1:9464.
    #[arg(long, value_name = "ADDR")]
    pub address: Option<std::net::SocketAddr>,
    /// The file the process wrote its bound address to (its `--metrics-address-file`).
    #[arg(long, value_name = "FILE")]
    pub address_file: Option<PathBuf>,
    /// Probe `/readyz` (connected and serving) instead of `/healthz` (the process answers).
    #[arg(long)]
    pub ready: bool,
    /// Seconds to wait for the answer.
    #[arg(long, default_value_t = 3)]
    pub timeout_secs: u64,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub manifest: ManifestArgs,
    /// Root of result bundles (`<output-dir>/<batch_id>/`).
    #[arg(long, default_value = "logs/batch")]
    pub output_dir: PathBuf,
    /// Plan only: write batch_plan.json and execute nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the outcome as JSON on stdout (progress stays on stderr).
    #[arg(long)]
    pub json: bool,
    /// Do not run an in-process worker (standalone `casebatch worker` replicas do the work).
    #[arg(long)]
    pub no_worker: bool,
    /// When this batch is still running (an older run of the same plan, for example a
    /// re-fire), supersede that run (kill its jobs, keep its finished results) and replace
    /// it, instead of following it.
    #[arg(long)]
    pub supersede: bool,
    /// Continue-as-new after this many history events (default 10000).
    #[arg(long, hide = true)]
    pub history_budget: Option<u32>,
    /// No tail speculation: a straggler dealt from a `runtime:` list is never duplicated on
    /// another runtime of its list.
    #[arg(long)]
    pub no_speculation: bool,
    /// The run-history index that weighs `runtime:` lists (default: `CASEBATCH_HISTORY_DB`,
    /// else `<output-dir>/.casebatch-history.sqlite`).
    #[arg(long)]
    pub history_db: Option<PathBuf>,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    /// Serve the embedded engine's Temporal Web UI on a loopback port while this runs (its
    /// address is printed); a headless engine already running is restarted with it.
    #[arg(long)]
    pub ui: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ResumeArgs {
    #[command(flatten)]
    pub batch: BatchRef,
    /// Do not run an in-process worker (standalone `casebatch worker` replicas do the work).
    #[arg(long)]
    pub no_worker: bool,
    /// Also give failed and cancelled cases a new attempt.
    #[arg(long)]
    pub retry_failed: bool,
    /// Raise (or set) what the batch may spend, as `cost_usd=N`, `tokens=N` or both
    /// (`cost_usd=40,tokens=2000000`): a limit given replaces the plan's of the same name,
    /// for this run and the runs it continues as. What was spent is carried.
    #[arg(long, value_name = "LIMITS", value_parser = parse_budget)]
    pub budget: Option<casebatch_proto::Budget>,
    /// Serve the embedded engine's Temporal Web UI on a loopback port while this runs (its
    /// address is printed); a headless engine already running is restarted with it.
    #[arg(long)]
    pub ui: bool,
}

/// `--budget cost_usd=40,tokens=2000000`.
fn parse_budget(value: &str) -> Result<casebatch_proto::Budget, String> {
    let mut budget = casebatch_proto::Budget::default();
    for part in value.split(',').map(str::trim) {
        let (name, n) = part.split_once('=').ok_or_else(|| {
            format!("`{part}` is not NAME=LIMIT (write cost_usd=40 or tokens=2000000)")
        })?;
        match name.trim() {
            "cost_usd" => match n.trim().parse::<f64>() {
                Ok(c) if c.is_finite() && c > 0.0 => budget.cost_usd = Some(c),
                _ => return Err(format!("cost_usd `{n}` is not a positive number")),
            },
            "tokens" => match n.trim().parse::<u64>() {
                Ok(t) if t > 0 => budget.tokens = Some(t),
                _ => return Err(format!("tokens `{n}` is not a positive whole number")),
            },
            other => {
                return Err(format!(
                    "`{other}` is not a budget limit (write cost_usd=N or tokens=N)"
                ));
            }
        }
    }
    Ok(budget)
}

#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("selection").required(true).args(["failed", "case", "all"])))]
pub struct RerunArgs {
    #[command(flatten)]
    pub batch: BatchRef,
    /// Every case that did not succeed.
    #[arg(long)]
    pub failed: bool,
    /// These cases; repeatable. A task id selects every run of the task (with epochs,
    /// `TASK#1`, `TASK#2`, ...); a case id (`TASK#2`) selects one run.
    #[arg(long, value_name = "TASK_ID|CASE_ID")]
    pub case: Vec<String>,
    /// Every case.
    #[arg(long)]
    pub all: bool,
    /// Do not run an in-process worker (standalone `casebatch worker` replicas do the work).
    #[arg(long)]
    pub no_worker: bool,
}

#[derive(Debug, Clone, Args)]
pub struct SingleRunArgs {
    #[command(flatten)]
    pub manifest: ManifestArgs,
    /// The case to run: its task id, or with epochs one run of the task (`TASK#2`).
    #[arg(long = "case")]
    pub case_id: String,
    /// Root of result bundles (`<output-dir>/<batch_id>--<case_dir>/`).
    #[arg(long, default_value = "logs/batch")]
    pub output_dir: PathBuf,
    /// Serve the embedded engine's Temporal Web UI on a loopback port while this runs (its
    /// address is printed); a headless engine already running is restarted with it.
    #[arg(long)]
    pub ui: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Debug, Clone, Args)]
pub struct RetryArgs {
    #[command(flatten)]
    pub batch: BatchRef,
    /// Only re-run failures of this class (infra, config, harness, agent); repeatable.
    #[arg(long = "class")]
    pub classes: Vec<String>,
    /// Id of the new batch (default: <batch-id>-retry<N>).
    #[arg(long)]
    pub new_batch_id: Option<String>,
    /// Do not run an in-process worker (standalone `casebatch worker` replicas do the work).
    #[arg(long)]
    pub no_worker: bool,
}

#[derive(Debug, Clone, Args)]
pub struct LogsArgs {
    /// The batch (its id within the output directory).
    #[arg(long)]
    pub batch_id: String,
    /// Root of result bundles (`<output-dir>/<batch_id>/`).
    #[arg(long, default_value = "logs/batch")]
    pub output_dir: PathBuf,
    /// The case's id (its task id; `<task_id>#<epoch>` for a task run several times).
    #[arg(long)]
    pub case: String,
    /// Which attempt, from 1 (default: the latest).
    #[arg(long)]
    pub attempt: Option<u32>,
    /// The evaluator's logs instead of the harness's.
    #[arg(long)]
    pub evaluator: bool,
    /// Keep printing lines as they are written until the attempt's job ends.
    #[arg(long, short)]
    pub follow: bool,
}

#[derive(Debug, Clone, Args)]
pub struct BatchRef {
    /// The batch (its id within the output directory).
    #[arg(long)]
    pub batch_id: String,
    /// Root of result bundles (`<output-dir>/<batch_id>/`).
    #[arg(long, default_value = "logs/batch")]
    pub output_dir: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// With the embedded engine: the output directory whose dev server to join.
    #[arg(long, default_value = "logs/batch")]
    pub output_dir: PathBuf,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    /// Serve the embedded engine's Temporal Web UI on a loopback port while this runs (its
    /// address is printed); a headless engine already running is restarted with it.
    #[arg(long)]
    pub ui: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// `casebatch agent`. Without a token it listens on loopback only; any other address needs
/// TLS and a token. The token is never given on the command line: name the variable or the
/// file that holds it.
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// Address to listen on, e.g. 127.0.0.1:7070 (port 0 picks one; the bound address is
    /// written to <data-dir>/agent.addr once the agent serves).
    #[arg(long, value_name = "ADDR")]
    pub listen: String,
    /// The agent's directory: job table, attempt directories, lock. One agent at a time.
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,
    /// Jobs not yet ended, at most; a submit beyond it is refused (RUNTIME_FULL), never queued.
    #[arg(long, value_name = "N", default_value_t = casebatch_agent::DEFAULT_MAX_CONCURRENT)]
    pub max_concurrent: u32,
    /// Sum of the declared memory (resources.memory_mb) of jobs not yet ended, at most, in MiB.
    #[arg(long, value_name = "MB")]
    pub memory_budget_mb: Option<u64>,
    /// TLS certificate chain (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Name of the environment variable holding the bearer token every call must present.
    #[arg(long, value_name = "VAR", conflicts_with = "token_file")]
    pub token_env: Option<String>,
    /// File holding the bearer token every call must present.
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// How long an ended job's row and files stay on the agent after it ended (30m, 12h, 7d,
    /// or forever); a job nobody cleaned up is cleaned up before it is removed.
    #[arg(long, value_name = "DURATION", default_value = "7d")]
    pub keep_ended: String,
    /// `container`: run a job whose manifest asks for a container sandbox as a container on
    /// this host's engine (DOCKER_HOST, else the default socket). `none` (the default):
    /// such jobs are refused, never run on the host instead.
    #[arg(long, value_name = "KIND", default_value = "none", value_parser = ["none", "container"])]
    pub sandbox: String,
    #[command(flatten)]
    pub metrics: MetricsArgs,
}

// Flags → the library's typed inputs.

impl AgentArgs {
    pub fn config(&self) -> CliResult<casebatch_agent::AgentConfig> {
        let listen = self.listen.parse().map_err(|e| {
            CliError::usage(format!(
                "failed to read --listen {:?}: {e}; give an IP address and port such as 127.0.0.1:7070",
                self.listen
            ))
        })?;
        let tls = self
            .tls_cert
            .clone()
            .zip(self.tls_key.clone())
            .map(|(cert, key)| casebatch_agent::TlsFiles { cert, key });
        let token = match (&self.token_env, &self.token_file) {
            (Some(var), _) => Some(casebatch_agent::TokenSource::Env(var.clone())),
            (None, Some(path)) => Some(casebatch_agent::TokenSource::File(path.clone())),
            (None, None) => None,
        };
        let keep_ended =
            casebatch_agent::parse_keep_ended(&self.keep_ended).map_err(CliError::usage)?;
        Ok(casebatch_agent::AgentConfig {
            listen,
            data_dir: self.data_dir.clone(),
            max_concurrent: self.max_concurrent,
            memory_budget_mb: self.memory_budget_mb,
            tls,
            token,
            keep_ended,
            containers: self.sandbox == "container",
        })
    }
}

/// `--runtime a` names one runtime, `--runtime a,b` a list to spread the cases over.
fn runtime_flag(value: &str) -> RuntimeChoice {
    if value.contains(',') {
        RuntimeChoice::Spread(value.split(',').map(|n| n.trim().to_owned()).collect())
    } else {
        RuntimeChoice::One(value.to_owned())
    }
}

impl ManifestArgs {
    pub fn input(&self) -> CliResult<ManifestInput> {
        // `--runtime` may name a runtimes-table entry, so the manifest crate checks it (exit 2
        // with the declared names) once the table is known.
        let options = LoadOptions {
            batch_id: self.batch_id.clone(),
            overrides: Defaults {
                concurrency: self.parallelism,
                max_retries: self.max_retries,
                runtime: self.runtime.as_deref().map(runtime_flag),
                harness: self.harness.clone().map(CommandSpec::Shell),
                evaluator: self.evaluator.clone().map(CommandSpec::Shell),
                ..Defaults::default()
            },
            defaults_file: self.defaults.clone(),
            max_cases: self.max_cases,
            runtimes_file: self.runtimes.clone(),
        };
        Ok(ManifestInput {
            path: self.manifest.clone(),
            options,
        })
    }
}

impl EngineArgs {
    pub fn choice(&self) -> EngineChoice {
        EngineChoice {
            address: self.address.clone(),
            namespace: self.namespace.clone(),
            profile: self.profile.clone(),
            ui: false,
        }
    }
}

impl BatchRef {
    pub fn location(&self) -> CliResult<BatchLocation> {
        Ok(BatchLocation::new(&self.output_dir, &self.batch_id)?)
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use crate::exit::tests_support::{help_entries, table};

    /// `casebatch --help` and `-h` list every code of the table, with its meaning, and no other.
    #[test]
    fn the_help_lists_exactly_the_table_s_exit_codes() {
        let codes: Vec<u8> = crate::exit::Exit::ALL.iter().map(|e| e.code()).collect();
        assert_eq!(codes, (0..=6).collect::<Vec<u8>>(), "every code, in order");
        let mut command = super::Cli::command();
        for help in [command.render_long_help(), command.render_help()] {
            let help = help.to_string();
            assert_eq!(help_entries(&help), table(), "{help}");
        }
    }

    /// Every flag and argument of every command says what it is for (`--help`, the man
    /// page and completions all show it).
    #[test]
    fn every_argument_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let path = format!("{path} {}", cmd.get_name());
            if cmd.get_about().is_none() && !path.ends_with(" help") {
                missing.push(format!("{path} (the command)"));
            }
            for arg in cmd.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} --{}", arg.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &path, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "", &mut missing);
        assert!(
            missing.is_empty(),
            "without help text:\n{}",
            missing.join("\n")
        );
    }

    /// Issue 58: `batch prepare --json` was refused although every other command takes it
    /// (and prepare prints JSON anyway).
    #[test]
    fn prepare_takes_json_as_every_command_does() {
        use clap::Parser;
        let parsed = super::Cli::try_parse_from([
            "casebatch",
            "batch",
            "prepare",
            "--manifest",
            "m.yaml",
            "--json",
        ]);
        assert!(parsed.is_ok(), "{}", parsed.unwrap_err());
    }

    /// Every flag a help text names is one. Quoted (`` `resume --budget` ``, `` `--json` ``),
    /// a flag some command takes, that command's when the quote names it first; written
    /// plainly in a command's help, one of that command's own. Issue 58: `set-concurrency
    /// --help` spoke of a resume's own --concurrency, which `resume` does not take.
    #[test]
    fn every_flag_a_help_text_names_exists() {
        use std::collections::{BTreeMap, BTreeSet};
        type Flags = BTreeMap<String, BTreeSet<String>>;
        fn gather(cmd: &clap::Command, flags: &mut Flags, texts: &mut Vec<(String, String)>) {
            let name = cmd.get_name().to_string();
            let own = flags.entry(name.clone()).or_default();
            for arg in cmd.get_arguments() {
                own.extend(arg.get_long().map(str::to_string));
                own.extend(
                    arg.get_all_aliases()
                        .into_iter()
                        .flatten()
                        .map(str::to_string),
                );
            }
            let mut add = |t: Option<&clap::builder::StyledStr>| {
                if let Some(t) = t {
                    texts.push((name.clone(), t.to_string()));
                }
            };
            add(cmd.get_about());
            add(cmd.get_long_about());
            for arg in cmd.get_arguments() {
                add(arg.get_help());
                add(arg.get_long_help());
            }
            for sub in cmd.get_subcommands() {
                gather(sub, flags, texts);
            }
        }
        let (mut flags, mut texts) = (Flags::new(), Vec::new());
        gather(&super::Cli::command(), &mut flags, &mut texts);
        // Global flags (`--log-format`) belong to every command.
        let global: BTreeSet<String> = super::Cli::command()
            .get_arguments()
            .filter(|a| a.is_global_set())
            .filter_map(|a| a.get_long().map(str::to_string))
            .collect();
        let every: BTreeSet<&String> = flags.values().flatten().collect();
        let flag_of = |word: &str| {
            let flag = word.strip_prefix("--")?.split('=').next()?;
            let flag = flag.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
            (!flag.is_empty()).then(|| flag.to_string())
        };
        let mut wrong = Vec::new();
        for (command, text) in &texts {
            // Odd pieces are inside backticks.
            for (i, piece) in text.split('`').enumerate() {
                let words: Vec<&str> = piece
                    .split(|c: char| c.is_whitespace() || "()[],;".contains(c))
                    .filter(|w| !w.is_empty())
                    .collect();
                let quoted = i % 2 == 1;
                let quoted_command = words
                    .iter()
                    .take_while(|w| !w.starts_with('-'))
                    .last()
                    .filter(|w| quoted && flags.contains_key(**w));
                for flag in words.iter().filter_map(|w| flag_of(w)) {
                    if global.contains(&flag) {
                        continue;
                    }
                    let takes = match (quoted, quoted_command) {
                        (true, Some(named)) => flags[*named].contains(&flag),
                        (true, None) => every.contains(&flag),
                        (false, _) => flags[command].contains(&flag),
                    };
                    if !takes {
                        wrong.push(format!("{command}: --{flag}: {text}"));
                    }
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}
