//! The `casebatch` command line as data: its flags (`cli.rs`), its exit codes (`exit.rs`), its
//! help, man pages and completions (`manual.rs`) and its logging setup (`logs.rs`). The binary
//! (`main.rs`, `commands/`, `render.rs`) runs them. Kept apart so that their unit tests build without the binary: a test build of the binary
//! compiles every command's engine code a second time, minutes on two cores.

pub mod cli;
pub mod exit;
pub mod logs;
pub mod manual;
