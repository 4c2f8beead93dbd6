//! The batch's lifecycle as one enum and one transition function: which operator controls a
//! phase accepts, what each one leads to, and the timeline note it leaves. Pure, so every
//! phase × control pair is unit-tested, and a combination such as "paused and cancelling" is
//! not representable.
//!
//! ```text
//!            ┌──────── pause ───────┐
//!            ▼                      │
//!         Running ⇄ Paused     (unpause)
//!            │ drain    → Draining
//!            │ cancel   → Cancelling
//!            │ supersede→ Cancelling (superseded)     (from Paused and Draining too)
//!            └ the run ends → Finished                (from every phase)
//! ```

use casebatch_proto::Phase;

/// Where the batch's run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lifecycle {
    /// Admitting cases.
    Running,
    /// Admitting nothing; in-flight cases run on, and the run waits for `unpause`.
    Paused,
    /// Admitting nothing more; the run ends as drained once in-flight cases finish.
    Draining,
    /// In-flight cases are being cancelled (their cleanup still runs). `superseded`: the
    /// batch's jobs are force-killed and the killed cases go back to the queue.
    Cancelling { superseded: bool },
    /// The run has ended (its outcome is being written): every control is refused.
    Finished,
}

/// An operator's control, by signal or by update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    Drain,
    Pause,
    Unpause,
    Cancel,
    Supersede,
}

impl Control {
    fn verb(self) -> &'static str {
        match self {
            Control::Drain => "drain",
            Control::Pause => "pause",
            Control::Unpause => "unpause",
            Control::Cancel => "cancel",
            Control::Supersede => "supersede",
        }
    }
}

/// A control the phase accepts: the phase after it, and the note for the timeline when it
/// changed anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    pub next: Lifecycle,
    pub note: Option<&'static str>,
}

impl Lifecycle {
    /// The phase a run starts in: paused when the run it continues was.
    pub(crate) fn starting(paused: bool) -> Self {
        if paused {
            Lifecycle::Paused
        } else {
            Lifecycle::Running
        }
    }

    /// The one transition function. `Err` is why the control is refused: a checked update
    /// returns it to the operator, a signal (unchecked) leaves the phase as it is.
    pub(crate) fn on(self, control: Control) -> Result<Step, String> {
        use Control as C;
        use Lifecycle as L;
        let to = |next, note| Ok(Step { next, note });
        let stay = Ok(Step {
            next: self,
            note: None,
        });
        let refuse = |why: &str| Err(format!("cannot {}: {why}", control.verb()));
        const DRAINING: &str = "drain requested: no new admissions";
        const CANCELLING: &str = "cancel requested: in-flight cases are being cancelled";
        const SUPERSEDED: &str = "superseded: admissions stopped, running jobs are being killed";
        match (self, control) {
            (L::Finished, _) => refuse("the batch's run is over"),
            // Cancelling twice is harmless; superseding a cancelling batch also kills its jobs.
            (L::Cancelling { superseded }, C::Cancel) => to(L::Cancelling { superseded }, None),
            (L::Cancelling { superseded: true }, C::Supersede) => stay,
            (_, C::Supersede) => to(L::Cancelling { superseded: true }, Some(SUPERSEDED)),
            (L::Cancelling { .. }, _) => refuse("the batch is being cancelled"),
            (_, C::Cancel) => to(L::Cancelling { superseded: false }, Some(CANCELLING)),
            (L::Draining, C::Drain) => stay,
            (L::Draining, C::Pause) => {
                refuse("the batch is draining: it admits nothing more anyway")
            }
            (L::Draining, C::Unpause) | (L::Running, C::Unpause) => {
                refuse("the batch is not paused")
            }
            (_, C::Drain) => to(L::Draining, Some(DRAINING)),
            (L::Paused, C::Pause) => stay,
            (L::Running, C::Pause) => to(L::Paused, Some("paused")),
            (L::Paused, C::Unpause) => to(L::Running, Some("unpaused")),
        }
    }

    /// Why an operation that only makes sense while the batch may still admit cases (such as
    /// setting its concurrency) is refused now, if it is.
    pub(crate) fn refuses_admission_changes(self, action: &str) -> Option<String> {
        match self {
            Lifecycle::Finished => Some(format!("cannot {action}: the batch's run is over")),
            Lifecycle::Cancelling { .. } => {
                Some(format!("cannot {action}: the batch is being cancelled"))
            }
            _ => None,
        }
    }

