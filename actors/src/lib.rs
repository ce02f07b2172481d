//! `overseer-actors`: the domain model, the actor tree and the ports of
//! overseer.
//!
//! ```text
//! OrchestratorActor                 (root; supervises root sessions, restarts them)
//! └── SessionActor                  (one per live session; pure machine + checkpoints)
//!     ├── ToolCallActor             (one per running tool call)
//!     └── provider stream task      (not an actor; reports back as messages)
//! ```
//!
//! This crate never touches the network or the disk: storage, providers and
//! tools are traits ([`store::CheckpointStore`], [`provider::Provider`],
//! [`tool::Tool`]) implemented by the `overseer` crate. The only
//! implementations here are the ones that need neither: [`store::MemStore`]
//! and [`scripted::ScriptedProvider`].

#![warn(missing_docs, unreachable_pub)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

// The public surface: the handle, the ports and the types they speak.
pub mod error;
#[cfg(feature = "fault-injection")]
pub mod fault;
#[cfg(not(feature = "fault-injection"))]
mod fault_off;
pub mod genai;
pub mod hub;
pub mod library;
pub mod limits;
pub mod metrics;
pub mod model;
pub mod provider;
pub mod schema;
pub mod scripted;
pub mod skills;
pub mod store;
pub mod supervision;
pub mod tasks;
pub mod tool;

// The actor tree and its bookkeeping: reached only through [`Overseer`].
pub(crate) mod delegation;

pub(crate) mod janitor;
pub(crate) mod journal;
pub(crate) mod machine;
pub(crate) mod messages;
pub(crate) mod orchestrator;
mod overseer;
pub(crate) mod ownership;
pub(crate) mod runtime;
pub(crate) mod session;
pub(crate) mod timers;
pub(crate) mod tool_call;

#[cfg(feature = "testing")]
pub mod testing;

pub use error::SessionError;
#[cfg(feature = "fault-injection")]
pub(crate) use fault::fault_point;
#[cfg(not(feature = "fault-injection"))]
pub(crate) use fault_off::fault_point;
pub use library::Library;
pub use limits::{IdlePressure, Limits};
pub use machine::{ForkAt, ForkPoint, ForkPointKind, DEFAULT_COMPACTION_THRESHOLD_PCT};
pub use model::SessionOverrides;
pub use overseer::{
    CreateSession, HistoryPoint, Overseer, PendingApproval, TaskRun, TreeNode, WeakOverseer,
};
pub use runtime::{Bookkeeping, JanitorConfig, Metrics, RuntimeConfig, DEFAULT_REST_AFTER};
pub use tool_call::run as run_tool;
