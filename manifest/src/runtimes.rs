//! The runtimes table: named places cases run, declared under `runtimes:` in a manifest or in
//! a `--runtimes FILE`, checked entry by entry; and `runtime: NAME` resolved against it.
//!
//! An entry holds where a token is read from, never a token. Relative `token_file` and
//! `tls_ca` paths are made absolute against the directory of the file that declares them, so
//! the plan means the same thing wherever it is read from. Plaintext (`http://`) is accepted
//! for loopback hosts only, as for Temporal.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::limits::{
    BREAKER_COOLDOWN_S_RANGE as BREAKER_COOLDOWN_S, BREAKER_FAILURES_RANGE as BREAKER_FAILURES,
    CONCURRENCY_RANGE, MAX_MEMORY_MB, MAX_RUNTIME_NAME_LEN, QUEUE_LIMIT_RANGE as QUEUE_LIMIT,
    UNREACHABLE_GRACE_S_RANGE as UNREACHABLE_GRACE_S,
};
use crate::model::{BUILT_IN, RuntimeKind, RuntimeSpec};
use crate::report::{FieldPath, Report};
use crate::source::{self, Syntax};
use crate::validate::env_name_syntax_error;
use crate::walk::{self, Obj};

/// Fields of one entry; a unit test compares them with [`RuntimeSpec`]'s schema.
pub(crate) const ENTRY_FIELDS: &[&str] = &[
    "kind",
    "endpoint",
    "token_env",
    "token_file",
    "tls_ca",
    "max_concurrent",
    "memory_budget_mb",
    "breaker_failures",
    "breaker_cooldown_s",
    "unreachable_grace_s",
    "queue_limit",
    "partition",
    "account",
    "qos",
    "constraint",
    "extra_args",
];

/// The `sbatch` options `extra_args` may carry: none changes what casebatch relies on (the
/// job's name, comment, output files, working directory, environment, memory, CPUs, time
/// limit, requeueing, array or dependency, which the runtime sets itself).
pub const SLURM_EXTRA_ARGS: &[&str] = &[
    "--nice",
    "--exclusive",
    "--reservation",
    "--licenses",
    "--tmp",
    "--nodelist",
    "--exclude",
    "--hint",
    "--wckey",
    "--mcs-label",
    "--cores-per-socket",
    "--sockets-per-node",
    "--threads-per-core",
    "--core-spec",
    "--cpu-freq",
    "--mem-bind",
    "--switches",
    "--network",
];
/// Accepted `breaker_failures`, `breaker_cooldown_s` and `unreachable_grace_s`.
/// The only top-level key of a `--runtimes` file.
const FILE_FIELDS: &[&str] = &["runtimes"];
const EXAMPLE: &str = "`box-a: {kind: agent, endpoint: \"http://127.0.0.1:7300\"}`";

/// One declared name and where it was declared.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// `None` when the entry was refused (already reported), so references to it are not
    /// reported a second time as unknown.
    pub(crate) spec: Option<RuntimeSpec>,
    /// Its line in the file that declares it.
    pub(crate) line: Option<usize>,
}

/// The runtimes one file declares (or the merged table).
#[derive(Debug, Clone, Default)]
pub(crate) struct Table {
    pub(crate) entries: BTreeMap<String, Entry>,
    /// The table itself could not be read: unknown names are then not reported, since
    /// they may well be in it.
    pub(crate) broken: bool,
}

impl Table {
    fn broken() -> Self {
        Table {
            broken: true,
            ..Table::default()
        }
    }

    /// A valid entry's spec.
    pub(crate) fn spec(&self, name: &str) -> Option<&RuntimeSpec> {
        self.entries.get(name)?.spec.as_ref()
    }

    /// The valid entries, as the plan holds them.
    pub(crate) fn specs(&self) -> BTreeMap<String, RuntimeSpec> {
        self.entries
            .iter()
            .filter_map(|(name, e)| Some((name.clone(), e.spec.clone()?)))
            .collect()
    }
}

/// What a `runtime:` name refers to.
pub(crate) enum Lookup {
    /// The kind, and the table entry's name (`None` for a built-in).
    Found(RuntimeKind, Option<String>),
    /// Declared but refused, or possibly in a table that could not be read: already reported.
    Reported,
    /// Not declared anywhere: (message, fix).
    Unknown(String, String),
}

