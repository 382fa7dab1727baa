//! The rack's frame format: what one connection carries, the encoders that append frames to a
//! write buffer, and a decoder that trusts no byte of its input.
//!
//! One TCP connection joins one worker of node A and one worker of node B and carries both
//! directions: A's requests to B's trustee with B's answers, and B's requests to A's trustee with
//! A's answers. Each direction of requests is a *lane*. Per loop round a worker writes at most one
//! frame of each kind it has something for, all into one buffer and one write. Values (arguments,
//! results, control messages) are bytes here: postcard runs above this module.
//!
//! # Layout
//!
//! Integers are little-endian and fixed-width. Every frame starts with a 16-byte header:
//!
//! | offset | field      | type | meaning                                                     |
//! |-------:|------------|------|-------------------------------------------------------------|
//! |      0 | `kind`     | u8   | 1 requests, 2 answers, 3 chunk, 4 heartbeat, 5 control      |
//! |      1 | `flags`    | u8   | 0 (reserved: anything else is an error)                     |
//! |      2 | `count`    | u16  | items in the body (requests, answers; 1 for a chunk)        |
//! |      4 | `body_len` | u32  | bytes after the header, at most `GSM_FRAME`                 |
//! |      8 | `seq`      | u64  | the frame's number on this connection and direction         |
//!
//! The body, by kind:
//!
//! | kind          | count | body                                                                |
//! |---------------|-------|---------------------------------------------------------------------|
//! | 1 Requests    | ≥ 1   | op table `n: u8` (≤ 16), `n × op: u64`; then `count` requests       |
//! | 2 Answers     | ≥ 1   | `count` answers                                                     |
//! | 3 Chunk       | 1     | `of: u8` (0 request argument, 1 answer), `id: u64`, `offset: u32`, then the chunk's bytes to the body's end |
//! | 4 Heartbeat   | 0     | empty                                                               |
//! | 5 Control     | 0     | opaque bytes (postcard, from the layer above)                       |
//!
//! A request is 22 bytes and its argument:
//!
//! | field        | type | meaning                                                              |
//! |--------------|------|----------------------------------------------------------------------|
//! | `id`         | u64  | names the request in its lane; a late answer carries it              |
//! | `op_index`   | u8   | index into this frame's op table                                     |
//! | `flags`      | u8   | bit 1 large; other bits (bit 0 included) are an error               |
//! | `slot`       | u32  | export slot of the property; `u32::MAX`: none (constructor, spawn)   |
//! | `generation` | u32  | the slot's generation (0 when there is no property)                  |
//! | `len`        | u32  | argument length; then `len` bytes, unless large                      |
//!
//! An answer is 14 bytes and its value:
//!
//! | field    | type | meaning                                                                  |
//! |----------|------|--------------------------------------------------------------------------|
//! | `id`     | u64  | the request it answers (in the other direction's lane)                   |
//! | `status` | u8   | 0 ok, 1 panicked (bytes: the message), 2 refused (bytes: why)            |
//! | `flags`  | u8   | bit 1 large; other bits are an error                                     |
//! | `len`    | u32  | value length; then `len` bytes, unless large                             |
//!
//! A *large* request or answer carries no bytes in its frame: `len` is the value's total length
//! (at most `GSM_MAX_MESSAGE`) and the bytes follow in chunk frames naming the same id, so a big
//! argument never holds up the small calls queued behind it.
//!
//! `seq` numbers the frames of kinds 1–3 and 5 per connection and direction (a lane and the
//! answers that go with it): 1, 2, 3, … in the order they are written. A heartbeat, which the
//! watchdog writes between frames, is outside the sequence and carries 0. The decoder returns
//! `seq` without judging it; the receiving link checks it with a [`Sequence`], and a gap or a
//! repeat is a bad frame. The sequence is what exactly-once calls will build on.
//!
//! # What the decoder checks, and what it leaves to the layer above
//!
//! The decoder rejects every frame whose bytes are inconsistent: unknown kinds, flags, statuses;
//! lengths and counts that exceed the limits or run past the body; op indexes outside the table;
//! trailing bytes. A body longer than the frame limit is an error as soon as the header is
//! complete, and every count is checked against the bytes it needs before anything is allocated
//! for it. What the bytes *mean* is checked above: whether an op is a real function descriptor of
//! the right type, whether an export slot and generation are live, whether an id is known, whether
//! chunks add up to their large value.
//!
//! The op table is the seed's vtable cache: a frame usually carries many calls of one or two
//! functions, so each request names its function by a one-byte index.

use std::fmt;

/// Bytes in a frame header.
pub(crate) const HEADER: usize = 16;
/// Fixed bytes of one request (everything but its argument).
const REQUEST_FIXED: usize = 22;
/// Fixed bytes of one answer (everything but its value).
const ANSWER_FIXED: usize = 14;
/// Fixed bytes of a chunk body (everything but the chunk's bytes).
const CHUNK_FIXED: usize = 13;
/// Entries an op table holds at most.
const MAX_OPS: usize = 16;
/// The slot of a request that targets no property.
const NO_SLOT: u32 = u32::MAX;
/// Request and answer flag: the value comes in chunk frames.
const LARGE: u8 = 0x02;
/// `body_len` is a u32, and header plus body must fit in a `usize`.
const MAX_BODY: usize = u32::MAX as usize - HEADER;
/// Request bytes in the smallest possible requests body besides the argument: the table's
/// length byte, one op, one request.
const ONE_REQUEST: usize = 1 + 8 + REQUEST_FIXED;

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
    fn body(&self) -> usize {
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
    fn from_byte(byte: u8) -> Option<Kind> {
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
    fn item(self) -> &'static str {
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
    /// The function descriptor's offset from the anchor, resolved through the op table.
    pub(crate) op: u64,
    /// The property's export slot and generation; `None` for constructors and spawns.
    pub(crate) target: Option<(u32, u32)>,
    /// The argument.
    pub(crate) arg: Payload<'a>,
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
}

impl Status {
    fn from_byte(byte: u8) -> Option<Status> {
        Some(match byte {
            0 => Status::Ok,
            1 => Status::Panicked,
            2 => Status::Refused,
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

/// The receiving end of one direction of a connection's frame numbers: frames of kinds 1–3
/// and 5 must arrive numbered 1, 2, 3, …, and heartbeats numbered 0 (module docs).
#[derive(Debug, Default)]
pub(crate) struct Sequence {
    /// The number of the last sequenced frame received; 0 before the first.
    last: u64,
}

/// A frame out of its place in the sequence: the peer skipped or repeated a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SequenceError {
    /// A frame numbered past the next one: frames went missing.
    Gap { seq: u64, expected: u64 },
    /// A frame numbered at or below the last one: a frame came again (or out of order).
    Repeat { seq: u64, expected: u64 },
    /// A heartbeat that carries a number.
    NumberedHeartbeat(u64),
}

impl Sequence {
    /// Takes the next frame's number, or says why it is not the next.
    pub(crate) fn check(&mut self, frame: &Frame<'_>) -> Result<(), SequenceError> {
        let seq = match *frame {
            Frame::Heartbeat { seq: 0 } => return Ok(()),
            Frame::Heartbeat { seq } => return Err(SequenceError::NumberedHeartbeat(seq)),
            Frame::Requests { seq, .. }
            | Frame::Answers { seq, .. }
            | Frame::Chunk { seq, .. }
            | Frame::Control { seq, .. } => seq,
        };
        let expected = self.last.wrapping_add(1);
        if seq == expected {
            self.last = seq;
            Ok(())
        } else if seq > expected {
            Err(SequenceError::Gap { seq, expected })
        } else {
            Err(SequenceError::Repeat { seq, expected })
        }
    }
}

impl fmt::Display for SequenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            SequenceError::Gap { seq, expected } => {
                write!(
                    f,
                    "frame numbered {seq}, expected {expected}: a gap in the sequence"
                )
            }
            SequenceError::Repeat { seq, expected } => write!(
                f,
                "frame numbered {seq}, expected {expected}: a repeat in the sequence"
            ),
            SequenceError::NumberedHeartbeat(seq) => {
                write!(
                    f,
                    "heartbeat numbered {seq}, expected 0 (outside the sequence)"
                )
            }
        }
    }
}

impl std::error::Error for SequenceError {}

// ---------------------------------------------------------------------------------------------
// Decoding

/// Reads fields off the front of a byte slice; running out is [`FrameError::PastEnd`].
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { rest: bytes }
    }

    fn left(&self) -> usize {
        self.rest.len()
    }

    fn take(&mut self, len: usize, part: Part) -> Result<&'a [u8], FrameError> {
        match self.rest.split_at_checked(len) {
            Some((head, tail)) => {
                self.rest = tail;
                Ok(head)
            }
            None => Err(FrameError::PastEnd {
                part,
                len,
                left: self.rest.len(),
            }),
        }
    }

    fn array<const N: usize>(&mut self, part: Part) -> Result<[u8; N], FrameError> {
        match self.rest.split_first_chunk::<N>() {
            Some((head, tail)) => {
                self.rest = tail;
                Ok(*head)
            }
            None => Err(FrameError::PastEnd {
                part,
                len: N,
                left: self.rest.len(),
            }),
        }
    }

    fn u8(&mut self, part: Part) -> Result<u8, FrameError> {
        self.array::<1>(part).map(|[byte]| byte)
    }

    fn u32(&mut self, part: Part) -> Result<u32, FrameError> {
        self.array(part).map(u32::from_le_bytes)
    }

    fn u64(&mut self, part: Part) -> Result<u64, FrameError> {
        self.array(part).map(u64::from_le_bytes)
    }
}

