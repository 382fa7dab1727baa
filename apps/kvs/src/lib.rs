//! kvs: a memcached-compatible key-value server built on trusts.
//!
//! This library is the runtime-independent core of the `kvs` binary:
//!
//! * [`protocol`]: memcached's text protocol, an incremental parser and answer encoders,
//!   byte-compatible with memcached 1.6 including its error answers; [`meta`] its meta
//!   commands;
//! * [`store`]: one shard of the table (items, LRU, memory limit, expiry, cas), a plain
//!   struct that the server entrusts to a trustee, driven by [`store::execute`];
//! * [`conn`]: per-connection input buffering, planning a request into shard commands and
//!   rendering their replies in order, plus [`conn::Engine`], a synchronous reference server;
//! * [`config`]: memcached's command-line options and the `stats` answers;
//! * [`server`]: the network server on the trust runtime (one fiber per connection,
//!   requests shipped to the shards' trustees with `apply_then`);
//! * [`rack`]: the same server as a rack job (`gsm run -n 4 -- kvs`), one table across
//!   every rank's trustees.
//!
//! Layers, each file importing only from those below it: `common` (what both parsers and
//! the store share: limits, [`protocol::ErrorReply`], [`protocol::StoreMode`],
//! [`protocol::item_size`], number reading), then [`store`], then [`meta`] (the meta-command
//! parser, which builds store operations), then [`protocol`] (the classic parser, which hands
//! `m*` lines to [`meta`]), then [`config`], [`conn`], [`server`] and [`rack`].
//!
//! ```
//! use kvs::conn::Engine;
//! let mut engine = Engine::new(kvs::config::Config::default(), 0);
//! let mut conn = engine.connect();
//! let (out, _) = engine.feed(&mut conn, b"incr n 1\r\nversion\r\n", 0);
//! assert!(out.starts_with(b"NOT_FOUND\r\nVERSION 1.6.18"));
//! ```

mod common;
pub mod config;
pub mod conn;
pub mod meta;
pub mod protocol;
pub mod rack;
pub mod server;
pub mod store;
