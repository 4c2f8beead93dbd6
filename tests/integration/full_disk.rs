//! A full disk stops the run: an output directory on a small tmpfs, filled by the batch's own
//! harnesses, ends the run with exit 5 naming the path and what is free (the embedded engine,
//! whose database lives there too, would otherwise die and never come back while the runner
//! waited for it); once the file system grows, `batch resume` finishes every case, none of
//! them run twice.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::support::*;

/// A tmpfs mounted on a directory (the tests run as root), unmounted when dropped, after the
/// engine that keeps its database there is stopped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let options = format!("size={size}");
        mount(&[
            "-t",
            "tmpfs",
            "-o",
            &options,
            "tmpfs",
            dir.to_str().unwrap(),
        ]);
        Self(dir.to_path_buf())
    }

    fn grow(&self, size: &str) {
        let options = format!("remount,size={size}");
        mount(&["-o", &options, self.0.to_str().unwrap()]);
    }

    /// Free bytes, as an unprivileged writer sees them.
    fn free(&self) -> u64 {
        let s = nix::sys::statvfs::statvfs(&self.0).unwrap();
        s.blocks_available() * s.fragment_size()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        kill_engine(&self.0);
        // Lazy: a process that still has a file open there must not keep it mounted.
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A process the test started, killed when dropped: a failing test leaves no runner or
/// worker behind.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn mount(args: &[&str]) {
    let status = Command::new("mount")
        .args(args)
        .status()
        .expect("run mount");
    assert!(status.success(), "mount {args:?} (the tests run as root)");
}

#[test]
fn a_disk_that_fills_mid_batch_ends_the_run_with_exit_5_and_resume_finishes_it() {
    let sb = Sandbox::engine();
    let out = sb.out();
    // Room for the engine (its database and write-ahead log take a few MB) and a dozen or
    // so cases of the forty; the run stops below a tenth of it (space.rs).
    let disk = Tmpfs::mount(&out, "12m");
    let manifest = sb.write(
        "full.yaml",
        &format!(
            r#"batch_id: full
defaults:
  pass_env: [SANDBOX]
  runtime: local-process
  concurrency: 4
  max_retries: 0
  harness: 'echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/ran.log"; head -c 200000 /dev/zero > "$CASEBATCH_OUTPUT_DIR/blob"; sleep 4; echo "{{}}" > "$CASEBATCH_RESULT"'
tasks:
{}"#,
            (1..=40)
                .map(|i| format!("  - task_id: c{i:02}\n"))
                .collect::<String>()
        ),
    );
    let mut runner = Reaped(sb.spawn_batch(&manifest, "run.log"));
    // The floor the runner stops at, as space.rs puts it for a file system this small.
    let floor = 12 * 1024 * 1024 / 10;
    let mut low_since = None;
    let code = loop {
        if let Some(status) = runner.0.try_wait().unwrap() {
            break status.code().unwrap_or(-1);
        }
        if low_since.is_none() && disk.free() < floor {
            low_since = Some(Instant::now());
        }
        if let Some(t) = low_since {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "the disk filled a minute ago and the run goes on: {}",
                tail(&sb.path("run.log"), 20)
            );
        }
        assert!(
            sb.lines("ran.log") < 40,
            "the disk never filled: {}",
            tail(&sb.path("run.log"), 5)
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = sb.read("run.log");
    assert_eq!(code, 5, "the output directory is unwritable: {log}");
    assert!(
        log.contains(&format!(
            "failed to continue batch full: {} is out of space",
            sb.bundle("full").display()
        )) && log.contains("free of")
            && log.contains("free space on that file system")
            && log.contains("casebatch batch resume --batch-id full"),
        "names the path, what is free, and what to do: {log}"
    );
    let before = sb.lines("ran.log");
    assert!(before > 0, "the batch ran before the disk filled");

    disk.grow("64m");
    let resumed = sb.op("resume", "full");
    assert_exit(&resumed, 0);

    let mut runs: BTreeMap<String, usize> = BTreeMap::new();
    for case in sb.read("ran.log").lines() {
        *runs.entry(case.to_string()).or_default() += 1;
    }
    assert_eq!(runs.len(), 40, "every case ran: {runs:?}");
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "cases that ran twice: {twice:?}");
    let summary = sb.json(&sb.bundle("full").join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 40, "{summary:#}");
    assert_eq!(
        summary["attempts_total"], 40,
        "no attempt was spent on the full disk: {summary:#}"
    );
    // Jobs outlast the worker's shutdown grace (4 s against 2 s): those running when the run
    // stopped were handed back, and the resume adopted them.
    assert!(
        summary["adopted_attempts"].as_u64() >= Some(1),
        "jobs in flight at the stop were adopted: {summary:#}"
    );
}

