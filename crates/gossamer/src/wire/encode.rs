//! The encoders: frames appended to a write buffer, each writer filling one frame until it is
//! [`Full`].

use super::frame::*;

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
struct OpenFrame {
    /// Offset of the header in the buffer.
    start: usize,
    /// The body limit.
    body_limit: usize,
    /// `GSM_MAX_MESSAGE`, for checking large totals.
    // large values: not sent yet
    max_message: usize,
    count: u16,
}

impl OpenFrame {
    fn begin(out: &mut Vec<u8>, kind: Kind, seq: u64, limits: &Limits) -> Self {
        let start = out.len();
        put_header(out, kind, 0, 0, seq);
        OpenFrame {
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
    open: OpenFrame,
    ops: [u64; MAX_OPS],
    n_ops: u8,
    /// Where the fixed part of the request pushed last starts in the buffer.
    last: Option<usize>,
}

impl RequestsWriter {
    /// Starts a requests frame numbered `seq` at the end of `out`.
    pub(crate) fn begin(out: &mut Vec<u8>, seq: u64, limits: &Limits) -> Self {
        let open = OpenFrame::begin(out, Kind::Requests, seq, limits);
        out.push(0); // the op table's length
        RequestsWriter {
            open,
            ops: [0; MAX_OPS],
            n_ops: 0,
            last: None,
        }
    }

    /// Adds a request carrying its argument. `target` is the property's (export slot,
    /// generation); slot `u32::MAX` is reserved for `None`.
    #[inline]
    pub(crate) fn push(
        &mut self,
        out: &mut Vec<u8>,
        id: u64,
        code: Code,
        target: Option<(u32, u32)>,
        arg: &[u8],
    ) -> Result<(), Full> {
        self.push_item(out, id, code, target, 0, arg.len(), arg)
    }

    /// Adds a request whose argument of `total` bytes (at most `GSM_MAX_MESSAGE`) follows in
    /// chunk frames.
    pub(crate) fn push_large(
        &mut self,
        out: &mut Vec<u8>,
        id: u64,
        code: Code,
        target: Option<(u32, u32)>,
        total: u32,
    ) -> Result<(), Full> {
        debug_assert!(
            total as usize <= self.open.max_message,
            "large argument of {total} bytes > GSM_MAX_MESSAGE: the caller refuses it first"
        );
        self.push_item(out, id, code, target, LARGE, total as usize, &[])
    }

    // Always: left to the heuristics, it went out of line as callers were added elsewhere
    // in the crate, at 29 instructions a request (`bench instructions`, remote apply_then).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn push_item(
        &mut self,
        out: &mut Vec<u8>,
        id: u64,
        code: Code,
        target: Option<(u32, u32)>,
        flags: u8,
        len: usize,
        inline: &[u8],
    ) -> Result<(), Full> {
        let (op, named) = code.encode();
        let flags = flags | named;
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
                // The op goes at the table's end; requests already written move up by 8 bytes
                // (at most 16 times per frame; a frame's first op precedes its requests).
                let n_at = self.open.start + HEADER;
                let at = n_at + 1 + 8 * usize::from(self.n_ops);
                let old_len = out.len();
                out.extend_from_slice(&op.to_le_bytes());
                if old_len > at {
                    // Requests follow the table: move them up and put the op in the gap.
                    out.copy_within(at..old_len, at + 8);
                    out[at..at + 8].copy_from_slice(&op.to_le_bytes());
                }
                self.ops[usize::from(self.n_ops)] = op;
                self.n_ops += 1;
                out[n_at] = self.n_ops;
                usize::from(self.n_ops - 1)
            }
        };
        let (slot, generation) = target.unwrap_or((NO_SLOT, 0));
        // Assembled first and appended at once: one capacity check rather than six.
        let mut fixed = [0; REQUEST_FIXED];
        fixed[..8].copy_from_slice(&id.to_le_bytes());
        fixed[8] = index as u8; // < MAX_OPS
        fixed[9] = flags;
        fixed[10..14].copy_from_slice(&slot.to_le_bytes());
        fixed[14..18].copy_from_slice(&generation.to_le_bytes());
        fixed[18..].copy_from_slice(&len.to_le_bytes());
        out.reserve(REQUEST_FIXED + inline.len());
        self.last = Some(out.len());
        out.extend_from_slice(&fixed);
        out.extend_from_slice(inline);
        self.open.count += 1;
        Ok(())
    }

    /// Flags the request pushed last as the last of its bank: the receiver returns the bank's
    /// credit once it ran (see `link`). Call it right after that push.
    pub(crate) fn ask_credit(&mut self, out: &mut [u8]) {
        let at = self.last.expect("a request was pushed") + 9;
        out[at] |= CREDIT;
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
    open: OpenFrame,
}

impl AnswersWriter {
    /// Starts an answers frame numbered `seq` at the end of `out`.
    pub(crate) fn begin(out: &mut Vec<u8>, seq: u64, limits: &Limits) -> Self {
        AnswersWriter {
            open: OpenFrame::begin(out, Kind::Answers, seq, limits),
        }
    }

    /// Adds an answer carrying its value. (`#[inline]`, as the request's: its caller is in
    /// another module, which the compiler may place in another codegen unit.)
    #[inline]
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

    #[inline]
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
        let mut fixed = [0; ANSWER_FIXED];
        fixed[..8].copy_from_slice(&id.to_le_bytes());
        fixed[8] = status as u8;
        fixed[9] = flags;
        fixed[10..].copy_from_slice(&len.to_le_bytes());
        out.reserve(ANSWER_FIXED + inline.len());
        out.extend_from_slice(&fixed);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::*;

