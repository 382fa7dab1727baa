//! The runtime-independent half of a connection: input buffering, turning requests into
//! shard commands, and rendering the shards' replies into answers.
//!
//! A connection does, for each read:
//!
//! 1. [`Input::extend`] with the bytes read;
//! 2. [`Round::plan`]: parses every complete request, answers those that need no shard, and
//!    hands the shard commands of each other request to its [`Host`], which runs them (or
//!    ships each `(shard, command)` to that shard's trustee with `apply_then` and
//!    [`store::execute`](crate::store::execute));
//! 3. once every reply is in, [`Round::render`]: the answers in request order, with memcached's
//!    rules for what a connection that aborts or meets a too-long key drops.
//!
//! [`Round`] is the one place those answer rules live; the network server and [`Engine`] (which
//! does all of this synchronously against local shards: the reference the server must match,
//! and what the tests drive) both go through it.

use bytes::Bytes;

use crate::config::{Config, ServerStats, StatsEnv, render_settings, render_stats};
use crate::protocol::{self, ErrorReply, Limits, Parse, Request, StatsGroup, StoreMode};
use crate::store::{
    ArithResult, Shard, ShardCommand, ShardReply, ShardStats, StoreRequest, execute, shard_of,
};

/// An answer that needs no shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Nothing (`noreply`).
    Nothing,
    /// An error line.
    Error(ErrorReply),
    /// A fixed line (`OK`, `MN`, `END`).
    Line(&'static str),
    /// `VERSION …`.
    Version,
}

impl Answer {
    /// Appends the answer.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Answer::Nothing => {}
            Answer::Error(e) => e.encode(out),
            Answer::Line(l) => protocol::encode_line(out, l),
            Answer::Version => {
                out.extend_from_slice(b"VERSION ");
                protocol::encode_line(out, protocol::VERSION);
            }
        }
    }
}

/// The keys of a multi-get, kept for rendering `VALUE` lines.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyList {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl KeyList {
    fn push(&mut self, key: &[u8]) {
        self.bytes.extend_from_slice(key);
        self.ends.push(self.bytes.len());
    }

    /// The keys in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let k = &self.bytes[start..end];
            start = end;
            k
        })
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
}

/// How to turn the shards' replies into the answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pending {
    /// `VALUE` lines for hits, then `END`; one reply per key.
    Get {
        /// The keys.
        keys: KeyList,
        /// Include cas uniques.
        cas: bool,
    },
    /// A multi-get that met a key over 250 bytes: `CLIENT_ERROR bad command line format`
    /// (the keys before it were looked up). memcached also drops the answers it has not
    /// written yet, see [`Pending::drops_unwritten`].
    GetKeyTooLong,
    /// A storage answer.
    Store {
        /// Answer nothing.
        noreply: bool,
    },
    /// `DELETED` / `NOT_FOUND`.
    Delete {
        /// Answer nothing.
        noreply: bool,
    },
    /// A number, `NOT_FOUND` or the non-numeric error.
    Arith {
        /// Answer nothing.
        noreply: bool,
    },
    /// `TOUCHED` / `NOT_FOUND`.
    Touch {
        /// Answer nothing.
        noreply: bool,
    },
    /// `OK` once every shard has flushed.
    Flush {
        /// Answer nothing.
        noreply: bool,
    },
    /// `stats`: every shard's counters, summed.
    Stats,
    /// `stats settings` (no shard replies).
    Settings,
    /// `RESET` once every shard has reset.
    Reset,
    /// A meta command's answer.
    Meta(crate::meta::MetaPending),
}

/// What the server needs to answer `stats`.
pub trait StatsSource {
    /// The configuration, server-wide counters and times.
    fn stats_env(&self) -> StatsEnv<'_>;
}

impl Pending {
    /// Whether memcached writes its pending answers out after this one (it does after each
    /// get-family answer). Answers after the last such point are what it drops when it
    /// aborts a connection or meets [`Pending::GetKeyTooLong`].
    pub fn flushes(&self) -> bool {
        matches!(self, Pending::Get { .. })
    }

