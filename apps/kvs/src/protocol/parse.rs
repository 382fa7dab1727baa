//! The classic command parser: [`Request`], [`Parse`] and [`parse`].

use crate::common::{
    ErrorReply, KEY_MAX_LENGTH, Limits, MAX_LINE_WITHOUT_NEWLINE, READ_BUFFER_SIZE, StoreMode,
    item_size, safe_strtol, safe_strtoul32, safe_strtoull,
};
use crate::meta::{self, MetaCommand};

/// memcached's `MAX_TOKENS`: the tokenizer stops after this many tokens minus one.
const MAX_TOKENS: usize = 24;

/// Which `stats` group was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatsGroup {
    /// `stats`: the general counters.
    General,
    /// `stats settings`.
    Settings,
    /// `stats reset`: zero the counters, answer `RESET`.
    Reset,
    /// `stats items`, `stats slabs`, `stats sizes`, `stats conns`: answered with an empty
    /// list (`END`), as this server has no slab classes.
    Empty,
}

/// One parsed request. Keys and data borrow the connection's buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// `get`/`gets`/`gat`/`gats`: look up keys (possibly none for `gat`), answer `VALUE`
    /// lines and `END`.
    Get {
        /// The keys in request order (duplicates allowed).
        keys: Vec<&'a [u8]>,
        /// `gets`/`gats`: include cas uniques.
        cas: bool,
        /// `gat`/`gats`: the new expiry time, as sent.
        touch: Option<i32>,
        /// A key over 250 bytes followed `keys`: memcached looks up (and touches) the keys
        /// before it, then answers only `CLIENT_ERROR bad command line format`.
        key_too_long: bool,
    },
    /// A storage command and its data block.
    Store {
        /// Which command.
        mode: StoreMode,
        /// The key.
        key: &'a [u8],
        /// Client flags (low 32 bits of what was sent).
        flags: u32,
        /// Expiry time as sent (see [`REALTIME_MAXDELTA`](crate::common::REALTIME_MAXDELTA)).
        exptime: i32,
        /// The data block, without its `\r\n`.
        data: &'a [u8],
        /// The cas unique to compare (`cas` only; 0 otherwise).
        cas_unique: u64,
        /// Answer nothing.
        noreply: bool,
    },
    /// A storage command whose item exceeds the size limit: its data was skipped. Answer
    /// `SERVER_ERROR object too large for cache`; a `set` also deletes the key.
    TooLarge {
        /// Which command.
        mode: StoreMode,
        /// The key.
        key: &'a [u8],
        /// Answer nothing.
        noreply: bool,
    },
    /// `delete <key>`.
    Delete {
        /// The key.
        key: &'a [u8],
        /// Answer nothing.
        noreply: bool,
    },
    /// `incr`/`decr <key> <delta>`.
    Arith {
        /// The key.
        key: &'a [u8],
        /// `incr` (true) or `decr`.
        incr: bool,
        /// The amount.
        delta: u64,
        /// Answer nothing.
        noreply: bool,
    },
    /// `touch <key> <exptime>`.
    Touch {
        /// The key.
        key: &'a [u8],
        /// New expiry time as sent.
        exptime: i32,
        /// Answer nothing.
        noreply: bool,
    },
    /// `flush_all [delay]`.
    FlushAll {
        /// Delay in seconds as sent (0: now).
        delay: i32,
        /// Answer nothing.
        noreply: bool,
    },
    /// `stats [group]`.
    Stats(StatsGroup),
    /// `version`.
    Version,
    /// `verbosity <level>`: answer `OK`.
    Verbosity {
        /// Answer nothing.
        noreply: bool,
    },
    /// `mn` (meta no-op): answer `MN`.
    MetaNoop,
    /// `mg`, `ms`, `md`, `ma`.
    Meta(meta::MetaRequest<'a>),
    /// `ms` with a value over the item size limit: its data was skipped. Answer
    /// `SERVER_ERROR object too large for cache`; in mode `S` the key is also deleted.
    MetaTooLarge {
        /// The (decoded) key.
        key: std::borrow::Cow<'a, [u8]>,
        /// Mode `S` (set).
        set: bool,
    },
    /// `quit`: close the connection.
    Quit,
    /// A request answered with an error line (unless `noreply`).
    Error {
        /// The answer.
        reply: ErrorReply,
        /// Answer nothing.
        noreply: bool,
    },
}

