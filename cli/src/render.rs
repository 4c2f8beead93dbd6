//! Everything the CLI prints: live progress (a bar on a terminal, plain lines otherwise),
//! outcomes, status and reports. Simulated runs say so in every output.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Instant;

use casebatch_bundle::stats::ScoresOver;
use casebatch_bundle::{Bundle, Lineage};
use casebatch_control::{
    DriveEvent, Ending, HistoryView, Observer, ReportView, RunReport, StatusView,
};
use casebatch_manifest::{CaseIdentity, Plan, PlanHead};
use casebatch_proto::share::RuntimeShare;
use casebatch_proto::{BatchEnd, BatchOutcome, BatchStatus, Counters, Counts, OOM_BOOST_CAP_MB};

use casebatch_views::{RunEnd, RunView, StatusSource};

use crate::exit::Exit;

/// `[simulation] ` when any case runs on the fake runtime.
pub fn sim_tag<C: CaseIdentity>(plan: &Plan<C>) -> &'static str {
    if plan.simulated() {
        "[simulation: fake runtime, nothing executed] "
    } else {
        ""
    }
}

/// Draws a running batch on stderr: a width-aware bar with counts, rate and ETA on a
/// terminal (redrawn in place), a plain line per change (at most every 2 s) otherwise, and
/// events when stderr carries JSON logs.
pub struct Progress {
    tty: bool,
    tag: &'static str,
    batch_id: String,
    total: u32,
    last: Option<Counts>,
    last_print: Instant,
    bar: Option<indicatif::ProgressBar>,
}

impl Default for Progress {
    fn default() -> Self {
        Self {
            tty: std::io::stderr().is_terminal() && !crate::logs::json(),
            tag: "",
            batch_id: String::new(),
            total: 0,
            last: None,
            last_print: Instant::now(),
            bar: None,
        }
    }
}

/// `[####----] 12/50 · 4 run · 11 ok · 1 failed · Running · 3.2/s · eta 12s`: the bar takes
/// what the terminal's width leaves (indicatif). A simulation says so as `[sim]`.
fn progress_bar(tag: &str, total: u32) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(u64::from(total)),
        indicatif::ProgressDrawTarget::stderr_with_hz(4),
    );
    let style = indicatif::ProgressStyle::with_template(
        "{prefix}[{wide_bar}] {pos}/{len} · {msg} · {rate} · eta {eta}",
    )
    .expect("the template is valid")
    .with_key(
        "rate",
        |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{:.1}/s", state.per_sec());
        },
    )
    .progress_chars("#>-");
    bar.set_style(style);
    bar.set_prefix(if tag.is_empty() { "" } else { "[sim] " });
    bar
}

impl Observer for Progress {
    fn on(&mut self, event: DriveEvent<'_>) {
        match event {
            DriveEvent::Batch(plan) => {
                self.tag = sim_tag(plan);
                self.batch_id = plan.batch_id.clone();
                self.total = plan.cases.len() as u32;
                if self.tty {
                    self.bar = Some(progress_bar(self.tag, self.total));
                }
            }
            DriveEvent::Reattached => {
                self.line(&format!("re-attaching to running batch {}", self.batch_id));
            }
            DriveEvent::Superseding => self.line(&format!(
                "superseding the running batch {}: killing its jobs, then replacing it",
                self.batch_id
            )),
            DriveEvent::Requeued(n) => {
                self.line(&format!("{n} finished case(s) get a new attempt"))
            }
            DriveEvent::Started {
                workflow_id,
                cases,
                concurrency,
            } => self.line(&format!(
                "batch {}: {cases} case(s), concurrency {concurrency}, workflow {workflow_id}",
                self.batch_id
            )),
            DriveEvent::Status(s) => self.update(s),
            DriveEvent::EngineUnreachable(e) => {
                self.line(&format!(
                    "engine unreachable ({e}); waiting for it to come back"
                ));
            }
            DriveEvent::EngineBack => self.line("engine reachable again"),
            DriveEvent::EngineUi(ui) => self.line(&format!(
                "Temporal Web UI: {ui}/namespaces/default/workflows/casebatch-{} (loopback only; \
                 served while this command runs)",
                self.batch_id
            )),
            DriveEvent::Unsearchable => self.line(
                "note: this namespace has no Casebatch* search attributes, so `temporal workflow list --query` cannot find the batch (docs/operations.md: Finding batches with Temporal's tools)",
            ),
            DriveEvent::NoWorker { task_queue } => self.line(&format!(
                "no worker polls task queue {task_queue}: nothing runs until one does (start `casebatch worker` with the same engine flags, or run without --no-worker); still waiting"
            )),
        }
    }
}