impl Table {
    pub(crate) fn lookup(&self, name: &str) -> Lookup {
        if let Some((_, kind)) = BUILT_IN.iter().find(|(n, _)| *n == name) {
            return Lookup::Found(*kind, None);
        }
        match self.entries.get(name) {
            Some(Entry {
                spec: Some(spec), ..
            }) => Lookup::Found(spec.kind, Some(name.to_string())),
            Some(_) => Lookup::Reported,
            None if self.broken => Lookup::Reported,
            None => {
                let (message, fix) = self.unknown(name);
                Lookup::Unknown(message, fix)
            }
        }
    }

    fn unknown(&self, name: &str) -> (String, String) {
        let declared: Vec<&str> = self.entries.keys().map(String::as_str).collect();
        let mut known: Vec<&str> = BUILT_IN.iter().map(|(n, _)| *n).collect();
        known.extend(&declared);
        let listed = if declared.is_empty() {
            "no runtimes are declared".to_string()
        } else {
            format!("declared: {}", declared.join(", "))
        };
        let message = format!("unknown runtime `{name}` ({listed}; built in: local-process, fake)");
        let fix = match walk::nearest(name, &known) {
            Some(near) => format!("use `{near}`"),
            None if name == "agent" => format!(
                "`agent` is a kind, not a name: declare an entry under `runtimes:` (or in \
                 --runtimes FILE) such as {EXAMPLE}, and use its name"
            ),
            None => format!(
                "declare `{name}` under `runtimes:` in the manifest or in --runtimes FILE, or \
                 use one of the names above"
            ),
        };
        (message, fix)
    }
}

/// The directory relative paths in `file` resolve against: absolute, symlinks resolved when
/// possible.
pub(crate) fn base_dir(file: &Path) -> PathBuf {
    let dir = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    dir.canonicalize()
        .or_else(|_| std::path::absolute(&dir))
        .unwrap_or(dir)
}

/// Read a `runtimes:` mapping at `path`; relative paths in it resolve against `base`.
pub(crate) fn table(value: &Value, path: &FieldPath, base: &Path, r: &mut Report) -> Table {
    let Value::Object(map) = value else {
        r.at(
            path,
            format!(
                "expected a mapping of runtime names to runtimes, found {}",
                walk::describe(value)
            ),
            format!("write {path} as a mapping of names to runtimes, such as {EXAMPLE}"),
        );
        return Table::broken();
    };
    let mut entries = BTreeMap::new();
    for (name, v) in map {
        let p = path.key(name);
        let before = r.problems.len();
        if let Some((message, fix)) = name_error(name) {
            r.at(&p, message, fix);
        }
        let spec = entry(v, &p, base, r);
        // An entry with any problem is not usable, whatever it managed to read.
        let spec = spec.filter(|_| r.problems.len() == before);
        entries.insert(
            name.clone(),
            Entry {
                spec,
                line: r.line_of(&p),
            },
        );
    }
    Table {
        entries,
        broken: false,
    }
}

/// Why `name` cannot name a table entry, if it cannot: (message, fix).
pub(crate) fn name_error(name: &str) -> Option<(String, String)> {
    let rule = format!(
        "lowercase letters, digits, `-` and `_`, starting with a letter or digit, at most \
         {MAX_RUNTIME_NAME_LEN} characters"
    );
    if BUILT_IN.iter().any(|(n, _)| *n == name) {
        return Some((
            format!("`{name}` is a built-in runtime; a table entry cannot reuse its name"),
            format!("remove the entry (`runtime: {name}` works without one) or rename it"),
        ));
    }
    let mut chars = name.chars();
    let valid = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && name.len() <= MAX_RUNTIME_NAME_LEN;
    (!valid).then(|| {
        let shown: String = name.chars().take(80).collect();
        (
            format!("runtime name {shown:?} is not {rule}"),
            format!("rename it using {rule}"),
        )
    })
}

