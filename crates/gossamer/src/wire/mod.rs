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

#[cfg(any(test, feature = "fuzzing"))]
mod check;
mod decode;
mod encode;
mod sequence;

#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use check::check_frames;
#[cfg(test)]
pub(crate) use check::tests::mutate;
pub(crate) use decode::decode;
pub(crate) use encode::{
    AnswersWriter, RequestsWriter, chunk_capacity, encode_chunk, encode_control, encode_heartbeat,
    fits_inline,
};
pub(crate) use sequence::Sequence;

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

#[cfg(test)]
pub(crate) mod tests {
    use super::check::encode_frame;
    use super::*;

    /// Small limits, so that mutations reach them easily.
    pub(super) const SMALL: Limits = Limits {
        frame: 512,
        max_message: 4096,
    };

    /// Decodes `buf` as exactly one frame.
    pub(super) fn one<'a>(buf: &'a [u8], limits: &Limits) -> Frame<'a> {
        match decode(buf, limits) {
            Ok(Some((frame, used))) => {
                assert_eq!(used, buf.len(), "the frame does not fill its buffer");
                frame
            }
            other => panic!("expected one frame, got {other:?}"),
        }
    }

    /// A frame from raw parts, for the frames the encoders never write.
    pub(super) fn raw(kind: u8, flags: u8, count: u16, body_len: u32, body: &[u8]) -> Vec<u8> {
        let mut out = vec![kind, flags];
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&body_len.to_le_bytes());
        out.extend_from_slice(&77u64.to_le_bytes());
        out.extend_from_slice(body);
        out
    }

    /// A frame whose `body_len` is its body's length.
    pub(super) fn framed(kind: u8, count: u16, body: &[u8]) -> Vec<u8> {
        raw(kind, 0, count, body.len() as u32, body)
    }

    pub(super) fn raw_request(
        op_index: u8,
        flags: u8,
        slot: u32,
        generation: u32,
        len: u32,
    ) -> Vec<u8> {
        let mut out = 5u64.to_le_bytes().to_vec();
        out.extend_from_slice(&[op_index, flags]);
        out.extend_from_slice(&slot.to_le_bytes());
        out.extend_from_slice(&generation.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out
    }

    pub(super) fn raw_answer(status: u8, flags: u8, len: u32) -> Vec<u8> {
        let mut out = 5u64.to_le_bytes().to_vec();
        out.extend_from_slice(&[status, flags]);
        out.extend_from_slice(&len.to_le_bytes());
        out
    }

    /// An op table followed by `rest`.
    pub(super) fn table(ops: &[u64], rest: &[u8]) -> Vec<u8> {
        let mut out = vec![ops.len() as u8];
        for op in ops {
            out.extend_from_slice(&op.to_le_bytes());
        }
        out.extend_from_slice(rest);
        out
    }

    /// One frame of every kind, back to back in `out`, with each frame's end and value.
    pub(super) fn samples(out: &mut Vec<u8>, limits: &Limits) -> Vec<(usize, Frame<'static>)> {
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

    /// How many variants `FrameError` has; the tests check that each one is reached.
    pub(super) const ERROR_KINDS: usize = 18;

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
}
