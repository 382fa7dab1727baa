//! What crosses threads: shard commands and replies travel to and from trustees, a shard is
//! entrusted (moved to its trustee), configuration and statistics are shared.

use kvs::config::{Config, ServerStats};
use kvs::conn::{Engine, Input, Pending, Plan};
use kvs::protocol::{ErrorReply, Limits, Request};
use kvs::store::{ItemView, Shard, ShardCommand, ShardReply, ShardStats, Value};

fn send<T: Send>() {}
fn sync<T: Sync>() {}

#[test]
fn shard_traffic_is_send() {
    send::<Shard>();
    send::<ShardCommand>();
    send::<ShardReply>();
    send::<ItemView>();
    send::<Value>();
    send::<Plan>();
    send::<Pending>();
    send::<Input>();
    send::<Engine>();
}

#[test]
fn shared_data_is_sync() {
    sync::<Config>();
    sync::<Limits>();
    sync::<ServerStats>();
    sync::<ShardStats>();
    sync::<ErrorReply>();
    sync::<Request<'static>>();
    sync::<Value>();
}
