//! What a link stages for its writer: requests and answers packed into frames, control
//! messages, and the chunks of large values, numbered in the order they are written.

use std::collections::VecDeque;

use crate::wire::{self, AnswersWriter, ChunkOf, Code, RequestsWriter, Status};

/// Chunk frames a link writes per round at most, taking turns among its large values: a few
/// frames' worth per write, so the small frames staged in between go out soon.
const CHUNKS_PER_ROUND: usize = 4;

/// Staged bytes and the frame being filled.
pub(super) struct Outgoing {
    pub(super) buf: Vec<u8>,
    /// The other buffer: while the writer writes one, requests are staged into the other, and
    /// neither has to grow again round after round.
    spare: Vec<u8>,
    open: OpenWriter,
    /// The number of the last frame staged (frames are numbered from 1, see `wire`).
    seq: u64,
    limits: wire::Limits,
    /// Values too large for a frame, announced in a frame already staged, whose bytes go in
    /// chunk frames, a few per round.
    large: VecDeque<LargeOut>,
}

/// A large value being sent.
struct LargeOut {
    of: ChunkOf,
    id: u64,
    bytes: Vec<u8>,
    /// How many of `bytes` have gone out in chunks.
    sent: usize,
}

#[derive(Default)]
enum OpenWriter {
    #[default]
    None,
    Requests(RequestsWriter),
    Answers(AnswersWriter),
}

impl Outgoing {
    pub(super) fn new(limits: wire::Limits) -> Outgoing {
        Outgoing {
            buf: Vec::new(),
            spare: Vec::new(),
            open: OpenWriter::None,
            seq: 0,
            limits,
            large: VecDeque::new(),
        }
    }