/// What [`parse`] found at the start of the buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parse<'a> {
    /// No complete request yet: read more bytes and call again.
    Incomplete,
    /// One request. Remove `consumed` bytes from the buffer afterwards. `consumed` may exceed
    /// the buffer's length (a too-large value being swallowed): the surplus must be discarded
    /// from the input as it arrives.
    Request {
        /// The request.
        request: Request<'a>,
        /// Bytes used, possibly more than were buffered.
        consumed: usize,
    },
    /// Close the connection without an answer (overlong line, an HTTP request).
    Close,
}

/// The tokens of a command line, split like memcached's `tokenize_command`.
struct Tokens<'a> {
    toks: [&'a [u8]; MAX_TOKENS],
    /// Number of real tokens (memcached's `ntokens` is this plus one).
    n: usize,
}

impl<'a> Tokens<'a> {
    fn split(line: &'a [u8]) -> Self {
        let mut toks: [&'a [u8]; MAX_TOKENS] = [&[]; MAX_TOKENS];
        let mut n = 0;
        for tok in line.split(|&b| b == b' ').filter(|t| !t.is_empty()) {
            if n == MAX_TOKENS - 1 {
                break;
            }
            toks[n] = tok;
            n += 1;
        }
        Tokens { toks, n }
    }

    /// memcached's `ntokens`, which counts a terminal token.
    fn ntokens(&self) -> usize {
        self.n + 1
    }

    fn get(&self, i: usize) -> &'a [u8] {
        if i < self.n { self.toks[i] } else { &[] }
    }

    /// memcached's `set_noreply_maybe`: the last token is `noreply`.
    fn noreply(&self) -> bool {
        self.n > 0 && self.toks[self.n - 1] == b"noreply"
    }
}

/// Parses the first request in `buf`.
///
/// ```
/// use kvs::protocol::{parse, Limits, Parse, Request};
/// let buf = b"delete k\r\nget k\r\n";
/// match parse(buf, &Limits::default()) {
///     Parse::Request { request: Request::Delete { key, noreply }, consumed } => {
///         assert_eq!((key, noreply, consumed), (&b"k"[..], false, 10));
///     }
///     other => panic!("{other:?}"),
/// }
/// assert_eq!(parse(b"get k", &Limits::default()), Parse::Incomplete);
/// ```
pub fn parse<'a>(buf: &'a [u8], limits: &Limits) -> Parse<'a> {
    let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
        return no_newline(buf, limits);
    };
    if nl >= READ_BUFFER_SIZE && no_newline(&buf[..nl], limits) == Parse::Close {
        return Parse::Close;
    }
    let line_consumed = nl + 1;
    let mut line = &buf[..nl];
    if line.len() > 1 && line[line.len() - 1] == b'\r' {
        line = &line[..line.len() - 1];
    }
    if let Some(z) = line.iter().position(|&b| b == 0) {
        line = &line[..z];
    }
    let done = |request| Parse::Request {
        request,
        consumed: line_consumed,
    };
    let toks = Tokens::split(line);
    let err = |reply| Request::Error {
        reply,
        noreply: false,
    };
    if toks.n == 0 || toks.get(0).len() < 2 {
        return done(err(ErrorReply::Error));
    }
    let cmd = toks.get(0);
    let nt = toks.ntokens();
    if cmd[0] == b'm' && cmd.len() == 2 {
        let Some((command, consumed)) =
            meta::parse(buf, line_consumed, &toks.toks[..toks.n], limits)
        else {
            return Parse::Incomplete;
        };
        let request = match command {
            MetaCommand::Noop => Request::MetaNoop,
            MetaCommand::Op(request) => Request::Meta(request),
            MetaCommand::TooLarge { key, set } => Request::MetaTooLarge { key, set },
            MetaCommand::Error(reply) => err(reply),
        };
        return Parse::Request { request, consumed };
    }
    let storage = |mode| match mode {
        StoreMode::Cas if nt == 7 || nt == 8 => Some(mode),
        StoreMode::Cas => None,
        _ if nt == 6 || nt == 7 => Some(mode),
        _ => None,
    };
    let mode = match cmd {
        b"set" => Some(StoreMode::Set),
        b"add" => Some(StoreMode::Add),
        b"replace" => Some(StoreMode::Replace),
        b"append" => Some(StoreMode::Append),
        b"prepend" => Some(StoreMode::Prepend),
        b"cas" => Some(StoreMode::Cas),
        _ => None,
    };
    if let Some(mode) = mode {
        return match storage(mode) {
            Some(mode) => parse_storage(buf, line_consumed, &toks, mode, limits),
            None => done(err(ErrorReply::Error)),
        };
    }
    let request = match cmd {
        b"get" | b"gets" | b"gat" | b"gats" | b"bget" if nt >= 3 => parse_get(line, cmd, &toks),
        b"incr" | b"decr" if nt == 4 || nt == 5 => parse_arith(&toks, cmd == b"incr"),
        b"touch" if nt == 4 || nt == 5 => parse_touch(&toks),
        b"delete" if (3..=5).contains(&nt) => parse_delete(&toks),
        b"flush_all" if (2..=4).contains(&nt) => parse_flush(&toks),
        b"verbosity" if nt == 3 || nt == 4 => {
            let noreply = toks.noreply();
            match safe_strtoul32(toks.get(1)) {
                Some(_) => Request::Verbosity { noreply },
                None => Request::Error {
                    reply: ErrorReply::BAD_FORMAT,
                    noreply,
                },
            }
        }
        b"version" => Request::Version,
        b"quit" => Request::Quit,
        b"stats" => parse_stats(&toks),
        b"shutdown" => err(ErrorReply::Raw("ERROR: shutdown not enabled")),
        _ => {
            // memcached answers ERROR to a known command with the wrong number of tokens and
            // to anything starting with one of its dispatch letters; only other lines ending
            // in an HTTP version close the connection.
            let dispatched = b"gsacidt".contains(&cmd[0])
                || matches!(cmd, b"flush_all" | b"verbosity" | b"bget");
            if !dispatched && toks.get(toks.n - 1).starts_with(b"HTTP/") {
                return Parse::Close;
            }
            err(ErrorReply::Error)
        }
    };
    done(request)
}