    /// Whether memcached drops its unwritten answers before this one.
    pub fn drops_unwritten(&self) -> bool {
        matches!(self, Pending::GetKeyTooLong)
    }

    /// Appends the answer for `replies` (one per command of the plan, in order).
    pub fn render(&self, replies: &[ShardReply], env: &dyn StatsSource, out: &mut Vec<u8>) {
        const INTERNAL: ErrorReply = ErrorReply::Server("internal error");
        let line = |out: &mut Vec<u8>, noreply: bool, l: &str| {
            if !noreply {
                protocol::encode_line(out, l);
            }
        };
        match (self, replies) {
            (Pending::Get { keys, cas }, _) if replies.len() == keys.len() => {
                for (key, reply) in keys.iter().zip(replies) {
                    if let ShardReply::Value(Some(item)) = reply {
                        let c = cas.then_some(item.cas);
                        protocol::encode_value(out, key, item.flags, item.value.as_ref(), c);
                    }
                }
                protocol::encode_line(out, "END");
            }
            (Pending::GetKeyTooLong, _) => ErrorReply::BAD_FORMAT.encode(out),
            (Pending::Store { noreply }, [ShardReply::Store(r)]) => line(out, *noreply, r.line()),
            (Pending::Delete { noreply }, [ShardReply::Deleted(d)]) => {
                line(out, *noreply, if *d { "DELETED" } else { "NOT_FOUND" });
            }
            (Pending::Touch { noreply }, [ShardReply::Touched(t)]) => {
                line(out, *noreply, if *t { "TOUCHED" } else { "NOT_FOUND" });
            }
            (Pending::Arith { noreply: true }, [ShardReply::Arith(_)]) => {}
            (Pending::Arith { noreply: false }, [ShardReply::Arith(a)]) => match a {
                ArithResult::Value(n) => protocol::encode_number(out, *n),
                ArithResult::NotFound => protocol::encode_line(out, "NOT_FOUND"),
                ArithResult::NonNumeric => ErrorReply::NON_NUMERIC.encode(out),
            },
            (Pending::Meta(p), [ShardReply::Meta(r)]) => p.render(r, out),
            (Pending::Flush { noreply }, _) => line(out, *noreply, "OK"),
            (Pending::Reset, _) => protocol::encode_line(out, "RESET"),
            (Pending::Settings, _) => render_settings(out, env.stats_env().config),
            (Pending::Stats, _) => {
                let mut sum = ShardStats::default();
                for r in replies {
                    if let ShardReply::Stats(s) = r {
                        sum.add(s);
                    }
                }
                render_stats(out, &env.stats_env(), &sum);
            }
            _ => INTERNAL.encode(out),
        }
    }
}

/// What to do for one request.
#[derive(Debug)]
pub enum Plan {
    /// The answer is known.
    Ready(Answer),
    /// Run these commands on these shards, then render.
    Shards {
        /// `(shard index, command)` in order.
        ops: Vec<(usize, ShardCommand)>,
        /// How to render the replies.
        pending: Pending,
    },
}

/// The next thing a connection must do.
#[derive(Debug)]
pub enum Step {
    /// Handle one request.
    Plan(Plan),
    /// Wait for more input.
    NeedMore,
    /// `quit`: write out earlier answers, then close.
    Quit,
    /// An overlong line or an HTTP request: close at once. memcached drops the answers it
    /// has not written yet (normally those of the same read), and so should the server.
    Abort,
}