    /// Finishes the frame being filled, if any.
    pub(super) fn close_frame(&mut self) {
        match std::mem::take(&mut self.open) {
            OpenWriter::None => {}
            OpenWriter::Requests(w) => w.finish(&mut self.buf),
            OpenWriter::Answers(w) => w.finish(&mut self.buf),
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Adds a request to the open Requests frame, opening one (after closing whatever else
    /// is open, or a full frame) as needed. An argument too large for a frame is announced
    /// there and follows in chunks. `credit` flags it as the last request of its bank in the
    /// window.
    pub(super) fn push_request(
        &mut self,
        id: u64,
        code: Code,
        target: Option<(u32, u32)>,
        arg: &[u8],
        credit: bool,
    ) {
        let large = !wire::fits_inline(arg.len(), &self.limits);
        for _ in 0..2 {
            if !matches!(self.open, OpenWriter::Requests(_)) {
                self.close_frame();
                let seq = self.next_seq();
                self.open =
                    OpenWriter::Requests(RequestsWriter::begin(&mut self.buf, seq, &self.limits));
            }
            let OpenWriter::Requests(writer) = &mut self.open else {
                unreachable!("opened above")
            };
            let pushed = if large {
                // `encode` refused values over GSM_MAX_MESSAGE, which is at most u32::MAX.
                let total = arg.len() as u32;
                writer.push_large(&mut self.buf, id, code, target, total)
            } else {
                writer.push(&mut self.buf, id, code, target, arg)
            };
            if pushed.is_ok() {
                if credit {
                    writer.ask_credit(&mut self.buf);
                }
                if large {
                    self.push_large(ChunkOf::Argument, id, arg.to_vec());
                }
                return;
            }
            self.close_frame();
        }
        unreachable!("a request fits an empty frame");
    }

    /// Adds an answer to the open Answers frame, as `push_request` does.
    pub(super) fn push_answer(&mut self, id: u64, status: Status, value: &[u8]) {
        let large = !wire::fits_inline(value.len(), &self.limits);
        for _ in 0..2 {
            if !matches!(self.open, OpenWriter::Answers(_)) {
                self.close_frame();
                let seq = self.next_seq();
                self.open =
                    OpenWriter::Answers(AnswersWriter::begin(&mut self.buf, seq, &self.limits));
            }
            let OpenWriter::Answers(writer) = &mut self.open else {
                unreachable!("opened above")
            };
            let pushed = if large {
                // Callers refuse values over GSM_MAX_MESSAGE, which is at most u32::MAX.
                writer.push_large(&mut self.buf, id, status, value.len() as u32)
            } else {
                writer.push(&mut self.buf, id, status, value)
            };
            if pushed.is_ok() {
                if large {
                    self.push_large(ChunkOf::Answer, id, value.to_vec());
                }
                return;
            }
            self.close_frame();
        }
        unreachable!("an answer fits an empty frame");
    }

    fn push_large(&mut self, of: ChunkOf, id: u64, bytes: Vec<u8>) {
        self.large.push_back(LargeOut {
            of,
            id,
            bytes,
            sent: 0,
        });
    }

    /// Appends up to [`CHUNKS_PER_ROUND`] chunk frames, one per large value in turn. Called
    /// after the frames that announce those values were closed, so chunks follow them.
    fn push_chunks(&mut self) {
        let capacity = wire::chunk_capacity(&self.limits);
        for _ in 0..CHUNKS_PER_ROUND {
            let Some(mut large) = self.large.pop_front() else {
                return;
            };
            let end = large.bytes.len().min(large.sent + capacity);
            let seq = self.next_seq();
            // offset < total <= u32::MAX; the chunk fits by `capacity`.
            wire::encode_chunk(
                &mut self.buf,
                seq,
                large.of,
                large.id,
                large.sent as u32,
                &large.bytes[large.sent..end],
                &self.limits,
            )
            .expect("a chunk of chunk_capacity bytes fits a frame");
            large.sent = end;
            if large.sent < large.bytes.len() {
                self.large.push_back(large);
            }
        }
    }

    pub(super) fn push_control(&mut self, body: &[u8]) {
        self.close_frame();
        let seq = self.next_seq();
        wire::encode_control(&mut self.buf, seq, body, &self.limits)
            .expect("control messages are small");
    }

    pub(super) fn is_empty(&self) -> bool {
        self.buf.is_empty() && matches!(self.open, OpenWriter::None) && self.large.is_empty()
    }

    /// Everything staged and the next chunks, ready to write; give the buffer back with
    /// [`Outgoing::recycle`] once written.
    pub(super) fn take(&mut self) -> Vec<u8> {
        self.close_frame();
        self.push_chunks();
        std::mem::replace(&mut self.buf, std::mem::take(&mut self.spare))
    }

    /// Keeps a written buffer's allocation for a later round, unless a burst (answers and
    /// delegated requests do not wait for room) grew it past what a link normally stages.
    pub(super) fn recycle(&mut self, mut written: Vec<u8>) {
        let usual = (super::BACKLOG_FRAMES + 1) * self.limits.frame;
        written.clear();
        if written.capacity() > self.spare.capacity() && written.capacity() <= usual {
            self.spare = written;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_buffers_are_reused_unless_a_burst_grew_them() {
        let mut out = Outgoing::new(wire::Limits {
            frame: 1024,
            max_message: 64 * 1024,
        });
        out.push_control(b"first");
        let first = out.take();
        assert!(!first.is_empty());
        let first_at = first.as_ptr();
        out.recycle(first);
        // The next round stages into another buffer; the one after that into the first again.
        out.push_control(b"second");
        let second = out.take();
        assert_ne!(second.as_ptr(), first_at);
        out.recycle(second);
        out.push_control(b"third");
        let third = out.take();
        assert_eq!(third.as_ptr(), first_at);
        assert!(third.ends_with(b"third"));
        out.recycle(third);
        // A buffer grown far past the backlog by a burst is freed, not kept.
        let burst = Vec::with_capacity(1 << 20);
        out.recycle(burst);
        assert!(out.spare.capacity() < 1 << 20);
    }
}