/// One entry of the table; `None` when it is not even a mapping or has no usable `kind`.
fn entry(value: &Value, path: &FieldPath, base: &Path, r: &mut Report) -> Option<RuntimeSpec> {
    let o = Obj::new(value, path, ENTRY_FIELDS, r)?;
    o.deny_unknown(r);
    let kind: Option<RuntimeKind> = o.req(
        "kind",
        &format!("add `kind: agent` or `kind: slurm` (or `local-process`, `fake`) to {path}"),
        r,
    );
    let endpoint: Option<String> = o.opt("endpoint", r);
    let token_env: Option<String> = o.opt("token_env", r);
    let token_file: Option<String> = o.opt("token_file", r);
    let tls_ca: Option<String> = o.opt("tls_ca", r);
    let max_concurrent: Option<u32> = o.opt("max_concurrent", r);
    let memory_budget_mb: Option<u64> = o.opt("memory_budget_mb", r);
    if let Some(n) = max_concurrent
        && !CONCURRENCY_RANGE.contains(&n)
    {
        r.at(
            &path.key("max_concurrent"),
            format!("max_concurrent {n} is outside 1..=512"),
            format!("set {path}.max_concurrent to how many cases may run there at once"),
        );
    }
    if let Some(mb) = memory_budget_mb
        && !(1..=MAX_MEMORY_MB).contains(&mb)
    {
        r.at(
            &path.key("memory_budget_mb"),
            format!("memory_budget_mb {mb} is outside 1..={MAX_MEMORY_MB}"),
            format!(
                "set {path}.memory_budget_mb to the memory, in MiB, its cases may declare in all"
            ),
        );
    }
    let breaker_failures: Option<u32> = o.opt("breaker_failures", r);
    let breaker_cooldown_s: Option<u64> = o.opt("breaker_cooldown_s", r);
    let unreachable_grace_s: Option<u64> = o.opt("unreachable_grace_s", r);
    let queue_limit: Option<u32> = o.opt("queue_limit", r);
    let settings = [
        (
            "breaker_failures",
            breaker_failures.map(u64::from),
            BREAKER_FAILURES,
            "how many consecutive infra failures open its circuit",
        ),
        (
            "breaker_cooldown_s",
            breaker_cooldown_s,
            BREAKER_COOLDOWN_S,
            "the seconds an open circuit waits before one probe",
        ),
        (
            "unreachable_grace_s",
            unreachable_grace_s,
            UNREACHABLE_GRACE_S,
            "the seconds a worker keeps retrying the unreachable agent",
        ),
        (
            "queue_limit",
            queue_limit.map(u64::from),
            QUEUE_LIMIT,
            "the waiting cases past which new batches wait to be admitted",
        ),
    ];
    for (field, value, range, fix) in settings {
        if let Some(v) = value
            && !range.contains(&v)
        {
            r.at(
                &path.key(field),
                format!("{field} {v} is outside {}..={}", range.start(), range.end()),
                format!("set {path}.{field} to {fix}"),
            );
        }
    }
    let partition: Option<String> = o.opt("partition", r);
    let account: Option<String> = o.opt("account", r);
    let qos: Option<String> = o.opt("qos", r);
    let constraint: Option<String> = o.opt("constraint", r);
    let extra_args: Option<Vec<String>> = o.opt("extra_args", r);
    let kind = kind?;
    let slurm_only = [
        ("partition", partition.is_some()),
        ("account", account.is_some()),
        ("qos", qos.is_some()),
        ("constraint", constraint.is_some()),
        ("extra_args", extra_args.is_some()),
    ];
    if kind == RuntimeKind::Slurm {
        slurm_fields(
            [
                ("partition", &partition),
                ("account", &account),
                ("qos", &qos),
            ],
            constraint.as_deref(),
            extra_args.as_deref().unwrap_or_default(),
            path,
            r,
        );
    } else {
        for (field, _) in slurm_only.iter().filter(|(_, set)| *set) {
            let p = path.key(field);
            r.at(
                &p,
                format!(
                    "`{field}` applies to `kind: slurm` only; this entry is of kind {}",
                    kind.as_str()
                ),
                format!("remove {p}, or set {path}.kind to slurm"),
            );
        }
    }
    let agent_only = [
        ("endpoint", endpoint.is_some()),
        ("token_env", token_env.is_some()),
        ("token_file", token_file.is_some()),
        ("tls_ca", tls_ca.is_some()),
        ("unreachable_grace_s", unreachable_grace_s.is_some()),
        ("queue_limit", queue_limit.is_some()),
    ];
    if kind != RuntimeKind::Agent {
        for (field, _) in agent_only.iter().filter(|(_, set)| *set) {
            let p = path.key(field);
            r.at(
                &p,
                format!(
                    "`{field}` applies to `kind: agent` only; this entry is of kind {}",
                    kind.as_str()
                ),
                format!("remove {p}, or set {path}.kind to agent"),
            );
        }
    } else {
        let tls = match &endpoint {
            None => {
                r.at(
                    path,
                    "a runtime of kind agent needs an `endpoint`",
                    format!(
                        "add `endpoint: \"http://127.0.0.1:7300\"` (loopback) or \
                         `endpoint: \"https://HOST:PORT\"` to {path}"
                    ),
                );
                None
            }
            Some(e) => check_endpoint(e, &path.key("endpoint"), r),
        };
        if let Some(name) = &token_env
            && let Some(why) = env_name_syntax_error(name)
        {
            r.at(
                &path.key("token_env"),
                why,
                "name the worker's environment variable that holds the token (letters, \
                 digits and `_`, not starting with a digit)",
            );
        }
        if token_env.is_some() && token_file.is_some() {
            r.at(
                &path.key("token_file"),
                "both `token_env` and `token_file` are set; the token is read from one place",
                format!("keep one of {path}.token_env and {path}.token_file"),
            );
        }
        for (field, value) in [("token_file", &token_file), ("tls_ca", &tls_ca)] {
            if let Some(v) = value
                && (v.trim().is_empty() || v.contains('\0'))
            {
                r.at(
                    &path.key(field),
                    format!("{field} {v:?} is not a file path"),
                    format!("set {path}.{field} to the path of a file on the worker"),
                );
            }
        }
        if tls == Some(false) && tls_ca.is_some() {
            r.at(
                &path.key("tls_ca"),
                "`tls_ca` is set but the endpoint is plaintext http://, so it would be ignored",
                format!("use an https:// endpoint, or remove {path}.tls_ca"),
            );
        }
    }
    Some(RuntimeSpec {
        kind,
        endpoint,
        token_env,
        token_file: token_file.map(|f| absolute(base, &f)),
        tls_ca: tls_ca.map(|f| absolute(base, &f)),
        max_concurrent,
        memory_budget_mb,
        breaker_failures,
        breaker_cooldown_s,
        unreachable_grace_s,
        queue_limit,
        partition,
        account,
        qos,
        constraint,
        extra_args: extra_args.unwrap_or_default(),
    })
}