/// A checked header.
struct Header {
    kind: Kind,
    count: u16,
    body_len: usize,
    seq: u64,
}

/// Checks everything the header alone decides, so that an impossible frame fails before its
/// body arrives (a peer announcing 4 GiB is cut off at once, not read).
fn header(bytes: &[u8; HEADER], limits: &Limits) -> Result<Header, FrameError> {
    let [kind_byte, flags, c0, c1, l0, l1, l2, l3, seq @ ..] = *bytes;
    let count = u16::from_le_bytes([c0, c1]);
    let len = u32::from_le_bytes([l0, l1, l2, l3]);
    let seq = u64::from_le_bytes(seq);

    let kind = Kind::from_byte(kind_byte).ok_or(FrameError::UnknownKind(kind_byte))?;
    if flags != 0 {
        return Err(FrameError::HeaderFlags(flags));
    }
    let body_len = len as usize;
    if body_len > limits.body() {
        return Err(FrameError::BodyTooLong {
            len,
            limit: limits.body(),
        });
    }
    let count_ok = match kind {
        Kind::Requests | Kind::Answers => count >= 1,
        Kind::Chunk => count == 1,
        Kind::Heartbeat | Kind::Control => count == 0,
    };
    if !count_ok {
        return Err(FrameError::WrongCount { kind, count });
    }
    // The least body the count needs; counted items have fixed-size headers.
    let needs = match kind {
        Kind::Requests => 1 + 8 + usize::from(count) * REQUEST_FIXED,
        Kind::Answers => usize::from(count) * ANSWER_FIXED,
        Kind::Chunk => CHUNK_FIXED,
        Kind::Heartbeat | Kind::Control => 0,
    };
    if needs > body_len {
        return Err(match kind {
            Kind::Chunk => FrameError::PastEnd {
                part: Part::ChunkHeader,
                len: CHUNK_FIXED,
                left: body_len,
            },
            _ => FrameError::CountPastBody {
                kind,
                count,
                needs,
                len,
            },
        });
    }
    if kind == Kind::Heartbeat && body_len != 0 {
        return Err(FrameError::HeartbeatBody(len));
    }
    Ok(Header {
        kind,
        count,
        body_len,
        seq,
    })
}

/// Decodes the frame at the start of `buf`.
///
/// `Ok(None)`: `buf` holds no complete frame yet (read more). `Ok(Some((frame, consumed)))`: the
/// frame and how many bytes of `buf` it took. An error means the peer sent a bad frame; the
/// connection cannot continue, since frame boundaries can no longer be trusted.
pub(crate) fn decode<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Option<(Frame<'a>, usize)>, FrameError> {
    let Some(head) = buf.first_chunk::<HEADER>() else {
        return Ok(None);
    };
    let Header {
        kind,
        count,
        body_len,
        seq,
    } = header(head, limits)?;
    // body_len <= MAX_BODY, so this cannot overflow.
    let end = HEADER + body_len;
    let Some(body) = buf.get(HEADER..end) else {
        return Ok(None);
    };
    let frame = match kind {
        Kind::Requests => Frame::Requests {
            seq,
            requests: requests(body, count, limits)?,
        },
        Kind::Answers => Frame::Answers {
            seq,
            answers: answers(body, count, limits)?,
        },
        Kind::Chunk => chunk(body, seq, limits)?,
        Kind::Heartbeat => Frame::Heartbeat { seq },
        Kind::Control => Frame::Control { seq, body },
    };
    Ok(Some((frame, end)))
}

/// A large value's total, checked against `GSM_MAX_MESSAGE`.
fn large(total: u32, limits: &Limits) -> Result<Payload<'static>, FrameError> {
    if total as usize > limits.max_message {
        return Err(FrameError::LargeTooLarge {
            total,
            limit: limits.max_message,
        });
    }
    Ok(Payload::Large { total })
}

fn requests<'a>(
    body: &'a [u8],
    count: u16,
    limits: &Limits,
) -> Result<Vec<Request<'a>>, FrameError> {
    let mut r = Reader::new(body);
    let n = r.u8(Part::OpTable)?;
    if usize::from(n) > MAX_OPS {
        return Err(FrameError::OpTableTooLong(n));
    }
    let mut table = Reader::new(r.take(usize::from(n) * 8, Part::OpTable)?);
    let mut ops = [0u64; MAX_OPS];
    for op in ops.iter_mut().take(usize::from(n)) {
        *op = table.u64(Part::OpTable)?;
    }

    let needs = usize::from(count) * REQUEST_FIXED;
    if needs > r.left() {
        return Err(FrameError::CountPastTable {
            count,
            needs,
            left: r.left(),
        });
    }
    let mut requests = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let mut fixed = Reader::new(r.take(REQUEST_FIXED, Part::RequestHeader)?);
        let id = fixed.u64(Part::RequestHeader)?;
        let op_index = fixed.u8(Part::RequestHeader)?;
        let flags = fixed.u8(Part::RequestHeader)?;
        let slot = fixed.u32(Part::RequestHeader)?;
        let generation = fixed.u32(Part::RequestHeader)?;
        let len = fixed.u32(Part::RequestHeader)?;

        if flags & !LARGE != 0 {
            return Err(FrameError::RequestFlags(flags));
        }
        let op = *ops[..usize::from(n)]
            .get(usize::from(op_index))
            .ok_or(FrameError::OpIndex {
                index: op_index,
                table: n,
            })?;
        let target = if slot == NO_SLOT {
            if generation != 0 {
                return Err(FrameError::GenerationWithoutSlot(generation));
            }
            None
        } else {
            Some((slot, generation))
        };
        let arg = if flags & LARGE != 0 {
            large(len, limits)?
        } else {
            Payload::Inline(r.take(len as usize, Part::Argument)?)
        };
        requests.push(Request {
            id,
            op,
            target,
            arg,
        });
    }
    if r.left() != 0 {
        return Err(FrameError::Trailing {
            bytes: r.left(),
            after: Kind::Requests,
        });
    }
    Ok(requests)
}