    #[test]
    fn the_same_op_takes_one_table_entry() {
        let mut out = Vec::new();
        let mut w = RequestsWriter::begin(&mut out, 1, &SMALL);
        for (id, op) in [(1, 40), (2, 50), (3, 40), (4, 40), (5, 50)] {
            w.push(&mut out, id, Code::Op(op), Some((1, 1)), b"xy")
                .unwrap();
        }
        w.finish(&mut out);
        assert_eq!(out[HEADER], 2, "op table length");
        assert_eq!(out.len(), HEADER + 1 + 2 * 8 + 5 * (REQUEST_FIXED + 2));
        let Frame::Requests { requests, .. } = one(&out, &SMALL) else {
            panic!("not a requests frame");
        };
        let ops: Vec<Code> = requests.iter().map(|r| r.code).collect();
        assert_eq!(ops, [40, 50, 40, 40, 50].map(Code::Op));
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
        let op = Code::Op(7);
        assert_eq!(w.push(&mut out, 1, op, None, &[0; 70]), Err(Full));
        assert_eq!(out, before, "a refused push leaves the buffer as it was");
        w.push(&mut out, 1, op, None, &[0; 69]).unwrap();
        let before = out.clone();
        assert_eq!(w.push(&mut out, 2, op, None, b""), Err(Full));
        assert_eq!(w.push_large(&mut out, 2, op, None, 5), Err(Full));
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
            w.push(&mut out, op, Code::Op(op * 1000), None, &[op as u8])
                .unwrap();
        }
        let before = out.clone();
        let new = Code::Name(16_000);
        assert_eq!(w.push(&mut out, 16, new, None, b""), Err(Full));
        assert_eq!(w.push_large(&mut out, 16, new, None, 9), Err(Full));
        assert_eq!(out, before);
        // A known op still fits, and a name whose index is a known entry too.
        w.push(&mut out, 17, Code::Op(5000), None, b"again")
            .unwrap();
        w.push(&mut out, 18, Code::Name(5000), None, b"named")
            .unwrap();
        w.finish(&mut out);
        let Frame::Requests { requests, .. } = one(&out, &Limits::default()) else {
            panic!("not a requests frame");
        };
        assert_eq!(requests.len(), 18);
        for (i, r) in requests.iter().take(16).enumerate() {
            assert_eq!(
                (r.id, r.code, r.arg),
                (
                    i as u64,
                    Code::Op(i as u64 * 1000),
                    Payload::Inline(&[i as u8][..])
                )
            );
        }
        assert_eq!(
            (requests[16].code, requests[16].arg),
            (Code::Op(5000), Payload::Inline(&b"again"[..]))
        );
        assert_eq!(
            (requests[17].code, requests[17].arg),
            (Code::Name(5000), Payload::Inline(&b"named"[..]))
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
            w.push(&mut out, id, Code::Op(3), Some((1, 2)), b"")
                .unwrap();
        }
        assert_eq!(w.push(&mut out, 0, Code::Op(3), None, b""), Err(Full));
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

    /// A reader's frames, decoded one after another with one scratch: each frame's items are
    /// its own, and the lists' allocations are reused rather than made per frame.
    #[test]
    fn frames_decoded_with_one_scratch_reuse_its_lists() {
        let limits = Limits::default();
        let mut scratch = crate::wire::Scratch::default();
        let (mut requests_at, mut answers_at) = (None, None);
        // Every frame's list is where the first frame's was.
        let same_list = |first: &mut Option<usize>, at: usize, what: &str| {
            assert_eq!(
                *first.get_or_insert(at),
                at,
                "the {what} list was not reused"
            );
        };
        // The first frame is the largest, so the list never needs to grow.
        for (round, count) in [(0u64, 3u64), (1, 1), (2, 2)] {
            let mut out = Vec::new();
            let mut w = RequestsWriter::begin(&mut out, 1, &limits);
            for id in 0..count {
                w.push(&mut out, 10 * round + id, Code::Op(7), None, &[id as u8])
                    .unwrap();
            }
            w.finish(&mut out);
            let mut w = AnswersWriter::begin(&mut out, 2, &limits);
            w.push(&mut out, round, Status::Ok, b"ok").unwrap();
            w.finish(&mut out);

            let (frame, used) = crate::wire::decode_with(&out, &limits, &mut scratch)
                .unwrap()
                .unwrap();
            let Frame::Requests { requests, .. } = frame else {
                panic!("not a requests frame");
            };
            let ids: Vec<u64> = requests.iter().map(|r| r.id).collect();
            assert_eq!(
                ids,
                (0..count).map(|id| 10 * round + id).collect::<Vec<_>>()
            );
            same_list(&mut requests_at, requests.as_ptr() as usize, "requests");
            scratch.keep_requests(requests);

            let (frame, _) = crate::wire::decode_with(&out[used..], &limits, &mut scratch)
                .unwrap()
                .unwrap();
            let Frame::Answers { answers, .. } = frame else {
                panic!("not an answers frame");
            };
            assert_eq!(answers.len(), 1);
            assert_eq!(answers[0].id, round);
            same_list(&mut answers_at, answers.as_ptr() as usize, "answers");
            scratch.keep_answers(answers);
        }
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
        assert_eq!(w.push(&mut out, 1, Code::Op(1), None, b""), Err(Full));
        w.finish(&mut out);
        assert!(out.is_empty());
    }
}
