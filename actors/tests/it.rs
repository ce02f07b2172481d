//! The integration tests of `overseer-actors`, one binary: a module per
//! former test file, under `it/`.

mod common;

#[path = "it/delegation.rs"]
mod delegation;
#[path = "it/fork.rs"]
mod fork;
#[path = "it/invariants.rs"]
mod invariants;
#[path = "it/library.rs"]
mod library;
#[path = "it/limits.rs"]
mod limits;
#[path = "it/long_conversations.rs"]
mod long_conversations;
#[path = "it/ownership.rs"]
mod ownership;
#[path = "it/recovery.rs"]
mod recovery;
#[path = "it/resting.rs"]
mod resting;
#[path = "it/turn_loop.rs"]
mod turn_loop;