#[cold]
fn no_newline<'a>(buf: &'a [u8], limits: &Limits) -> Parse<'a> {
    if buf.len() <= MAX_LINE_WITHOUT_NEWLINE {
        return Parse::Incomplete;
    }
    let lead = buf.iter().take_while(|&&b| b == b' ').count();
    let rest = &buf[lead..];
    let is_get = rest.starts_with(b"get ") || rest.starts_with(b"gets ");
    if lead > 100 || !is_get || buf.len() > limits.max_get_line {
        Parse::Close
    } else {
        Parse::Incomplete
    }
}

fn parse_get<'a>(line: &'a [u8], cmd: &[u8], toks: &Tokens<'a>) -> Request<'a> {
    let touch = matches!(cmd, b"gat" | b"gats");
    let cas = matches!(cmd, b"gets" | b"gats");
    let mut words = line.split(|&b| b == b' ').filter(|t| !t.is_empty()).skip(1);
    let exptime = if touch {
        words.next();
        match safe_strtol(toks.get(1)) {
            Some(e) => Some(e),
            None => {
                return Request::Error {
                    reply: ErrorReply::BAD_EXPTIME,
                    noreply: false,
                };
            }
        }
    } else {
        None
    };
    let mut keys = Vec::new();
    let mut key_too_long = false;
    for key in words {
        if key.len() > KEY_MAX_LENGTH {
            key_too_long = true;
            break;
        }
        keys.push(key);
    }
    Request::Get {
        keys,
        cas,
        touch: exptime,
        key_too_long,
    }
}

fn parse_storage<'a>(
    buf: &'a [u8],
    line_consumed: usize,
    toks: &Tokens<'a>,
    mode: StoreMode,
    limits: &Limits,
) -> Parse<'a> {
    let noreply = toks.noreply();
    let error = |reply| Parse::Request {
        request: Request::Error { reply, noreply },
        consumed: line_consumed,
    };
    let key = toks.get(1);
    if key.len() > KEY_MAX_LENGTH {
        return error(ErrorReply::BAD_FORMAT);
    }
    let (Some(flags), Some(exptime), Some(vlen)) = (
        safe_strtoul32(toks.get(2)),
        safe_strtol(toks.get(3)),
        safe_strtol(toks.get(4)),
    ) else {
        return error(ErrorReply::BAD_FORMAT);
    };
    let mut cas_unique = 0;
    if mode == StoreMode::Cas {
        match safe_strtoull(toks.get(5)) {
            Some(c) => cas_unique = c,
            None => return error(ErrorReply::BAD_FORMAT),
        }
    }
    if !(0..=i32::MAX - 2).contains(&vlen) {
        return error(ErrorReply::BAD_FORMAT);
    }
    let vlen = vlen as usize;
    let total = line_consumed + vlen + 2;
    if item_size(key.len(), vlen, flags) > limits.item_size_max {
        return Parse::Request {
            request: Request::TooLarge { mode, key, noreply },
            consumed: total,
        };
    }
    if buf.len() < total {
        return Parse::Incomplete;
    }
    if &buf[total - 2..total] != b"\r\n" {
        return Parse::Request {
            request: Request::Error {
                reply: ErrorReply::BAD_CHUNK,
                noreply,
            },
            consumed: total,
        };
    }
    Parse::Request {
        request: Request::Store {
            mode,
            key,
            flags,
            exptime,
            data: &buf[line_consumed..line_consumed + vlen],
            cas_unique,
            noreply,
        },
        consumed: total,
    }
}

