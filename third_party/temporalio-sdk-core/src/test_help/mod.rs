#![allow(missing_docs)]

// Re-export unit test helpers (cfg(test) only)
#[cfg(test)]
pub use unit_helpers::*;

#[cfg(any(feature = "test-utilities", test))]
pub use integ_helpers::*;
#[cfg(any(feature = "test-utilities", test))]
pub use test_utils::*;

#[cfg(any(feature = "test-utilities", test))]
mod integ_helpers;
#[cfg(any(feature = "test-utilities", test))]
mod test_utils;
#[cfg(test)]
mod unit_helpers;