impl Progress {
    fn line(&mut self, msg: &str) {
        if crate::logs::json() {
            tracing::info!(target: "casebatch::progress", batch = %self.batch_id, "{}{msg}", self.tag);
            return;
        }
        match &self.bar {
            Some(bar) => bar.println(format!("{}{msg}", self.tag)),
            None => eprintln!("{}{msg}", self.tag),
        }
    }

    fn update(&mut self, s: &BatchStatus) {
        let c = &s.counts;
        if crate::logs::json() {
            if self.last.as_ref() != Some(c) {
                tracing::info!(
                    target: "casebatch::progress",
                    batch = %self.batch_id,
                    done = c.done(),
                    total = self.total,
                    running = c.running,
                    succeeded = c.succeeded,
                    failed = c.failed,
                    cancelled = c.cancelled,
                    phase = ?s.phase,
                    "progress"
                );
                self.last = Some(c.clone());
            }
        } else if let Some(bar) = &self.bar {
            bar.set_position(u64::from(c.done()));
            bar.set_message(format!(
                "{} run · {} ok · {} failed · {:?}",
                c.running,
                c.succeeded,
                c.failed + c.cancelled,
                s.phase
            ));
        } else if self.last.as_ref() != Some(c) && self.last_print.elapsed().as_secs() >= 2 {
            eprintln!(
                "{}progress: {}/{} done, {} running, {} succeeded, {} failed, {} cancelled ({:?})",
                self.tag,
                c.done(),
                self.total,
                c.running,
                c.succeeded,
                c.failed,
                c.cancelled,
                s.phase
            );
            self.last = Some(c.clone());
            self.last_print = Instant::now();
        }
    }

