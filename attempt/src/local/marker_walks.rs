//! Marker scans shared between concurrent cleanups: one walk of `/proc` answers every scan
//! asked for before it began.
//!
//! Why: a cleanup's scan reads the stat of every process and the environment of every process
//! younger than its job, and in a wide batch those are mostly the other cases' processes. With
//! 256 cases in flight each cleanup read about a thousand `/proc` files alone, so the cost of a
//! case grew with the batch's width. Cleanups end in bursts; a burst now shares a walk.
//!
//! Correctness: a scan must not be answered by a walk that began before it was asked for (the
//! walk could predate the kill it checks). Each ask takes a ticket; a walk serves the tickets
//! taken before it began, at the lowest start time any of them asks about, looking for the
//! markers they ask about (and passing over every other case's processes).

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock, Mutex};

use crate::local::procfs::{self, MarkerScan, Walk};

/// Scans waiting for a walk: ticket → the marker and the start time (clock ticks) each
/// asks about.
#[derive(Default)]
struct Asks {
    next: u64,
    waiting: BTreeMap<u64, (String, Option<u64>)>,
}

/// The latest walk and the first ticket it does not serve.
struct Latest {
    serves_below: u64,
    walk: Arc<Walk>,
}

static ASKS: LazyLock<Mutex<Asks>> = LazyLock::new(Mutex::default);
/// Held while walking, so asks that arrive meanwhile wait for the next walk together.
static LATEST: LazyLock<tokio::sync::Mutex<Option<Latest>>> =
    LazyLock::new(tokio::sync::Mutex::default);

/// The processes started at or after `since_ticks` (all, without it) that carry `marker` in
/// their environment, as [`procfs::scan_marker_since`] finds them, from a walk of `/proc`
/// that began after this call did.
pub async fn scan_marker_since(marker: &str, since_ticks: Option<u64>) -> MarkerScan {
    let ticket = {
        let mut asks = ASKS.lock().expect("asks");
        let ticket = asks.next;
        asks.next += 1;
        asks.waiting
            .insert(ticket, (marker.to_string(), since_ticks));
        ticket
    };
    let walk = {
        let mut latest = LATEST.lock().await;
        match latest.as_ref() {
            Some(l) if ticket < l.serves_below => l.walk.clone(),
            _ => {
                let (serves_below, floor, markers) = {
                    let asks = ASKS.lock().expect("asks");
                    let floor = asks
                        .waiting
                        .values()
                        .try_fold(u64::MAX, |low, (_, since)| since.map(|s| low.min(s)));
                    let markers: Vec<String> =
                        asks.waiting.values().map(|(m, _)| m.clone()).collect();
                    (asks.next, floor, markers)
                };
                let walk = tokio::task::spawn_blocking(move || {
                    let markers: Vec<&str> = markers.iter().map(String::as_str).collect();
                    procfs::walk(floor, &markers)
                })
                .await
                .map(Arc::new)
                // A panicked walk: this ask walks alone, on this thread.
                .unwrap_or_else(|_| Arc::new(procfs::walk(since_ticks, &[marker])));
                *latest = Some(Latest {
                    serves_below,
                    walk: walk.clone(),
                });
                walk
            }
        }
    };
    ASKS.lock().expect("asks").waiting.remove(&ticket);
    walk.select(marker, since_ticks)
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    use super::*;

    fn marked_sleeper(marker: &str) -> std::process::Child {
        let mut cmd = Command::new("sleep");
        cmd.arg("30")
            .env(procfs::MARKER_ENV, marker)
            .stdout(Stdio::null())
            .process_group(0);
        cmd.spawn().expect("spawn sleep")
    }

    /// Concurrent asks each find their own marked process, and only theirs, also when one
    /// walk answers several of them; a process started after an ask's `since` is found, an
    /// older one is not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_scans_each_find_their_own_process() {
        let markers: Vec<String> = (0..8)
            .map(|i| format!("walks-test-{}-{i}", std::process::id()))
            .collect();
        let mut children: Vec<_> = markers.iter().map(|m| marked_sleeper(m)).collect();
        // Until a child has exec'd, its environment is still ours (without the marker).
        for m in &markers {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while procfs::scan_marker(m).marked.is_empty() {
                assert!(std::time::Instant::now() < deadline, "{m} never exec'd");
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
        let asks: Vec<_> = markers
            .iter()
            .zip(&children)
            .map(|(m, c)| {
                let (m, pid) = (m.clone(), c.id());
                tokio::spawn(async move { (pid, scan_marker_since(&m, None).await) })
            })
            .collect();
        for ask in asks {
            let (pid, scan) = ask.await.expect("scan task");
            assert_eq!(scan.marked, vec![pid]);
        }
        let first = &children[0];
        let born = procfs::start_ticks(first.id()).expect("alive");
        let found = scan_marker_since(&markers[0], Some(born)).await;
        assert_eq!(found.marked, vec![first.id()], "as young as asked: found");
        let found = scan_marker_since(&markers[0], Some(born + 1_000_000)).await;
        assert!(found.marked.is_empty(), "older than asked: skipped");
        for c in &mut children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let gone = scan_marker_since(&markers[1], None).await;
        assert!(
            gone.marked.is_empty(),
            "a killed process is not found again"
        );
    }
}