/// Turns a parsed request into a plan for `shards` shards.
pub fn plan(req: Request<'_>, shards: usize) -> Plan {
    let one = |key: &[u8], cmd: ShardCommand, pending: Pending| Plan::Shards {
        ops: vec![(shard_of(key, shards), cmd)],
        pending,
    };
    let all = |cmd: ShardCommand, pending: Pending| Plan::Shards {
        ops: (0..shards).map(|i| (i, cmd.clone())).collect(),
        pending,
    };
    let own = Bytes::copy_from_slice;
    match req {
        Request::Get {
            keys,
            cas,
            touch,
            key_too_long,
        } => {
            if keys.is_empty() && !key_too_long {
                return Plan::Ready(Answer::Line("END"));
            }
            let mut list = KeyList::default();
            let ops = keys
                .iter()
                .map(|&k| {
                    list.push(k);
                    (
                        shard_of(k, shards),
                        ShardCommand::Get { key: own(k), touch },
                    )
                })
                .collect();
            let pending = if key_too_long {
                Pending::GetKeyTooLong
            } else {
                Pending::Get { keys: list, cas }
            };
            Plan::Shards { ops, pending }
        }
        Request::Store {
            mode,
            key,
            flags,
            exptime,
            data,
            cas_unique,
            noreply,
        } => one(
            key,
            ShardCommand::Store(Box::new(StoreRequest {
                mode,
                key: own(key),
                flags,
                exptime,
                data: own(data),
                cas_unique,
            })),
            Pending::Store { noreply },
        ),
        Request::TooLarge { mode, key, noreply } => one(
            key,
            ShardCommand::TooLarge {
                mode,
                key: own(key),
            },
            Pending::Store { noreply },
        ),
        Request::Delete { key, noreply } => one(
            key,
            ShardCommand::Delete { key: own(key) },
            Pending::Delete { noreply },
        ),
        Request::Arith {
            key,
            incr,
            delta,
            noreply,
        } => one(
            key,
            ShardCommand::Arith {
                key: own(key),
                incr,
                delta,
            },
            Pending::Arith { noreply },
        ),
        Request::Touch {
            key,
            exptime,
            noreply,
        } => one(
            key,
            ShardCommand::Touch {
                key: own(key),
                exptime,
            },
            Pending::Touch { noreply },
        ),
        Request::FlushAll { delay, noreply } => {
            all(ShardCommand::FlushAll { delay }, Pending::Flush { noreply })
        }
        Request::Stats(StatsGroup::General) => all(ShardCommand::Stats, Pending::Stats),
        Request::Stats(StatsGroup::Reset) => all(ShardCommand::ResetStats, Pending::Reset),
        Request::Stats(StatsGroup::Settings) => Plan::Shards {
            ops: Vec::new(),
            pending: Pending::Settings,
        },
        Request::Stats(StatsGroup::Empty) => Plan::Ready(Answer::Line("END")),
        Request::Version => Plan::Ready(Answer::Version),
        Request::Verbosity { noreply } => Plan::Ready(if noreply {
            Answer::Nothing
        } else {
            Answer::Line("OK")
        }),
        Request::MetaNoop => Plan::Ready(Answer::Line("MN")),
        Request::Meta(m) => {
            let op = m.op();
            one(
                &m.key,
                ShardCommand::Meta(Box::new(op)),
                Pending::Meta(m.pending),
            )
        }
        Request::MetaTooLarge { key, set } => one(
            &key,
            ShardCommand::TooLarge {
                mode: if set { StoreMode::Set } else { StoreMode::Add },
                key: own(&key),
            },
            Pending::Store { noreply: false },
        ),
        Request::Quit => Plan::Ready(Answer::Nothing),
        Request::Error { reply, noreply } => Plan::Ready(if noreply {
            Answer::Nothing
        } else {
            Answer::Error(reply)
        }),
    }
}

/// A connection's input buffer: bytes read but not yet parsed, and bytes still to be
/// discarded from a too-large value.
#[derive(Debug, Default)]
pub struct Input {
    buf: Vec<u8>,
    start: usize,
    skip: usize,
    /// Counters for `stats` (`bytes_read`, `cmd_flush`).
    pub stats: ServerStats,
}

impl Input {
    /// An empty buffer.
    pub fn new() -> Input {
        Input::default()
    }

