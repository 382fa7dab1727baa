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
//! | `flags`      | u8   | bit 0 named, bit 1 large, bit 2 credit; other bits are an error      |
//! | `slot`       | u32  | export slot of the property; `u32::MAX`: none (constructor, spawn)   |
//! | `generation` | u32  | the slot's generation (0 when there is no property)                  |
//! | `len`        | u32  | argument length; then `len` bytes, unless large                      |
//!
//! An answer is 14 bytes and its value:
//!
//! | field    | type | meaning                                                                  |
//! |----------|------|--------------------------------------------------------------------------|
//! | `id`     | u64  | the request it answers (in the other direction's lane)                   |
//! | `status` | u8   | 0 ok, 1 panicked (bytes: the message), 2 refused (bytes: why), 3 unresolved (bytes: a named request's `NamedError`) |
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
//! functions, so each request names its function by a one-byte index. An entry is a
//! descriptor's offset in the sender's build (see `op`), or, for a request flagged *named*, the
//! index the sender gave a function's name on this connection (at most `u32::MAX`): the name
//! itself travels once, in a control message before the first request that uses it.

#[cfg(any(test, feature = "fuzzing"))]
mod check;
mod decode;
mod encode;
mod frame;
mod sequence;
mod waiting;

#[cfg(feature = "fuzzing")]
pub(crate) use check::check_frames;
#[cfg(test)]
pub(crate) use check::tests::mutate;
#[cfg(test)]
pub(crate) use decode::decode;
pub(crate) use decode::{Scratch, decode_with};
pub(crate) use encode::{
    AnswersWriter, RequestsWriter, chunk_capacity, encode_chunk, encode_control, encode_heartbeat,
    fits_inline,
};
pub(crate) use frame::{ChunkOf, Code, Frame, HEADER, Limits, Payload, Status};
pub(crate) use sequence::Sequence;
pub(crate) use waiting::Waiting;

#[cfg(test)]
pub(crate) mod tests {
    use super::check::encode_frame;
    use super::decode::decode;
    use super::encode::*;
    use super::frame::*;

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
        w.push(out, 1, Code::Op(0xAAAA), Some((3, 9)), b"arg one")
            .unwrap();
        w.push(out, 2, Code::Name(0xBBBB), None, b"").unwrap();
        w.ask_credit(out);
        w.push_large(out, 3, Code::Op(0xAAAA), Some((0, 0)), 2000)
            .unwrap();
        w.finish(out);
        expected.push((
            out.len(),
            Frame::Requests {
                seq: 7,
                requests: vec![
                    Request {
                        id: 1,
                        code: Code::Op(0xAAAA),
                        target: Some((3, 9)),
                        arg: Payload::Inline(b"arg one"),
                        credit: false,
                    },
                    Request {
                        id: 2,
                        code: Code::Name(0xBBBB),
                        target: None,
                        arg: Payload::Inline(b""),
                        credit: true,
                    },
                    Request {
                        id: 3,
                        code: Code::Op(0xAAAA),
                        target: Some((0, 0)),
                        arg: Payload::Large { total: 2000 },
                        credit: false,
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
    pub(super) const ERROR_KINDS: usize = 19;

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