/// A `slurm` entry's own settings: names Slurm accepts, a constraint on one line, and
/// `extra_args` from [`SLURM_EXTRA_ARGS`] only.
fn slurm_fields(
    names: [(&str, &Option<String>); 3],
    constraint: Option<&str>,
    extra_args: &[String],
    path: &FieldPath,
    r: &mut Report,
) {
    for (field, value) in names {
        if let Some(v) = value
            && (v.is_empty()
                || !v
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
        {
            let p = path.key(field);
            r.at(
                &p,
                format!("{field} {v:?} is not a Slurm name (letters, digits, `_`, `.`, `-`)"),
                format!("set {p} to the {field}'s name as `sinfo`/`sacctmgr` show it"),
            );
        }
    }
    if let Some(c) = constraint
        && (c.trim().is_empty() || c.chars().any(|ch| ch.is_control() || ch.is_whitespace()))
    {
        let p = path.key("constraint");
        r.at(
            &p,
            format!("constraint {c:?} is not a Slurm feature expression"),
            format!("set {p} to features such as `gpu&a100`, without spaces"),
        );
    }
    for (i, arg) in extra_args.iter().enumerate() {
        let p = path.key("extra_args").index(i);
        let name = arg.split_once('=').map_or(arg.as_str(), |(name, _)| name);
        if !SLURM_EXTRA_ARGS.contains(&name) || arg.chars().any(char::is_control) {
            r.at(
                &p,
                format!(
                    "{arg:?} is not an sbatch option casebatch passes on: casebatch sets the \
                     job's name, comment, files, directory, environment, memory, CPUs, time \
                     limit and requeueing itself"
                ),
                format!(
                    "write it as `--name=value` with one of {}, or remove it",
                    SLURM_EXTRA_ARGS.join(", ")
                ),
            );
        }
    }
}

fn absolute(base: &Path, raw: &str) -> String {
    let joined = base.join(raw);
    std::path::absolute(&joined)
        .unwrap_or(joined)
        .display()
        .to_string()
}

/// An agent endpoint, taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub(crate) tls: bool,
    pub(crate) host: String,
    pub(crate) port: u16,
}