    /// Adds bytes read from the socket.
    pub fn extend(&mut self, data: &[u8]) {
        self.stats.bytes_read += data.len() as u64;
        let skipped = self.skip.min(data.len());
        self.skip -= skipped;
        let data = &data[skipped..];
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > 4096 && self.start * 2 > self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// Bytes buffered and not yet parsed.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Parses the next request and plans it.
    pub fn next(&mut self, limits: &Limits, shards: usize) -> Step {
        let data = &self.buf[self.start..];
        match protocol::parse(data, limits) {
            Parse::Incomplete => Step::NeedMore,
            Parse::Close => Step::Abort,
            Parse::Request { request, consumed } => {
                let quit = matches!(request, Request::Quit);
                if matches!(request, Request::FlushAll { .. }) {
                    self.stats.cmd_flush += 1;
                }
                let p = plan(request, shards);
                let here = consumed.min(data.len());
                self.skip = consumed - here;
                self.start += here;
                if quit { Step::Quit } else { Step::Plan(p) }
            }
        }
    }
}

/// What a read's requests need from the server around them.
pub trait Host: StatsSource {
    /// Runs or starts the commands of request `request` of the read; their replies, one per
    /// command in order, are handed to [`Round::render`] later.
    fn ship(&mut self, request: usize, ops: Vec<(usize, ShardCommand)>);

    /// `stats reset`: zero the server-wide counters (at the point of the request).
    fn reset_stats(&mut self);

    /// Adds a connection's counters (`bytes_read`, `cmd_flush`) to the server-wide ones.
    fn add_counters(&mut self, counters: &ServerStats);
}

/// How a read left the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Keep reading.
    Open,
    /// `quit`: write the answers, then close.
    Quit,
    /// An overlong line or an HTTP request: write what memcached would have written before it
    /// (the answers up to the last get-family answer), then close.
    Abort,
}

/// One request of a read: its answer, or how to render it from its replies.
#[derive(Debug)]
enum Slot {
    Ready(Answer),
    Pending(Pending),
}

/// The requests of one read, from planning to the bytes to write.
#[derive(Debug, Default)]
pub struct Round {
    slots: Vec<Slot>,
}

impl Round {
    /// An empty round (reuse it read after read).
    pub fn new() -> Round {
        Round::default()
    }

    /// Plans every complete request in `input`, shipping shard commands through `host`.
    pub fn plan(
        &mut self,
        input: &mut Input,
        limits: &Limits,
        shards: usize,
        host: &mut impl Host,
    ) -> End {
        self.slots.clear();
        loop {
            match input.next(limits, shards) {
                Step::NeedMore => return End::Open,
                Step::Quit => return End::Quit,
                Step::Abort => return End::Abort,
                Step::Plan(Plan::Ready(answer)) => self.slots.push(Slot::Ready(answer)),
                Step::Plan(Plan::Shards { ops, pending }) => {
                    if matches!(pending, Pending::Reset) {
                        // memcached zeroes its counters, this connection's included, at once.
                        input.stats = ServerStats::default();
                        host.reset_stats();
                    }
                    host.ship(self.slots.len(), ops);
                    self.slots.push(Slot::Pending(pending));
                }
            }
        }
    }

    /// Appends the answers of the planned requests to `out`, in order; `replies(i)` gives the
    /// replies of request `i`'s commands. Adds `input`'s counters to the host's first, so
    /// `stats` counts this read.
    pub fn render(
        &mut self,
        end: End,
        input: &mut Input,
        host: &mut impl Host,
        mut replies: impl FnMut(usize) -> Vec<ShardReply>,
        out: &mut Vec<u8>,
    ) {
        host.add_counters(&std::mem::take(&mut input.stats));
        // memcached writes its answers out after each get-family answer; what came after the
        // last such point is dropped when it aborts the connection or meets a key too long.
        let mut written = out.len();
        for (i, slot) in self.slots.drain(..).enumerate() {
            match slot {
                Slot::Ready(answer) => answer.encode(out),
                Slot::Pending(pending) => {
                    if pending.drops_unwritten() {
                        out.truncate(written);
                    }
                    pending.render(&replies(i), &*host, out);
                    if pending.flushes() {
                        written = out.len();
                    }
                }
            }
        }
        if end == End::Abort {
            out.truncate(written);
        }
    }
}