/// Fills a file system to the last byte with one file, removed when dropped.
struct Filler(PathBuf);

impl Filler {
    fn fill(path: PathBuf) -> Self {
        use std::io::Write;
        let mut file = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        loop {
            match file.write_all(&chunk) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                Err(e) => panic!("fill {}: {e}", path.display()),
            }
        }
        Self(path)
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A stage that finds no space for the bundle waits for space (a worker replica here, its
/// engine on another disk, so nothing else stops it) instead of failing its attempt: failed,
/// the case would count as finished and no resume would run it.
#[test]
fn a_stage_with_no_space_for_the_bundle_waits_for_space_instead_of_failing_the_case() {
    let sb = Sandbox::engine();
    let cluster = Cluster::start(&sb);
    let out = sb.out();
    let _disk = Tmpfs::mount(&out, "4m");
    let manifest = sb.write(
        "nospace.yaml",
        r#"batch_id: nospace
defaults:
  pass_env: [SANDBOX]
  runtime: local-process
  max_retries: 0
  harness: 'echo "$CASEBATCH_CASE_ID" >> "$SANDBOX/ran.log"; echo "{}" > "$CASEBATCH_RESULT"'
tasks: [{task_id: n1}, {task_id: n2}, {task_id: n3}]
"#,
    );
    let mut runner = Reaped(sb.spawn_batch_on_cluster(&manifest, &cluster, "run.log"));
    let describe = ["workflow", "describe", "--workflow-id", "casebatch-nospace"];
    wait_until(Duration::from_secs(60), "the workflow starts", || {
        cluster.temporal(&describe).status.success()
    });
    let filler = Filler::fill(out.join("filler"));
    assert_eq!(
        wait_child(&mut runner.0, Duration::from_secs(60)),
        5,
        "the runner stops on the full disk: {}",
        tail(&sb.path("run.log"), 10)
    );
    let bundle = sb.bundle("nospace").display().to_string();
    assert!(
        sb.read("run.log")
            .contains(&format!("{bundle} is out of space: 0 B free of 4.0 MiB")),
        "{}",
        sb.read("run.log")
    );

    let mut worker = Reaped(sb.spawn(&["worker", "--address", &cluster.address], "worker.log"));
    let waiting = || {
        sb.read("worker.log")
            .contains("no space for the bundle: waiting for space")
    };
    let failed = || sb.status("nospace")["status"]["counts"]["failed"] != 0;
    wait_until(
        Duration::from_secs(90),
        "a stage waits for space, or fails",
        || waiting() || failed(),
    );
    assert!(
        !failed(),
        "the full disk failed a case: {}",
        tail(&sb.path("worker.log"), 20)
    );
    assert_eq!(sb.lines("ran.log"), 0, "nothing ran without its spec");
    drop(filler);
    let resumed = sb.op("resume", "nospace");
    assert_exit(&resumed, 0);
    stop(&mut worker.0);

    assert_eq!(sb.lines("ran.log"), 3, "each case ran once");
    let summary = sb.json(&sb.bundle("nospace").join("batch_summary.json"));
    assert_eq!(summary["counts"]["succeeded"], 3, "{summary:#}");
    assert_eq!(summary["attempts_total"], 3, "{summary:#}");
}