fn answers<'a>(body: &'a [u8], count: u16, limits: &Limits) -> Result<Vec<Answer<'a>>, FrameError> {
    let mut r = Reader::new(body);
    // The header check guarantees count × ANSWER_FIXED <= body_len, bounding this allocation.
    let mut answers = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let mut fixed = Reader::new(r.take(ANSWER_FIXED, Part::AnswerHeader)?);
        let id = fixed.u64(Part::AnswerHeader)?;
        let status_byte = fixed.u8(Part::AnswerHeader)?;
        let flags = fixed.u8(Part::AnswerHeader)?;
        let len = fixed.u32(Part::AnswerHeader)?;

        let status =
            Status::from_byte(status_byte).ok_or(FrameError::UnknownStatus(status_byte))?;
        if flags & !LARGE != 0 {
            return Err(FrameError::AnswerFlags(flags));
        }
        let value = if flags & LARGE != 0 {
            large(len, limits)?
        } else {
            Payload::Inline(r.take(len as usize, Part::Value)?)
        };
        answers.push(Answer { id, status, value });
    }
    if r.left() != 0 {
        return Err(FrameError::Trailing {
            bytes: r.left(),
            after: Kind::Answers,
        });
    }
    Ok(answers)
}

fn chunk<'a>(body: &'a [u8], seq: u64, limits: &Limits) -> Result<Frame<'a>, FrameError> {
    let mut r = Reader::new(body);
    let of = match r.u8(Part::ChunkHeader)? {
        0 => ChunkOf::Argument,
        1 => ChunkOf::Answer,
        other => return Err(FrameError::ChunkOf(other)),
    };
    let id = r.u64(Part::ChunkHeader)?;
    let offset = r.u32(Part::ChunkHeader)?;
    let bytes = r.rest;
    let end = u64::from(offset) + bytes.len() as u64;
    if end > limits.max_message as u64 {
        return Err(FrameError::ChunkPastMessage {
            end,
            limit: limits.max_message,
        });
    }
    Ok(Frame::Chunk {
        seq,
        of,
        id,
        offset,
        bytes,
    })
}

// ---------------------------------------------------------------------------------------------
// Encoding

fn put_header(out: &mut Vec<u8>, kind: Kind, count: u16, body_len: u32, seq: u64) {
    out.push(kind as u8);
    out.push(0);
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&body_len.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
}

/// Whether a value of `len` bytes fits inline in an otherwise empty requests or answers frame.
/// If not, it goes as a large value in chunks ([`chunk_capacity`] bytes each).
pub(crate) fn fits_inline(len: usize, limits: &Limits) -> bool {
    // A request costs more than an answer (op table, target), so this holds for both.
    limits
        .body()
        .checked_sub(ONE_REQUEST)
        .is_some_and(|room| len <= room)
}

/// The most bytes one chunk frame carries.
pub(crate) fn chunk_capacity(limits: &Limits) -> usize {
    limits.body().saturating_sub(CHUNK_FIXED)
}

/// Where a frame under construction starts in the caller's buffer, and how full it is.
#[derive(Debug)]
struct Open {
    /// Offset of the header in the buffer.
    start: usize,
    /// The body limit.
    body_limit: usize,
    /// `GSM_MAX_MESSAGE`, for checking large totals.
    // large values: not sent yet
    max_message: usize,
    count: u16,
}

impl Open {
    fn begin(out: &mut Vec<u8>, kind: Kind, seq: u64, limits: &Limits) -> Self {
        let start = out.len();
        put_header(out, kind, 0, 0, seq);
        Open {
            start,
            body_limit: limits.body(),
            max_message: limits.max_message,
            count: 0,
        }
    }

    fn body_len(&self, out: &[u8]) -> usize {
        debug_assert!(
            out.len() >= self.start + HEADER,
            "the buffer was cut while a frame was open"
        );
        out.len().saturating_sub(self.start + HEADER)
    }

    /// Whether `more` body bytes and one more item fit.
    fn room(&self, out: &[u8], more: usize) -> Result<(), Full> {
        if self.count == u16::MAX || self.body_len(out).saturating_add(more) > self.body_limit {
            return Err(Full);
        }
        Ok(())
    }

    /// Patches count and length into the header, or removes the header of an empty frame.
    fn finish(self, out: &mut Vec<u8>) {
        if self.count == 0 {
            out.truncate(self.start);
            return;
        }
        // body_len <= body_limit <= MAX_BODY, so it fits a u32.
        let body_len = u32::try_from(self.body_len(out)).unwrap_or(u32::MAX);
        if let Some(field) = out.get_mut(self.start + 2..self.start + 8) {
            field[..2].copy_from_slice(&self.count.to_le_bytes());
            field[2..].copy_from_slice(&body_len.to_le_bytes());
        }
    }
}

/// Builds one requests frame at the end of a caller's buffer.
///
/// Between [`begin`](Self::begin) and [`finish`](Self::finish) nothing else may append to the
/// buffer. `push` answers [`Full`] (leaving the buffer as it was) when the item would exceed the
/// frame limit, a 17th op or the u16 count: finish this frame and begin another. An argument
/// for which [`fits_inline`] is false never fits: send it with `push_large` and chunks.
#[must_use = "a frame is only complete after `finish`"]
#[derive(Debug)]
pub(crate) struct RequestsWriter {
    open: Open,
    ops: [u64; MAX_OPS],
    n_ops: u8,
}

impl RequestsWriter {
    /// Starts a requests frame numbered `seq` at the end of `out`.
    pub(crate) fn begin(out: &mut Vec<u8>, seq: u64, limits: &Limits) -> Self {
        let open = Open::begin(out, Kind::Requests, seq, limits);
        out.push(0); // the op table's length
        RequestsWriter {
            open,
            ops: [0; MAX_OPS],
            n_ops: 0,
        }
    }

    /// Adds a request carrying its argument. `target` is the property's (export slot,
    /// generation); slot `u32::MAX` is reserved for `None`.
    pub(crate) fn push(
        &mut self,
        out: &mut Vec<u8>,
        id: u64,
        op: u64,
        target: Option<(u32, u32)>,
        arg: &[u8],
    ) -> Result<(), Full> {
        self.push_item(out, id, op, target, 0, arg.len(), arg)
    }

    /// Adds a request whose argument of `total` bytes (at most `GSM_MAX_MESSAGE`) follows in
    /// chunk frames.
    pub(crate) fn push_large(
        &mut self,
        out: &mut Vec<u8>,
        id: u64,
        op: u64,
        target: Option<(u32, u32)>,
        total: u32,
    ) -> Result<(), Full> {
        debug_assert!(
            total as usize <= self.open.max_message,
            "large argument of {total} bytes > GSM_MAX_MESSAGE: the caller refuses it first"
        );
        self.push_item(out, id, op, target, LARGE, total as usize, &[])
    }

