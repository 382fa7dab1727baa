//! Helpers shared by the transcript tests: the trace format of differential.py --record,
//! answer splitting and normalization (cas uniques, stats values and the version masked), and
//! the one way a test waits.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How long a test waits for any one thing before it fails: far above what any wait here
/// takes, so that a hang fails with a message naming what it waited for.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// Calls `attempt` until it gives a value, sleeping a millisecond between calls.
///
/// # Panics
/// Naming `what`, when [`PATIENCE`] runs out first.
pub(crate) fn wait_for<T>(what: &str, mut attempt: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(value) = attempt() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "gave up after {PATIENCE:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sends `req` and reads until the answers end with `want_end` (or EOF / timeout).
pub(crate) fn talk(s: &mut TcpStream, req: &[u8], want_end: &[u8]) -> Vec<u8> {
    s.write_all(req).unwrap();
    let mut out = Vec::new();
    let mut buf = vec![0; 1 << 16];
    while !out.ends_with(want_end) {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    out
}

/// The transcript recorded from Debian's memcached 1.6.18 (differential.py --seed 11
/// --rounds 600 --record), or the file named by KVS_TRACE.
pub(crate) fn trace() -> String {
    std::env::var("KVS_TRACE")
        .map(|p| std::fs::read_to_string(p).expect("KVS_TRACE file"))
        .unwrap_or_else(|_| include_str!("../data/memcached-1.6.18.trace").to_string())
}

/// One round of a transcript.
pub(crate) struct Round {
    /// Which of the three connections.
    pub(crate) conn: usize,
    /// Followed by the `mn` sentinel (else the connection is expected to close).
    pub(crate) sentinel: bool,
    /// The request bytes, with `@CAS:key@` placeholders.
    pub(crate) template: Vec<u8>,
    /// memcached's normalized answer lines.
    pub(crate) expect: Vec<Vec<u8>>,
}

/// Parses a transcript.
pub(crate) fn rounds(trace: &str) -> Vec<Round> {
    trace
        .lines()
        .map(|record| {
            let mut fields = record.split(' ');
            let conn = fields.next().unwrap().parse().unwrap();
            let sentinel = fields.next().unwrap() == "sentinel";
            let template = dec(fields.next().unwrap());
            Round {
                conn,
                sentinel,
                template,
                expect: fields.map(dec).collect(),
            }
        })
        .collect()
}

/// The last cas unique seen per key on one connection.
pub(crate) type CasSeen = HashMap<Vec<u8>, Vec<u8>>;

pub(crate) fn dec(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    if s == "-" {
        return out;
    }
    for piece in s.split('.') {
        if let Some(run) = piece.strip_prefix('*') {
            let (b, n) = run.split_once(':').expect("run piece");
            let b = u8::from_str_radix(b, 16).expect("run byte");
            out.extend(std::iter::repeat_n(b, n.parse().expect("run length")));
        } else {
            for i in (0..piece.len()).step_by(2) {
                out.push(u8::from_str_radix(&piece[i..i + 2], 16).expect("hex"));
            }
        }
    }
    out
}

/// Splits answers into lines like differential.py's reader: VALUE data blocks are one
/// element. Stops at the sentinel's `MN` (when `sentinel`) or at the first incomplete line or
/// block; says whether the sentinel was seen.
pub(crate) fn split(out: &[u8], sentinel: bool) -> (Vec<Vec<u8>>, bool) {
    let mut v = Vec::new();
    let mut pos = 0;
    loop {
        let Some(nl) = out[pos..].windows(2).position(|w| w == b"\r\n") else {
            return (v, false);
        };
        let line = &out[pos..pos + nl];
        let next = pos + nl + 2;
        let size_at = if line.starts_with(b"VALUE ") {
            Some(3)
        } else if line.starts_with(b"VA ") {
            Some(1)
        } else {
            None
        };
        if let Some(at) = size_at {
            let n: usize = std::str::from_utf8(line.split(|&b| b == b' ').nth(at).unwrap_or(b"x"))
                .ok()
                .and_then(|n| n.parse().ok())
                .expect("VALUE line with a length");
            if out.len() < next + n + 2 {
                return (v, false);
            }
            v.push(line.to_vec());
            v.push(out[next..next + n].to_vec());
            pos = next + n + 2;
            continue;
        }
        pos = next;
        if line == b"MN" && sentinel {
            return (v, true);
        }
        v.push(line.to_vec());
    }
}

pub(crate) fn normalize(lines: &[Vec<u8>], cas: &mut CasSeen) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = &lines[i];
        let meta = line.starts_with(b"VA ");
        if line.starts_with(b"VALUE ") || meta {
            let mut parts: Vec<Vec<u8>> = line.split(|&b| b == b' ').map(<[u8]>::to_vec).collect();
            if !meta && parts.len() == 5 {
                cas.insert(parts[1].clone(), parts[4].clone());
                parts[4] = b"<cas>".to_vec();
            }
            if meta {
                parts = meta_masked(&parts);
            }
            let size_at = if meta { 1 } else { 3 };
            let mut data = lines.get(i + 1).cloned().unwrap_or_default();
            // A number padded with spaces by an in-place incr/decr: compared without the
            // padding, as differential.py does (memcached pads only when no other reference
            // to the item is held).
            let digits = data.iter().take_while(|b| b.is_ascii_digit()).count();
            if digits > 0 && digits < data.len() && data[digits..].iter().all(|&b| b == b' ') {
                data.truncate(digits);
                if parts.len() > size_at {
                    parts[size_at] = digits.to_string().into_bytes();
                }
            }
            out.push(parts.join(&b' '));
            if i + 1 < lines.len() {
                out.push(data);
            }
            i += 2;
            continue;
        }
        if line.starts_with(b"STAT ") {
            if out.last().map(Vec::as_slice) != Some(b"<stats>") {
                out.push(b"<stats>".to_vec());
            }
        } else if line.starts_with(b"VERSION ") {
            out.push(b"VERSION <v>".to_vec());
        } else if [&b"VA "[..], b"HD ", b"EN ", b"NS ", b"EX ", b"NF "]
            .iter()
            .any(|p| line.starts_with(p))
        {
            let words: Vec<Vec<u8>> = line.split(|&b| b == b' ').map(<[u8]>::to_vec).collect();
            out.push(meta_masked(&words).join(&b' '));
        } else {
            out.push(line.clone());
        }
        i += 1;
    }
    out
}

