//! The `sh` wrapper every local job runs under: it records its own identity in the attempt's
//! journal before the harness can run, joins the attempt's cgroups, runs the harness and
//! records its exit status. It leads its own process group and outlives the process that
//! spawned it, so a job survives a worker's crash and its result can still be harvested.

/// Appends its own pid and start time to the attempt's journal (`$1`; before anything else,
/// so the harness never runs unrecorded), joins the cgroups (`:`-separated `cgroup.procs`
/// files), runs the harness, and appends its exit status. Each entry is one `printf` to a file
/// opened for appending: one write, whole, whose newline marks it complete. Field 22 of
/// `/proc/$$/stat` is the start time, counted after the command name's closing parenthesis.
pub const WRAPPER: &str = r#"
journal=$1; shift
stat=; read -r stat < /proc/$$/stat
ticks=; field22() { shift 19; ticks=$1; }; field22 ${stat##*') '}; unset -f field22
case $ticks in ''|*[!0-9]*) ticks=null ;; esac
printf '{"wrapper":[%s,%s]}\n' "$$" "$ticks" >> "$journal" || exit 95
if [ -n "$CASEBATCH_CGROUP_PROCS" ]; then
  IFS=:; for procs in $CASEBATCH_CGROUP_PROCS; do echo $$ > "$procs" || exit 96; done; unset IFS
fi
unset CASEBATCH_CGROUP_PROCS
"$@"
code=$?
printf '{"exit":%s}\n' "$code" >> "$journal"
exit $code
"#;

/// The wrapper's `$0`: how it shows in `ps`, and what its shell puts before what it says.
pub const WRAPPER_NAME: &str = "casebatch-wrapper";
