//! The answer encoders.

use std::fmt::Write as _;

/// Appends `VALUE <key> <flags> <bytes>[ <cas>]\r\n<data>\r\n`.
///
/// ```
/// let mut out = Vec::new();
/// kvs::protocol::encode_value(&mut out, b"k", 5, b"hi", Some(7));
/// assert_eq!(out, b"VALUE k 5 2 7\r\nhi\r\n");
/// ```
pub fn encode_value(out: &mut Vec<u8>, key: &[u8], flags: u32, data: &[u8], cas: Option<u64>) {
    out.reserve(key.len() + data.len() + 48);
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    out.push(b' ');
    push_u64(out, u64::from(flags));
    out.push(b' ');
    push_u64(out, data.len() as u64);
    if let Some(cas) = cas {
        out.push(b' ');
        push_u64(out, cas);
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Appends a number and `\r\n` (the answer to `incr`/`decr`).
pub fn encode_number(out: &mut Vec<u8>, n: u64) {
    push_u64(out, n);
    out.extend_from_slice(b"\r\n");
}

/// Appends `STAT <name> <value>\r\n`.
pub fn encode_stat(out: &mut Vec<u8>, name: &str, value: impl std::fmt::Display) {
    let mut s = String::with_capacity(32);
    let _ = write!(s, "STAT {name} {value}\r\n");
    out.extend_from_slice(s.as_bytes());
}

/// Appends a line and `\r\n`.
pub fn encode_line(out: &mut Vec<u8>, line: &str) {
    out.extend_from_slice(line.as_bytes());
    out.extend_from_slice(b"\r\n");
}

fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::ErrorReply;

    #[test]
    fn encoders() {
        let mut out = Vec::new();
        encode_number(&mut out, u64::MAX);
        encode_number(&mut out, 0);
        ErrorReply::TOO_LARGE.encode(&mut out);
        assert_eq!(
            out,
            b"18446744073709551615\r\n0\r\nSERVER_ERROR object too large for cache\r\n"
        );
    }
}