/// Meta return flags, masked: cas uniques differ; a TTL may be read a second apart.
fn meta_masked(words: &[Vec<u8>]) -> Vec<Vec<u8>> {
    words
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let digits = w.len() > 1 && w[1..].iter().all(u8::is_ascii_digit);
            match w.first() {
                Some(b'c') if i > 0 && digits => b"c<cas>".to_vec(),
                Some(b't') if i > 0 && digits => b"t<ttl>".to_vec(),
                _ => w.clone(),
            }
        })
        .collect()
}

/// Replaces `@CAS:key@` with the cas unique this connection last saw for `key`.
pub(crate) fn resolve(template: &[u8], cas: &CasSeen) -> Vec<u8> {
    let mut out = Vec::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.windows(5).position(|w| w == b"@CAS:") {
        out.extend_from_slice(&rest[..at]);
        let after = &rest[at + 5..];
        let end = after.iter().position(|&b| b == b'@').expect("closing @");
        let key = &after[..end];
        out.extend_from_slice(cas.get(key).map_or(&b"9999999999999"[..], Vec::as_slice));
        rest = &after[end + 1..];
    }
    out.extend_from_slice(rest);
    out
}

pub(crate) fn show(v: &[Vec<u8>]) -> Vec<String> {
    v.iter()
        .map(|l| String::from_utf8_lossy(&l[..l.len().min(80)]).into_owned())
        .collect()
}