    /// What `status` shows.
    pub(crate) fn phase(self) -> Phase {
        match self {
            Lifecycle::Running => Phase::Running,
            Lifecycle::Paused => Phase::Paused,
            Lifecycle::Draining => Phase::Draining,
            Lifecycle::Cancelling { .. } => Phase::Cancelling,
            Lifecycle::Finished => Phase::Finished,
        }
    }

    /// Whether new cases may be admitted.
    pub(crate) fn admits(self) -> bool {
        self == Lifecycle::Running
    }

    pub(crate) fn is_paused(self) -> bool {
        self == Lifecycle::Paused
    }

    pub(crate) fn is_draining(self) -> bool {
        self == Lifecycle::Draining
    }

    pub(crate) fn is_cancelling(self) -> bool {
        matches!(self, Lifecycle::Cancelling { .. })
    }

    pub(crate) fn is_superseded(self) -> bool {
        self == Lifecycle::Cancelling { superseded: true }
    }

    /// Draining or cancelling: a case waiting for a slot will never be granted one.
    pub(crate) fn winds_down(self) -> bool {
        self.is_draining() || self.is_cancelling()
    }
}

#[cfg(test)]
mod tests {
    use super::{Control as C, Lifecycle as L, *};

    const CONTROLS: [Control; 5] = [C::Drain, C::Pause, C::Unpause, C::Cancel, C::Supersede];

    const PHASES: [Lifecycle; 6] = [
        L::Running,
        L::Paused,
        L::Draining,
        L::Cancelling { superseded: false },
        L::Cancelling { superseded: true },
        L::Finished,
    ];

    /// The whole table, phase × control: the phase after it, or `None` when refused.
    fn expected(from: Lifecycle, control: Control) -> Option<Lifecycle> {
        let cancelled = L::Cancelling { superseded: false };
        let superseded = L::Cancelling { superseded: true };
        Some(match (from, control) {
            (L::Finished, _) => return None,
            (L::Running, C::Drain) => L::Draining,
            (L::Running, C::Pause) => L::Paused,
            (L::Running, C::Unpause) => return None,
            (L::Running, C::Cancel) => cancelled,
            (L::Running, C::Supersede) => superseded,
            (L::Paused, C::Drain) => L::Draining,
            (L::Paused, C::Pause) => L::Paused,
            (L::Paused, C::Unpause) => L::Running,
            (L::Paused, C::Cancel) => cancelled,
            (L::Paused, C::Supersede) => superseded,
            (L::Draining, C::Drain) => L::Draining,
            (L::Draining, C::Pause | C::Unpause) => return None,
            (L::Draining, C::Cancel) => cancelled,
            (L::Draining, C::Supersede) => superseded,
            (L::Cancelling { .. }, C::Drain | C::Pause | C::Unpause) => return None,
            (L::Cancelling { superseded: s }, C::Cancel) => L::Cancelling { superseded: s },
            (L::Cancelling { .. }, C::Supersede) => superseded,
        })
    }

    #[test]
    fn every_phase_and_control_follows_the_table() {
        for from in PHASES {
            for control in CONTROLS {
                let got = from.on(control);
                assert_eq!(
                    got.as_ref().ok().map(|s| s.next),
                    expected(from, control),
                    "{from:?} on {control:?}: {got:?}"
                );
            }
        }
    }

    #[test]
    fn a_note_is_left_exactly_when_the_phase_changes() {
        for from in PHASES {
            for control in CONTROLS {
                if let Ok(step) = from.on(control) {
                    assert_eq!(
                        step.note.is_some(),
                        step.next != from,
                        "{from:?} {control:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_refusal_names_the_control_and_the_reason() {
        let why = L::Draining.on(C::Pause).unwrap_err();
        assert_eq!(
            why,
            "cannot pause: the batch is draining: it admits nothing more anyway"
        );
        let why = L::Finished.on(C::Cancel).unwrap_err();
        assert_eq!(why, "cannot cancel: the batch's run is over");
        assert_eq!(
            L::Cancelling { superseded: false }.refuses_admission_changes("set the concurrency"),
            Some("cannot set the concurrency: the batch is being cancelled".to_string())
        );
        assert_eq!(L::Paused.refuses_admission_changes("x"), None);
    }

    #[test]
    fn only_running_admits_and_only_a_continued_paused_run_starts_paused() {
        for phase in PHASES {
            assert_eq!(phase.admits(), phase == L::Running);
        }
        assert_eq!(L::starting(true), L::Paused);
        assert_eq!(L::starting(false), L::Running);
    }
}