impl Endpoint {
    /// Loopback: 127.0.0.0/8, `::1` or `localhost`.
    pub(crate) fn is_loopback(&self) -> bool {
        let host = self.host.trim_end_matches('.');
        host.eq_ignore_ascii_case("localhost")
            || host.parse::<Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
            || host.parse::<Ipv6Addr>().is_ok_and(|ip| ip.is_loopback())
    }
}

/// `http://HOST:PORT` or `https://HOST:PORT` (an IPv6 host in brackets); nothing else.
pub(crate) fn parse_endpoint(text: &str) -> Result<Endpoint, String> {
    let (tls, rest) = if let Some(rest) = text.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = text.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err("it does not start with http:// or https://".into());
    };
    if let Some(c) = rest
        .chars()
        .find(|c| matches!(c, '/' | '?' | '#' | '@') || c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "it has {c:?} after the scheme; only HOST:PORT may follow (no path, user or query)"
        ));
    }
    let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
        let Some((host, port)) = inner.split_once("]:") else {
            return Err("an IPv6 host in brackets must be followed by `:PORT`".into());
        };
        if host.parse::<Ipv6Addr>().is_err() {
            return Err(format!("{host:?} is not an IPv6 address"));
        }
        (host, port)
    } else {
        let Some((host, port)) = rest.rsplit_once(':') else {
            return Err("it has no `:PORT`".into());
        };
        if host.contains(':') {
            return Err("an IPv6 host must be written in brackets, as [::1]".into());
        }
        if !is_host(host) {
            return Err(format!("{host:?} is not a host name or IPv4 address"));
        }
        (host, port)
    };
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0 && port.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| format!("port {port:?} is not a number from 1 to 65535"))?;
    Ok(Endpoint {
        tls,
        host: host.to_string(),
        port,
    })
}

