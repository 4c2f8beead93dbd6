//! Everything the CLI prints: live progress (a bar on a terminal, plain lines otherwise),
//! outcomes, status and reports. Simulated runs say so in every output.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use casebatch_bundle::{BatchSummary, Bundle};
use casebatch_manifest::{Plan, RuntimeKind};
use casebatch_proto::{BatchOutcome, BatchStatus, Counts};

/// `[simulation] ` when any case runs on the fake runtime.
pub fn sim_tag(plan: &Plan) -> &'static str {
    if plan.cases.iter().any(|c| c.runtime == RuntimeKind::Fake) {
        "[simulation: fake runtime, nothing executed] "
    } else {
        ""
    }
}

pub struct Progress {
    tty: bool,
    tag: &'static str,
    total: u32,
    last: Option<Counts>,
    last_print: Instant,
    drawn: bool,
}

impl Progress {
    pub fn new(plan: &Plan) -> Self {
        Self {
            tty: std::io::stderr().is_terminal(),
            tag: sim_tag(plan),
            total: plan.cases.len() as u32,
            last: None,
            last_print: Instant::now(),
            drawn: false,
        }
    }

    pub fn line(&mut self, msg: &str) {
        self.clear();
        eprintln!("{}{msg}", self.tag);
    }

    pub fn update(&mut self, s: &BatchStatus) {
        let c = &s.counts;
        if self.tty {
            let width = 30usize;
            let done = c.done() as usize;
            let filled = (done * width)
                .checked_div(self.total as usize)
                .unwrap_or(width);
            eprint!(
                "\r{}[{}{}] {}/{} done · {} running · {} ok · {} failed · {:?}   ",
                self.tag,
                "#".repeat(filled),
                "-".repeat(width - filled),
                done,
                self.total,
                c.running,
                c.succeeded,
                c.failed + c.cancelled,
                s.phase
            );
            let _ = std::io::stderr().flush();
            self.drawn = true;
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

    fn clear(&mut self) {
        if self.drawn {
            eprintln!();
            self.drawn = false;
        }
    }

    pub fn finish(&mut self) {
        self.clear();
    }
}

pub fn outcome(bundle: &Bundle, plan: &Plan, o: &BatchOutcome) {
    let c = &o.status.counts;
    let tag = sim_tag(plan);
    say!(
        "{tag}batch {} {}: {} succeeded, {} failed, {} cancelled, {} queued (of {})",
        plan.batch_id,
        match o.end {
            casebatch_proto::BatchEnd::Completed => "completed",
            casebatch_proto::BatchEnd::Drained => "drained",
            casebatch_proto::BatchEnd::Cancelled => "cancelled",
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
    if c.queued > 0 {
        say!(
            "  queued work remains: casebatch batch resume --batch-id {} --output-dir {}",
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

fn counters_line(k: &casebatch_proto::Counters) -> String {
    format!(
        "  adopted {} · re-dispatched {} · retries {} · OOM boosts {} · cleanup unconfirmed {}",
        k.adopted, k.redispatched, k.retries, k.oom_boosts, k.cleanup_unconfirmed
    )
}

pub fn status(plan: &Plan, s: &BatchStatus, live: bool) {
    let c = &s.counts;
    say!(
        "{}batch {}: {:?}{} · segment {} · concurrency {}",
        sim_tag(plan),
        s.batch_id,
        s.phase,
        if live { "" } else { " (not running)" },
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
    say!("{}", counters_line(&s.counters));
    if !s.in_flight.is_empty() {
        let ids: Vec<&str> = s
            .in_flight
            .iter()
            .filter_map(|i| plan.cases.get(*i as usize).map(|c| c.case_id.as_str()))
            .collect();
        say!("  in flight: {}", ids.join(", "));
    }
    for step in s.timeline.iter().rev().take(10).rev() {
        say!("  · {}", with_case_id(plan, &step.message));
    }
}

pub fn report(plan: &Plan, s: &BatchSummary, redispatched: usize) {
    say!(
        "{}report of batch {} ({} cases, {} attempts)",
        sim_tag(plan),
        s.batch_id,
        s.total,
        s.attempts_total
    );
    let counts: Vec<String> = s.counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    say!("  cases: {}", counts.join(" · "));
    say!(
        "  recovery: {} attempt(s) adopted after a crash, {} re-dispatched",
        s.adopted_attempts,
        redispatched
    );
    say!(
        "  cleanup unconfirmed: {} · trace collection failed: {}",
        s.cleanup_unconfirmed,
        s.collect_failed
    );
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

/// History names cases by index to stay compact; people read ids.
fn with_case_id(plan: &Plan, message: &str) -> String {
    let named = message.strip_prefix("case ").and_then(|rest| {
        let (index, tail) = rest.split_once(':')?;
        let case = plan.cases.get(index.parse::<usize>().ok()?)?;
        Some(format!("case {}:{tail}", case.case_id))
    });
    named.unwrap_or_else(|| message.to_string())
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
