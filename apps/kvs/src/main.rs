//! kvs: a memcached-compatible key-value server.
fn main() {}