    #[allow(clippy::too_many_arguments)]
    fn push_item(
        &mut self,
        out: &mut Vec<u8>,
        id: u64,
        op: u64,
        target: Option<(u32, u32)>,
        flags: u8,
        len: usize,
        inline: &[u8],
    ) -> Result<(), Full> {
        debug_assert!(
            !matches!(target, Some((NO_SLOT, _))),
            "export slot u32::MAX is reserved for requests without a property"
        );
        let known = self.ops[..usize::from(self.n_ops)]
            .iter()
            .position(|&o| o == op);
        let table_growth = match known {
            Some(_) => 0,
            None if usize::from(self.n_ops) == MAX_OPS => return Err(Full),
            None => 8,
        };
        self.open.room(
            out,
            (table_growth + REQUEST_FIXED).saturating_add(inline.len()),
        )?;
        // Fits in the body, so within u32 (inline); large totals are u32 by type.
        let len = u32::try_from(len).map_err(|_| Full)?;

        let index = match known {
            Some(index) => index,
            None => {
                // Open a gap for the op at the table's end; the requests already written move
                // up by 8 bytes (at most 16 times per frame, usually once before any request).
                let n_at = self.open.start + HEADER;
                let at = n_at + 1 + 8 * usize::from(self.n_ops);
                let old_len = out.len();
                out.extend_from_slice(&[0; 8]);
                out.copy_within(at..old_len, at + 8);
                out[at..at + 8].copy_from_slice(&op.to_le_bytes());
                self.ops[usize::from(self.n_ops)] = op;
                self.n_ops += 1;
                out[n_at] = self.n_ops;
                usize::from(self.n_ops - 1)
            }
        };
        let (slot, generation) = target.unwrap_or((NO_SLOT, 0));
        out.extend_from_slice(&id.to_le_bytes());
        out.push(index as u8); // < MAX_OPS
        out.push(flags);
        out.extend_from_slice(&slot.to_le_bytes());
        out.extend_from_slice(&generation.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(inline);
        self.open.count += 1;
        Ok(())
    }

    /// Completes the frame; a frame with no requests is removed (nothing is written).
    pub(crate) fn finish(self, out: &mut Vec<u8>) {
        self.open.finish(out);
    }
}

/// Builds one answers frame at the end of a caller's buffer; used like [`RequestsWriter`].
#[must_use = "a frame is only complete after `finish`"]
#[derive(Debug)]
pub(crate) struct AnswersWriter {
    open: Open,
}

impl AnswersWriter {
    /// Starts an answers frame numbered `seq` at the end of `out`.
    pub(crate) fn begin(out: &mut Vec<u8>, seq: u64, limits: &Limits) -> Self {
        AnswersWriter {
            open: Open::begin(out, Kind::Answers, seq, limits),
        }
    }

    /// Adds an answer carrying its value.
    pub(crate) fn push(
        &mut self,
        out: &mut Vec<u8>,
        id: u64,
        status: Status,
        value: &[u8],
    ) -> Result<(), Full> {
        self.push_item(out, id, status, 0, value.len(), value)
    }

    /// Adds an answer whose value of `total` bytes (at most `GSM_MAX_MESSAGE`) follows in chunk
    /// frames.
    pub(crate) fn push_large(
        &mut self,
        out: &mut Vec<u8>,
        id: u64,
        status: Status,
        total: u32,
    ) -> Result<(), Full> {
        debug_assert!(
            total as usize <= self.open.max_message,
            "large answer of {total} bytes > GSM_MAX_MESSAGE: the caller refuses it first"
        );
        self.push_item(out, id, status, LARGE, total as usize, &[])
    }

    fn push_item(
        &mut self,
        out: &mut Vec<u8>,
        id: u64,
        status: Status,
        flags: u8,
        len: usize,
        inline: &[u8],
    ) -> Result<(), Full> {
        self.open
            .room(out, ANSWER_FIXED.saturating_add(inline.len()))?;
        let len = u32::try_from(len).map_err(|_| Full)?;
        out.extend_from_slice(&id.to_le_bytes());
        out.push(status as u8);
        out.push(flags);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(inline);
        self.open.count += 1;
        Ok(())
    }

    /// Completes the frame; a frame with no answers is removed (nothing is written).
    pub(crate) fn finish(self, out: &mut Vec<u8>) {
        self.open.finish(out);
    }
}

/// Appends a chunk of the large value (`of`, `id`) starting at byte `offset` of that value.
/// [`Full`] when `bytes` is longer than [`chunk_capacity`].
pub(crate) fn encode_chunk(
    out: &mut Vec<u8>,
    seq: u64,
    of: ChunkOf,
    id: u64,
    offset: u32,
    bytes: &[u8],
    limits: &Limits,
) -> Result<(), Full> {
    if bytes.len() > chunk_capacity(limits) {
        return Err(Full);
    }
    debug_assert!(
        u64::from(offset) + bytes.len() as u64 <= limits.max_message as u64,
        "a chunk past GSM_MAX_MESSAGE belongs to no large value"
    );
    // <= body limit <= MAX_BODY
    let body_len = (CHUNK_FIXED + bytes.len()) as u32;
    put_header(out, Kind::Chunk, 1, body_len, seq);
    out.push(of as u8);
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(bytes);
    Ok(())
}

/// Appends a heartbeat; `seq` is 0, since heartbeats are outside the sequence (module docs).
pub(crate) fn encode_heartbeat(out: &mut Vec<u8>, seq: u64) {
    put_header(out, Kind::Heartbeat, 0, 0, seq);
}

/// Appends a control frame; [`Full`] when `body` exceeds the frame limit.
pub(crate) fn encode_control(
    out: &mut Vec<u8>,
    seq: u64,
    body: &[u8],
    limits: &Limits,
) -> Result<(), Full> {
    if body.len() > limits.body() {
        return Err(Full);
    }
    // <= body limit <= MAX_BODY
    put_header(out, Kind::Control, 0, body.len() as u32, seq);
    out.extend_from_slice(body);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The oracle shared by the fuzz target and the mutation test

/// Appends `frame` as the encoders write it. A decoded frame always fits the limits it was
/// decoded under: re-encoding only shrinks its op table.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn encode_frame(
    frame: &Frame<'_>,
    out: &mut Vec<u8>,
    limits: &Limits,
) -> Result<(), Full> {
    let start = out.len();
    let written = match frame {
        Frame::Requests { seq, requests } => {
            let mut w = RequestsWriter::begin(out, *seq, limits);
            let pushed = requests.iter().try_for_each(|r| match r.arg {
                Payload::Inline(arg) => w.push(out, r.id, r.op, r.target, arg),
                Payload::Large { total } => w.push_large(out, r.id, r.op, r.target, total),
            });
            w.finish(out);
            pushed
        }
        Frame::Answers { seq, answers } => {
            let mut w = AnswersWriter::begin(out, *seq, limits);
            let pushed = answers.iter().try_for_each(|a| match a.value {
                Payload::Inline(value) => w.push(out, a.id, a.status, value),
                Payload::Large { total } => w.push_large(out, a.id, a.status, total),
            });
            w.finish(out);
            pushed
        }
        Frame::Chunk {
            seq,
            of,
            id,
            offset,
            bytes,
        } => encode_chunk(out, *seq, *of, *id, *offset, bytes, limits),
        Frame::Heartbeat { seq } => {
            encode_heartbeat(out, *seq);
            Ok(())
        }
        Frame::Control { seq, body } => encode_control(out, *seq, body, limits),
    };
    if written.is_err() {
        out.truncate(start);
    }
    written
}

/// Decodes `data` as a stream of frames and checks each one the decoder accepts: a strict prefix
/// of it asks for more bytes, and re-encoded it decodes to the same value and re-encodes to the
/// same bytes. Panics when one of these fails. Returns how many frames were accepted and the
/// error that stopped the stream, if any.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn check_frames(data: &[u8], limits: &Limits) -> (usize, Option<FrameError>) {
    let mut rest = data;
    let mut frames = 0;
    let mut first = Vec::new();
    let mut second = Vec::new();
    loop {
        let (frame, used) = match decode(rest, limits) {
            Ok(Some(decoded)) => decoded,
            Ok(None) => return (frames, None),
            Err(error) => return (frames, Some(error)),
        };
        assert!(
            (HEADER..=rest.len()).contains(&used),
            "consumed {used} of {} bytes",
            rest.len()
        );
        assert_eq!(
            decode(&rest[..used - 1], limits),
            Ok(None),
            "a strict prefix of an accepted frame is not incomplete"
        );

        first.clear();
        encode_frame(&frame, &mut first, limits).expect("a decoded frame re-encodes");
        let again = decode(&first, limits);
        assert_eq!(
            again,
            Ok(Some((frame.clone(), first.len()))),
            "re-encoded frame decodes differently"
        );
        if let Ok(Some((again, _))) = again {
            second.clear();
            encode_frame(&again, &mut second, limits).expect("a decoded frame re-encodes");
            assert_eq!(first, second, "encoding is not canonical");
        }
        frames += 1;
        rest = &rest[used..];
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};
    use std::mem::{Discriminant, discriminant};

