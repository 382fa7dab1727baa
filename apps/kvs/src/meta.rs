//! memcached's meta commands (`mg`, `ms`, `md`, `ma`, `mn`), as memcached 1.6.18 parses and
//! answers them.
//!
//! A meta command is `m<x> <key> [<datalen>] <flag>*`. Each flag is one character, some
//! with an argument glued on (`T30`, `Oopaque`). Flags that act on the item (`T C F M N J D
//! I q b`) go to the shard in a [`MetaOp`]; flags that ask for something back
//! (`v f t s c k O h l`) are kept in request order and rendered by [`MetaPending`].
//!
//! Checked against memcached 1.6.18 (see `tests/differential.py`). Known differences: `me`
//! (debug) answers `ERROR`; `mg`'s `N`/`R` (vivify, recache), `u`, `P`, `L` and the `I`
//! (invalidate) flag are accepted but have no effect; win/stale flags are never returned.

use std::borrow::Cow;

use bytes::Bytes;

use crate::common::{
    ErrorReply, KEY_MAX_LENGTH, Limits, item_size, safe_strtol, safe_strtoul32, safe_strtoull,
};
use crate::store::{MetaKind, MetaOp, MetaReply, MetaStatus};

/// Longest opaque (`O`) argument memcached echoes (the token, with its `O`, is at most 32).
const MAX_OPAQUE: usize = 31;

/// A return flag, in request order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetaRet {
    /// `f`: client flags.
    Flags,
    /// `t`: remaining time to live.
    Ttl,
    /// `s`: value size.
    Size,
    /// `c`: cas unique.
    Cas,
    /// `k`: the key as sent (followed by ` b` when it was base64).
    Key,
    /// `O`: an opaque token echoed back.
    Opaque(Vec<u8>),
    /// `h`: whether the item had been fetched before.
    Hit,
    /// `l`: seconds since last access.
    LastAccess,
    /// `T` (no output): from here on `t` shows the new expiry, as memcached applies the
    /// flags in order.
    Touch(i32),
    /// `N` (no output): like `Touch`, for a counter `ma` has just created.
    Vivify(i32),
}

/// A parsed meta command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaRequest<'a> {
    /// What to run on the shard (the key decoded, the data not yet owned).
    pub kind: MetaKind,
    /// The decoded key.
    pub key: Cow<'a, [u8]>,
    /// The flags that act on the item.
    pub op: MetaOpArgs,
    /// The value (`ms`).
    pub data: &'a [u8],
    /// How to answer.
    pub pending: MetaPending,
}

/// The item-side flags of a meta command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetaOpArgs {
    /// `T`.
    pub ttl: Option<i32>,
    /// `C`.
    pub cas: Option<u64>,
    /// `F`.
    pub flags: u32,
    /// `M` (or the default mode).
    pub mode: u8,
    /// `N`.
    pub vivify: Option<i32>,
    /// The expiry of a counter `ma` creates: the last of `N` and `T`.
    pub create_ttl: i32,
    /// `J`.
    pub initial: u64,
    /// `D` (default 1).
    pub delta: u64,
    /// `u`.
    pub no_update: bool,
    /// One of `T N R h l` was given (memcached's "locked" fetch).
    pub locked: bool,
}

impl MetaRequest<'_> {
    /// The shard command (copies key and data).
    pub fn op(&self) -> MetaOp {
        let a = self.op;
        MetaOp {
            kind: self.kind,
            key: Bytes::copy_from_slice(&self.key),
            ttl: a.ttl,
            cas: a.cas,
            flags: a.flags,
            mode: a.mode,
            vivify: a.vivify.map(|_| a.create_ttl),
            initial: a.initial,
            delta: a.delta,
            data: Bytes::copy_from_slice(self.data),
            // With T, N, R, h or l memcached marks the item fetched after writing the flags,
            // which an overlong opaque cuts short; otherwise it marks it when it finds it.
            no_update: a.no_update || (self.pending.opaque_too_long && a.locked),
        }
    }
}