/// A DNS name (letters, digits, `-`, dot-separated labels) or a dotted IPv4 address.
fn is_host(host: &str) -> bool {
    if host.parse::<Ipv4Addr>().is_ok() {
        return true;
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    let labels_ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    // All digits and dots but not an IPv4 address (`999.1.1.1`): a typo, not a name.
    labels_ok && !name.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

/// Report what is wrong with `endpoint`; `Some(tls)` when it is usable.
fn check_endpoint(endpoint: &str, path: &FieldPath, r: &mut Report) -> Option<bool> {
    let shown: String = endpoint.chars().take(80).collect();
    match parse_endpoint(endpoint) {
        Err(why) => {
            r.at(
                path,
                format!("endpoint {shown:?} is not http://HOST:PORT or https://HOST:PORT: {why}"),
                format!(
                    "write {path} as \"https://HOST:PORT\" (or \"http://127.0.0.1:PORT\" for \
                     an agent on the worker's own host)"
                ),
            );
            None
        }
        Ok(e) if !e.tls && !e.is_loopback() => {
            r.at(
                path,
                format!(
                    "endpoint {shown:?} uses http:// to {}, which is not loopback: plaintext \
                     is refused off loopback: use https:// (and tls_ca if the agent's \
                     certificate is not signed by a system root)",
                    e.host
                ),
                format!(
                    "write {path} as \"https://{}:{}\" and start the agent with TLS",
                    e.host, e.port
                ),
            );
            None
        }
        Ok(e) => Some(e.tls),
    }
}

/// Read `--runtimes FILE`: a YAML/JSON document whose only key is `runtimes:`. Its problems
/// are reported with the file (and its line) named in the message.
pub(crate) fn load_file(file: &Path, r: &mut Report) -> Table {
    let mut sub = Report::default();
    let table = read_file(file, &mut sub);
    let label = format!("runtimes file {}", file.display());
    r.absorb(sub, &label, &FieldPath::root(), None);
    table
}

fn read_file(file: &Path, r: &mut Report) -> Table {
    let Some(bytes) = source::read_bounded(file, "the runtimes file", source::Kind::Named, r)
    else {
        return Table::broken();
    };
    let Some(text) = source::decode(&bytes, r) else {
        return Table::broken();
    };
    let syntax = match source::syntax_of(file, text) {
        Syntax::Jsonl => Syntax::Json,
        s => s,
    };
    let Some((value, locator)) = source::parse_document(text, syntax, r) else {
        return Table::broken();
    };
    r.set_locator(locator);
    let root = FieldPath::root();
    let Some(o) = Obj::new(&value, &root, FILE_FIELDS, r) else {
        return Table::broken();
    };
    o.deny_unknown(r);
    match o.get("runtimes") {
        Some(v) => table(v, &root.key("runtimes"), &base_dir(file), r),
        None => {
            r.at(
                &root,
                "missing required field `runtimes`",
                format!("write the file as `runtimes:` followed by entries such as {EXAMPLE}"),
            );
            Table::broken()
        }
    }
}

/// The manifest's table and the `--runtimes` file's, as one. A name in both is refused at
/// the manifest's declaration, naming both files.
pub(crate) fn merge(
    manifest: Table,
    file: Option<&(Table, &Path)>,
    manifest_path: &Path,
    r: &mut Report,
) -> Table {
    let Some((file_table, file_path)) = file else {
        return manifest;
    };
    let mut merged = manifest;
    merged.broken |= file_table.broken;
    for (name, entry) in file_table.entries.clone() {
        let Some(mine) = merged.entries.get_mut(&name) else {
            merged.entries.insert(name, entry);
            continue;
        };
        let at = |line: Option<usize>| line.map(|l| format!(" line {l}")).unwrap_or_default();
        r.at(
            &FieldPath::root().key("runtimes").key(&name),
            format!(
                "runtime `{name}` is declared both in the manifest {}{} and in the runtimes \
                 file {}{}",
                manifest_path.display(),
                at(mine.line),
                file_path.display(),
                at(entry.line)
            ),
            "declare it in one of the two files (rename one if they are different runtimes)",
        );
        mine.spec = None;
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let ok = |s: &str| parse_endpoint(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        let e = ok("http://127.0.0.1:7301");
        assert_eq!((e.tls, e.host.as_str(), e.port), (false, "127.0.0.1", 7301));
        assert!(e.is_loopback());
        assert!(ok("http://127.3.4.5:1").is_loopback());
        assert!(ok("http://[::1]:7300").is_loopback());
        assert!(ok("http://LocalHost:80").is_loopback());
        let e = ok("https://gpu-1.internal:7300");
        assert!(e.tls && !e.is_loopback());
        assert!(!ok("http://10.0.0.1:7300").is_loopback());
        assert!(!ok("http://localhost.evil.com:1").is_loopback());
        for bad in [
            "",
            "127.0.0.1:7300",
            "grpc://h:1",
            "http://h",
            "http://h:",
            "http://h:0",
            "http://h:65536",
            "http://h:+80",
            "http://h:80/",
            "http://h:80/path",
            "http://u@h:80",
            "http://:80",
            "http://::1:80",
            "http://[zz]:80",
            "http://[::1]",
            "http://999.1.1.1:80",
            "http://a..b:80",
            "http://-a:80",
            "http://h h:80",
        ] {
            assert!(parse_endpoint(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn names() {
        for good in ["box-a", "gpu", "a", "0", "x_1-y", &"a".repeat(63)] {
            assert_eq!(name_error(good), None, "{good}");
        }
        for bad in [
            "",
            "Box",
            "-a",
            "_a",
            "a.b",
            "a b",
            "é",
            "local-process",
            "fake",
            &"a".repeat(64),
        ] {
            assert!(name_error(bad).is_some(), "{bad}");
        }
    }
}
