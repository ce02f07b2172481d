//! `overseer`: the edges around the actor tree of `overseer-actors`.
//!
//! This crate owns everything that touches the disk, the network or the
//! terminal: configuration, the sled checkpoint store, built-in tools,
//! scenario files for the scripted provider, the CLI and the HTTP API. It
//! deliberately holds no session logic: the turn loop, approvals and
//! supervision live in `overseer-actors` and are reached through its
//! [`Overseer`](overseer_actors::Overseer) handle.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod acp;
pub mod alloc;
pub mod auth;
pub mod backoff;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod docs;
pub mod http;
pub mod metrics;
pub mod provider;
pub mod render;
pub mod scenario;
pub mod scope_token;
pub mod service;
pub mod skills;
pub mod store;
pub mod telemetry;
pub mod tools;
pub mod webhooks;

pub use overseer_actors as actors;