    /// Small limits, so that mutations reach them easily.
    const SMALL: Limits = Limits {
        frame: 512,
        max_message: 4096,
    };

    /// Decodes `buf` as exactly one frame.
    fn one<'a>(buf: &'a [u8], limits: &Limits) -> Frame<'a> {
        match decode(buf, limits) {
            Ok(Some((frame, used))) => {
                assert_eq!(used, buf.len(), "the frame does not fill its buffer");
                frame
            }
            other => panic!("expected one frame, got {other:?}"),
        }
    }

    /// A frame from raw parts, for the frames the encoders never write.
    fn raw(kind: u8, flags: u8, count: u16, body_len: u32, body: &[u8]) -> Vec<u8> {
        let mut out = vec![kind, flags];
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&body_len.to_le_bytes());
        out.extend_from_slice(&77u64.to_le_bytes());
        out.extend_from_slice(body);
        out
    }

    /// A frame whose `body_len` is its body's length.
    fn framed(kind: u8, count: u16, body: &[u8]) -> Vec<u8> {
        raw(kind, 0, count, body.len() as u32, body)
    }

    fn raw_request(op_index: u8, flags: u8, slot: u32, generation: u32, len: u32) -> Vec<u8> {
        let mut out = 5u64.to_le_bytes().to_vec();
        out.extend_from_slice(&[op_index, flags]);
        out.extend_from_slice(&slot.to_le_bytes());
        out.extend_from_slice(&generation.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out
    }

    fn raw_answer(status: u8, flags: u8, len: u32) -> Vec<u8> {
        let mut out = 5u64.to_le_bytes().to_vec();
        out.extend_from_slice(&[status, flags]);
        out.extend_from_slice(&len.to_le_bytes());
        out
    }

    /// An op table followed by `rest`.
    fn table(ops: &[u64], rest: &[u8]) -> Vec<u8> {
        let mut out = vec![ops.len() as u8];
        for op in ops {
            out.extend_from_slice(&op.to_le_bytes());
        }
        out.extend_from_slice(rest);
        out
    }

    /// One frame of every kind, back to back in `out`, with each frame's end and value.
    fn samples(out: &mut Vec<u8>, limits: &Limits) -> Vec<(usize, Frame<'static>)> {
        let mut expected = Vec::new();

        let mut w = RequestsWriter::begin(out, 7, limits);
        w.push(out, 1, 0xAAAA, Some((3, 9)), b"arg one").unwrap();
        w.push(out, 2, 0xBBBB, None, b"").unwrap();
        w.push_large(out, 3, 0xAAAA, Some((0, 0)), 2000).unwrap();
        w.finish(out);
        expected.push((
            out.len(),
            Frame::Requests {
                seq: 7,
                requests: vec![
                    Request {
                        id: 1,
                        op: 0xAAAA,
                        target: Some((3, 9)),
                        arg: Payload::Inline(b"arg one"),
                    },
                    Request {
                        id: 2,
                        op: 0xBBBB,
                        target: None,
                        arg: Payload::Inline(b""),
                    },
                    Request {
                        id: 3,
                        op: 0xAAAA,
                        target: Some((0, 0)),
                        arg: Payload::Large { total: 2000 },
                    },
                ],
            },
        ));

        let mut w = AnswersWriter::begin(out, 8, limits);
        w.push(out, 1, Status::Ok, b"result").unwrap();
        w.push(out, 9, Status::Panicked, b"boom").unwrap();
        w.push(out, 4, Status::Refused, b"stale export").unwrap();
        w.push_large(out, 3, Status::Ok, 3000).unwrap();
        w.finish(out);
        expected.push((
            out.len(),
            Frame::Answers {
                seq: 8,
                answers: vec![
                    Answer {
                        id: 1,
                        status: Status::Ok,
                        value: Payload::Inline(b"result"),
                    },
                    Answer {
                        id: 9,
                        status: Status::Panicked,
                        value: Payload::Inline(b"boom"),
                    },
                    Answer {
                        id: 4,
                        status: Status::Refused,
                        value: Payload::Inline(b"stale export"),
                    },
                    Answer {
                        id: 3,
                        status: Status::Ok,
                        value: Payload::Large { total: 3000 },
                    },
                ],
            },
        ));

        encode_chunk(out, 9, ChunkOf::Argument, 3, 0, b"first part", limits).unwrap();
        expected.push((
            out.len(),
            Frame::Chunk {
                seq: 9,
                of: ChunkOf::Argument,
                id: 3,
                offset: 0,
                bytes: b"first part",
            },
        ));
        encode_chunk(out, 10, ChunkOf::Answer, 3, 1000, b"", limits).unwrap();
        expected.push((
            out.len(),
            Frame::Chunk {
                seq: 10,
                of: ChunkOf::Answer,
                id: 3,
                offset: 1000,
                bytes: b"",
            },
        ));
        encode_heartbeat(out, 10);
        expected.push((out.len(), Frame::Heartbeat { seq: 10 }));
        encode_control(out, u64::MAX, b"\x01release", limits).unwrap();
        expected.push((
            out.len(),
            Frame::Control {
                seq: u64::MAX,
                body: b"\x01release",
            },
        ));
        encode_control(out, 0, b"", limits).unwrap();
        expected.push((out.len(), Frame::Control { seq: 0, body: b"" }));
        expected
    }

    #[test]
    fn the_sequence_takes_frames_in_order_and_refuses_gaps_and_repeats() {
        let control = |seq| Frame::Control { seq, body: b"" };
        let heartbeat = |seq| Frame::Heartbeat { seq };
        let mut s = Sequence::default();
        for seq in 1..=3 {
            assert_eq!(s.check(&control(seq)), Ok(()), "frame {seq} in order");
            assert_eq!(s.check(&heartbeat(0)), Ok(()), "heartbeats between frames");
        }
        let requests = Frame::Requests {
            seq: 4,
            requests: Vec::new(),
        };
        assert_eq!(s.check(&requests), Ok(()), "every sequenced kind counts");
        let gap = SequenceError::Gap {
            seq: 6,
            expected: 5,
        };
        assert_eq!(s.check(&control(6)), Err(gap));
        let repeat = SequenceError::Repeat {
            seq: 4,
            expected: 5,
        };
        assert_eq!(s.check(&control(4)), Err(repeat));
        assert_eq!(
            s.check(&control(0)),
            Err(SequenceError::Repeat {
                seq: 0,
                expected: 5
            })
        );
        assert_eq!(
            s.check(&heartbeat(5)),
            Err(SequenceError::NumberedHeartbeat(5))
        );
        assert_eq!(s.check(&control(5)), Ok(()), "refusals do not advance it");
        assert!(gap.to_string().contains("a gap"), "{gap}");
        assert!(repeat.to_string().contains("a repeat"), "{repeat}");
        let mut fresh = Sequence::default();
        assert!(matches!(
            fresh.check(&control(2)),
            Err(SequenceError::Gap {
                seq: 2,
                expected: 1
            })
        ));
    }

    #[test]
    fn every_kind_round_trips() {
        let limits = Limits::default();
        let mut out = Vec::new();
        let mut start = 0;
        for (end, frame) in samples(&mut out, &limits) {
            assert_eq!(one(&out[start..end], &limits), frame);
            let mut again = Vec::new();
            encode_frame(&frame, &mut again, &limits).unwrap();
            assert_eq!(again, out[start..end], "re-encoding {frame:?}");
            start = end;
        }
    }

    #[test]
    fn frames_back_to_back_decode_in_order() {
        let mut out = b"leftover from an earlier write".to_vec();
        let skip = out.len();
        let expected = samples(&mut out, &SMALL);
        let mut at = skip;
        for (end, frame) in &expected {
            let (decoded, used) = decode(&out[at..], &SMALL).unwrap().unwrap();
            assert_eq!(&decoded, frame);
            assert_eq!(at + used, *end);
            at = *end;
        }
        assert_eq!(at, out.len());
        assert_eq!(decode(&out[at..], &SMALL), Ok(None));
        assert_eq!(check_frames(&out[skip..], &SMALL), (expected.len(), None));
    }

    #[test]
    fn every_split_point_asks_for_more() {
        let mut out = Vec::new();
        let expected = samples(&mut out, &SMALL);
        for split in 0..=out.len() {
            // A reader that has received `split` bytes decodes the frames that ended before
            // it, then waits.
            let mut at = 0;
            let mut decoded = 0;
            while let Some((frame, used)) = decode(&out[at..split], &SMALL).unwrap() {
                assert_eq!(frame, expected[decoded].1);
                at += used;
                decoded += 1;
            }
            let complete = expected.iter().filter(|(end, _)| *end <= split).count();
            assert_eq!(decoded, complete, "split at {split}");
        }
    }

    #[test]
    fn the_same_op_takes_one_table_entry() {
        let mut out = Vec::new();
        let mut w = RequestsWriter::begin(&mut out, 1, &SMALL);
        for (id, op) in [(1, 40), (2, 50), (3, 40), (4, 40), (5, 50)] {
            w.push(&mut out, id, op, Some((1, 1)), b"xy").unwrap();
        }
        w.finish(&mut out);
        assert_eq!(out[HEADER], 2, "op table length");
        assert_eq!(out.len(), HEADER + 1 + 2 * 8 + 5 * (REQUEST_FIXED + 2));
        let Frame::Requests { requests, .. } = one(&out, &SMALL) else {
            panic!("not a requests frame");
        };
        let ops: Vec<u64> = requests.iter().map(|r| r.op).collect();
        assert_eq!(ops, [40, 50, 40, 40, 50]);
    }

    #[test]
    fn a_writer_with_nothing_writes_nothing() {
        let mut out = b"earlier frames".to_vec();
        RequestsWriter::begin(&mut out, 1, &SMALL).finish(&mut out);
        AnswersWriter::begin(&mut out, 1, &SMALL).finish(&mut out);
        assert_eq!(out, b"earlier frames");
    }

    #[test]
    fn requests_are_full_at_the_frame_limit() {
        let limits = Limits {
            frame: 100,
            max_message: 4096,
        };
        let fits = 100 - ONE_REQUEST;
        assert!(fits_inline(fits, &limits));
        assert!(!fits_inline(fits + 1, &limits));

        let mut out = Vec::new();
        let mut w = RequestsWriter::begin(&mut out, 1, &limits);
        let before = out.clone();
        assert_eq!(w.push(&mut out, 1, 7, None, &[0; 70]), Err(Full));
        assert_eq!(out, before, "a refused push leaves the buffer as it was");
        w.push(&mut out, 1, 7, None, &[0; 69]).unwrap();
        let before = out.clone();
        assert_eq!(w.push(&mut out, 2, 7, None, b""), Err(Full));
        assert_eq!(w.push_large(&mut out, 2, 7, None, 5), Err(Full));
        assert_eq!(out, before);
        w.finish(&mut out);
        assert_eq!(out.len(), HEADER + 100);
        assert!(
            matches!(one(&out, &limits), Frame::Requests { requests, .. } if requests.len() == 1)
        );
    }

    #[test]
    fn requests_are_full_at_the_seventeenth_op() {
        let mut out = Vec::new();
        let mut w = RequestsWriter::begin(&mut out, 1, &Limits::default());
        for op in 0..16 {
            w.push(&mut out, op, op * 1000, None, &[op as u8]).unwrap();
        }
        let before = out.clone();
        assert_eq!(w.push(&mut out, 16, 16_000, None, b""), Err(Full));
        assert_eq!(w.push_large(&mut out, 16, 16_000, None, 9), Err(Full));
        assert_eq!(out, before);
        // A known op still fits.
        w.push(&mut out, 17, 5000, None, b"again").unwrap();
        w.finish(&mut out);
        let Frame::Requests { requests, .. } = one(&out, &Limits::default()) else {
            panic!("not a requests frame");
        };
        assert_eq!(requests.len(), 17);
        for (i, r) in requests.iter().take(16).enumerate() {
            assert_eq!(
                (r.id, r.op, r.arg),
                (i as u64, i as u64 * 1000, Payload::Inline(&[i as u8][..]))
            );
        }
        assert_eq!(
            (requests[16].op, requests[16].arg),
            (5000, Payload::Inline(&b"again"[..]))
        );
    }

    #[test]
    fn writers_are_full_at_the_largest_count() {
        let limits = Limits {
            frame: 2 << 20,
            max_message: 1 << 20,
        };
        let mut out = Vec::new();
        let mut w = RequestsWriter::begin(&mut out, 1, &limits);
        for id in 0..u64::from(u16::MAX) {
            w.push(&mut out, id, 3, Some((1, 2)), b"").unwrap();
        }
        assert_eq!(w.push(&mut out, 0, 3, None, b""), Err(Full));
        w.finish(&mut out);
        let Frame::Requests { requests, .. } = one(&out, &limits) else {
            panic!("not a requests frame");
        };
        assert_eq!(requests.len(), usize::from(u16::MAX));

        out.clear();
        let mut w = AnswersWriter::begin(&mut out, 1, &limits);
        for id in 0..u64::from(u16::MAX) {
            w.push(&mut out, id, Status::Ok, b"").unwrap();
        }
        assert_eq!(w.push_large(&mut out, 0, Status::Ok, 1), Err(Full));
        w.finish(&mut out);
        let Frame::Answers { answers, .. } = one(&out, &limits) else {
            panic!("not an answers frame");
        };
        assert_eq!(answers.len(), usize::from(u16::MAX));
    }

    #[test]
    fn answers_chunks_and_control_are_full_at_the_frame_limit() {
        let limits = Limits {
            frame: 100,
            max_message: 4096,
        };
        let mut out = Vec::new();
        let mut w = AnswersWriter::begin(&mut out, 1, &limits);
        assert_eq!(w.push(&mut out, 1, Status::Ok, &[1; 87]), Err(Full));
        w.push(&mut out, 1, Status::Ok, &[1; 86]).unwrap();
        assert_eq!(w.push(&mut out, 2, Status::Refused, b""), Err(Full));
        w.finish(&mut out);
        assert_eq!(out.len(), HEADER + 100);
        one(&out, &limits);

        out.clear();
        assert_eq!(chunk_capacity(&limits), 87);
        assert_eq!(
            encode_chunk(&mut out, 1, ChunkOf::Answer, 1, 0, &[2; 88], &limits),
            Err(Full)
        );
        assert!(out.is_empty());
        encode_chunk(&mut out, 1, ChunkOf::Answer, 1, 0, &[2; 87], &limits).unwrap();
        assert_eq!(out.len(), HEADER + 100);
        one(&out, &limits);

        out.clear();
        assert_eq!(encode_control(&mut out, 1, &[3; 101], &limits), Err(Full));
        assert!(out.is_empty());
        encode_control(&mut out, 1, &[3; 100], &limits).unwrap();
        one(&out, &limits);
    }

    #[test]
    fn limits_too_small_for_any_item_refuse_every_push() {
        let limits = Limits {
            frame: 10,
            max_message: 100,
        };
        assert!(!fits_inline(0, &limits));
        assert_eq!(chunk_capacity(&limits), 0);
        let mut out = Vec::new();
        let mut w = RequestsWriter::begin(&mut out, 1, &limits);
        assert_eq!(w.push(&mut out, 1, 1, None, b""), Err(Full));
        w.finish(&mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn each_bad_frame_is_an_error_that_names_it() {
        let d = Limits::default();
        let req = |rest: &[u8]| table(&[10, 20], rest);
        let one_request = |r: Vec<u8>| framed(1, 1, &req(&r));
        let one_answer = |a: Vec<u8>| framed(2, 1, &a);
        let mut arg = raw_request(0, 0, 1, 1, 1000);
        arg.extend_from_slice(&[0; 12]);
        let mut two = raw_request(0, 0, 1, 1, 20);
        two.extend_from_slice(&[0; 32]);
        let mut value = raw_answer(0, 0, 50);
        value.extend_from_slice(&[0; 20]);
        let mut answer_short = raw_answer(0, 0, 6);
        answer_short.extend_from_slice(&[0; 6 + 10]);
        let mut trailing = raw_request(1, 0, 1, 1, 2);
        trailing.extend_from_slice(b"ab...");
        let mut chunk = vec![1];
        chunk.extend_from_slice(&3u64.to_le_bytes());
        chunk.extend_from_slice(&4090u32.to_le_bytes());
        chunk.extend_from_slice(&[0; 10]);

        use FrameError as E;
        #[rustfmt::skip]
        let cases: Vec<(Vec<u8>, &Limits, FrameError, &str)> = vec![
            (raw(9, 0, 0, 0, b""), &d, E::UnknownKind(9),
                "unknown frame kind 9"),
            (raw(4, 0x80, 0, 0, b""), &d, E::HeaderFlags(0x80),
                "unknown frame flags 0x80 (reserved, must be 0)"),
            // The header alone decides these: the body has not arrived.
            (raw(1, 0, 1, 70000, b""), &d, E::BodyTooLong { len: 70000, limit: 65536 },
                "body length 70000 > frame limit 65536"),
            (raw(1, 0, 700, 64, b""), &d,
                E::CountPastBody { kind: Kind::Requests, count: 700, needs: 15409, len: 64 },
                "count 700 > length 64: 700 requests need at least 15409 bytes"),
            (raw(2, 0, 5, 64, b""), &d,
                E::CountPastBody { kind: Kind::Answers, count: 5, needs: 70, len: 64 },
                "count 5 > length 64: 5 answers need at least 70 bytes"),
            (raw(3, 0, 1, 5, b""), &d, E::PastEnd { part: Part::ChunkHeader, len: 13, left: 5 },
                "chunk header of 13 bytes runs past the frame end (5 bytes left)"),
            (raw(4, 0, 3, 0, b""), &d, E::WrongCount { kind: Kind::Heartbeat, count: 3 },
                "heartbeat frame with count 3, expected 0"),
            (raw(4, 0, 0, 5, b""), &d, E::HeartbeatBody(5),
                "heartbeat frame with a body of 5 bytes, expected none"),
            (raw(5, 0, 1, 0, b""), &d, E::WrongCount { kind: Kind::Control, count: 1 },
                "control frame with count 1, expected 0"),
            (raw(3, 0, 2, 13, b""), &d, E::WrongCount { kind: Kind::Chunk, count: 2 },
                "chunk frame with count 2, expected 1"),
            (raw(1, 0, 0, 0, b""), &d, E::WrongCount { kind: Kind::Requests, count: 0 },
                "requests frame with count 0, expected at least 1"),
            (raw(2, 0, 0, 0, b""), &d, E::WrongCount { kind: Kind::Answers, count: 0 },
                "answers frame with count 0, expected at least 1"),
            // The body's errors.
            (framed(1, 1, &table(&[0; 17], &[0; 22])), &d, E::OpTableTooLong(17),
                "op table of 17 entries > 16"),
            (framed(1, 1, &[&[16][..], &[0; 39]].concat()), &d,
                E::PastEnd { part: Part::OpTable, len: 128, left: 39 },
                "op table of 128 bytes runs past the frame end (39 bytes left)"),
            (framed(1, 1, &table(&[1, 2, 3], &[0; 15])), &d,
                E::CountPastTable { count: 1, needs: 22, left: 15 },
                "count 1 > length 15 after the op table: 1 requests need at least 22 bytes"),
            (one_request(arg), &d, E::PastEnd { part: Part::Argument, len: 1000, left: 12 },
                "argument of 1000 bytes runs past the frame end (12 bytes left)"),
            (framed(1, 2, &req(&two)), &d,
                E::PastEnd { part: Part::RequestHeader, len: 22, left: 12 },
                "request header of 22 bytes runs past the frame end (12 bytes left)"),
            (one_request(raw_request(0, 0x84, 1, 1, 0)), &d, E::RequestFlags(0x84),
                "unknown request flags 0x84"),
            // Bit 0 once meant "answer wanted"; every request is answered now.
            (one_request(raw_request(0, 0x01, 1, 1, 0)), &d, E::RequestFlags(0x01),
                "unknown request flags 0x01"),
            (one_request(raw_request(5, 0, 1, 1, 0)), &d, E::OpIndex { index: 5, table: 2 },
                "op index 5 outside a table of 2"),
            (one_request(raw_request(0, 0, u32::MAX, 5, 0)), &d, E::GenerationWithoutSlot(5),
                "request without a property (slot u32::MAX) has generation 5, expected 0"),
            (one_request(raw_request(0, LARGE, 1, 1, 2_000_000_000)), &d,
                E::LargeTooLarge { total: 2_000_000_000, limit: 1 << 30 },
                "large value of 2000000000 bytes > GSM_MAX_MESSAGE 1073741824"),
            (one_request(trailing), &d, E::Trailing { bytes: 3, after: Kind::Requests },
                "3 trailing bytes after the last request"),
            (one_answer(raw_answer(7, 0, 0)), &d, E::UnknownStatus(7),
                "unknown status 7"),
            (one_answer(raw_answer(0, 0x01, 0)), &d, E::AnswerFlags(1),
                "unknown answer flags 0x01"),
            (one_answer(raw_answer(1, LARGE, 4097)), &SMALL,
                E::LargeTooLarge { total: 4097, limit: 4096 },
                "large value of 4097 bytes > GSM_MAX_MESSAGE 4096"),
            (one_answer(value), &d, E::PastEnd { part: Part::Value, len: 50, left: 20 },
                "answer value of 50 bytes runs past the frame end (20 bytes left)"),
            (framed(2, 2, &answer_short), &d,
                E::PastEnd { part: Part::AnswerHeader, len: 14, left: 10 },
                "answer header of 14 bytes runs past the frame end (10 bytes left)"),
            (framed(2, 1, &[raw_answer(0, 0, 0), vec![0; 2]].concat()), &d,
                E::Trailing { bytes: 2, after: Kind::Answers },
                "2 trailing bytes after the last answer"),
            (framed(3, 1, &[&[7][..], &[0; 12]].concat()), &d, E::ChunkOf(7),
                "unknown chunk target 7 (0 = request argument, 1 = answer)"),
            (framed(3, 1, &chunk), &SMALL, E::ChunkPastMessage { end: 4100, limit: 4096 },
                "chunk ends at byte 4100 > GSM_MAX_MESSAGE 4096"),
        ];
        let mut seen = HashSet::new();
        for (bytes, limits, error, message) in cases {
            assert_eq!(
                decode(&bytes, limits),
                Err(error.clone()),
                "decoding {bytes:?}"
            );
            assert_eq!(error.to_string(), message);
            // Bytes after the frame change nothing.
            let mut more = bytes.clone();
            more.extend_from_slice(&[0xff; 40]);
            assert_eq!(decode(&more, limits), Err(error.clone()));
            seen.insert(discriminant(&error));
        }
        assert_eq!(
            seen.len(),
            ERROR_KINDS,
            "a FrameError variant has no case here"
        );
    }

    /// How many variants `FrameError` has; the tests check that each one is reached.
    const ERROR_KINDS: usize = 18;

    use crate::splitmix::Rng;

    /// Appends one to three valid frames of random kinds and contents.
    fn random_frames(rng: &mut Rng, out: &mut Vec<u8>, limits: &Limits) {
        let ops: Vec<u64> = (0..20).map(|_| rng.next() >> rng.below(64)).collect();
        let mut seq = rng.next() >> 40;
        let mut bytes = Vec::new();
        for _ in 0..1 + rng.below(3) {
            seq += 1;
            bytes.clear();
            let len = rng.below(60);
            rng.fill(&mut bytes, len);
            let id = rng.next() >> rng.below(64);
            match rng.below(5) {
                0 => {
                    let mut w = RequestsWriter::begin(out, seq, limits);
                    for i in 0..1 + rng.below(12) {
                        // Mostly a few ops, sometimes more than a table holds.
                        let pool = if rng.chance(2) { 3 } else { ops.len() };
                        let op = ops[rng.below(pool)];
                        let target =
                            (!rng.chance(5)).then(|| (rng.below(1000) as u32, rng.next() as u32));
                        let arg = &bytes[..rng.below(bytes.len() + 1)];
                        let id = id.wrapping_add(i as u64);
                        let pushed = if rng.chance(6) {
                            let total = rng.below(limits.max_message + 1) as u32;
                            w.push_large(out, id, op, target, total)
                        } else {
                            w.push(out, id, op, target, arg)
                        };
                        if pushed.is_err() {
                            break;
                        }
                    }
                    w.finish(out);
                }
                1 => {
                    let mut w = AnswersWriter::begin(out, seq, limits);
                    for i in 0..1 + rng.below(12) {
                        let status = [Status::Ok, Status::Panicked, Status::Refused][rng.below(3)];
                        let id = id.wrapping_add(i as u64);
                        let value = &bytes[..rng.below(bytes.len() + 1)];
                        let pushed = if rng.chance(6) {
                            let total = rng.below(limits.max_message + 1) as u32;
                            w.push_large(out, id, status, total)
                        } else {
                            w.push(out, id, status, value)
                        };
                        if pushed.is_err() {
                            break;
                        }
                    }
                    w.finish(out);
                }
                2 => {
                    let of = if rng.chance(2) {
                        ChunkOf::Argument
                    } else {
                        ChunkOf::Answer
                    };
                    let offset = rng.below(limits.max_message - bytes.len() + 1) as u32;
                    encode_chunk(out, seq, of, id, offset, &bytes, limits).unwrap();
                }
                3 => encode_heartbeat(out, seq),
                _ => encode_control(out, seq, &bytes, limits).unwrap(),
            }
        }
    }

    /// A value worth writing into a length, count or other field of `width` bytes.
    fn extreme(rng: &mut Rng, width: usize, limits: &Limits) -> u64 {
        let max = if width == 8 {
            u64::MAX
        } else {
            (1u64 << (8 * width)) - 1
        };
        let candidates = [
            0,
            1,
            2,
            max,
            max - 1,
            max / 2 + 1,
            limits.frame as u64,
            limits.frame as u64 + 1,
            limits.max_message as u64,
            limits.max_message as u64 + 1,
            REQUEST_FIXED as u64,
            ANSWER_FIXED as u64,
            CHUNK_FIXED as u64,
            rng.below(64) as u64,
        ];
        candidates[rng.below(candidates.len())] & max
    }

    pub(crate) fn mutate(rng: &mut Rng, buf: &mut Vec<u8>, limits: &Limits) {
        let len = buf.len();
        match rng.below(9) {
            0 if len > 0 => buf[rng.below(len)] ^= 1 << rng.below(8),
            1 if len > 0 => buf[rng.below(len)] = rng.next() as u8,
            2 => buf.truncate(rng.below(len + 1)),
            3 => {
                let at = rng.below(len + 1);
                let mut extra = Vec::new();
                let n = 1 + rng.below(8);
                rng.fill(&mut extra, n);
                buf.splice(at..at, extra);
            }
            4 if len > 0 => {
                let from = rng.below(len);
                let to = from + 1 + rng.below((len - from).min(16));
                buf.drain(from..to);
            }
            5 => {
                // A header field (at the start or a random place) or any field set to an
                // extreme value.
                let (at, width) = match rng.below(3) {
                    0 => (2, 2),
                    1 => (4, 4),
                    _ => (rng.below(len + 1), [1, 2, 4, 8][rng.below(4)]),
                };
                let value = extreme(rng, width, limits).to_le_bytes();
                if at + width <= len {
                    buf[at..at + width].copy_from_slice(&value[..width]);
                }
            }
            6 => {
                // Random bytes, often behind a plausible header start.
                buf.clear();
                if rng.chance(2) {
                    buf.extend_from_slice(&[1 + rng.below(5) as u8, 0]);
                }
                let n = rng.below(80);
                rng.fill(buf, n);
            }
            7 if len > 0 => {
                // Copy a slice of the buffer elsewhere in it (a frame inside a frame).
                let from = rng.below(len);
                let slice = buf[from..(from + 1 + rng.below(32)).min(len)].to_vec();
                let at = rng.below(len + 1);
                buf.splice(at..at, slice);
            }
            8 if len > 0 => {
                let interesting = [0, 1, 2, 3, 4, 5, 6, 15, 16, 17, 0x7f, 0x80, 0xfe, 0xff];
                buf[rng.below(len)] = interesting[rng.below(interesting.len())];
            }
            _ => {}
        }
    }

    /// The seeded mutation test: a million damaged buffers, none of which may panic the decoder,
    /// and every frame it accepts must survive re-encoding. Every error variant must be reached,
    /// so the mutations demonstrably get past each check.
    #[test]
    fn mutated_frames_never_panic_and_accepted_ones_reencode() {
        const BUFFERS: usize = 1_000_000;
        let limits = SMALL;
        let mut rng = Rng(0x005e_ed0f_9055_a3e8);
        let mut bases = Vec::new();
        let mut out = Vec::new();
        samples(&mut out, &limits);
        bases.push(out);
        for _ in 0..300 {
            let mut out = Vec::new();
            random_frames(&mut rng, &mut out, &limits);
            assert!(
                check_frames(&out, &limits).1.is_none(),
                "a base buffer is invalid"
            );
            bases.push(out);
        }

        let mut errors: HashMap<Discriminant<FrameError>, FrameError> = HashMap::new();
        let (mut accepted, mut clean) = (0usize, 0usize);
        let mut buf = Vec::new();
        for _ in 0..BUFFERS {
            buf.clear();
            buf.extend_from_slice(&bases[rng.below(bases.len())]);
            for _ in 0..1 + rng.below(3) {
                mutate(&mut rng, &mut buf, &limits);
            }
            let (frames, error) = check_frames(&buf, &limits);
            accepted += frames;
            match error {
                Some(error) => {
                    assert!(!error.to_string().is_empty());
                    errors.entry(discriminant(&error)).or_insert(error);
                }
                None => clean += 1,
            }
        }
        let mut seen: Vec<String> = errors.values().map(|e| format!("{e:?}")).collect();
        seen.sort();
        assert_eq!(errors.len(), ERROR_KINDS, "errors reached: {seen:#?}");
        assert!(accepted > BUFFERS / 10, "only {accepted} frames accepted");
        assert!(
            clean > BUFFERS / 20,
            "only {clean} buffers without an error"
        );
    }
}