/// A synchronous, single-threaded server core over local shards: the reference semantics
/// of `kvs`, used by the tests and usable by any embedding.
///
/// ```
/// use kvs::config::Config;
/// use kvs::conn::Engine;
/// let mut engine = Engine::new(Config::default(), 1_700_000_000);
/// let mut conn = engine.connect();
/// let (out, open) = engine.feed(&mut conn, b"set k 0 0 2\r\nhi\r\nget k\r\n", 1_700_000_000);
/// assert_eq!(out, b"STORED\r\nVALUE k 0 2\r\nhi\r\nEND\r\n");
/// assert!(open);
/// ```
#[derive(Debug)]
pub struct Engine {
    config: Config,
    shards: Vec<Shard>,
    server: ServerStats,
    started: u64,
    now: u64,
    /// Replies of the read being fed, by request.
    replies: Vec<Vec<ShardReply>>,
}

impl StatsSource for Engine {
    fn stats_env(&self) -> StatsEnv<'_> {
        StatsEnv {
            config: &self.config,
            server: self.server,
            started: self.started,
            now: self.now,
        }
    }
}

impl Engine {
    /// An empty table for `config`, started at Unix time `started`.
    pub fn new(config: Config, started: u64) -> Engine {
        let shards = (0..config.shards)
            .map(|i| Shard::new(config.shard(i)))
            .collect();
        Engine {
            config,
            shards,
            server: ServerStats::default(),
            started,
            now: started,
            replies: Vec::new(),
        }
    }

    /// The shards (for inspection in tests).
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// Opens a connection.
    pub fn connect(&mut self) -> Input {
        self.server.curr_connections += 1;
        self.server.total_connections += 1;
        Input::new()
    }

    /// Closes a connection.
    pub fn disconnect(&mut self, conn: Input) {
        self.server.curr_connections -= 1;
        self.add_counters(&conn.stats);
    }

    /// Feeds bytes to a connection at Unix time `now`; returns the answers and whether the
    /// connection stays open.
    pub fn feed(&mut self, conn: &mut Input, data: &[u8], now: u64) -> (Vec<u8>, bool) {
        self.now = now;
        conn.extend(data);
        let limits = self.config.limits();
        let shards = self.shards.len();
        let mut round = Round::new();
        let end = round.plan(conn, &limits, shards, self);
        let mut replies = std::mem::take(&mut self.replies);
        let mut out = Vec::new();
        round.render(
            end,
            conn,
            self,
            |i| std::mem::take(&mut replies[i]),
            &mut out,
        );
        replies.clear();
        self.replies = replies;
        self.server.bytes_written += out.len() as u64;
        (out, end == End::Open)
    }
}

impl Host for Engine {
    fn ship(&mut self, request: usize, ops: Vec<(usize, ShardCommand)>) {
        let now = self.now;
        let replies = ops
            .into_iter()
            .map(|(i, cmd)| execute(&mut self.shards[i], cmd, now))
            .collect();
        if self.replies.len() <= request {
            self.replies.resize_with(request + 1, Vec::new);
        }
        self.replies[request] = replies;
    }

    fn reset_stats(&mut self) {
        self.server = ServerStats {
            curr_connections: self.server.curr_connections,
            total_connections: self.server.total_connections,
            ..ServerStats::default()
        };
    }

