//! Per-case vectors in workflow payloads, packed so that no payload outgrows Temporal's
//! 2 MiB limit as a batch grows (a continue-as-new input of a 100,000-case batch with one JSON
//! object per case did, and the batch wedged for good).
//!
//! - [`slots`]: a batch's case states, one byte per case (state and attempts), deflated; a
//!   batch's states come in long runs (a finished prefix, a queued tail, scattered failures),
//!   so a million cases take tens of KiB.
//! - [`json`]: any other per-case vector (case loads, routes), as its JSON deflated: they
//!   repeat a handful of values.
//!
//! Both are written packed and read either way: histories recorded before hold the plain
//! JSON arrays and still replay.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{CaseSlot, CaseState};

/// Deflate level: the payloads are written once per segment, so the best ratio is worth it.
const LEVEL: u8 = 9;

/// Inflated bytes a packed field may claim: far above any real batch (a million cases is
/// 1 MB of slots, a few of JSON), far below what would exhaust a worker.
const INFLATE_LIMIT: usize = 256 << 20;

/// A packed field on the wire.
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Packed {
    /// Entries packed.
    pub n: u32,
    /// The encoding: `slots1` (one byte per case) or `json1` (the JSON array).
    pub enc: String,
    /// base64 (standard alphabet, padded) of the raw deflate stream.
    pub deflated: String,
    /// `slots1` only: `[case, attempts]` of cases whose attempts do not fit their byte.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wide: Vec<(u32, u32)>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Either<T> {
    Plain(Vec<T>),
    Packed(Packed),
}

fn deflate(bytes: &[u8]) -> String {
    BASE64.encode(miniz_oxide::deflate::compress_to_vec(bytes, LEVEL))
}

fn inflate(text: &str) -> Result<Vec<u8>, String> {
    let raw = BASE64
        .decode(text)
        .map_err(|e| format!("packed field: not base64: {e}"))?;
    miniz_oxide::inflate::decompress_to_vec_with_limit(&raw, INFLATE_LIMIT)
        .map_err(|e| format!("packed field: not a deflate stream: {e:?}"))
}

fn check_encoding(p: &Packed, want: &str) -> Result<(), String> {
    if p.enc == want {
        Ok(())
    } else {
        Err(format!(
            "packed field: encoding {:?}, expected {want:?} (written by a newer casebatch?)",
            p.enc
        ))
    }
}

/// `#[serde(with = "packed::slots")]` for a `Vec<CaseSlot>`.
pub mod slots {
    use super::*;

    /// Attempts up to this fit the byte (5 bits); a case with more is listed in `wide`, and
    /// its byte holds this value.
    const WIDE: u32 = 31;

    fn code(state: CaseState) -> u8 {
        match state {
            CaseState::Queued => 0,
            CaseState::Running => 1,
            CaseState::Succeeded => 2,
            CaseState::Failed => 3,
            CaseState::Cancelled => 4,
            // Only a case's record shows it; the workflow never holds it.
            CaseState::Retrying => 5,
        }
    }

    fn state(code: u8) -> Option<CaseState> {
        Some(match code {
            0 => CaseState::Queued,
            1 => CaseState::Running,
            2 => CaseState::Succeeded,
            3 => CaseState::Failed,
            4 => CaseState::Cancelled,
            5 => CaseState::Retrying,
            _ => return None,
        })
    }

