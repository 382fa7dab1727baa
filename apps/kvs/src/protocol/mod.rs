//! memcached's text protocol: an incremental request parser and the answer encoders.
//!
//! [`parse`] looks at the bytes a connection has buffered and returns one of
//! [`Parse::Incomplete`] (read more), [`Parse::Request`] (one request and how many bytes it
//! used) or [`Parse::Close`] (drop the connection, as memcached does). It never panics and
//! never allocates more than a key list.
//!
//! The behaviour copies memcached 1.6 byte for byte (checked against Debian's memcached
//! 1.6.18, see `tests/protocol.rs`):
//!
//! * a line ends at `\n`; one `\r` before it is dropped; the line is cut at the first NUL;
//!   tokens are separated by spaces only (a tab is part of a key);
//! * numbers are read like C's `strtol`/`strtoul` do in memcached's `safe_strto*`: leading
//!   white space and a sign are allowed, trailing white space is allowed, and 32-bit fields
//!   keep the low 32 bits of a larger number (`set k 4294967296 0 1` stores flags `0`);
//! * an unknown command, or a known one with the wrong number of tokens, is answered `ERROR`;
//! * a malformed argument is answered `CLIENT_ERROR bad command line format` (or the
//!   command's own message), and for storage commands the data block is **not** skipped:
//!   memcached reads it as the next command line, so does this parser;
//! * a data block that does not end in `\r\n` exactly `bytes` bytes later is answered
//!   `CLIENT_ERROR bad data chunk`, after consuming `bytes + 2` bytes;
//! * a value larger than the item size limit is answered
//!   `SERVER_ERROR object too large for cache` and its data block is swallowed; a `set` that
//!   is too large also deletes the old value of the key;
//! * a line without `\n` longer than 2048 bytes closes the connection, unless it is a
//!   `get`/`gets` (multi-gets may be long; here up to [`Limits::max_get_line`] bytes); so
//!   does a line whose `\n` comes [`READ_BUFFER_SIZE`] bytes or more after its start, which
//!   memcached cannot hold (between the two, memcached's answer depends on how the bytes
//!   arrive; this parser answers the line);
//! * `noreply` (as the last token) silences the answer, errors included, like memcached.
//!
//! Meta commands (`mg`, `ms`, `md`, `ma`, `mn`) are parsed by [`crate::meta`]; `me` answers
//! `ERROR`.
//!
//! The items the parsers share with each other and with the store (limits, [`ErrorReply`],
//! [`StoreMode`], [`item_size`], number reading) live in the crate's lower `common` module and
//! are re-exported here; `parse.rs` holds the classic parser, `encode.rs` the answer encoders.

mod encode;
mod parse;

pub use crate::common::{
    ErrorReply, ITEM_OVERHEAD, KEY_MAX_LENGTH, Limits, MAX_LINE_WITHOUT_NEWLINE, READ_BUFFER_SIZE,
    REALTIME_MAXDELTA, StoreMode, VERSION, item_size, safe_strtol, safe_strtoul32, safe_strtoull,
};
pub use encode::{encode_line, encode_number, encode_stat, encode_value};
pub use parse::{Parse, Request, StatsGroup, parse};
