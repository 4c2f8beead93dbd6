//! A small `TestCommand`-style helper: a temp directory per test, the binary, and readers for
//! the bundle.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A temp directory per test. Which tests may run side by side is nextest's to decide
/// (`.config/nextest.toml`: test groups, by test name); the constructors say what a test
/// needs, and under nextest check that the configuration gives it that.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
    /// What `spawn` started (pid and start time), killed when the sandbox goes: a failing
    /// test must not leave its runner, worker or fixture server running.
    spawned: std::sync::Mutex<Vec<(u32, u64)>>,
}

impl Sandbox {
    /// A sandbox for a test that needs no engine.
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
            spawned: Default::default(),
        }
    }

    /// A sandbox for a test that runs batches: nextest's `engine` group, at most two at once.
    pub fn engine() -> Self {
        Self::in_group("engine")
    }

    /// The same, for a test that must run with no other test beside it (group `alone`): the
    /// cleanup tests, which once timed out waiting for a killed grandchild to leave /proc
    /// while another engine test ran (cause not found; they ran alone before, and do again).
    pub fn engine_alone() -> Self {
        Self::in_group("alone")
    }

    /// The same, for a test that starts a Slurm cluster of its own (group `slurm`, one at a
    /// time).
    pub fn slurm() -> Self {
        Self::in_group("slurm")
    }

    /// Nextest (0.9.90 and later) names the test group it runs a test in: a test outside the
    /// group it needs would run beside tests it must not, so it fails here and says where to
    /// add it. Under `cargo test` (one test picked by hand) there is no group to check.
    fn in_group(group: &str) -> Self {
        if let Ok(actual) = std::env::var("NEXTEST_TEST_GROUP") {
            let test = std::env::var("NEXTEST_TEST_NAME").unwrap_or_default();
            assert!(
                actual == group,
                "{test} runs in nextest test group {actual}, but needs group {group}: add it \
                 to that group's filter in .config/nextest.toml"
            );
        }
        Self::new()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn out(&self) -> PathBuf {
        self.path("out")
    }

    pub fn write(&self, rel: &str, content: &str) -> PathBuf {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content).unwrap();
        p
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_casebatch"));
        c.args(args)
            .current_dir(self.dir.path())
            .env_remove("TEMPORAL_ADDRESS")
            .env("SANDBOX", self.dir.path())
            // Attempts' scratch goes with the sandbox, also what a test leaves uncleaned.
            .env(
                "CASEBATCH_SCRATCH_DIR",
                self.dir.path().join("scratch-root"),
            )
            .stdin(Stdio::null());
        c
    }

    /// Runs to completion (with a generous timeout) and returns the output.
    pub fn run(&self, args: &[&str]) -> Output {
        let child = self
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn casebatch");
        wait_output(child, Duration::from_secs(240))
    }

    /// [`Sandbox::run`] with extra variables in the runner's own environment.
    pub fn run_env(&self, args: &[&str], envs: &[(&str, &str)]) -> Output {
        let child = self
            .command(args)
            .envs(envs.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn casebatch");
        wait_output(child, Duration::from_secs(240))
    }

    /// Starts in the background (stdout/stderr to files in the sandbox).
    pub fn spawn(&self, args: &[&str], log: &str) -> Child {
        self.spawn_env(args, log, &[])
    }

    /// `casebatch batch run --manifest M --output-dir <out>`, to completion.
    pub fn run_batch(&self, manifest: &Path) -> Output {
        self.run(&batch_run_args(manifest, &self.out()))
    }

    /// The same in the background.
    pub fn spawn_batch(&self, manifest: &Path, log: &str) -> Child {
        self.spawn(&batch_run_args(manifest, &self.out()), log)
    }

    /// `batch run --no-worker --manifest M --output-dir <out> --address <cluster>` in the
    /// background: a runner on a shared cluster that leaves the work to worker replicas.
    pub fn spawn_batch_on_cluster(&self, manifest: &Path, cluster: &Cluster, log: &str) -> Child {
        let out = self.out().display().to_string();
        let args = [
            "batch",
            "run",
            "--no-worker",
            "--manifest",
            manifest.to_str().unwrap(),
            "--output-dir",
            &out,
            "--address",
            &cluster.address,
        ];
        self.spawn(&args, log)
    }

    /// `batch run --no-worker` in the background on the embedded engine, returned once that
    /// engine is up: worker replicas joining it do the work.
    pub fn spawn_batch_without_worker(&self, manifest: &Path, log: &str) -> Child {
        let out = self.out().display().to_string();
        let args = [
            "batch",
            "run",
            "--no-worker",
            "--manifest",
            manifest.to_str().unwrap(),
            "--output-dir",
            &out,
        ];
        let runner = self.spawn(&args, log);
        let engine = self.out().join(".casebatch-engine/engine.json");
        wait_until(Duration::from_secs(60), "the embedded engine is up", || {
            engine.exists()
        });
        runner
    }

    /// `casebatch batch <verb> --batch-id B --output-dir <out>`.
    pub fn op(&self, verb: &str, batch: &str) -> Output {
        self.op_with(verb, batch, &[])
    }

    /// [`Sandbox::op`] with more flags.
    pub fn op_with(&self, verb: &str, batch: &str, flags: &[&str]) -> Output {
        let out = self.out();
        let mut args = vec![
            "batch",
            verb,
            "--batch-id",
            batch,
            "--output-dir",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(flags);
        self.run(&args)
    }

    /// `casebatch batch validate --manifest M`.
    pub fn validate(&self, manifest: &Path) -> Output {
        self.run(&[
            "batch",
            "validate",
            "--manifest",
            manifest.to_str().unwrap(),
        ])
    }

    pub fn bundle(&self, batch: &str) -> PathBuf {
        self.out().join(batch)
    }

    pub fn json(&self, path: &Path) -> Value {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        serde_json::from_slice(&bytes).unwrap()
    }

    /// Lines of a side-effect file (0 when absent).
    pub fn lines(&self, rel: &str) -> usize {
        std::fs::read_to_string(self.path(rel)).map_or(0, |s| s.lines().count())
    }

    pub fn status(&self, batch: &str) -> Value {
        let out_dir = self.out();
        let o = self.run(&[
            "batch",
            "status",
            "--batch-id",
            batch,
            "--output-dir",
            out_dir.to_str().unwrap(),
            "--json",
        ]);
        assert_exit(&o, 0);
        serde_json::from_slice(&o.stdout).expect("status JSON")
    }

    pub fn case_result(&self, batch: &str, case_dir: &str) -> Value {
        self.json(
            &self
                .bundle(batch)
                .join("cases")
                .join(case_dir)
                .join("result.json"),
        )
    }
}

impl Drop for Sandbox {
    /// What a test started and did not stop (it failed first), then the dev servers of the
    /// sandbox's output roots, which a killed runner leaves behind: each by identity.
    fn drop(&mut self) {
        let spawned = std::mem::take(self.spawned.get_mut().unwrap());
        for (pid, ticks) in spawned {
            if casebatch_attempt::local::procfs::is_same_process(pid, ticks) {
                casebatch_attempt::local::procfs::kill_pid(pid);
            }
        }
        let roots = std::fs::read_dir(self.dir.path()).into_iter().flatten();
        for root in roots.flatten() {
            kill_engine(&root.path());
        }
    }
}

/// SIGKILLs the embedded dev server of an output root, if `engine.json` still names it (same
/// pid *and* start time, so a recycled pid is never signalled).
pub fn kill_engine(output_root: &Path) {
    let Ok(bytes) = std::fs::read(output_root.join(".casebatch-engine/engine.json")) else {
        return;
    };
    let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
        return;
    };
    if let (Some(pid), Some(ticks)) = (v["pid"].as_u64(), v["start_ticks"].as_u64())
        && casebatch_attempt::local::procfs::is_same_process(pid as u32, ticks)
    {
        casebatch_attempt::local::procfs::kill_pid(pid as u32);
    }
}