    fn add_counters(&mut self, counters: &ServerStats) {
        self.server.cmd_flush += counters.cmd_flush;
        self.server.bytes_read += counters.bytes_read;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000;

    fn engine(shards: usize) -> Engine {
        Engine::new(
            Config {
                shards,
                ..Config::default()
            },
            NOW,
        )
    }

    fn talk(e: &mut Engine, c: &mut Input, data: &[u8]) -> String {
        String::from_utf8_lossy(&e.feed(c, data, NOW).0).into_owned()
    }

    #[test]
    fn multi_get_across_shards_keeps_order() {
        let mut e = engine(4);
        let mut c = e.connect();
        let mut req = Vec::new();
        for i in 0..20 {
            req.extend_from_slice(format!("set k{i} {i} 0 1\r\n{}\r\n", i % 10).as_bytes());
        }
        let out = talk(&mut e, &mut c, &req);
        assert_eq!(out, "STORED\r\n".repeat(20));
        let out = talk(&mut e, &mut c, b"get k3 nope k1 k3\r\n");
        assert_eq!(
            out,
            "VALUE k3 3 1\r\n3\r\nVALUE k1 1 1\r\n1\r\nVALUE k3 3 1\r\n3\r\nEND\r\n"
        );
        assert!(e.shards().iter().all(|s| !s.is_empty()));
    }

    #[test]
    fn byte_at_a_time_equals_all_at_once() {
        let script: &[u8] = b"set a 1 0 3\r\nabc\r\nappend a 0 0 2\r\nde\r\nget a\r\n\
            incr a 1\r\nset n 0 0 2\r\n41\r\nincr n 1\r\ndecr n 50\r\ndelete a\r\n\
            set big 0 0 2000000\r\nxyz\r\nbogus\r\nflush_all\r\nget n\r\n";
        let mut e1 = engine(2);
        let mut c1 = e1.connect();
        let whole = e1.feed(&mut c1, script, NOW).0;
        let mut e2 = engine(3);
        let mut c2 = e2.connect();
        let mut pieces = Vec::new();
        for b in script {
            pieces.extend(e2.feed(&mut c2, std::slice::from_ref(b), NOW).0);
        }
        assert_eq!(whole, pieces);
        let text = String::from_utf8_lossy(&whole);
        assert!(text.starts_with(
            "STORED\r\nSTORED\r\nVALUE a 1 5\r\nabcde\r\nEND\r\nCLIENT_ERROR cannot increment"
        ));
        // The too-large value swallows the rest of the script as its data block.
        assert!(
            text.ends_with("DELETED\r\nSERVER_ERROR object too large for cache\r\n"),
            "{text}"
        );
    }

    #[test]
    fn too_large_value_is_swallowed_across_reads() {
        let mut e = engine(1);
        let mut c = e.connect();
        // The error is answered at once (memcached answers after the swallow; the bytes on
        // the wire are the same).
        let mut answers = talk(&mut e, &mut c, b"set a 0 0 1\r\nx\r\nset a 0 0 2000000\r\n");
        let chunk = vec![b'y'; 65536];
        let mut left = 2_000_002usize;
        while left > 0 {
            let n = left.min(chunk.len());
            answers += &talk(&mut e, &mut c, &chunk[..n]);
            left -= n;
        }
        answers += &talk(&mut e, &mut c, b"get a\r\n");
        assert_eq!(
            answers,
            "STORED\r\nSERVER_ERROR object too large for cache\r\nEND\r\n"
        );
        assert_eq!(c.buffered(), 0);
    }

    #[test]
    fn quit_and_noreply() {
        let mut e = engine(2);
        let mut c = e.connect();
        let (out, open) = e.feed(
            &mut c,
            b"set a 0 0 1 noreply\r\nx\r\nincr a 1 noreply\r\ndelete zz noreply\r\nget a\r\nquit\r\nget a\r\n",
            NOW,
        );
        assert_eq!(out, b"VALUE a 0 1\r\nx\r\nEND\r\n");
        assert!(!open);
    }

    #[test]
    fn stats_count() {
        let mut e = engine(2);
        let mut c = e.connect();
        talk(
            &mut e,
            &mut c,
            b"set a 0 0 1\r\nx\r\nget a b\r\nflush_all\r\n",
        );
        let s = talk(&mut e, &mut c, b"stats\r\n");
        for want in [
            "STAT cmd_get 2\r\n",
            "STAT get_hits 1\r\n",
            "STAT get_misses 1\r\n",
            "STAT cmd_set 1\r\n",
            "STAT cmd_flush 1\r\n",
            "STAT curr_connections 1\r\n",
            "STAT curr_items 0\r\n",
            "STAT total_items 1\r\n",
        ] {
            assert!(s.contains(want), "{want} missing in {s}");
        }
        assert_eq!(talk(&mut e, &mut c, b"stats reset\r\n"), "RESET\r\n");
        let s = talk(&mut e, &mut c, b"stats\r\n");
        assert!(s.contains("STAT cmd_get 0\r\n"));
        assert!(talk(&mut e, &mut c, b"stats settings\r\n").contains("STAT maxbytes 67108864\r\n"));
        assert_eq!(talk(&mut e, &mut c, b"stats items\r\n"), "END\r\n");
    }
}