    /// Takes the bar away before the outcome is printed.
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

pub fn warnings(plan: &Plan) {
    for w in &plan.warnings {
        if crate::logs::json() {
            tracing::warn!(target: "casebatch::plan", "{w}");
        } else {
            eprintln!("warning: {w}");
        }
    }
}

pub fn json(value: &impl serde::Serialize) {
    say!(
        "{}",
        serde_json::to_string_pretty(value).expect("serializes")
    );
}

/// The run's outcome as one JSON object on stdout (`--json`); same exit code as the text.
pub fn run_report_json(report: &RunReport) -> Exit {
    let plan = &report.plan;
    let (end, counts, counters) = match &report.ending {
        Ending::Ran(o) => (
            o.end.into(),
            o.status.counts.clone(),
            Some(o.status.counters.clone()),
        ),
        Ending::AlreadyComplete(summary) => {
            (RunEnd::AlreadyComplete, summary_counts(summary), None)
        }
    };
    json(&RunView {
        batch_id: plan.batch_id.clone(),
        bundle: report.bundle.root().to_path_buf(),
        simulated: !sim_tag(plan).is_empty(),
        end,
        counts,
        counters,
    });
    report.verdict().into()
}

/// A finished batch's summary counts (by state name) as a run's counts: retrying cases are
/// waiting for their next attempt, so they count as queued.
fn summary_counts(summary: &casebatch_bundle::BatchSummary) -> Counts {
    let n = |state: &str| summary.count(state) as u32;
    Counts {
        queued: n("queued") + n("retrying"),
        running: n("running"),
        succeeded: n("succeeded"),
        failed: n("failed"),
        cancelled: n("cancelled"),
    }
}

/// Prints how a run ended; returns the exit code it deserves.
pub fn run_report(report: &RunReport) -> Exit {
    let plan = &report.plan;
    match &report.ending {
        Ending::Ran(outcome) => self::outcome(&report.bundle, plan, outcome),
        Ending::AlreadyComplete(summary) => say!(
            "batch {} is already complete: {}/{} succeeded; nothing re-run",
            plan.batch_id,
            summary.succeeded(),
            summary.total
        ),
    }
    report.verdict().into()
}

fn outcome(bundle: &Bundle, plan: &PlanHead, o: &BatchOutcome) {
    let c = &o.status.counts;
    let tag = sim_tag(plan);
    say!(
        "{tag}batch {} {}: {} succeeded, {} failed, {} cancelled, {} queued (of {})",
        plan.batch_id,
        match o.end {
            BatchEnd::Completed => "completed",
            BatchEnd::Drained => "drained",
            BatchEnd::Cancelled => "cancelled",
            BatchEnd::Superseded => "superseded",
            BatchEnd::BudgetExhausted => "stopped: budget exhausted (resume --budget continues it)",
        },
        c.succeeded,
        c.failed,
        c.cancelled,
        c.queued,
        c.total()
    );
    let k = &o.status.counters;
    if k.adopted + k.redispatched + k.retries + k.oom_boosts + k.cleanup_unconfirmed > 0 {
        say!("{}", counters_line(k));
    }
    if let Some(line) = spread_line(k) {
        say!("{line}");
    }
    if let Some(line) = rate_line(k) {
        say!("{line}");
    }
    if let Some(line) = outage_line(k) {
        say!("{line}");
    }
    if let Some(line) = prepared_line(k) {
        say!("{line}");
    }
    spread(plan);
    if let Some(first) = o.status.unrecorded.first() {
        say!(
            "  {} failed case(s) could not be recorded by their worker; written from the engine's \
             record. First: {}",
            o.status.unrecorded.len(),
            first.failure
        );
    }
    if c.queued > 0 {
        // Resumed as it is, a spent budget ends the run at once.
        let raise = match o.end {
            BatchEnd::BudgetExhausted => " --budget cost_usd=<more>",
            _ => "",
        };
        say!(
            "  queued work remains: casebatch batch resume --batch-id {} --output-dir {}{raise}",
            plan.batch_id,
            bundle
                .root()
                .parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        );
    }
    say!("  bundle: {}", bundle.root().display());
}

/// Spillovers, circuit effects and tail speculation, when a batch had any.
fn spread_line(k: &Counters) -> Option<String> {
    (k.spillovers + k.circuit_skips + k.width_changes + k.speculations > 0).then(|| {
        format!(
            "  spillovers {} · dispatches skipped on open circuits {} · width changes {} · \
             tail speculations {} (duplicate won {})",
            k.spillovers, k.circuit_skips, k.width_changes, k.speculations, k.speculation_wins
        )
    })
}

/// Environments provisioned ahead, when the batch provisioned any.
fn prepared_line(k: &Counters) -> Option<String> {
    (k.prepared > 0).then(|| {
        format!(
            "  provisioned ahead {} · released unused {}",
            k.prepared, k.released
        )
    })
}

/// How the plan's `runtime:` lists were dealt, when by weight.
pub fn spread(plan: &PlanHead) {
    if let Some(line) = spread_weights_line(plan) {
        say!("{line}");
    }
}

fn spread_weights_line(plan: &PlanHead) -> Option<String> {
    let spread = plan.spread.as_ref()?;
    let weights: Vec<String> = spread
        .weights
        .iter()
        .map(|(name, w)| format!("{name} {w}"))
        .collect();
    let mut dealt: BTreeMap<&str, usize> = BTreeMap::new();
    for case in plan.cases.iter().filter(|c| !c.runtime_spread.is_empty()) {
        *dealt
            .entry(case.runtime_name.as_deref().unwrap_or("?"))
            .or_default() += 1;
    }
    let dealt: Vec<String> = dealt.iter().map(|(n, c)| format!("{n} {c}")).collect();
    Some(format!(
        "  runtime lists dealt by weight: {} ({}); cases: {}",
        weights.join(" · "),
        spread.source,
        dealt.join(" · ")
    ))
}

/// `casebatch history`: one row per harness and runtime.
pub fn history_view(view: &HistoryView) {
    let r = &view.refreshed;
    say!(
        "run history {} ({} bundle(s) indexed now, {} unchanged, {} forgotten)",
        view.index.display(),
        r.indexed,
        r.unchanged,
        r.forgotten
    );
    for skipped in &r.skipped {
        say!("  skipped {skipped}");
    }
    if view.medians.is_empty() {
        say!("  no finished attempt with a duration yet");
        return;
    }
    say!(
        "  {:<16}  {:<12}  {:<20}  {:>8}  {:>10}  {:>9}",
        "harness",
        "version",
        "runtime",
        "attempts",
        "median",
        "succeeded"
    );
    for m in &view.medians {
        say!(
            "  {:<16}  {:<12}  {:<20}  {:>8}  {:>9.1}s  {:>9}",
            m.harness,
            m.harness_version.as_deref().unwrap_or("-"),
            m.runtime,
            m.attempts,
            m.median_ms as f64 / 1000.0,
            m.succeeded
        );
    }
}

/// `cost_usd 1.25 · input_tokens 12000 · output_tokens 3000`: whole numbers as such, the rest
/// to four decimals.
fn usage_text(u: &casebatch_proto::Usage) -> String {
    let number = |x: f64| {
        if x.fract() == 0.0 && x.abs() < 1e15 {
            format!("{x:.0}")
        } else {
            let s = format!("{x:.4}");
            s.trim_end_matches('0').to_string()
        }
    };
    let parts: Vec<String> =
        u.0.iter()
            .map(|(k, v)| format!("{k} {}", number(*v)))
            .collect();
    parts.join(" · ")
}

/// `75.0% (3 of 4 finished cases …)`, or `- (no finished case)`.
fn rate(r: &casebatch_bundle::stats::Rate) -> String {
    match r.rate {
        Some(x) => format!(
            "{:.1}% ({} of {} {})",
            100.0 * x,
            r.passed,
            r.of,
            r.denominator
        ),
        None => format!("- (no {})", r.denominator),
    }
}

/// `mean 0.500 ± 0.289` (`± -` below two values).
fn mean_and_error(sc: &casebatch_bundle::mean::ScoreStat) -> String {
    let stderr = sc.stderr.map_or("-".to_string(), |e| format!("{e:.3}"));
    format!("mean {:.3} ± {stderr}", sc.mean)
}

/// pass@k of the batch with its standard error, then each task's runs.
fn task_lines(t: &casebatch_bundle::epochs::TaskStats) {
    for p in &t.pass_at_k {
        match p.mean {
            Some(m) => say!(
                "  pass@{}: {} (mean of {} {}; standard error over tasks)",
                p.k,
                percent_and_error(m, p.stderr),
                p.of,
                p.denominator
            ),
            None => say!("  pass@{}: - (no {})", p.k, p.denominator),
        }
    }
    if let Some(note) = t.reruns_note() {
        say!("  note: {note}");
    }
    // A long task list belongs in the JSON, not on a terminal.
    const MOST_ROWS: usize = 50;
    if t.rows.len() > MOST_ROWS {
        say!(
            "  {} tasks: their runs are in batch_summary.json (stats.tasks.rows)",
            t.rows.len()
        );
        return;
    }
    for row in &t.rows {
        let at: Vec<String> = row
            .pass_at_k
            .iter()
            .enumerate()
            .map(|(i, x)| format!("pass@{} {:.2}", i + 1, x))
            .collect();
        say!(
            "  task {}: {} of {} finished run(s) passed ({} planned{}){}{}",
            row.task_id,
            row.passed,
            row.finished,
            row.epochs,
            if row.reruns > 0 {
                format!(", {} re-run", row.reruns)
            } else {
                String::new()
            },
            if at.is_empty() { "" } else { " · " },
            at.join(" · ")
        );
    }
}

/// `50.0% ± 28.9%`, a share in percent with its standard error (`± -` below two tasks).
fn percent_and_error(mean: f64, stderr: Option<f64>) -> String {
    let stderr = stderr.map_or("-".to_string(), |e| format!("{:.1}%", 100.0 * e));
    format!("{:.1}% ± {stderr}", 100.0 * mean)
}

fn stats_lines(st: &casebatch_bundle::stats::BatchStats) {
    say!("  pass rate: {}", rate(&st.pass_rate));
    say!(
        "  pass rate excluding infra: {}",
        rate(&st.pass_rate_excluding_infra)
    );
    for (name, sc) in &st.scores {
        match st.scores_over {
            ScoresOver::Cases => say!(
                "  score {name}: {} (standard error, n={})",
                mean_and_error(sc),
                sc.n
            ),
            ScoresOver::Tasks => say!(
                "  score {name}: {} (mean of each task's mean over its runs; standard error \
                 clustered by task, n={} tasks)",
                mean_and_error(sc),
                sc.n
            ),
        }
    }
    for (name, sc) in &st.scores_unclustered {
        say!(
            "  score {name} over runs, unclustered: {} (n={} runs taken as independent, which \
             a task's runs are not: this standard error is too small)",
            mean_and_error(sc),
            sc.n
        );
    }
    if let Some(t) = &st.tasks {
        task_lines(t);
    }
    let secs = |ms: u64| format!("{:.1}s", ms as f64 / 1000.0);
    let percentiles = |d: &casebatch_bundle::stats::Durations| {
        format!(
            "p50 {} · p90 {} · p99 {} · max {}",
            secs(d.p50_ms),
            secs(d.p90_ms),
            secs(d.p99_ms),
            secs(d.max_ms)
        )
    };
    if let Some(d) = &st.durations {
        say!("  attempt durations: {} ({} attempts)", percentiles(d), d.n);
    }
    for (stage, d) in &st.stage_durations {
        let stage = stage.as_str();
        say!(
            "  stage durations, {stage}: {} ({} runs)",
            percentiles(d),
            d.n
        );
    }
}

pub fn diff(d: &casebatch_control::BatchDiff) {
    say!("{} → {}", d.a, d.b);
    if !d.same_task_list {
        say!("  note: the two batches ran different task lists; cases are matched by id");
    }
    let delta = |r: &casebatch_control::compare::RateDelta| match r.delta {
        Some(x) => format!("{:+.1} points", 100.0 * x),
        None => "-".into(),
    };
    say!(
        "  pass rate: {} → {} ({})",
        rate(&d.pass_rate.a),
        rate(&d.pass_rate.b),
        delta(&d.pass_rate)
    );
    say!(
        "  pass rate excluding infra: {} → {} ({})",
        rate(&d.pass_rate_excluding_infra.a),
        rate(&d.pass_rate_excluding_infra.b),
        delta(&d.pass_rate_excluding_infra)
    );
    let paired = |p: &casebatch_control::compare::PairedDelta| match &p.ci95 {
        Some(ci) => format!(
            "{:+.3}, 95% CI [{:+.3}, {:+.3}], n={}",
            p.delta, ci.low, ci.high, p.n
        ),
        None => format!("{:+.3}, n={}", p.delta, p.n),
    };
    if d.paired_pass_rate.n > 0 {
        let p = &d.paired_pass_rate;
        say!(
            "  pass rate over cases finished in both: {:.1}% → {:.1}% ({})",
            100.0 * p.mean_a,
            100.0 * p.mean_b,
            paired(p)
        );
    }
    for (name, s) in &d.scores {
        say!(
            "  score {name}: {:.3} → {:.3} ({})",
            s.mean_a,
            s.mean_b,
            paired(s)
        );
    }
    say!("  flipped (finished in both): {}", d.flipped.len());
    for f in &d.flipped {
        say!("    {:<29} {} → {}", truncate(&f.case_id, 29), f.from, f.to);
    }
    if !d.not_finished.is_empty() {
        say!("  not finished in one of them: {}", d.not_finished.len());
        for f in &d.not_finished {
            say!("    {:<29} {} → {}", truncate(&f.case_id, 29), f.from, f.to);
        }
    }
    for (side, ids) in [(&d.a, &d.only_in_a), (&d.b, &d.only_in_b)] {
        if !ids.is_empty() {
            say!("  only in {side}: {}", ids.join(", "));
        }
    }
}

pub fn list(listed: &[casebatch_control::Listed]) {
    if listed.is_empty() {
        say!("no batch in this output directory");
        return;
    }
    say!(
        "  batch                          cases  outcome        pass rate  started (UTC)     \
         took      counts"
    );
    for b in listed {
        let counts: Vec<String> = b.counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
        say!(
            "  {:<30} {:>5}  {:<14} {:>9}  {:<16}  {:<8}  {}",
            truncate(&b.batch_id, 30),
            b.cases,
            b.outcome,
            b.pass_rate
                .map_or("-".into(), |r| format!("{:.1}%", 100.0 * r)),
            b.started_at_ms.map_or("-".into(), utc_minute),
            match (b.started_at_ms, b.duration_ms) {
                (_, Some(ms)) => took(ms),
                (Some(_), None) => "not ended".into(),
                (None, None) => "-".into(),
            },
            counts.join(" · ")
        );
    }
}

/// Rate-limited attempts, when a batch had any.
fn rate_line(k: &Counters) -> Option<String> {
    (k.rate_limited > 0).then(|| {
        format!(
            "  rate limited: {} attempt(s) waited and were retried on their own cap · width cut \
             {} time(s)",
            k.rate_limited, k.rate_width_cuts
        )
    })
}

/// Jobs of runtimes that stopped answering, when a batch had any.
fn outage_line(k: &Counters) -> Option<String> {
    (k.reattached + k.stranded + k.paid_twice > 0).then(|| {
        format!(
            "  runtimes that stopped answering: jobs asked about again {} · attempts stranded {} \
             · jobs paid for twice {}",
            k.reattached, k.stranded, k.paid_twice
        )
    })
}

/// `temporal actions 123 (2.1 per case): activities 80 · heartbeats 20 · ...`, zero kinds left out.
fn actions_line(a: &casebatch_proto::TemporalActions, cases: usize) -> String {
    let kinds: Vec<String> = a
        .by_kind()
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    let per_case = if cases > 0 {
        format!(" ({:.1} per case)", a.total() as f64 / cases as f64)
    } else {
        String::new()
    };
    if kinds.is_empty() {
        return format!("  temporal actions {}{per_case}", a.total());
    }
    format!(
        "  temporal actions {}{per_case}: {}",
        a.total(),
        kinds.join(" · ")
    )
}

/// One shared runtime as the batch sees it: its slots, its fair share, and what waits.
fn share_line(r: &RuntimeShare) -> String {
    let share = format!("{:.1}", f64::from(r.fair_share_milli) / 1000.0);
    let mut line = format!(
        "  runtime {} (shared): holds {} of {} slots · fair share {} · {} waiting",
        r.runtime,
        r.held,
        r.capacity,
        share.strip_suffix(".0").unwrap_or(&share),
        r.waiting
    );
    if let Some(position) = r.position {
        line += &format!(" · next in line after {position}");
    }
    if let Some(since) = r.waiting_since_ms {
        line += &format!(" · held back by other batches since {}", clock(since));
    }
    line
}

fn counters_line(k: &Counters) -> String {
    format!(
        "  adopted {} · re-dispatched {} · retries {} · OOM boosts {} · cleanup unconfirmed {}",
        k.adopted, k.redispatched, k.retries, k.oom_boosts, k.cleanup_unconfirmed
    )
}

pub fn status(view: &StatusView) {
    let (plan, s) = (&view.plan, &view.status);
    let c = &s.counts;
    if view.source != StatusSource::Workflow && view.source != StatusSource::Result {
        return status_from_bundle(view);
    }
    say!(
        "{}batch {}: {:?}{} · segment {} · concurrency {}",
        sim_tag(plan),
        s.batch_id,
        s.phase,
        if view.live { "" } else { " (not running)" },
        s.segment,
        s.concurrency
    );
    say!(
        "  queued {} · running {} · succeeded {} · failed {} · cancelled {}",
        c.queued,
        c.running,
        c.succeeded,
        c.failed,
        c.cancelled
    );
    for e in &s.envelopes {
        let of = |limit: Option<u64>| limit.map_or(String::new(), |l| format!("/{l}"));
        say!(
            "  runtime {}: running {}{} · {}{} MB declared · {} waiting",
            e.runtime,
            e.running,
            of(e.max_concurrent.map(u64::from)),
            e.memory_mb,
            of(e.memory_budget_mb),
            e.waiting
        );
    }
    if let Some(share) = &s.share {
        say!(
            "  shares its runtimes at priority {} · weight {}",
            share.priority,
            share.weight
        );
    }
    for r in &s.shares {
        say!("{}", share_line(r));
    }
    if let Some(width) = s.width {
        say!(
            "  width {width} of {} while circuits are open",
            s.concurrency
        );
    }
    if let Some(width) = s.rate_width {
        say!(
            "  width {width} of {} while cases are rate limited (one back per finished case)",
            s.concurrency
        );
    }
    if let Some(line) = spread_weights_line(plan) {
        say!("{line}");
    }
    if let Some(ms) = s.speculate_after_ms {
        say!(
            "  tail speculation: a listed case in flight over {:.1}s gets a duplicate once all are dispatched",
            ms as f64 / 1000.0
        );
    }
    if !s.prepared.is_empty() {
        say!(
            "  provisioned ahead, next to start: {} case(s)",
            s.prepared.len()
        );
    }
    for c in &s.open_circuits {
        say!(
            "  runtime {}: circuit open (a probe may go at {})",
            c.runtime,
            clock(c.retry_at_ms)
        );
    }
    if let Some(spending) = &s.spending {
        let budget = s
            .budget
            .map_or(String::new(), |b| format!(" · budget {}", b.describe()));
        let spent = if spending.spent.is_empty() {
            "nothing reported yet".to_string()
        } else {
            usage_text(&spending.spent)
        };
        say!("  spent: {spent}{budget}");
    }
    say!("{}", counters_line(&s.counters));
    say!(
        "{}",
        actions_line(&s.counters.temporal_actions, plan.cases.len())
    );
    if let Some(line) = spread_line(&s.counters) {
        say!("{line}");
    }
    if let Some(line) = rate_line(&s.counters) {
        say!("{line}");
    }
    if let Some(line) = outage_line(&s.counters) {
        say!("{line}");
    }
    if !s.in_flight.is_empty() {
        let ids: Vec<&str> = s
            .in_flight
            .iter()
            .filter_map(|i| plan.case_id(*i))
            .collect();
        say!("  in flight: {}", ids.join(", "));
    }
    if !view.queued.is_empty() {
        let held: Vec<String> = view
            .queued
            .iter()
            .map(|q| {
                format!(
                    "{} (job {}: {})",
                    q.case_id,
                    q.job_id.as_deref().unwrap_or("being submitted"),
                    q.reason.as_deref().unwrap_or("no reason given")
                )
            })
            .collect();
        say!(
            "  queued by the scheduler, not running yet ({}): {}",
            held.len(),
            held.join(", ")
        );
    }
    for step in s.timeline.iter().rev().take(10).rev() {
        match step.case.and_then(|i| plan.case_id(i)) {
            Some(id) => say!("  · case {id}: {}", step.message),
            None => say!("  · {}", step.message),
        }
    }
    if let Some(end) = view.end {
        let how = match end {
            BatchEnd::Completed => "completed",
            BatchEnd::Drained => "drained (resume continues it)",
            BatchEnd::Cancelled => "cancelled",
            BatchEnd::Superseded => "superseded (its killed cases wait for the run replacing it)",
            BatchEnd::BudgetExhausted => "budget exhausted (resume --budget continues it)",
        };
        say!("  last run ended: {how}");
    }
}

/// A status no workflow gave: only what the cases' records in the bundle say, and why. What
/// only the workflow knows (its segment, what runs, its counters and Temporal actions) is
/// left out rather than shown as zeros.
fn status_from_bundle(view: &StatusView) {
    let (plan, s) = (&view.plan, &view.status);
    let c = &s.counts;
    let why = match (view.source, view.live) {
        (StatusSource::NoWorker, _) => {
            "not running: no runner or worker polls its task queue (its runner was stopped or \
             killed; jobs it started may still be running). `casebatch batch resume` continues \
             it and adopts them"
        }
        (_, true) => {
            "running, but no worker answered the status query in time (is a runner or worker \
             up?)"
        }
        (_, false) => "not running: the workflow ended without a result",
    };
    say!("{}batch {}: {why}", sim_tag(plan), s.batch_id);
    say!(
        "  from the cases' records in the bundle: not finished {} · succeeded {} · failed {} · \
         cancelled {}",
        c.queued + c.running,
        c.succeeded,
        c.failed,
        c.cancelled
    );
}

/// A workflow time (ms since the epoch) as `HH:MM:SS UTC`.
fn clock(at_ms: u64) -> String {
    let s = at_ms / 1000;
    format!("{:02}:{:02}:{:02} UTC", s / 3600 % 24, s / 60 % 60, s % 60)
}

/// Wall-clock ms since the epoch as `YYYY-MM-DD HH:MM` in UTC (days to a civil date by
/// Howard Hinnant's algorithm: no time-zone database needed for UTC).
fn utc_minute(at_ms: u64) -> String {
    let secs = at_ms / 1000;
    let days = (secs / 86_400) as i64 + 719_468;
    let era = days.div_euclid(146_097);
    let doe = days.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}",
        secs / 3600 % 24,
        secs / 60 % 60
    )
}

