//! What memcached's classic and meta command parsers and the store share: the limits and
//! constants of memcached 1.6, the size it charges for an item, the storage modes, the error
//! answers, and reading numbers like its `safe_strto*`.

use serde::{Deserialize, Serialize};

/// memcached's longest key, in bytes.
pub const KEY_MAX_LENGTH: usize = 250;

/// A line longer than this without a newline closes the connection (memcached's rule),
/// unless it starts with `get ` or `gets `.
pub const MAX_LINE_WITHOUT_NEWLINE: usize = 2048;

/// memcached's read buffer: a line whose newline is further than this from its start is
/// never seen whole, and the connection is closed (unless it is a `get`/`gets`).
pub const READ_BUFFER_SIZE: usize = 16384;

/// Relative expiry times up to this many seconds (30 days) are relative; larger ones are
/// absolute Unix times.
pub const REALTIME_MAXDELTA: i64 = 60 * 60 * 24 * 30;

/// The version this server reports: the memcached protocol version it follows, then itself.
pub const VERSION: &str = concat!("1.6.18-kvs-", env!("CARGO_PKG_VERSION"));

/// Per-item overhead in memcached 1.6 on 64-bit Linux: the item header (48 bytes), the cas
/// unique (8), the key's NUL (1) and the data's `\r\n` (2). Client flags other than 0 add 4.
pub const ITEM_OVERHEAD: usize = 48 + 8 + 1 + 2;

/// The size memcached charges for an item: header, key and value, as its `bytes` statistic
/// counts it and as its item size limit (`-I`) applies to it.
///
/// ```
/// // memcached 1.6 with -I 1m stores a 1-byte key with at most 1048516 value bytes.
/// assert_eq!(kvs::protocol::item_size(1, 1_048_516, 0), 1024 * 1024);
/// ```
pub fn item_size(key_len: usize, value_len: usize, flags: u32) -> usize {
    ITEM_OVERHEAD + key_len + value_len + if flags != 0 { 4 } else { 0 }
}

/// Limits the parser enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest item (header + key + value, see [`item_size`]), memcached's `-I`.
    pub item_size_max: usize,
    /// Longest `get`/`gets` line accepted without a newline before the connection is closed.
    /// memcached has no such bound; this one keeps a connection's buffer finite.
    pub max_get_line: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            item_size_max: 1024 * 1024,
            max_get_line: 1024 * 1024,
        }
    }
}

/// The storage commands, which are followed by a data block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StoreMode {
    /// `set`: store unconditionally.
    Set,
    /// `add`: store only if the key is absent.
    Add,
    /// `replace`: store only if the key is present.
    Replace,
    /// `append`: add the data after the existing value.
    Append,
    /// `prepend`: add the data before the existing value.
    Prepend,
    /// `cas`: store only if the cas unique still matches.
    Cas,
}

/// An error answer, exactly as memcached writes it (without `\r\n`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorReply {
    /// `ERROR`: unknown command or wrong number of tokens.
    Error,
    /// `CLIENT_ERROR <message>`.
    Client(&'static str),
    /// `SERVER_ERROR <message>`.
    Server(&'static str),
    /// A free-form line (memcached's `ERROR: shutdown not enabled`).
    Raw(&'static str),
}

impl ErrorReply {
    /// `CLIENT_ERROR bad command line format`.
    pub const BAD_FORMAT: ErrorReply = ErrorReply::Client("bad command line format");
    /// `CLIENT_ERROR bad data chunk`.
    pub const BAD_CHUNK: ErrorReply = ErrorReply::Client("bad data chunk");
    /// `SERVER_ERROR object too large for cache`.
    pub const TOO_LARGE: ErrorReply = ErrorReply::Server("object too large for cache");
    /// `CLIENT_ERROR invalid exptime argument`.
    pub const BAD_EXPTIME: ErrorReply = ErrorReply::Client("invalid exptime argument");
    /// `CLIENT_ERROR invalid numeric delta argument`.
    pub const BAD_DELTA: ErrorReply = ErrorReply::Client("invalid numeric delta argument");
    /// `CLIENT_ERROR cannot increment or decrement non-numeric value`.
    pub const NON_NUMERIC: ErrorReply =
        ErrorReply::Client("cannot increment or decrement non-numeric value");
    /// `SERVER_ERROR out of memory storing object`.
    pub const OUT_OF_MEMORY: ErrorReply = ErrorReply::Server("out of memory storing object");

    /// Appends the answer line, with `\r\n`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            ErrorReply::Error => out.extend_from_slice(b"ERROR"),
            ErrorReply::Client(m) => {
                out.extend_from_slice(b"CLIENT_ERROR ");
                out.extend_from_slice(m.as_bytes());
            }
            ErrorReply::Server(m) => {
                out.extend_from_slice(b"SERVER_ERROR ");
                out.extend_from_slice(m.as_bytes());
            }
            ErrorReply::Raw(m) => out.extend_from_slice(m.as_bytes()),
        }
        out.extend_from_slice(b"\r\n");
    }
}

fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// C's `strto*` in base 10 on a token: `(negative, magnitude, overflowed, end)` or `None`
/// when no digit was found. The magnitude saturates; `overflowed` says it did not fit 64 bits.
fn c_strto(t: &[u8]) -> Option<(bool, u64, bool, usize)> {
    let mut i = 0;
    while i < t.len() && is_c_space(t[i]) {
        i += 1;
    }
    let mut neg = false;
    if i < t.len() && (t[i] == b'+' || t[i] == b'-') {
        neg = t[i] == b'-';
        i += 1;
    }
    let start = i;
    let mut mag: u64 = 0;
    let mut overflow = false;
    while i < t.len() && t[i].is_ascii_digit() {
        match mag
            .checked_mul(10)
            .and_then(|m| m.checked_add(u64::from(t[i] - b'0')))
        {
            Some(m) => mag = m,
            None => overflow = true,
        }
        i += 1;
    }
    if i == start {
        return None;
    }
    Some((neg, mag, overflow, i))
}

/// memcached's check after `strto*`: the number must end the token or be followed by space.
fn ends_well(t: &[u8], end: usize) -> bool {
    end == t.len() || is_c_space(t[end]) || t[end] == 0
}

/// memcached's `safe_strtoull`.
pub fn safe_strtoull(t: &[u8]) -> Option<u64> {
    let (neg, mag, overflow, end) = c_strto(t)?;
    if overflow || !ends_well(t, end) {
        return None;
    }
    let v = if neg { mag.wrapping_neg() } else { mag };
    if (v as i64) < 0 && t[..end].contains(&b'-') {
        return None;
    }
    Some(v)
}

/// memcached's `safe_strtoul` for 32-bit fields (flags, verbosity): the low 32 bits.
pub fn safe_strtoul32(t: &[u8]) -> Option<u32> {
    safe_strtoull(t).map(|v| v as u32)
}

/// memcached 1.6.18's `safe_strtol`: a C `long`, of which an `int32_t` keeps the low bits.
pub fn safe_strtol(t: &[u8]) -> Option<i32> {
    let (neg, mag, overflow, end) = c_strto(t)?;
    let limit = if neg { 1u64 << 63 } else { i64::MAX as u64 };
    if overflow || mag > limit || !ends_well(t, end) {
        return None;
    }
    let v = if neg {
        (mag as i64).wrapping_neg()
    } else {
        mag as i64
    };
    Some(v as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_follow_c() {
        assert_eq!(safe_strtoul32(b"4294967296"), Some(0));
        assert_eq!(safe_strtoul32(b"+5"), Some(5));
        assert_eq!(safe_strtoul32(b"-1"), None);
        assert_eq!(safe_strtoul32(b"-0"), Some(0));
        assert_eq!(safe_strtoul32(b"0x10"), None);
        assert_eq!(safe_strtoul32(b"18446744073709551616"), None);
        assert_eq!(safe_strtoull(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(safe_strtoull(b"-18446744073709551615"), Some(1));
        assert_eq!(safe_strtoull(b" 12\r"), Some(12));
        assert_eq!(safe_strtoull(b"12a"), None);
        assert_eq!(safe_strtoull(b""), None);
        assert_eq!(safe_strtoull(b"+"), None);
        assert_eq!(safe_strtol(b"4294967296"), Some(0));
        assert_eq!(safe_strtol(b"4294967297"), Some(1));
        assert_eq!(safe_strtol(b"2147483648"), Some(i32::MIN));
        assert_eq!(safe_strtol(b"-1"), Some(-1));
        assert_eq!(safe_strtol(b"9223372036854775808"), None);
        assert_eq!(safe_strtol(b"-9223372036854775808"), Some(0));
    }
}