/// SIGTERM (what service managers send), then the exit code.
pub fn stop(child: &mut Child) -> i32 {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_child(child, Duration::from_secs(30))
}

/// A loopback port held bound and never listening, for a runtime that is dead: a connection
/// to it is refused, and no server another test starts can take it while this lives (one
/// did take a killed agent's port, and answered for the dead runtime).
pub struct DeadPort {
    _socket: std::os::fd::OwnedFd,
    port: u16,
}

impl DeadPort {
    pub fn new() -> Self {
        use nix::sys::socket::{
            AddressFamily, SockFlag, SockType, SockaddrIn, bind, getsockname, socket,
        };
        use std::os::fd::AsRawFd;
        let socket = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        bind(socket.as_raw_fd(), &SockaddrIn::new(127, 0, 0, 1, 0)).unwrap();
        let port = getsockname::<SockaddrIn>(socket.as_raw_fd())
            .unwrap()
            .port();
        Self {
            _socket: socket,
            port,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// A loopback port nothing listens on (yet).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits for the child while threads drain its pipes (a chatty child never blocks on a full
/// pipe); kills it after `timeout`.
fn wait_output(child: Child, timeout: Duration) -> Output {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(o) => o.expect("casebatch's output is readable"),
        Err(_) => {
            casebatch_attempt::local::procfs::kill_pid(pid);
            let o = rx.recv().unwrap().unwrap();
            panic!(
                "casebatch did not finish within {timeout:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
}

/// Waits for a background child, returning its exit code.
pub fn wait_child(child: &mut Child, timeout: Duration) -> i32 {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code().unwrap_or(-1);
        }
        assert!(
            start.elapsed() < timeout,
            "background casebatch did not finish in {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The arguments of `casebatch batch run --manifest M --output-dir OUT`.
pub fn batch_run_args<'a>(manifest: &'a Path, out: &'a Path) -> [&'a str; 6] {
    let (manifest, out) = (manifest.to_str().unwrap(), out.to_str().unwrap());
    ["batch", "run", "--manifest", manifest, "--output-dir", out]
}

pub fn assert_exit(o: &Output, code: i32) {
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(code),
        "unexpected exit code\nstdout:\n{stdout}\nstderr:\n{}\nfailed cases:\n{}",
        String::from_utf8_lossy(&o.stderr),
        failed_cases(&stdout)
    );
}

/// The result records with a failure in the bundle `stdout` names: why an unexpected exit
/// happened, for a run that failed only on a loaded machine.
fn failed_cases(stdout: &str) -> String {
    let Some(bundle) = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("bundle: "))
    else {
        return "(no bundle named)".into();
    };
    let Ok(cases) = std::fs::read_dir(Path::new(bundle).join("cases")) else {
        return format!("(no cases in {bundle})");
    };
    let mut failed = String::new();
    for case in cases.flatten() {
        let result = std::fs::read_to_string(case.path().join("result.json")).unwrap_or_default();
        if !result.contains(r#""state": "succeeded""#) {
            failed += &format!("{}: {result}\n", case.path().display());
        }
    }
    failed
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Live processes whose command line contains `needle` (to prove nothing was left behind).
/// True once no live process's command line contains `needle`. A SIGKILLed process can
/// linger in /proc for a moment while the kernel tears it down; that is not a survivor.
pub fn no_process_matches(needle: &str) -> bool {
    let start = Instant::now();
    while !processes_matching(needle).is_empty() {
        if start.elapsed() > Duration::from_secs(5) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// What a test needs to know of a process that should be gone: its name, state, parent,
/// cgroups and command line, from `/proc`.
pub fn describe_processes(pids: &[u32]) -> String {
    let read = |pid: u32, file: &str| std::fs::read_to_string(format!("/proc/{pid}/{file}"));
    pids.iter()
        .map(|&pid| {
            let status: Vec<String> = read(pid, "status")
                .unwrap_or_default()
                .lines()
                .filter(|l| {
                    ["Name:", "State:", "PPid:", "NSpid:"]
                        .iter()
                        .any(|k| l.starts_with(k))
                })
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect();
            let cmd = read(pid, "cmdline").unwrap_or_default().replace('\0', " ");
            let cgroups = read(pid, "cgroup").unwrap_or_default().replace('\n', "; ");
            format!(
                "pid {pid}: {} | cgroups: {cgroups}| cmdline: {cmd}",
                status.join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Kills, when dropped, every live process whose command line contains its needle: a test
/// that fails because a process outlived its batch does not leave it running.
pub struct KillOnDrop(pub &'static str);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for pid in processes_matching(self.0) {
            casebatch_attempt::local::procfs::kill_pid(pid);
        }
    }
}

pub fn processes_matching(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        // A zombie (or a process gone meanwhile) is not a survivor.
        if cmd.contains(needle) && casebatch_attempt::local::procfs::is_alive(pid) {
            found.push(pid);
        }
    }
    found
}

impl Sandbox {
    /// `spawn` with extra environment (e.g. `CASEBATCH_LOG` to keep the SDK's warnings).
    pub fn spawn_env(&self, args: &[&str], log: &str, envs: &[(&str, &str)]) -> Child {
        let out = std::fs::File::create(self.path(log)).unwrap();
        let err = out.try_clone().unwrap();
        let mut c = self.command(args);
        c.envs(envs.iter().copied()).stdout(out).stderr(err);
        let child = c.spawn().expect("spawn casebatch");
        if let Some(ticks) = casebatch_attempt::local::procfs::start_ticks(child.id()) {
            let mut spawned = self.spawned.lock().unwrap();
            spawned.push((child.id(), ticks));
        }
        child
    }

    /// The text of a file in the sandbox ("" when absent).
    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap_or_default()
    }

    /// `batch run` in the background with extra environment for the runner (test hooks such
    /// as `CASEBATCH_FAULT_POINT`, worker settings such as `CASEBATCH_MAX_RESULT_BYTES`).
    pub fn spawn_batch_with_env(&self, manifest: &Path, log: &str, envs: &[(&str, &str)]) -> Child {
        self.spawn_env(&batch_run_args(manifest, &self.out()), log, envs)
    }

    /// What the attempt's journal (`attempt.jsonl`) records of `kind` (`spec`, `job`,
    /// `evaluation`, `cleanup`, `record`, `container`, `prepared`, `exit`, `stages`): the last
    /// entry of that kind, `null` when there is none.
    pub fn recorded(&self, batch: &str, case_dir: &str, attempt: u32, kind: &str) -> Value {
        journal_at(&self.attempt_file(batch, case_dir, attempt, ""))[kind].clone()
    }

    /// A file of an attempt: `cases/<case_dir>/attempts/<n>/<name>`.
    pub fn attempt_file(&self, batch: &str, case_dir: &str, attempt: u32, name: &str) -> PathBuf {
        self.bundle(batch)
            .join("cases")
            .join(case_dir)
            .join("attempts")
            .join(attempt.to_string())
            .join(name)
    }
}

/// An attempt directory's journal, folded, as JSON (empty when there is none).
pub fn journal_at(dir: &Path) -> Value {
    let journal = casebatch_bundle::AttemptJournal::read(dir)
        .unwrap_or_else(|e| panic!("journal of {}: {e}", dir.display()));
    serde_json::to_value(&*journal).unwrap()
}

/// The last `n` lines of a text file (what is there when it is absent or not UTF-8).
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_else(|e| format!("<{}: {e}>", path.display()));
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Whether `pid` is a live process (not a zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// The embedded engine's `engine.json` under an output root, if there is one.
pub fn engine_record(output_root: &Path) -> Option<Value> {
    let bytes = std::fs::read(output_root.join(".casebatch-engine/engine.json")).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// True when the process an `engine.json` names is alive and is that very process.
pub fn engine_alive(record: &Value) -> bool {
    match (record["pid"].as_u64(), record["start_ticks"].as_u64()) {
        (Some(pid), Some(ticks)) => {
            casebatch_attempt::local::procfs::is_same_process(pid as u32, ticks)
        }
        _ => false,
    }
}

/// Waits for a background child and returns its whole exit status (a signal included).
pub fn wait_status(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!("background casebatch did not finish in {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Peak resident memory (`VmHWM`) of a live process, in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A standalone Temporal dev server standing in for a shared cluster (stopped on drop).
pub struct Cluster {
    server: Child,
    pub address: String,
}

impl Cluster {
    /// Starts it and waits until its default namespace answers. A port another process took
    /// between choosing and binding it is given up for another.
    pub fn start(sb: &Sandbox) -> Self {
        for _ in 0..3 {
            if let Some(cluster) = Self::try_start_on(sb, free_port()) {
                return cluster;
            }
        }
        panic!("the cluster's server lost its port three times");
    }

    /// `None` when its server exits before it holds the port (another process has it).
    fn try_start_on(sb: &Sandbox, port: u16) -> Option<Self> {
        let server = Command::new(temporal_bin())
            .args(["server", "start-dev", "--headless", "--ip", "127.0.0.1"])
            .args(["--log-level", "error", "--port", &port.to_string()])
            .arg("--db-filename")
            .arg(sb.path(&format!("cluster-{port}.db")))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a Temporal dev server as the 'cluster'");
        let mut cluster = Self {
            server,
            address: format!("127.0.0.1:{port}"),
        };
        let mut exited = false;
        // Its own socket, not merely an open port: another test's server may answer there.
        wait_until(Duration::from_secs(60), "the cluster answers", || {
            exited = !matches!(cluster.server.try_wait(), Ok(None));
            exited
                || casebatch_attempt::local::procfs::listens_on(cluster.pid(), port)
                    && cluster
                        .temporal(&[
                            "operator",
                            "namespace",
                            "describe",
                            "--namespace",
                            "default",
                        ])
                        .status
                        .success()
        });
        (!exited).then_some(cluster)
    }

    /// The server's process (the `temporal` CLI runs it in-process).
    pub fn pid(&self) -> u32 {
        self.server.id()
    }

    /// Runs the `temporal` CLI against this server.
    pub fn temporal(&self, args: &[&str]) -> Output {
        Command::new(temporal_bin())
            .args(args)
            .args(["--address", &self.address])
            .stdin(Stdio::null())
            .output()
            .expect("temporal CLI runs")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

pub fn temporal_bin() -> String {
    std::env::var("CASEBATCH_TEMPORAL_BIN").unwrap_or_else(|_| "temporal".into())
}

/// `GET path` on loopback: (status, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    s.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// The sum of a metric's samples whose labels include every pair of `labels`.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The system's Chromium, for tests that look at a page in a real browser. Without one the
/// test is skipped with a notice, unless `CASEBATCH_REQUIRE_BROWSER` is set (CI sets it, so
/// there a missing browser fails the test rather than passing it unseen).
pub fn browser_or_skip(test: &str) -> Option<PathBuf> {
    let found = casebatch_demo::browser::find();
    if found.is_none() {
        assert!(
            std::env::var_os("CASEBATCH_REQUIRE_BROWSER").is_none(),
            "{test}: no Chromium (CASEBATCH_BROWSER, or chromium on PATH) and \
             CASEBATCH_REQUIRE_BROWSER is set"
        );
        eprintln!("SKIPPED {test}: no Chromium found (Debian: apt-get install chromium)");
    }
    found
}

/// The DOM of a page once headless Chromium has run its scripts and fetches: for pages built
/// in the browser, such as Temporal's Web UI. Each call is a fresh browser with a profile of
/// its own under `dir` (one still shutting down would hold a shared profile's lock, and a
/// second browser on it hands the page over and prints nothing). The error says what the
/// browser printed instead.
pub fn dom_of(browser: &Path, url: &str, dir: &Path) -> Result<String, String> {
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let profile = dir.join(format!("chromium-dom-profile-{n}"));
    let output = Command::new(browser)
        .args(casebatch_demo::browser::headless_args(&profile))
        // Virtual time runs ahead while the page is idle and waits while it fetches.
        .arg("--virtual-time-budget=15000")
        .arg("--dump-dom")
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .expect("start chromium");
    let _ = std::fs::remove_dir_all(&profile);
    let dom = String::from_utf8_lossy(&output.stdout).into_owned();
    if dom.is_empty() {
        return Err(format!(
            "{}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(dom)
}

/// A page rendered by headless Chromium: its screenshot's pixels, RGB.
pub struct Screenshot {
    pub width: u32,
    pub height: u32,
    rgb: Vec<[u8; 3]>,
}

impl Screenshot {
    /// Loads `page` (a file) in a fresh headless Chromium with its own profile under `dir`, and
    /// reads back the screenshot it writes there. A browser killed by a signal before it wrote
    /// one (a SIGSEGV under a loaded suite, seen once) is run again, twice at most: the page
    /// is a file, so nothing of casebatch runs again.
    pub fn of(browser: &Path, page: &Path, dir: &Path, size: (u32, u32)) -> Self {
        use std::os::unix::process::ExitStatusExt;
        let png_path = dir.join("screenshot.png");
        let mut tries = 0;
        let output = loop {
            tries += 1;
            let profile = dir.join(format!("chromium-profile-{tries}"));
            let output = Command::new(browser)
                .args(casebatch_demo::browser::headless_args(&profile))
                .arg("--force-color-profile=srgb")
                .arg(format!("--window-size={},{}", size.0, size.1))
                .arg(format!("--screenshot={}", png_path.display()))
                .arg(format!("file://{}", page.display()))
                .stdin(Stdio::null())
                .output()
                .expect("start chromium");
            if png_path.exists() || output.status.signal().is_none() || tries == 3 {
                break output;
            }
        };
        assert!(
            png_path.exists(),
            "chromium wrote no screenshot ({}, try {tries}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let decoder = png::Decoder::new(std::fs::File::open(&png_path).unwrap());
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        let channels = match info.color_type {
            png::ColorType::Rgb => 3,
            png::ColorType::Rgba => 4,
            other => panic!("an unexpected screenshot colour type {other:?}"),
        };
        let rgb = buf[..info.buffer_size()]
            .chunks_exact(channels)
            .map(|p| [p[0], p[1], p[2]])
            .collect();
        Self {
            width: info.width,
            height: info.height,
            rgb,
        }
    }

    /// How many pixels are exactly this colour (`#rrggbb`).
    pub fn pixels_of(&self, hex: &str) -> usize {
        let c = u32::from_str_radix(hex.trim_start_matches('#'), 16).unwrap();
        let want = [(c >> 16) as u8, (c >> 8) as u8, c as u8];
        self.rgb.iter().filter(|p| **p == want).count()
    }
}

/// Live processes whose command line contains `name` and whose environment contains `needle`
/// (a sandbox's path: what every process of its attempts inherits, browsers included).
pub fn processes_with_env(name: &str, needle: &str) -> Vec<u32> {
    processes_matching(name)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| String::from_utf8_lossy(&env).contains(needle))
        })
        .collect()
}

/// Freezes a process (SIGSTOP: it neither answers nor dies, as in a stall; its children run
/// on) for `secs`, running `during` meanwhile, then thaws it. The frozen span is the test's
/// chaos, not a wait for an event.
pub fn freeze(pid: u32, secs: u64, during: impl FnOnce()) {
    use nix::sys::signal::{Signal, kill};
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
    let thaw = Instant::now() + Duration::from_secs(secs);
    during();
    std::thread::sleep(thaw.saturating_duration_since(Instant::now()));
    kill(pid, Signal::SIGCONT).expect("SIGCONT");
}

/// The embedded engine's address, once `engine.json` names a live server.
pub fn engine_address(out: &Path) -> String {
    let mut address = String::new();
    wait_until(
        Duration::from_secs(60),
        "a live embedded engine",
        || match engine_record(out) {
            Some(r) if engine_alive(&r) => {
                address = r["address"].as_str().unwrap_or_default().to_string();
                true
            }
            _ => false,
        },
    );
    address.trim_start_matches("http://").to_string()
}

/// The batch's pending activities whose type ends with `kind` (`start`, `settle`), as the
/// server sees them (`temporal workflow describe` on `address`).
pub fn pending_activities(address: &str, batch: &str, kind: &str) -> Vec<Value> {
    let o = Command::new(temporal_bin())
        .args(["workflow", "describe", "-o", "json", "--address", address])
        .args(["-w", &format!("casebatch-{batch}")])
        .output()
        .expect("temporal CLI runs");
    let mut d: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    let all = d["pendingActivities"].as_array_mut().map(std::mem::take);
    all.into_iter()
        .flatten()
        .filter(|a| {
            a["activityType"]["name"]
                .as_str()
                .is_some_and(|t| t.ends_with(kind))
        })
        .collect()
}

/// How many of those a worker is running now.
pub fn activities_running(address: &str, batch: &str, kind: &str) -> usize {
    pending_activities(address, batch, kind)
        .iter()
        .filter(|a| a["state"] == "PENDING_ACTIVITY_STATE_STARTED")
        .count()
}

/// A command's stdout as JSON (its `--json` view).
pub fn json_of(o: &std::process::Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

/// The sandbox's own promise: what a test started and left running goes with it.
#[test]
fn a_sandbox_stops_what_it_started_when_it_goes() {
    let sb = Sandbox::new();
    let args = ["agent", "--listen", "127.0.0.1:0", "--data-dir", "agent"];
    let mut agent = sb.spawn(&args, "agent.log");
    let addr = sb.path("agent/agent.addr");
    wait_until(Duration::from_secs(30), "the agent listening", || {
        addr.exists()
    });
    let pid = agent.id();
    let ticks = casebatch_attempt::local::procfs::start_ticks(pid).unwrap();
    drop(sb);
    wait_until(Duration::from_secs(10), "the agent stopped", || {
        !casebatch_attempt::local::procfs::is_same_process(pid, ticks)
    });
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        agent.wait().unwrap().signal(),
        Some(9),
        "killed by the sandbox"
    );
}

/// One `casebatch agent` on a fixed loopback port (a restart must come back where the
/// manifest's runtimes table points).
pub struct Agent {
    pub child: Child,
    port: u16,
    data_dir: PathBuf,
    pub name: String,
    extra: Vec<String>,
}

impl Agent {
    pub fn start(sb: &Sandbox, name: &str, extra: &[&str]) -> Self {
        let port = free_port();
        let data_dir = sb.path(&format!("agent-{name}"));
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let child = launch(sb, name, port, &data_dir, &extra);
        Self {
            child,
            port,
            data_dir,
            name: name.into(),
            extra,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// SIGKILL, as a crashed host would.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    pub fn restart(&mut self, sb: &Sandbox) {
        self.child = launch(sb, &self.name, self.port, &self.data_dir, &self.extra);
    }
}

/// Starts an agent and waits until it listens (it writes `agent.addr` once bound).
fn launch(sb: &Sandbox, name: &str, port: u16, data_dir: &Path, extra: &[String]) -> Child {
    let addr = data_dir.join("agent.addr");
    let _ = std::fs::remove_file(&addr);
    let listen = format!("127.0.0.1:{port}");
    let data = data_dir.display().to_string();
    let mut args = vec!["agent", "--listen", &listen, "--data-dir", &data];
    args.extend(extra.iter().map(String::as_str));
    // AGENT_NAME reaches harnesses through `pass_env`, read on the agent's host;
    // AGENT_TOKEN is there for an agent started with `--token-env AGENT_TOKEN`.
    let child = sb.spawn_env(
        &args,
        &format!("agent-{name}.log"),
        &[("AGENT_NAME", name), ("AGENT_TOKEN", AGENT_TOKEN)],
    );
    wait_until(Duration::from_secs(30), "the agent is listening", || {
        addr.exists()
    });
    child
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The token of agents started with `--token-env AGENT_TOKEN`.
pub const AGENT_TOKEN: &str = "s3cret-agent-token";

/// A standalone server with two `casebatch worker` replicas polling it, so a batch starts only
/// once both poll: these tests are about replicas sharing a batch, not about which came up
/// first.
pub fn replicas_on_a_cluster(sb: &Sandbox) -> (Cluster, Child, Child) {
    let cluster = Cluster::start(sb);
    let out = sb.out().display().to_string();
    // AGENT_NAME is in the manifests' pass_env: harnesses and evaluators read it on their
    // agent; `worker` here says a process ran on a worker.
    let replica = |log: &str| {
        let w = sb.spawn_env(
            &[
                "worker",
                "--output-dir",
                &out,
                "--address",
                &cluster.address,
            ],
            log,
            &[("AGENT_NAME", "worker")],
        );
        wait_until(Duration::from_secs(60), "the replica polls", || {
            sb.read(log).contains("worker polling")
        });
        w
    };
    let (w1, w2) = (replica("w1.log"), replica("w2.log"));
    (cluster, w1, w2)
}