/// A span as people say it: `42s`, `3m05s`, `2h07m`.
fn took(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s / 60 % 60),
    }
}

pub fn report(view: &ReportView) {
    let s = &view.summary;
    say!(
        "{}report of batch {} ({} cases, {} attempts)",
        sim_tag(&view.plan),
        s.batch_id,
        s.total,
        s.attempts_total
    );
    let counts: Vec<String> = s.counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    say!("  cases: {}", counts.join(" · "));
    if let Some(lineage) = &s.lineage {
        lineage_lines(lineage);
    }
    if let Some(stats) = &s.stats {
        stats_lines(stats);
    }
    if let Some(usage) = &s.usage {
        let cases = s.rows.iter().filter(|r| r.usage.is_some()).count();
        let carried = match &s.lineage {
            Some(l) if l.carried > 0 => format!(
                "; what this batch ran only: its {} carried-over results were paid for by batch {}",
                l.carried,
                l.retry_of.as_deref().unwrap_or("?")
            ),
            _ => String::new(),
        };
        say!(
            "  usage: {} (over {cases} case(s){carried})",
            usage_text(usage)
        );
    }
    say!(
        "  recovery: {} attempt(s) adopted after a crash, {} re-dispatched",
        s.adopted_attempts,
        view.redispatched
    );
    say!(
        "  cleanup unconfirmed: {} · trace collection failed: {}",
        s.cleanup_unconfirmed,
        s.collect_failed
    );
    if s.speculative_losers > 0 {
        say!(
            "  tail speculation: {} attempt(s) lost the race (stopped, kept as evidence)",
            s.speculative_losers
        );
    }
    if s.stranded_attempts > 0 {
        say!(
            "  stranded: {} attempt(s) left on a runtime that stopped answering (cleaned up once \
             it answered, kept as evidence)",
            s.stranded_attempts
        );
    }
    if s.jobs_paid_twice > 0 {
        say!(
            "  jobs paid for twice: {} (speculation losers and stranded jobs their runtime held)",
            s.jobs_paid_twice
        );
    }
    if let Some(actions) = &s.temporal_actions {
        say!("{}", actions_line(actions, s.total));
    }
    if !s.cases_by_runtime.is_empty() {
        let ran: Vec<String> = s
            .cases_by_runtime
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        say!("  runtimes: {}", ran.join(" · "));
    }
    if !s.failures_by_stage_class.is_empty() {
        say!("  failures by stage/class:");
        for (k, v) in &s.failures_by_stage_class {
            say!("    {k}: {v}");
        }
        say!("  failures by code:");
        for (k, v) in &s.failures_by_code {
            say!("    {k}: {v}");
        }
    }
    say!("  case                          state      att  actor     verdict  cleanup  failure");
    for r in &s.rows {
        say!(
            "  {:<29} {:<10} {:>3}  {:<9} {:<8} {:<8} {}",
            truncate(&r.case_id, 29),
            r.state.as_str(),
            r.attempts,
            r.actor_status.as_deref().unwrap_or("-"),
            r.verdict.as_deref().unwrap_or("-"),
            r.cleanup_confirmed
                .map_or("-", |b| if b { "ok" } else { "NO" }),
            match (&r.failure_stage, &r.failure_class, &r.failure_code) {
                (Some(st), Some(cl), Some(co)) => format!("{st}/{cl}/{co}"),
                _ => String::new(),
            }
        );
    }
}

