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

pub mod delegation;
pub mod error;
#[cfg(feature = "fault-injection")]
pub mod fault;
#[cfg(not(feature = "fault-injection"))]
mod fault_off;
pub mod genai;
pub mod hub;
pub mod janitor;
pub mod journal;
pub mod library;
pub mod limits;
pub mod machine;
pub mod messages;
pub mod metrics;
pub mod model;
pub mod orchestrator;
pub mod overseer;
pub mod ownership;
pub mod provider;
pub mod runtime;
pub mod schema;
pub mod scripted;
pub mod session;
pub mod skills;
pub mod store;
pub mod supervision;
pub mod tasks;
pub mod timers;
pub mod tool;
pub mod tool_call;

pub use error::SessionError;
#[cfg(feature = "fault-injection")]
pub(crate) use fault::fault_point;
#[cfg(not(feature = "fault-injection"))]
pub(crate) use fault_off::fault_point;
pub use library::Library;
pub use limits::{IdlePressure, Limits};
pub use model::SessionOverrides;
pub use overseer::{CreateSession, HistoryPoint, Overseer, PendingApproval, TaskRun, TreeNode};
pub use runtime::{Bookkeeping, Runtime, RuntimeConfig};