/// How to render a meta command's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaPending {
    /// Which command.
    pub kind: MetaKind,
    /// `v`: return the value (`mg`) or the number (`ma`).
    pub value: bool,
    /// `q`: hide the common answer (`EN` for `mg`; `HD` for `ms`, `md`; `HD`/`VA` for `ma`).
    pub quiet: bool,
    /// The key token as sent (for `k`).
    pub key_token: Vec<u8>,
    /// Whether the key was base64 (`b`).
    pub binary: bool,
    /// Return flags in request order.
    pub rets: Vec<MetaRet>,
    /// `mg`/`ma` with an opaque token over 32 bytes: memcached runs the command, then
    /// answers `CLIENT_ERROR opaque token too long` (`ms`/`md` refuse it before running).
    pub opaque_too_long: bool,
}

impl MetaPending {
    /// Appends the answer for `reply`.
    pub fn render(&self, reply: &MetaReply, out: &mut Vec<u8>) {
        use MetaStatus as S;
        if self.opaque_too_long && reply.status != S::NonNumeric {
            return ErrorReply::Client("opaque token too long").encode(out);
        }
        let (head, full) = match (self.kind, reply.status) {
            (MetaKind::Get, S::Hit) => ("", true),
            (MetaKind::Get, S::Miss) if self.quiet => return,
            (MetaKind::Get, S::Miss) => ("EN", false),
            // q hides a plain success, not a created counter.
            (_, S::Done | S::Number(_)) if self.quiet => return,
            (_, S::Done) => ("HD", true),
            (_, S::Number(_) | S::Created(_)) => ("", true),
            (_, S::NotStored) => ("NS", false),
            (_, S::Exists) => ("EX", false),
            (_, S::NotFound) => ("NF", false),
            (_, S::NonNumeric) => return ErrorReply::NON_NUMERIC.encode(out),
            (_, S::OutOfMemory) => return ErrorReply::OUT_OF_MEMORY.encode(out),
            (_, S::Hit | S::Miss) => return ErrorReply::Server("internal error").encode(out),
        };
        let number = match reply.status {
            S::Number(n) | S::Created(n) => Some(n.to_string()),
            _ => None,
        };
        let value: Option<&[u8]> = match (&number, &reply.value) {
            (Some(n), _) if self.value => Some(n.as_bytes()),
            (None, Some(v)) if self.value && reply.status == S::Hit => Some(v.as_ref()),
            _ => None,
        };
        match (head, value) {
            ("", Some(v)) => {
                out.extend_from_slice(b"VA ");
                out.extend_from_slice(v.len().to_string().as_bytes());
            }
            ("", None) => out.extend_from_slice(b"HD"),
            (h, _) => out.extend_from_slice(h.as_bytes()),
        }
        let created = matches!(reply.status, S::Created(_));
        let mut ttl = reply.ttl_before;
        for r in &self.rets {
            match *r {
                MetaRet::Touch(t) => {
                    ttl = ttl_of(t, reply.now);
                    continue;
                }
                MetaRet::Vivify(t) => {
                    if created {
                        ttl = ttl_of(t, reply.now);
                    }
                    continue;
                }
                _ => {}
            }
            let allowed = match self.kind {
                MetaKind::Get => full || matches!(r, MetaRet::Key | MetaRet::Opaque(_)),
                MetaKind::Set => matches!(r, MetaRet::Key | MetaRet::Opaque(_) | MetaRet::Cas),
                MetaKind::Delete => matches!(r, MetaRet::Key | MetaRet::Opaque(_)),
                MetaKind::Arith => {
                    matches!(r, MetaRet::Key | MetaRet::Opaque(_))
                        || (full && matches!(r, MetaRet::Ttl | MetaRet::Cas))
                }
            };
            if !allowed {
                continue;
            }
            out.push(b' ');
            let num = |out: &mut Vec<u8>, c: u8, n: String| {
                out.push(c);
                out.extend_from_slice(n.as_bytes());
            };
            match r {
                MetaRet::Flags => num(out, b'f', reply.flags.to_string()),
                MetaRet::Ttl => num(out, b't', ttl.to_string()),
                MetaRet::Size => num(out, b's', reply.size.to_string()),
                MetaRet::Cas => num(out, b'c', reply.cas.to_string()),
                MetaRet::Hit => num(out, b'h', u8::from(reply.fetched).to_string()),
                MetaRet::LastAccess => num(out, b'l', reply.idle.to_string()),
                MetaRet::Key => {
                    out.push(b'k');
                    out.extend_from_slice(&self.key_token);
                    if self.binary {
                        out.extend_from_slice(b" b");
                    }
                }
                MetaRet::Opaque(o) => {
                    out.push(b'O');
                    out.extend_from_slice(o);
                }
                MetaRet::Touch(_) | MetaRet::Vivify(_) => {}
            }
        }
        out.extend_from_slice(b"\r\n");
        if let (Some(v), true) = (value, head.is_empty()) {
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// The `t` value of an item given expiry time `t` at `now`: seconds left, -1 for never.
fn ttl_of(t: i32, now: u64) -> i64 {
    match crate::store::expiry(t, now) {
        0 => -1,
        e => e as i64 - now as i64,
    }
}

/// Decodes standard base64 with padding; `None` if malformed or empty.
fn base64_decode(s: &[u8]) -> Option<Vec<u8>> {
    fn val(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    if s.is_empty() || !s.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let groups = s.len() / 4;
    for (g, chunk) in s.chunks(4).enumerate() {
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && g + 1 != groups) {
            return None;
        }
        let mut n = 0u32;
        for &c in &chunk[..4 - pad] {
            n = (n << 6) | val(c)?;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    (!out.is_empty()).then_some(out)
}

/// A parsed meta command line; the classic parser turns it into its `Request`.
#[derive(Debug)]
pub(crate) enum MetaCommand<'a> {
    /// `mn`.
    Noop,
    /// `mg`, `ms`, `md`, `ma`.
    Op(MetaRequest<'a>),
    /// `ms` with a value over the item size limit, its data skipped.
    TooLarge {
        /// The (decoded) key.
        key: Cow<'a, [u8]>,
        /// Mode `S` (set).
        set: bool,
    },
    /// A command answered with an error line (meta commands have no `noreply`).
    Error(ErrorReply),
}

/// Parses a meta command line whose tokens are `toks` (command first). `line_consumed` is
/// the length of the command line with its newline. Returns the command and the bytes it
/// used (possibly more than `buf` holds: a too-large value being swallowed), or `None`
/// until its data block is complete.
pub(crate) fn parse<'a>(
    buf: &'a [u8],
    line_consumed: usize,
    toks: &[&'a [u8]],
    limits: &Limits,
) -> Option<(MetaCommand<'a>, usize)> {
    let done = |command| Some((command, line_consumed));
    let err = MetaCommand::Error;
    let kind = match toks[0][1] {
        b'n' => return done(MetaCommand::Noop),
        b'g' => MetaKind::Get,
        b's' => MetaKind::Set,
        b'd' => MetaKind::Delete,
        b'a' => MetaKind::Arith,
        _ => return done(err(ErrorReply::Error)),
    };
    if toks.len() < 2 {
        return done(err(ErrorReply::Error));
    }
    let key_token = toks[1];
    if key_token.len() > KEY_MAX_LENGTH {
        return done(err(ErrorReply::BAD_FORMAT));
    }
    let mut first_flag = 2;
    let mut vlen = 0usize;
    if kind == MetaKind::Set {
        let Some(v) = toks.get(2).and_then(|t| safe_strtol(t)) else {
            return done(err(ErrorReply::BAD_FORMAT));
        };
        if !(0..=i32::MAX - 2).contains(&v) {
            return done(err(ErrorReply::BAD_FORMAT));
        }
        vlen = v as usize;
        first_flag = 3;
    }
    // From here on an error in `ms` swallows the data block.
    let total = line_consumed + vlen + 2;
    let consumed = if kind == MetaKind::Set {
        total
    } else {
        line_consumed
    };
    let fail = |reply: ErrorReply| Some((err(reply), consumed));
    // `md` and `ma` answer every error of the flags themselves with one message.
    let fail_flags = |reply: ErrorReply| {
        let reply = match kind {
            MetaKind::Delete | MetaKind::Arith => ErrorReply::Client("invalid or duplicate flag"),
            _ => reply,
        };
        fail(reply)
    };
    let mut args = MetaOpArgs {
        mode: if kind == MetaKind::Arith { b'I' } else { b'S' },
        delta: 1,
        ..MetaOpArgs::default()
    };
    let mut key: Cow<'a, [u8]> = Cow::Borrowed(key_token);
    let mut binary = false;
    let mut value = false;
    let mut quiet = false;
    let mut rets = Vec::new();
    let mut seen = [false; 128];
    let mut error: Option<ErrorReply> = None;
    let bad_token = ErrorReply::Client("bad token in command line format");
    // memcached applies `T`/`N` while it writes the answer, in flag order, and stops at an
    // overlong opaque: those after it have no effect.
    let mut cut = false;
    for &t in &toks[first_flag..] {
        let c = t[0];
        if c >= 127 || seen[usize::from(c)] {
            return fail_flags(ErrorReply::Client("duplicate flag"));
        }
        seen[usize::from(c)] = true;
        args.locked |= matches!(c, b'T' | b'N' | b'R' | b'h' | b'l');
        let arg = &t[1..];
        match c {
            b'b' => match base64_decode(key_token) {
                Some(k) => {
                    key = Cow::Owned(k);
                    binary = true;
                }
                None => error = Some(ErrorReply::Client("error decoding key")),
            },
            b'N' | b'T' | b'R' => match safe_strtol(arg) {
                Some(v) if c == b'N' => {
                    args.vivify = Some(v);
                    if !cut {
                        args.create_ttl = v;
                        rets.push(MetaRet::Vivify(v));
                    }
                }
                Some(v) if c == b'T' => {
                    if !cut {
                        args.ttl = Some(v);
                        args.create_ttl = v;
                        rets.push(MetaRet::Touch(v));
                    }
                }
                Some(_) => {}
                None => error = Some(bad_token),
            },
            b'C' => match safe_strtoull(arg) {
                Some(v) => args.cas = Some(v),
                None => error = Some(bad_token),
            },
            b'F' => match safe_strtoul32(arg) {
                Some(v) => args.flags = v,
                None => error = Some(error.unwrap_or(ErrorReply::BAD_FORMAT)),
            },
            b'M' => {
                if t.len() != 2 {
                    error = Some(ErrorReply::Client("incorrect length for M token"));
                } else {
                    args.mode = t[1];
                }
            }
            b'J' => match safe_strtoull(arg) {
                Some(v) => args.initial = v,
                None => error = Some(ErrorReply::Client("invalid numeric initial value")),
            },
            b'D' => match safe_strtoull(arg) {
                Some(v) => args.delta = v,
                None => error = Some(ErrorReply::Client("invalid numeric delta value")),
            },
            b'v' => value = true,
            b'q' => quiet = true,
            b'f' => rets.push(MetaRet::Flags),
            b't' => rets.push(MetaRet::Ttl),
            b's' => rets.push(MetaRet::Size),
            b'c' => rets.push(MetaRet::Cas),
            b'k' => rets.push(MetaRet::Key),
            b'h' => rets.push(MetaRet::Hit),
            b'l' => rets.push(MetaRet::LastAccess),
            b'O' => {
                cut |= arg.len() > MAX_OPAQUE;
                rets.push(MetaRet::Opaque(arg.to_vec()));
            }
            b'u' => args.no_update = true,
            b'P' | b'L' | b'I' => {}
            _ => return fail_flags(ErrorReply::Client("invalid flag")),
        }
    }
    if let Some(e) = error {
        return fail_flags(e);
    }
    match kind {
        MetaKind::Set if !b"SEAPR".contains(&args.mode) => {
            return fail(ErrorReply::Client("invalid mode for ms M token"));
        }
        MetaKind::Arith if !b"I+D-".contains(&args.mode) => {
            return fail(ErrorReply::Client("invalid mode for ma M token"));
        }
        _ => {}
    }
    let opaque_too_long = rets
        .iter()
        .any(|r| matches!(r, MetaRet::Opaque(o) if o.len() > MAX_OPAQUE));
    // memcached meets an overlong opaque while writing the answer: `mg` and `ma` have run
    // by then, `ms` and `md` have not.
    if opaque_too_long && matches!(kind, MetaKind::Set | MetaKind::Delete) {
        return fail(ErrorReply::Client("opaque token too long"));
    }
    let pending = MetaPending {
        kind,
        value,
        quiet,
        key_token: key_token.to_vec(),
        binary,
        rets,
        opaque_too_long,
    };
    let mut data: &[u8] = &[];
    if kind == MetaKind::Set {
        if item_size(key.len(), vlen, args.flags) > limits.item_size_max {
            let set = args.mode == b'S';
            return Some((MetaCommand::TooLarge { key, set }, total));
        }
        if buf.len() < total {
            return None;
        }
        if &buf[total - 2..total] != b"\r\n" {
            return Some((err(ErrorReply::BAD_CHUNK), total));
        }
        data = &buf[line_consumed..line_consumed + vlen];
    }
    let request = MetaRequest {
        kind,
        key,
        op: args,
        data,
        pending,
    };
    Some((MetaCommand::Op(request), consumed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::conn::Engine;

    /// Answers of a fresh engine to `input` (expected values measured on memcached 1.6.18).
    fn talk(input: &[u8]) -> String {
        let mut e = Engine::new(
            Config {
                shards: 2,
                ..Config::default()
            },
            1_700_000_000,
        );
        let mut c = e.connect();
        String::from_utf8_lossy(&e.feed(&mut c, input, 1_700_000_000).0).into_owned()
    }

    #[test]
    fn get_set_delete() {
        assert_eq!(
            talk(b"ms a 3 T0 F7\r\nabc\r\nmg a s v f t k h O99\r\nmg a\r\nmg zz k O1\r\nmg zz q\r\nmn\r\n"),
            "HD\r\nVA 3 s3 f7 t-1 ka h0 O99\r\nabc\r\nHD\r\nEN kzz O1\r\nMN\r\n"
        );
        assert_eq!(
            talk(b"ms a 1\r\n1\r\nmd a q\r\nmd a k O3\r\nmd a zz\r\n"),
            "HD\r\nNF ka O3\r\nCLIENT_ERROR invalid or duplicate flag\r\n"
        );
        assert_eq!(
            talk(b"ms a 3 T100\r\nabc\r\nmg a t T500\r\nmg a t\r\n"),
            "HD\r\nHD t100\r\nHD t500\r\n"
        );
    }

    #[test]
    fn set_modes_and_cas() {
        assert_eq!(
            talk(b"ms a 1\r\nx\r\nms a 1 MA\r\ny\r\nms a 1 MP\r\nw\r\nmg a v\r\nms b 1 MR\r\nx\r\nms b 1 ME C1\r\nx\r\nms c 1 MR C1\r\nx\r\nms a 1 C1 c\r\nx\r\n"),
            "HD\r\nHD\r\nHD\r\nVA 3\r\nwxy\r\nNS\r\nHD\r\nNF\r\nEX c0\r\n"
        );
        assert_eq!(
            talk(b"ms a 2 Ms\r\nxx\r\nms a 2 MAB\r\nxx\r\nms a 2 Fx\r\nxx\r\nms a x\r\nmn\r\n"),
            "CLIENT_ERROR invalid mode for ms M token\r\nCLIENT_ERROR incorrect length for M token\r\nCLIENT_ERROR bad command line format\r\nCLIENT_ERROR bad command line format\r\nMN\r\n"
        );
    }

    #[test]
    fn arithmetic() {
        assert_eq!(
            talk(b"ma n\r\nma n N0 J5 v\r\nma n v\r\nma n MD D10 v t\r\nma n q\r\nma m N100 v t\r\nma m q N0\r\n"),
            "NF\r\nVA 1\r\n5\r\nVA 1\r\n6\r\nVA 1 t-1\r\n0\r\nVA 1 t100\r\n0\r\n"
        );
        // An overlong opaque: ma runs, then fails.
        let long = [b"ma n N0 O".as_slice(), &[b'x'; 32], b"\r\nmg n v\r\n"].concat();
        assert_eq!(
            talk(&long),
            "CLIENT_ERROR opaque token too long\r\nVA 1\r\n0\r\n"
        );
    }

    #[test]
    fn base64_keys() {
        assert_eq!(
            talk(b"ms YQ== 1 b k\r\nx\r\nmg a v\r\nmg YQ== b k v\r\nmg Y b v\r\n"),
            "HD kYQ== b\r\nVA 1\r\nx\r\nVA 1 kYQ== b\r\nx\r\nCLIENT_ERROR error decoding key\r\n"
        );
    }

    #[test]
    fn base64() {
        assert_eq!(base64_decode(b"YQ=="), Some(b"a".to_vec()));
        assert_eq!(base64_decode(b"YWJj"), Some(b"abc".to_vec()));
        assert_eq!(base64_decode(b"YWI="), Some(b"ab".to_vec()));
        assert_eq!(base64_decode(b"YQ==="), None);
        assert_eq!(base64_decode(b"Y"), None);
        assert_eq!(base64_decode(b"a"), None);
        assert_eq!(base64_decode(b"!!!!"), None);
        assert_eq!(base64_decode(b"YQ==YQ=="), None);
    }
}