/// Where a retried or re-run batch's results come from, before its numbers.
fn lineage_lines(l: &casebatch_bundle::BatchLineage) {
    if let Some(source) = &l.retry_of {
        let recollected = if l.recollected > 0 {
            format!(
                " ({} of them with their trace collected again)",
                l.recollected
            )
        } else {
            String::new()
        };
        say!(
            "  retry of batch {source}: {} case(s) re-run here, {} carried over as they \
             were{recollected}",
            l.rerun,
            l.carried
        );
    }
    if l.rerun_in_place > 0 {
        say!(
            "  re-run in this batch: {} case(s) got a new attempt after they had finished \
             (batch rerun); their latest result counts",
            l.rerun_in_place
        );
    }
}

/// What `retry-failed` is about to do, before the new batch runs.
pub fn retry_plan(new_id: &str, lineage: &Lineage) {
    say!(
        "batch {new_id} retries {}: re-running {} failed case(s), carrying {} result(s){}",
        lineage.retry_of,
        lineage.rerun.len(),
        lineage.carried.len(),
        if lineage.memory_boost_mb.is_empty() {
            String::new()
        } else {
            format!(", {} with memory doubled", lineage.memory_boost_mb.len())
        }
    );
    if !lineage.recollected.is_empty() {
        say!(
            "  {} collect-failed case(s) re-collected without re-run ({} recovered)",
            lineage.recollected.len(),
            lineage.recovered.len()
        );
    }
    for id in &lineage.past_cap {
        say!(
            "  {id}: OOM-killed at the {OOM_BOOST_CAP_MB} MB cap; not re-run. Change the case's resources.memory_mb (or what it does)"
        );
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}
