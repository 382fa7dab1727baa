//! The frame's parts as decoded ([`Frame`] and its items), the limits a connection accepts,
//! and why a frame is refused. The layout is in the module docs of `wire`.

use std::fmt;

/// Bytes in a frame header.
pub(crate) const HEADER: usize = 16;
/// Fixed bytes of one request (everything but its argument).
pub(super) const REQUEST_FIXED: usize = 22;
/// Fixed bytes of one answer (everything but its value).
pub(super) const ANSWER_FIXED: usize = 14;
/// Fixed bytes of a chunk body (everything but the chunk's bytes).
pub(super) const CHUNK_FIXED: usize = 13;
/// Entries an op table holds at most.
pub(super) const MAX_OPS: usize = 16;
/// The slot of a request that targets no property.
pub(super) const NO_SLOT: u32 = u32::MAX;
/// Request flag: the op table entry is a function's name index, not a descriptor offset.
pub(super) const NAMED: u8 = 0x01;
/// Request and answer flag: the value comes in chunk frames.
pub(super) const LARGE: u8 = 0x02;
/// Request flag: the last request of a bank of the sender's window (see `link`); the receiver
/// returns the bank's credit once it ran.
pub(super) const CREDIT: u8 = 0x04;
/// `body_len` is a u32, and header plus body must fit in a `usize`.
pub(super) const MAX_BODY: usize = u32::MAX as usize - HEADER;
/// Request bytes in the smallest possible requests body besides the argument: the table's
/// length byte, one op, one request.
pub(super) const ONE_REQUEST: usize = 1 + 8 + REQUEST_FIXED;

/// The sizes a connection accepts, from `GSM_FRAME` and `GSM_MAX_MESSAGE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Largest `body_len` of a frame (`GSM_FRAME`).
    pub(crate) frame: usize,
    /// Largest total length of a large value (`GSM_MAX_MESSAGE`).
    pub(crate) max_message: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            frame: 64 * 1024,
            max_message: 1 << 30,
        }
    }
}

impl Limits {
    /// The largest body this connection sends or accepts.
    pub(super) fn body(&self) -> usize {
        self.frame.min(MAX_BODY)
    }
}

/// The kinds of frame, by their header byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Requests = 1,
    Answers = 2,
    Chunk = 3,
    Heartbeat = 4,
    Control = 5,
}

impl Kind {
    pub(super) fn from_byte(byte: u8) -> Option<Kind> {
        Some(match byte {
            1 => Kind::Requests,
            2 => Kind::Answers,
            3 => Kind::Chunk,
            4 => Kind::Heartbeat,
            5 => Kind::Control,
            _ => return None,
        })
    }

    /// What one counted item of this kind is called in messages.
    pub(super) fn item(self) -> &'static str {
        match self {
            Kind::Requests => "request",
            Kind::Answers => "answer",
            Kind::Chunk => "chunk",
            Kind::Heartbeat | Kind::Control => "item",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Requests => "requests",
            Kind::Answers => "answers",
            Kind::Chunk => "chunk",
            Kind::Heartbeat => "heartbeat",
            Kind::Control => "control",
        })
    }
}

/// One decoded frame; its byte slices borrow from the buffer it was decoded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame<'a> {
    /// Calls into the receiver's trustee.
    Requests {
        seq: u64,
        requests: Vec<Request<'a>>,
    },
    /// Results of the receiver's earlier requests, in any order.
    Answers { seq: u64, answers: Vec<Answer<'a>> },
    /// A piece of a large argument or answer.
    Chunk {
        seq: u64,
        of: ChunkOf,
        id: u64,
        offset: u32,
        bytes: &'a [u8],
    },
    /// The link is alive; nothing else to say.
    Heartbeat { seq: u64 },
    /// A message for the connection's control layer (counting, shutdown, ...).
    Control { seq: u64, body: &'a [u8] },
}

/// One call, as decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request<'a> {
    /// The request's number in its lane.
    pub(crate) id: u64,
    /// What it runs, resolved through the op table.
    pub(crate) code: Code,
    /// The property's export slot and generation; `None` for constructors and spawns.
    pub(crate) target: Option<(u32, u32)>,
    /// The argument.
    pub(crate) arg: Payload<'a>,
    /// Whether it is the last request of a bank: the receiver returns a credit once it ran.
    pub(crate) credit: bool,
}

