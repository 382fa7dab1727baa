//! The decoder: one frame from the start of a buffer, every length, count and flag checked
//! before it is used.

use super::frame::*;

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

/// [`decode_with`] with lists of its own, for checks that decode a frame on its own.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn decode<'a>(
    buf: &'a [u8],
    limits: &Limits,
) -> Result<Option<(Frame<'a>, usize)>, FrameError> {
    decode_with(buf, limits, &mut Scratch::default())
}

/// The item lists of frames already handled, kept for the next ones: a reader that decodes
/// frame after frame allocates its lists once, not per frame (at one call at a time, a frame
/// is one request or one answer, so a list per frame was an allocation and a free per call).
#[derive(Default)]
pub(crate) struct Scratch {
    requests: Vec<Request<'static>>,
    answers: Vec<Answer<'static>>,
}

impl Scratch {
    /// Keeps the list of a handled frame (its items taken out or not) for the next.
    pub(crate) fn keep_requests(&mut self, requests: Vec<Request<'_>>) {
        self.requests = emptied(requests);
    }

    /// As [`Scratch::keep_requests`], for an answers frame.
    pub(crate) fn keep_answers(&mut self, answers: Vec<Answer<'_>>) {
        self.answers = emptied(answers);
    }
}

/// `items`' allocation, emptied, for items of another lifetime. Collecting an iterator over a
/// vector into a vector of a type of the same layout reuses its allocation (std's in-place
/// collection); were that ever not so, this would allocate anew, as decoding did before.
fn emptied<T, U>(mut items: Vec<T>) -> Vec<U> {
    items.clear();
    items.into_iter().map(|_| unreachable!("cleared")).collect()
}

/// Decodes the frame at the start of `buf`, filling the item list `scratch` keeps.
///
/// `Ok(None)`: `buf` holds no complete frame yet (read more). `Ok(Some((frame, consumed)))`: the
/// frame and how many bytes of `buf` it took; hand its list back to `scratch` once handled. An
/// error means the peer sent a bad frame; the connection cannot continue, since frame
/// boundaries can no longer be trusted.
pub(crate) fn decode_with<'a>(
    buf: &'a [u8],
    limits: &Limits,
    scratch: &mut Scratch,
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
            requests: requests(
                body,
                count,
                limits,
                emptied(std::mem::take(&mut scratch.requests)),
            )?,
        },
        Kind::Answers => Frame::Answers {
            seq,
            answers: answers(
                body,
                count,
                limits,
                emptied(std::mem::take(&mut scratch.answers)),
            )?,
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

/// The requests of a requests frame's body, into `requests` (empty).
fn requests<'a>(
    body: &'a [u8],
    count: u16,
    limits: &Limits,
    mut requests: Vec<Request<'a>>,
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
    requests.reserve(usize::from(count));
    for _ in 0..count {
        let mut fixed = Reader::new(r.take(REQUEST_FIXED, Part::RequestHeader)?);
        let id = fixed.u64(Part::RequestHeader)?;
        let op_index = fixed.u8(Part::RequestHeader)?;
        let flags = fixed.u8(Part::RequestHeader)?;
        let slot = fixed.u32(Part::RequestHeader)?;
        let generation = fixed.u32(Part::RequestHeader)?;
        let len = fixed.u32(Part::RequestHeader)?;

        if flags & !(LARGE | NAMED | CREDIT) != 0 {
            return Err(FrameError::RequestFlags(flags));
        }
        let entry =
            *ops[..usize::from(n)]
                .get(usize::from(op_index))
                .ok_or(FrameError::OpIndex {
                    index: op_index,
                    table: n,
                })?;
        let code = if flags & NAMED != 0 {
            Code::Name(u32::try_from(entry).map_err(|_| FrameError::NameIndex(entry))?)
        } else {
            Code::Op(entry)
        };
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
            code,
            target,
            arg,
            credit: flags & CREDIT != 0,
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

/// The answers of an answers frame's body, into `answers` (empty).
fn answers<'a>(
    body: &'a [u8],
    count: u16,
    limits: &Limits,
    mut answers: Vec<Answer<'a>>,
) -> Result<Vec<Answer<'a>>, FrameError> {
    let mut r = Reader::new(body);
    // The header check guarantees count × ANSWER_FIXED <= body_len, bounding this allocation.
    answers.reserve(usize::from(count));
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::mem::discriminant;

    use super::*;
    use crate::wire::check::check_frames;
    use crate::wire::tests::*;

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
            (framed(1, 1, &table(&[1 << 32], &raw_request(0, NAMED, 1, 1, 0))), &d,
                E::NameIndex(1 << 32), "named request with name index 4294967296 > u32::MAX"),
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
}
