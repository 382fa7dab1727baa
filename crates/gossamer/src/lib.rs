//! Gossamer: the rack. `Trust<T>` across processes and machines over TCP.
//!
//! A rack program is one binary started once per node (process). Each node runs a `trust`
//! runtime; a property lives on one trustee worker of one node, and any fiber on any node
//! applies closures to it. This crate adds what crossing a process boundary needs on top of
//! `trust`, which stays network-free:
//!
//! - [`env`]: every `GSM_*` setting and how rank, size and the coordinator are found;
//! - `handshake`: what every connection proves before its first frame;
//! - `wire`: the frame format, decoded without trusting a byte.

pub mod env;
mod handshake;
mod wire;