/// What a request runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    /// A descriptor of the sender's build, by its offset from the anchor (see `op`): only a
    /// peer of the same build sends these.
    Op(u64),
    /// A function by name: the index the sender gave the name on this connection, in a
    /// control message sent before (see `link`). Any build may send these.
    Name(u32),
}

impl Code {
    /// The op table entry and the request flag that say this.
    pub(super) fn encode(self) -> (u64, u8) {
        match self {
            Code::Op(offset) => (offset, 0),
            Code::Name(index) => (u64::from(index), NAMED),
        }
    }
}

/// A value carried in its frame, or announced there and sent in chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Payload<'a> {
    /// The value's bytes.
    Inline(&'a [u8]),
    /// The value arrives in chunk frames; this is its total length.
    Large { total: u32 },
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// It ran; the value is its result.
    Ok = 0,
    /// It panicked; the value is the panic message.
    Panicked = 1,
    /// It was not run (stale export, type mismatch, unknown op, undecodable argument, ...); the
    /// value says why.
    Refused = 2,
    /// A named request whose name this node has no function of that signature for: not run;
    /// the value is the `NamedError` (see `function`), for the caller to return.
    Unresolved = 3,
}

impl Status {
    pub(super) fn from_byte(byte: u8) -> Option<Status> {
        Some(match byte {
            0 => Status::Ok,
            1 => Status::Panicked,
            2 => Status::Refused,
            3 => Status::Unresolved,
            _ => return None,
        })
    }
}

/// One answer, as decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer<'a> {
    /// The id of the request it answers.
    pub(crate) id: u64,
    /// How that request ended.
    pub(crate) status: Status,
    /// The result, panic message or refusal.
    pub(crate) value: Payload<'a>,
}

/// Which large value a chunk belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ChunkOf {
    /// The argument of the sender's request with the chunk's id.
    Argument = 0,
    /// The sender's answer to the receiver's request with the chunk's id.
    Answer = 1,
}

/// The part of a body that ran past its end, for [`FrameError::PastEnd`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    OpTable,
    RequestHeader,
    Argument,
    AnswerHeader,
    Value,
    ChunkHeader,
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Part::OpTable => "op table",
            Part::RequestHeader => "request header",
            Part::Argument => "argument",
            Part::AnswerHeader => "answer header",
            Part::Value => "answer value",
            Part::ChunkHeader => "chunk header",
        })
    }
}

