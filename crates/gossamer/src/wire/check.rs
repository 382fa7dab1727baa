//! The oracle shared by the fuzz target and the seeded mutation test: re-encoding what the
//! decoder accepts, and checking that it decodes the same.

use super::decode::{Scratch, decode, decode_with};
use super::encode::{
    AnswersWriter, RequestsWriter, encode_chunk, encode_control, encode_heartbeat,
};
use super::frame::*;

/// Appends `frame` as the encoders write it. A decoded frame always fits the limits it was
/// decoded under: re-encoding only shrinks its op table.
pub(crate) fn encode_frame(
    frame: &Frame<'_>,
    out: &mut Vec<u8>,
    limits: &Limits,
) -> Result<(), Full> {
    let start = out.len();
    let written = match frame {
        Frame::Requests { seq, requests } => {
            let mut w = RequestsWriter::begin(out, *seq, limits);
            let pushed = requests.iter().try_for_each(|r| {
                match r.arg {
                    Payload::Inline(arg) => w.push(out, r.id, r.code, r.target, arg)?,
                    Payload::Large { total } => w.push_large(out, r.id, r.code, r.target, total)?,
                }
                if r.credit {
                    w.ask_credit(out);
                }
                Ok(())
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
pub(crate) fn check_frames(data: &[u8], limits: &Limits) -> (usize, Option<FrameError>) {
    let mut rest = data;
    let mut frames = 0;
    let mut first = Vec::new();
    let mut second = Vec::new();
    // The stream's requests are taken as this side's, its answers as the peer's to them: the
    // waiting table accepts exactly the answers a plain set of outstanding ids expects (any
    // order, each once), and refuses the rest.
    let mut waiting = super::Waiting::default();
    let mut outstanding = std::collections::HashSet::new();
    // The stream is decoded as a link's reader decodes it: with one scratch, whose lists each
    // frame hands back (the checks below decode with fresh ones, and must agree).
    let mut scratch = Scratch::default();
    loop {
        let (frame, used) = match decode_with(rest, limits, &mut scratch) {
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
        match &frame {
            Frame::Requests { requests, .. } => {
                for r in requests {
                    waiting.insert(r.id, ());
                    outstanding.insert(r.id);
                }
            }
            Frame::Answers { answers, .. } => {
                for a in answers {
                    let expected = outstanding.remove(&a.id);
                    assert_eq!(
                        waiting.answer(a.id).is_ok(),
                        expected,
                        "answer to request {}",
                        a.id
                    );
                }
            }
            _ => {}
        }
        match frame {
            Frame::Requests { requests, .. } => scratch.keep_requests(requests),
            Frame::Answers { answers, .. } => scratch.keep_answers(answers),
            _ => {}
        }
        frames += 1;
        rest = &rest[used..];
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;
    use std::mem::{Discriminant, discriminant};

    use super::*;
    use crate::splitmix::Rng;
    use crate::wire::tests::*;

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
                        // Some named: their entries are indices, within u32.
                        let op = if rng.chance(4) {
                            Code::Name(op as u32)
                        } else {
                            Code::Op(op)
                        };
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
                        if rng.chance(8) {
                            w.ask_credit(out);
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

    /// Requests 1–4, then their answers late and out of order (3, 1 | 4, 2), then an answer to
    /// 2 again: the waiting table takes each answer once, in any order, and refuses the repeat.
    /// Written to `fuzz/corpus/rack_frame/late-answers` as a seed when `WRITE_FUZZ_SEEDS` is set.
    #[test]
    fn late_answers_are_taken_once_in_any_order() {
        let limits = SMALL;
        let mut out = Vec::new();
        let mut w = RequestsWriter::begin(&mut out, 1, &limits);
        for id in 1..=4 {
            w.push(&mut out, id, Code::Op(0), Some((0, 0)), &[7])
                .unwrap();
        }
        w.finish(&mut out);
        for (seq, ids) in [(2, &[3, 1][..]), (3, &[4, 2][..])] {
            let mut w = AnswersWriter::begin(&mut out, seq, &limits);
            for &id in ids {
                w.push(&mut out, id, Status::Ok, &[0]).unwrap();
            }
            w.finish(&mut out);
        }
        assert_eq!(check_frames(&out, &limits), (3, None));
        if let Some(dir) = std::env::var_os("WRITE_FUZZ_SEEDS") {
            std::fs::write(std::path::Path::new(&dir).join("late-answers"), &out).unwrap();
        }
        let mut repeat = AnswersWriter::begin(&mut out, 4, &limits);
        repeat.push(&mut out, 2, Status::Ok, &[0]).unwrap();
        repeat.finish(&mut out);
        // The model agrees that the repeat is refused (the check would panic otherwise).
        assert_eq!(check_frames(&out, &limits), (4, None));
        let mut waiting = super::super::Waiting::default();
        waiting.insert(2, ());
        assert!(waiting.answer(2).is_ok());
        let refused = waiting.answer(2).unwrap_err();
        assert_eq!(refused, "answer to unknown request 2");
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
