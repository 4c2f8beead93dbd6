//! Reading the files the kernel generates as they are read (`/proc/<pid>/stat`, `/proc/stat`,
//! cgroup files): in as few reads as it takes, and a process's stat into the fields the
//! machinery needs.

use std::fs;

/// What cleanup needs of `/proc/<pid>/stat`, from one read of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// State letter (`R`, `S`, `Z`, ...), field 3.
    pub state: u8,
    /// Parent, field 4.
    pub ppid: u32,
    /// Process group, field 5.
    pub pgrp: u32,
    /// Kernel flags (`PF_*`), field 9.
    pub flags: u64,
    /// Start time in clock ticks since boot, field 22.
    pub start_ticks: u64,
}

impl Stat {
    /// Neither a zombie nor dead.
    pub fn is_alive(&self) -> bool {
        !matches!(self.state, b'Z' | b'X')
    }

    /// Kernel threads have no environment to read and are never an attempt's descendants.
    pub(crate) fn is_kernel_thread(&self) -> bool {
        const PF_KTHREAD: u64 = 0x0020_0000;
        self.flags & PF_KTHREAD != 0
    }

    /// Parses a stat line. The command name (field 2) may contain spaces and parentheses:
    /// fields are counted after the last `)`.
    fn parse(line: &[u8]) -> Option<Self> {
        let close = line.iter().rposition(|b| *b == b')')?;
        let mut fields = line[close + 1..]
            .split(|b| b.is_ascii_whitespace())
            .filter(|f| !f.is_empty());
        let number = |f: &[u8]| std::str::from_utf8(f).ok()?.parse().ok();
        let state = *fields.next()?.first()?;
        let ppid = number(fields.next()?)?;
        let pgrp = number(fields.next()?)?;
        let flags = number(fields.nth(3)?)?;
        let start_ticks = number(fields.nth(12)?)?;
        Some(Self {
            state,
            ppid: u32::try_from(ppid).ok()?,
            pgrp: u32::try_from(pgrp).ok()?,
            flags,
            start_ticks,
        })
    }
}

/// The whole of a file the kernel generates as it is read (`/proc`, `/sys/fs/cgroup`), in as
/// few reads as it takes. Such a file says its size is 0, so `fs::read` would `fstat` and
/// `lseek` it for nothing and then read 32 bytes, 32, 64, ... doubling: eight reads for
/// `/proc/stat`, which every walk of `/proc` reads twice.
pub fn read_generated(path: impl AsRef<std::path::Path>) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut file = fs::File::open(path)?;
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(2 * len, 0);
        }
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    Ok(buf)
}

/// [`read_generated`], as text.
pub fn read_generated_text(path: impl AsRef<std::path::Path>) -> std::io::Result<String> {
    String::from_utf8(read_generated(path)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// One read of `/proc/<pid>/stat`, into a buffer on the stack: cleanup reads the stat of
/// every process on the host, so this is its hottest path.
pub fn stat(pid: u32) -> Option<Stat> {
    use std::io::Read;
    let mut file = fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    // The line is a few hundred bytes; a command name is at most 64.
    let mut buf = [0u8; 1024];
    let mut len = 0;
    while len < buf.len() {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Stat::parse(&buf[..len])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_file_is_read_whole_however_long() {
        for path in ["/proc/self/cmdline", "/proc/self/environ"] {
            assert_eq!(
                read_generated(path).unwrap(),
                fs::read(path).unwrap(),
                "{path}"
            );
        }
        let stat = read_generated_text("/proc/stat").unwrap();
        assert!(stat.lines().any(|l| l.starts_with("processes ")), "{stat}");
        // Past the first buffer and its doubling.
        let dir = tempfile::tempdir().unwrap();
        let long: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("long"), &long).unwrap();
        assert_eq!(read_generated(dir.path().join("long")).unwrap(), long);
        assert!(read_generated(dir.path().join("missing")).is_err());
    }

    #[test]
    fn a_stat_line_is_read_after_the_last_parenthesis_of_its_command_name() {
        // A command name may hold spaces and parentheses; field 22 is the start time.
        let line = b"4242 (a) b (c) S 1 4240 4240 0 -1 4194560 97 0 0 0 1 2 0 0 20 0 1 0 \
            123456 2490368 215 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
        assert_eq!(
            Stat::parse(line),
            Some(Stat {
                state: b'S',
                ppid: 1,
                pgrp: 4240,
                flags: 4_194_560,
                start_ticks: 123_456,
            })
        );
        assert_eq!(Stat::parse(b"4242 (cut short) S 1 2"), None);
        // This very process, as the kernel writes it.
        let me = stat(std::process::id()).expect("own stat");
        assert_eq!(me.pgrp, nix::unistd::getpgrp().as_raw() as u32);
        assert!(me.is_alive() && !me.is_kernel_thread());
    }
}