/// Why a frame was rejected. Any of these means the peer is broken or hostile: the connection
/// ends, naming the peer and this message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FrameError {
    /// The header's kind byte names no frame kind.
    UnknownKind(u8),
    /// The header's reserved flags byte is not 0.
    HeaderFlags(u8),
    /// `body_len` exceeds the frame limit.
    BodyTooLong { len: u32, limit: usize },
    /// A count that this kind of frame cannot have.
    WrongCount { kind: Kind, count: u16 },
    /// A heartbeat with a body.
    HeartbeatBody(u32),
    /// The count needs more bytes than the whole body has.
    CountPastBody {
        kind: Kind,
        count: u16,
        needs: usize,
        len: u32,
    },
    /// The op table has more than 16 entries.
    OpTableTooLong(u8),
    /// The count needs more bytes than the body has after the op table.
    CountPastTable {
        count: u16,
        needs: usize,
        left: usize,
    },
    /// A field or value runs past the end of the body.
    PastEnd { part: Part, len: usize, left: usize },
    /// A request's flags have unknown bits.
    RequestFlags(u8),
    /// An answer's flags have unknown bits.
    AnswerFlags(u8),
    /// A named request's op table entry is past the u32 name indices.
    NameIndex(u64),
    /// A request's op index is outside the op table.
    OpIndex { index: u8, table: u8 },
    /// A request without a property (slot `u32::MAX`) has a generation.
    GenerationWithoutSlot(u32),
    /// An answer's status byte is unknown.
    UnknownStatus(u8),
    /// A large value's total length exceeds `GSM_MAX_MESSAGE`.
    LargeTooLarge { total: u32, limit: usize },
    /// A chunk's `of` byte is neither argument nor answer.
    ChunkOf(u8),
    /// A chunk reaches past `GSM_MAX_MESSAGE`, so it belongs to no acceptable large value.
    ChunkPastMessage { end: u64, limit: usize },
    /// Bytes after the last counted item.
    Trailing { bytes: usize, after: Kind },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FrameError::UnknownKind(kind) => write!(f, "unknown frame kind {kind}"),
            FrameError::HeaderFlags(flags) => {
                write!(f, "unknown frame flags {flags:#04x} (reserved, must be 0)")
            }
            FrameError::BodyTooLong { len, limit } => {
                write!(f, "body length {len} > frame limit {limit}")
            }
            FrameError::WrongCount { kind, count } => {
                let expected = match kind {
                    Kind::Requests | Kind::Answers => "at least 1",
                    Kind::Chunk => "1",
                    Kind::Heartbeat | Kind::Control => "0",
                };
                write!(f, "{kind} frame with count {count}, expected {expected}")
            }
            FrameError::HeartbeatBody(len) => {
                write!(
                    f,
                    "heartbeat frame with a body of {len} bytes, expected none"
                )
            }
            FrameError::CountPastBody {
                kind,
                count,
                needs,
                len,
            } => write!(
                f,
                "count {count} > length {len}: {count} {kind} need at least {needs} bytes"
            ),
            FrameError::OpTableTooLong(n) => {
                write!(f, "op table of {n} entries > {MAX_OPS}")
            }
            FrameError::CountPastTable { count, needs, left } => write!(
                f,
                "count {count} > length {left} after the op table: \
                 {count} requests need at least {needs} bytes"
            ),
            FrameError::PastEnd { part, len, left } => write!(
                f,
                "{part} of {len} bytes runs past the frame end ({left} bytes left)"
            ),
            FrameError::RequestFlags(flags) => write!(f, "unknown request flags {flags:#04x}"),
            FrameError::AnswerFlags(flags) => write!(f, "unknown answer flags {flags:#04x}"),
            FrameError::NameIndex(entry) => {
                write!(f, "named request with name index {entry} > u32::MAX")
            }
            FrameError::OpIndex { index, table } => {
                write!(f, "op index {index} outside a table of {table}")
            }
            FrameError::GenerationWithoutSlot(generation) => write!(
                f,
                "request without a property (slot u32::MAX) has generation {generation}, \
                 expected 0"
            ),
            FrameError::UnknownStatus(status) => write!(f, "unknown status {status}"),
            FrameError::LargeTooLarge { total, limit } => {
                write!(f, "large value of {total} bytes > GSM_MAX_MESSAGE {limit}")
            }
            FrameError::ChunkOf(of) => write!(
                f,
                "unknown chunk target {of} (0 = request argument, 1 = answer)"
            ),
            FrameError::ChunkPastMessage { end, limit } => {
                write!(f, "chunk ends at byte {end} > GSM_MAX_MESSAGE {limit}")
            }
            FrameError::Trailing { bytes, after } => {
                write!(f, "{bytes} trailing bytes after the last {}", after.item())
            }
        }
    }
}

impl std::error::Error for FrameError {}

/// A frame cannot take this item (body limit, op table or count): finish it and begin another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full;

impl fmt::Display for Full {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("frame full")
    }
}

impl std::error::Error for Full {}