fn parse_arith<'a>(toks: &Tokens<'a>, incr: bool) -> Request<'a> {
    let noreply = toks.noreply();
    let key = toks.get(1);
    if key.len() > KEY_MAX_LENGTH {
        return Request::Error {
            reply: ErrorReply::BAD_FORMAT,
            noreply,
        };
    }
    match safe_strtoull(toks.get(2)) {
        Some(delta) => Request::Arith {
            key,
            incr,
            delta,
            noreply,
        },
        None => Request::Error {
            reply: ErrorReply::BAD_DELTA,
            noreply,
        },
    }
}

fn parse_touch<'a>(toks: &Tokens<'a>) -> Request<'a> {
    let noreply = toks.noreply();
    let key = toks.get(1);
    if key.len() > KEY_MAX_LENGTH {
        return Request::Error {
            reply: ErrorReply::BAD_FORMAT,
            noreply,
        };
    }
    match safe_strtol(toks.get(2)) {
        Some(exptime) => Request::Touch {
            key,
            exptime,
            noreply,
        },
        None => Request::Error {
            reply: ErrorReply::BAD_EXPTIME,
            noreply,
        },
    }
}

fn parse_delete<'a>(toks: &Tokens<'a>) -> Request<'a> {
    let nt = toks.ntokens();
    let mut noreply = false;
    if nt > 3 {
        let hold_is_zero = toks.get(2) == b"0";
        noreply = toks.noreply();
        let valid = (nt == 4 && (hold_is_zero || noreply)) || (nt == 5 && hold_is_zero && noreply);
        if !valid {
            return Request::Error {
                reply: ErrorReply::Client(
                    "bad command line format.  Usage: delete <key> [noreply]",
                ),
                noreply,
            };
        }
    }
    let key = toks.get(1);
    if key.len() > KEY_MAX_LENGTH {
        return Request::Error {
            reply: ErrorReply::BAD_FORMAT,
            noreply,
        };
    }
    Request::Delete { key, noreply }
}

fn parse_flush<'a>(toks: &Tokens<'a>) -> Request<'a> {
    let noreply = toks.noreply();
    let mut delay = 0;
    if toks.ntokens() != if noreply { 3 } else { 2 } {
        match safe_strtol(toks.get(1)) {
            Some(d) => delay = d,
            None => {
                return Request::Error {
                    reply: ErrorReply::BAD_EXPTIME,
                    noreply,
                };
            }
        }
    }
    Request::FlushAll { delay, noreply }
}

fn parse_stats<'a>(toks: &Tokens<'a>) -> Request<'a> {
    if toks.ntokens() == 2 {
        return Request::Stats(StatsGroup::General);
    }
    match toks.get(1) {
        b"reset" => Request::Stats(StatsGroup::Reset),
        b"settings" => Request::Stats(StatsGroup::Settings),
        b"items" | b"slabs" | b"sizes" | b"conns" => Request::Stats(StatsGroup::Empty),
        b"detail" if toks.get(2) != b"on" && toks.get(2) != b"off" && toks.get(2) != b"dump" => {
            Request::Error {
                reply: ErrorReply::Client("usage: stats detail on|off|dump"),
                noreply: false,
            }
        }
        _ => Request::Error {
            reply: ErrorReply::Error,
            noreply: false,
        },
    }
}

// ---------------------------------------------------------------------------------------
// Answers.

#[cfg(test)]
mod tests {
    use super::*;

