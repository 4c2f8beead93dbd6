//! `casebatch demo` (fixture + embedded engine + the three tasks + the report, in one
//! command), `casebatch demo serve` (the fixture alone), and the demo's harness commands.

use std::path::{Path, PathBuf};
use std::time::Duration;

use casebatch_control::{DriveOptions, EngineChoice, ManifestInput, RunRequest};
use casebatch_demo::fixture::read_receipts;
use casebatch_demo::{Fixture, FixtureOptions, MANIFEST_BATCH_ID};
use casebatch_manifest::{Defaults, LoadOptions};

use crate::cli::{ActorChoice, BatchRef, DemoArgs, DemoCommand, EngineArgs, HarnessCommand};
use crate::exit::{CliError, CliResult, Exit};
use crate::render::{self, Progress};

fn delay(seconds: f64) -> CliResult<Duration> {
    Duration::try_from_secs_f64(seconds).map_err(|_| {
        CliError::usage(format!(
            "failed to read --response-delay {seconds}: use seconds >= 0"
        ))
    })
}

/// The browser the demo's actor drives, per `--actor`; says which actor it is.
fn pick_actor(choice: ActorChoice) -> CliResult<Option<PathBuf>> {
    let found = match choice {
        ActorChoice::Http => None,
        ActorChoice::Auto | ActorChoice::Browser => casebatch_demo::browser::find(),
    };
    match (&found, choice) {
        (Some(b), _) => eprintln!("actor: a headless Chromium per attempt ({})", b.display()),
        (None, ActorChoice::Browser) => {
            return Err(CliError::usage(
                "failed to find a Chromium for --actor browser: set CASEBATCH_BROWSER, or \
                 install one (Debian: apt-get install chromium)",
            ));
        }
        (None, ActorChoice::Auto) => eprintln!(
            "actor: a plain HTTP client (no Chromium found; Debian: apt-get install chromium, \
             or set CASEBATCH_BROWSER)"
        ),
        (None, ActorChoice::Http) => eprintln!("actor: a plain HTTP client (--actor http)"),
    }
    Ok(found)
}

async fn start_fixture(
    directory: &Path,
    response_delay: f64,
    port: u16,
    actor: ActorChoice,
) -> CliResult<Fixture> {
    let exe = std::env::current_exe()
        .map_err(|e| CliError::usage(format!("failed to find the casebatch executable: {e}")))?;
    let directory = std::path::absolute(directory)
        .map_err(|e| CliError::usage(format!("failed to resolve {}: {e}", directory.display())))?;
    Fixture::start(FixtureOptions {
        directory,
        response_delay: delay(response_delay)?,
        port,
        casebatch_exe: exe,
        browser: pick_actor(actor)?,
    })
    .await
    .map_err(CliError::usage)
}

pub async fn run(args: DemoArgs) -> CliResult {
    if let Some(DemoCommand::Serve {
        directory,
        response_delay,
        port,
        actor,
    }) = args.serve
    {
        return serve(&directory, response_delay, port, actor).await;
    }
    let fixture = start_fixture(&args.directory, args.response_delay, 0, args.actor).await?;
    let output_dir = args.directory.join("batches");
    eprintln!(
        "fixture on http://{} · manifest {}",
        fixture.addr,
        fixture.manifest.display()
    );
    let request = RunRequest {
        manifest: ManifestInput {
            path: fixture.manifest.clone(),
            options: LoadOptions {
                overrides: Defaults {
                    concurrency: args.parallelism,
                    ..Defaults::default()
                },
                ..LoadOptions::default()
            },
        },
        output_dir: output_dir.clone(),
        engine: EngineChoice::default(),
        drive: DriveOptions::default(),
    };
    let mut progress = Progress::default();
    let report = casebatch_control::run(request, &mut progress).await;
    progress.finish();
    let exit = render::run_report(&report?);
    // The report as `batch report --html` makes it: the text here, the page beside the bundle.
    let html = args.directory.join("report.html");
    let batch = BatchRef {
        batch_id: MANIFEST_BATCH_ID.into(),
        output_dir: output_dir.clone(),
        json: false,
        engine: EngineArgs {
            address: None,
            namespace: None,
            profile: None,
        },
    };
    super::status::report(&batch, Some(&html))?;
    let clicks = fixture
        .receipts()
        .iter()
        .filter(|r| r.action == "click")
        .count();
    say!(
        "page-action receipts: {clicks} click(s) in {}",
        fixture.events.display()
    );
    say!(
        "HTML report: {} (open it in a browser; `casebatch batch report --batch-id {} \
         --output-dir {} --html FILE` writes it again)",
        html.display(),
        MANIFEST_BATCH_ID,
        output_dir.display()
    );
    Ok(exit)
}

async fn serve(directory: &Path, response_delay: f64, port: u16, actor: ActorChoice) -> CliResult {
    let fixture = start_fixture(directory, response_delay, port, actor).await?;
    say!("fixture: http://{}", fixture.addr);
    say!("manifest: {}", fixture.manifest.display());
    say!("receipts: {}", fixture.events.display());
    say!("ready: true");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| CliError::usage(format!("failed to watch SIGTERM: {e}")))?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    let clicks = read_receipts(&fixture.events)
        .iter()
        .filter(|r| r.action == "click")
        .count();
    eprintln!("fixture stopped; {clicks} click receipt(s) recorded");
    Ok(Exit::Success)
}

pub async fn harness(h: HarnessCommand) -> CliResult {
    let result = match h {
        HarnessCommand::WebDemo { browser: None } => casebatch_demo::actor::run_actor().await,
        HarnessCommand::WebDemo {
            browser: Some(path),
        } => match path.or_else(casebatch_demo::browser::find) {
            Some(b) => casebatch_demo::browser_actor::run_actor(b).await,
            None => Err(casebatch_demo::DemoError::Other(
                "find a Chromium for --browser: name it (--browser PATH), set CASEBATCH_BROWSER, \
                 or install one (Debian: apt-get install chromium)"
                    .into(),
            )),
        },
        HarnessCommand::WebDemoEval => casebatch_demo::actor::run_evaluator().await,
    };
    match result {
        Ok(()) => Ok(Exit::Success),
        // A harness failure is exit 1 by the harness contract.
        Err(e) => {
            eprintln!("error: {e}");
            Ok(Exit::Incomplete)
        }
    }
}
