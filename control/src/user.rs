//! Who runs a command: the owner a batch's memo records and the user its shared runtimes'
//! slots are split between.

use casebatch_attempt::hostname;

/// `user@host` of this process: `USER`, else `LOGNAME`, else the passwd name of its uid.
pub(crate) fn user_at_host() -> String {
    use std::os::unix::fs::MetadataExt;
    let from_passwd = || {
        let uid = std::fs::metadata("/proc/self").ok()?.uid().to_string();
        let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
        passwd.lines().find_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            (f.nth(1)? == uid).then(|| name.to_string())
        })
    };
    let user = ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
        .or_else(from_passwd)
        .unwrap_or_else(|| "unknown".into());
    format!("{user}@{}", hostname())
}