    fn one(buf: &[u8]) -> (Request<'_>, usize) {
        match parse(buf, &Limits::default()) {
            Parse::Request { request, consumed } => (request, consumed),
            other => panic!("{other:?} for {:?}", String::from_utf8_lossy(buf)),
        }
    }

    fn error_of(buf: &[u8]) -> ErrorReply {
        match one(buf).0 {
            Request::Error { reply, .. } => reply,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn storage_line() {
        let (r, n) = one(b"set k 5 10 2\r\nhi\r\nget k\r\n");
        assert_eq!(n, 18);
        assert_eq!(
            r,
            Request::Store {
                mode: StoreMode::Set,
                key: b"k",
                flags: 5,
                exptime: 10,
                data: b"hi",
                cas_unique: 0,
                noreply: false
            }
        );
        assert_eq!(
            parse(b"set k 5 10 2\r\nh", &Limits::default()),
            Parse::Incomplete
        );
        let (r, _) = one(b"cas k 0 0 1 99 noreply\r\nx\r\n");
        assert!(matches!(
            r,
            Request::Store {
                mode: StoreMode::Cas,
                cas_unique: 99,
                noreply: true,
                ..
            }
        ));
    }

    #[test]
    fn storage_errors() {
        assert_eq!(error_of(b"set a 0 0 -1\r\n"), ErrorReply::BAD_FORMAT);
        assert_eq!(error_of(b"set a 0 0\r\n"), ErrorReply::Error);
        assert_eq!(error_of(b"set a 0 0 1 2 3\r\n"), ErrorReply::Error);
        assert_eq!(error_of(b"cas a 0 0 1\r\n"), ErrorReply::Error);
        assert_eq!(error_of(b"cas a 0 0 1 x\r\n"), ErrorReply::BAD_FORMAT);
        assert_eq!(
            error_of(b"set a 0 0 2147483646\r\n"),
            ErrorReply::BAD_FORMAT
        );
        let long = [b"set ".as_slice(), &[b'k'; 251], b" 0 0 1\r\n"].concat();
        assert_eq!(error_of(&long), ErrorReply::BAD_FORMAT);
        // Bad chunk consumes exactly bytes + 2.
        let (r, n) = one(b"set a 1 0 1\r\nxyz\r\n");
        assert_eq!(n, 16);
        assert_eq!(
            r,
            Request::Error {
                reply: ErrorReply::BAD_CHUNK,
                noreply: false
            }
        );
        // A length that wraps to 0 reads an empty block.
        let (r, n) = one(b"set a 1 0 4294967296\r\nge");
        assert_eq!(n, 24);
        assert_eq!(
            error_of(b"set a 1 0 4294967296\r\nge"),
            ErrorReply::BAD_CHUNK
        );
        let _ = r;
    }

    #[test]
    fn too_large_is_swallowed() {
        let (r, n) = one(b"set a 1 0 2000000\r\n");
        assert_eq!(n, 19 + 2_000_002);
        assert_eq!(
            r,
            Request::TooLarge {
                mode: StoreMode::Set,
                key: b"a",
                noreply: false
            }
        );
        // The boundary measured on memcached 1.6.18 with -I 1m.
        assert!(matches!(
            parse(b"set a 0 0 1048516\r\n", &Limits::default()),
            Parse::Incomplete
        ));
        assert!(matches!(
            one(b"set a 0 0 1048517\r\n").0,
            Request::TooLarge { .. }
        ));
        assert!(matches!(
            one(b"set a 1 0 1048513\r\n").0,
            Request::TooLarge { .. }
        ));
    }

    #[test]
    fn line_rules() {
        assert_eq!(error_of(b"\r\n"), ErrorReply::Error);
        assert_eq!(error_of(b"\n"), ErrorReply::Error);
        assert_eq!(error_of(b"GET a\r\n"), ErrorReply::Error);
        assert_eq!(error_of(b"get\r\n"), ErrorReply::Error);
        assert_eq!(error_of(b"get \r\n"), ErrorReply::Error);
        assert_eq!(one(b"   get  a   b\n").0, get(&[b"a", b"b"]));
        assert_eq!(one(b"get a\x00b\r\n").0, get(&[b"a"]));
        assert_eq!(one(b"get a\r\r\n").0, get(&[b"a\r"]));
        assert_eq!(one(b"get a\tb\r\n").0, get(&[b"a\tb"]));
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\n", &Limits::default()),
            Parse::Close
        );
        let long = vec![b'x'; 3000];
        assert_eq!(parse(&long, &Limits::default()), Parse::Close);
        let mut get_line = b"get ".to_vec();
        get_line.extend(std::iter::repeat_n(b"a ".as_slice(), 1500).flatten());
        assert_eq!(parse(&get_line, &Limits::default()), Parse::Incomplete);
        let mut long_nl = long.clone();
        long_nl.extend_from_slice(b"\r\n");
        assert_eq!(error_of(&long_nl), ErrorReply::Error);
        let mut huge_nl = vec![b'x'; READ_BUFFER_SIZE];
        huge_nl.extend_from_slice(b"\r\n");
        assert_eq!(parse(&huge_nl, &Limits::default()), Parse::Close);
        let mut huge_get = b"get ".to_vec();
        huge_get.extend(std::iter::repeat_n(b"a ".as_slice(), 10000).flatten());
        huge_get.extend_from_slice(b"\r\n");
        assert!(matches!(one(&huge_get).0, Request::Get { .. }));
    }

    fn get<'a>(keys: &[&'a [u8]]) -> Request<'a> {
        Request::Get {
            keys: keys.to_vec(),
            cas: false,
            touch: None,
            key_too_long: false,
        }
    }

    #[test]
    fn many_keys_continue_past_max_tokens() {
        let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
        let line = format!("get {}\r\n", keys.join(" "));
        match one(line.as_bytes()).0 {
            Request::Get { keys: got, .. } => assert_eq!(got.len(), 40),
            other => panic!("{other:?}"),
        }
        let line = format!("set a 0 0 1 {}\r\n", keys.join(" "));
        assert_eq!(error_of(line.as_bytes()), ErrorReply::Error);
    }

    #[test]
    fn other_commands() {
        assert_eq!(
            error_of(b"delete a 1\r\n").to_string_lossy(),
            "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]"
        );
        assert_eq!(
            one(b"delete a 0 noreply\r\n").0,
            Request::Delete {
                key: b"a",
                noreply: true
            }
        );
        assert_eq!(
            one(b"delete noreply\r\n").0,
            Request::Delete {
                key: b"noreply",
                noreply: false
            }
        );
        assert_eq!(error_of(b"incr n abc\r\n"), ErrorReply::BAD_DELTA);
        assert_eq!(error_of(b"incr n -1\r\n"), ErrorReply::BAD_DELTA);
        assert_eq!(error_of(b"incr n\r\n"), ErrorReply::Error);
        assert_eq!(error_of(b"touch t x\r\n"), ErrorReply::BAD_EXPTIME);
        assert_eq!(error_of(b"gat x t\r\n"), ErrorReply::BAD_EXPTIME);
        assert_eq!(
            one(b"gat 10\r\n").0,
            Request::Get {
                keys: vec![],
                cas: false,
                touch: Some(10),
                key_too_long: false,
            }
        );
        assert_eq!(error_of(b"verbosity\r\n"), ErrorReply::Error);
        assert_eq!(error_of(b"verbosity x\r\n"), ErrorReply::BAD_FORMAT);
        assert_eq!(
            one(b"verbosity 1 2\r\n").0,
            Request::Verbosity { noreply: false }
        );
        assert_eq!(error_of(b"verbosity 1 2 3\r\n"), ErrorReply::Error);
        assert_eq!(
            one(b"flush_all 1 2\r\n").0,
            Request::FlushAll {
                delay: 1,
                noreply: false
            }
        );
        assert_eq!(error_of(b"flush_all x\r\n"), ErrorReply::BAD_EXPTIME);
        assert_eq!(
            one(b"flush_all noreply\r\n").0,
            Request::FlushAll {
                delay: 0,
                noreply: true
            }
        );
        assert_eq!(one(b"version x\r\n").0, Request::Version);
        assert_eq!(one(b"quit\r\n").0, Request::Quit);
        assert_eq!(one(b"mn\r\n").0, Request::MetaNoop);
        assert_eq!(error_of(b"stats nosuch\r\n"), ErrorReply::Error);
        assert_eq!(one(b"stats reset\r\n").0, Request::Stats(StatsGroup::Reset));
    }

    impl ErrorReply {
        fn to_string_lossy(self) -> String {
            let mut v = Vec::new();
            self.encode(&mut v);
            String::from_utf8_lossy(&v).trim_end().to_string()
        }
    }
}
