//! A case's stage activities, one file per stage as in `casebatch_workflows::case`: `start`
//! (provision and submit), `settle` (await, evaluate, collect), `cleanup` (the end of every
//! attempt), `ahead` (environments provisioned ahead of their slot) and `legacy` (the single
//! stages of the old pipeline), over the context they share.

pub(crate) mod ahead;
pub(crate) mod cleanup;
pub(crate) mod context;
pub(crate) mod legacy;
pub(crate) mod settle;
pub(crate) mod space;
pub(crate) mod start;
