//! The check of a connection's frame numbers, on the receiving side (see the module docs of
//! `wire`).

use std::fmt;

use super::frame::Frame;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
