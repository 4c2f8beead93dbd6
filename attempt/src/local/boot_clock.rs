//! Time since the host booted, the clock a local job's deadline is measured on: it never
//! steps (an NTP correction, a resumed VM or a laptop waking moves the wall clock, not this),
//! it counts time suspended like a wall clock would, and it is the clock of a process's start
//! time in `/proc` (`start_ticks`), so a job's age is known to any worker on its host, after
//! any restart, without a record of its own. Read from `/proc/uptime`, which no time-faking
//! library rewrites: what a test steps is the wall clock alone.

use crate::local::kernel::read_generated_text;

/// Milliseconds since boot, now; `None` where `/proc/uptime` cannot be read.
pub fn now_ms() -> Option<u64> {
    let text = read_generated_text("/proc/uptime").ok()?;
    parse_uptime(&text)
}

fn parse_uptime(text: &str) -> Option<u64> {
    let seconds = text.split_whitespace().next()?;
    let (whole, fraction) = seconds.split_once('.').unwrap_or((seconds, "0"));
    let whole: u64 = whole.parse().ok()?;
    // Hundredths, as the kernel writes them; more digits are cut, fewer padded.
    let fraction = format!("{fraction:0<3}");
    let millis: u64 = fraction.get(..3)?.parse().ok()?;
    Some(whole * 1000 + millis)
}

/// A process start time in clock ticks since boot (`/proc/<pid>/stat` field 22), in
/// milliseconds since boot.
pub fn ticks_to_ms(ticks: u64) -> u64 {
    ticks * 1000 / clock_ticks_per_second()
}

fn clock_ticks_per_second() -> u64 {
    static TCK: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| {
        nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .and_then(|t| u64::try_from(t).ok())
            .filter(|t| *t > 0)
            .unwrap_or(100)
    });
    *TCK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uptime_reads_as_milliseconds_since_boot() {
        assert_eq!(parse_uptime("350735.47 1234.56\n"), Some(350_735_470));
        assert_eq!(parse_uptime("12.5 1.0"), Some(12_500));
        assert_eq!(parse_uptime("7 0"), Some(7_000));
        assert_eq!(parse_uptime(""), None);
        let now = now_ms().expect("/proc/uptime");
        // This process started after boot, and its start is on the same clock.
        let started = crate::local::procfs::start_ticks(std::process::id()).unwrap();
        assert!(ticks_to_ms(started) <= now, "{started} ticks, {now} ms");
    }
}