    pub fn pack(slots: &[CaseSlot]) -> Packed {
        let mut wide = Vec::new();
        let bytes: Vec<u8> = slots
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let attempts = if s.attempts >= WIDE {
                    wide.push((i as u32, s.attempts));
                    WIDE
                } else {
                    s.attempts
                };
                code(s.state) | (attempts as u8) << 3
            })
            .collect();
        Packed {
            n: slots.len() as u32,
            enc: "slots1".into(),
            deflated: deflate(&bytes),
            wide,
        }
    }

    pub fn unpack(p: &Packed) -> Result<Vec<CaseSlot>, String> {
        check_encoding(p, "slots1")?;
        let bytes = inflate(&p.deflated)?;
        if bytes.len() != p.n as usize {
            return Err(format!(
                "packed slots: {} bytes for {} cases",
                bytes.len(),
                p.n
            ));
        }
        let mut slots = bytes
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let state = state(b & 0b111)
                    .ok_or_else(|| format!("packed slots: case {i}: state code {}", b & 0b111))?;
                Ok(CaseSlot {
                    state,
                    attempts: u32::from(b >> 3),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        for &(case, attempts) in &p.wide {
            let slot = slots
                .get_mut(case as usize)
                .ok_or_else(|| format!("packed slots: wide entry for case {case} of {}", p.n))?;
            slot.attempts = attempts;
        }
        Ok(slots)
    }

    pub fn serialize<S: Serializer>(slots: &[CaseSlot], s: S) -> Result<S::Ok, S::Error> {
        pack(slots).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<CaseSlot>, D::Error> {
        match Either::<CaseSlot>::deserialize(d)? {
            Either::Plain(slots) => Ok(slots),
            Either::Packed(p) => unpack(&p).map_err(serde::de::Error::custom),
        }
    }
}

/// `#[serde(with = "packed::json")]` for a `Vec<T>` of few distinct values.
pub mod json {
    use super::*;

    pub fn pack<T: Serialize>(items: &[T]) -> Result<Packed, serde_json::Error> {
        Ok(Packed {
            n: items.len() as u32,
            enc: "json1".into(),
            deflated: deflate(&serde_json::to_vec(items)?),
            wide: Vec::new(),
        })
    }

    pub fn unpack<T: DeserializeOwned>(p: &Packed) -> Result<Vec<T>, String> {
        check_encoding(p, "json1")?;
        let items: Vec<T> = serde_json::from_slice(&inflate(&p.deflated)?)
            .map_err(|e| format!("packed field: {e}"))?;
        if items.len() != p.n as usize {
            return Err(format!(
                "packed field: {} entries, {} announced",
                items.len(),
                p.n
            ));
        }
        Ok(items)
    }

    pub fn serialize<T: Serialize, S: Serializer>(items: &[T], s: S) -> Result<S::Ok, S::Error> {
        pack(items).map_err(serde::ser::Error::custom)?.serialize(s)
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<Vec<T>, D::Error>
    where
        T: DeserializeOwned,
        D: Deserializer<'de>,
    {
        match Either::<T>::deserialize(d)? {
            Either::Plain(items) => Ok(items),
            Either::Packed(p) => unpack(&p).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Carried, CaseLoad, CaseRoute};

    /// A small, seeded generator: the sizes below are the same on every run.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn percent(&mut self) -> u64 {
            self.next() % 100
        }
    }

    /// A batch of the most cases allowed, 70 % through: most cases passed first time, some on a
    /// retry, some failed after three attempts or were cancelled, 64 are running, the rest
    /// wait.
    fn million_case_slots() -> Vec<CaseSlot> {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let frontier = crate::MAX_BATCH_CASES / 10 * 7;
        (0..crate::MAX_BATCH_CASES)
            .map(|i| {
                let (state, attempts) = if i >= frontier {
                    (CaseState::Queued, 0)
                } else if i >= frontier - 64 {
                    (CaseState::Running, 1)
                } else {
                    match rng.percent() {
                        0..=84 => (CaseState::Succeeded, 1),
                        85..=91 => (CaseState::Succeeded, 2),
                        92..=97 => (CaseState::Failed, 3),
                        _ => (CaseState::Cancelled, 1),
                    }
                };
                CaseSlot { state, attempts }
            })
            .collect()
    }

    #[test]
    fn carried_state_of_the_largest_batch_stays_under_256_kib() {
        let carried = Carried {
            slots: million_case_slots(),
            ..Carried::default()
        };
        let json = serde_json::to_vec(&carried).unwrap();
        eprintln!("carried state of 1,000,000 cases: {} bytes", json.len());
        assert!(
            json.len() < 256 * 1024,
            "carried state of 1,000,000 cases is {} bytes",
            json.len()
        );
        let back: Carried = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, carried);
    }

    /// No pattern at all (every case a random state and 0 to 7 attempts) is the worst a
    /// batch can do: the most cases allowed still fit a payload, with room to spare.
    #[test]
    fn the_largest_batch_of_random_slots_still_fits_a_payload() {
        let mut rng = XorShift(42);
        let slots: Vec<CaseSlot> = (0..crate::MAX_BATCH_CASES)
            .map(|_| CaseSlot {
                state: slots_state(rng.next() % 5),
                attempts: (rng.next() % 8) as u32,
            })
            .collect();
        let json = serde_json::to_vec(&slots::pack(&slots)).unwrap();
        eprintln!("1,000,000 random slots: {} bytes", json.len());
        assert!(json.len() < 1536 * 1024, "{} bytes", json.len());
        assert_eq!(slots::unpack(&slots::pack(&slots)).unwrap(), slots);
    }

    fn slots_state(code: u64) -> CaseState {
        [
            CaseState::Queued,
            CaseState::Running,
            CaseState::Succeeded,
            CaseState::Failed,
            CaseState::Cancelled,
        ][code as usize]
    }

    #[test]
    fn attempts_past_a_byte_round_trip() {
        let slots = vec![
            CaseSlot {
                state: CaseState::Failed,
                attempts: 31,
            },
            CaseSlot {
                state: CaseState::Succeeded,
                attempts: 30,
            },
            CaseSlot {
                state: CaseState::Queued,
                attempts: 4_000_000,
            },
        ];
        let packed = slots::pack(&slots);
        assert_eq!(packed.wide, vec![(0, 31), (2, 4_000_000)]);
        assert_eq!(slots::unpack(&packed).unwrap(), slots);
    }

    /// Inputs and results recorded before packing hold plain arrays: they still read.
    #[test]
    fn plain_arrays_of_older_histories_still_read() {
        let mut recorded = serde_json::to_value(Carried::default()).unwrap();
        recorded["slots"] = serde_json::json!([{"s": "succeeded", "a": 1}, {"s": "queued"}]);
        let carried: Carried = serde_json::from_value(recorded).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(carried.slots.len(), 2);
        assert_eq!(carried.slots[0].state, CaseState::Succeeded);
        assert_eq!(carried.slots[1].attempts, 0);

        let loads: Vec<CaseLoad> = json::deserialize(&serde_json::json!([[0, 512], [null, 0]]))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(loads, vec![CaseLoad(Some(0), 512), CaseLoad(None, 0)]);
    }

    #[test]
    fn a_million_case_loads_and_routes_pack_small() {
        let loads: Vec<CaseLoad> = (0..1_000_000u32)
            .map(|i| CaseLoad(Some((i % 3) as u16), 512))
            .collect();
        let routes: Vec<Option<CaseRoute>> = (0..1_000_000u32)
            .map(|i| Some(CaseRoute(0, (i % 2) as u16)))
            .collect();
        for size in [
            serde_json::to_vec(&json::pack(&loads).unwrap())
                .unwrap()
                .len(),
            serde_json::to_vec(&json::pack(&routes).unwrap())
                .unwrap()
                .len(),
        ] {
            assert!(size < 64 * 1024, "{size} bytes");
        }
        assert_eq!(
            json::unpack::<CaseLoad>(&json::pack(&loads).unwrap()).unwrap(),
            loads
        );
    }

    #[test]
    fn a_corrupt_packed_field_is_an_error_not_a_panic() {
        let mut packed = slots::pack(&million_case_slots()[..10]);
        packed.n = 11;
        assert!(
            slots::unpack(&packed)
                .unwrap_err()
                .contains("10 bytes for 11")
        );
        packed.deflated = "not base64!".into();
        assert!(slots::unpack(&packed).unwrap_err().contains("base64"));
        packed.enc = "slots9".into();
        assert!(
            slots::unpack(&packed)
                .unwrap_err()
                .contains("newer casebatch")
        );
    }
}
