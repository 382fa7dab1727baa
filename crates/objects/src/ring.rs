//! [`Ring`]: one writer, many readers, messages of any size (the seed's §5).

use std::fmt;

use gossamer::RegionError;
use serde::{Deserialize, Serialize};

use crate::error::{OpenError, SendError};
use crate::fabric::{Fabric, Rack};
use crate::msw::{to_bytes, to_words};
use crate::object::{Declare, Object, On, Parts, Regions};
use crate::var::SharedArray;
use crate::work::Work;

/// A ring's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingParams {
    /// The writer's index among the members; every other member reads.
    pub writer: usize,
    /// Words for messages (a message takes one for its length and one per 8 bytes).
    pub capacity: usize,
}

/// A broadcast ring: the writer sends messages of any size, every other member receives each
/// of them once, in order. Each node holds one copy of the messages (the writer puts them
/// into every reader's), and a reader returns their space by sending its position back.
///
/// Roles are types: opening gives the writer a [`RingWriter`] and every other member a
/// [`RingReader`] (`Send`, never `Clone`); nobody else can act on the ring.
///
/// How it keeps order (§5.2 of the seed): a message's words go to each reader before the
/// writer's position does, to the same node, so they land first; the writer waits for its
/// previous position's broadcast before bumping it, and never writes over space a reader
/// has not returned, however slow that reader is. A failed [`try_recv`](RingReader::try_recv)
/// does not promise that the message was not sent yet, only that it had not landed (the
/// seed's weaker alternative of §5.1): fence, or pass a barrier, to make a send land.
///
/// A ring needs two members, so this runs on two or more nodes (`gsm run -n 3`; the tests
/// run `examples/ring.rs`, which is this with more messages):
///
/// ```no_run
/// use objects::{Ring, RingParams};
/// let code = gossamer::Rack::from_env().run(|| {
///     let members: Vec<_> = gossamer::nodes().collect();
///     objects::on_members(&members, |members| {
///         let params = RingParams { writer: 0, capacity: 64 };
///         match objects::open::<Ring>("doc-ring", &params, &members).unwrap() {
///             Ring::Writer(mut w) => {
///                 for i in 0..100u32 {
///                     w.send(&i.to_le_bytes()).unwrap(); // waits while the ring is full
///                 }
///             }
///             Ring::Reader(mut r) => {
///                 for i in 0..100u32 {
///                     assert_eq!(r.recv().unwrap(), i.to_le_bytes());
///                 }
///             }
///         }
///     });
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
#[derive(Debug)]
pub enum Ring<F: Fabric = Rack> {
    /// The writer's endpoint.
    Writer(RingWriter<F>),
    /// A reader's endpoint.
    Reader(RingReader<F>),
}

impl<F: Fabric> Object<F> for Ring<F> {
    type Params = RingParams;

    fn declare(d: &mut Declare, p: &RingParams) {
        let members = d.members();
        for m in 0..members {
            if m != p.writer {
                d.region(&format!("buf{m}"), p.capacity, On::Member(m));
            }
        }
        d.object::<F, SharedArray<F>>("head", &1);
        d.object::<F, SharedArray<F>>("tails", &members);
    }

    fn build(parts: Parts<F>, p: &RingParams) -> Result<Self, OpenError> {
        let members = parts.members().len();
        if p.writer >= members || members < 2 || p.capacity < 2 {
            return Err(OpenError::BadParams {
                why: format!(
                    "a ring needs a writer among its members and at least one reader, and 2 words: \
                     writer {} of {members} members, {} words",
                    p.writer, p.capacity
                ),
            });
        }
        let head = parts.object("head", &1)?;
        let tails = parts.object("tails", &members)?;
        let me = parts.me();
        Ok(if me == p.writer {
            Ring::Writer(RingWriter {
                bufs: (0..members)
                    .filter(|&m| m != p.writer)
                    .map(|m| (m, parts.region(&format!("buf{m}"))))
                    .collect(),
                head,
                tails,
                capacity: p.capacity as u64,
                position: 0,
            })
        } else {
            Ring::Reader(RingReader {
                buf: parts.region(&format!("buf{me}")),
                head,
                tails,
                writer: p.writer,
                capacity: p.capacity as u64,
                position: 0,
            })
        })
    }
}

impl<F: Fabric> Ring<F> {
    /// The writer's endpoint, if this member writes.
    pub fn writer(self) -> Option<RingWriter<F>> {
        match self {
            Ring::Writer(w) => Some(w),
            Ring::Reader(_) => None,
        }
    }

    /// The reader's endpoint, if this member reads.
    pub fn reader(self) -> Option<RingReader<F>> {
        match self {
            Ring::Reader(r) => Some(r),
            Ring::Writer(_) => None,
        }
    }
}

/// The writer of a [`Ring`].
pub struct RingWriter<F: Fabric = Rack> {
    /// Each reader's copy of the messages, by member index.
    bufs: Vec<(usize, Regions<F>)>,
    head: SharedArray<F>,
    /// The readers' positions as they sent them (word `m` is member `m`'s).
    tails: SharedArray<F>,
    capacity: u64,
    /// Words ever written.
    position: u64,
}

/// Words a message of `len` bytes takes.
fn words_for(len: usize) -> u64 {
    1 + len.div_ceil(8) as u64
}

impl<F: Fabric> RingWriter<F> {
    /// Sends `message` if the ring has room for it now.
    ///
    /// # Errors
    /// [`SendError::Full`] (try later: a reader has not returned the space yet),
    /// [`SendError::TooLarge`] for a message that never fits, or a region error of an earlier
    /// send.
    pub fn try_send(&mut self, message: &[u8]) -> Result<(), SendError> {
        let need = words_for(message.len());
        if need > self.capacity {
            return Err(SendError::TooLarge {
                needed: need as usize,
                capacity: self.capacity as usize,
            });
        }
        let oldest = self
            .bufs
            .iter()
            .map(|(m, _)| self.tails.load(*m))
            .min()
            .expect("a ring has a reader");
        if self.position + need - oldest > self.capacity {
            return Err(SendError::Full);
        }
        let mut words = Vec::with_capacity(need as usize);
        words.push(message.len() as u64);
        words.extend(to_words(message));
        let at = (self.position % self.capacity) as usize;
        let first = words.len().min(self.capacity as usize - at);
        let work = Work::new();
        for (m, buf) in &self.bufs {
            buf.put(*m, at, &words[..first], &work);
            if first < words.len() {
                buf.put(*m, 0, &words[first..], &work);
            }
        }
        self.position += need;
        self.head.store(0, self.position);
        self.head.broadcast(0, &work);
        // The position's broadcast must have read its word before the word changes again
        // (§5.2): with puts that read their source late, a reader could otherwise see a later
        // position before that message's words. Here puts read their words when issued, so
        // this wait costs nothing; it keeps the ring right on a fabric whose puts do not.
        work.wait()?;
        Ok(())
    }

    /// Sends `message`, waiting (only the fiber) while the ring is full.
    ///
    /// # Errors
    /// As [`try_send`](RingWriter::try_send), but never `Full`.
    pub fn send(&mut self, message: &[u8]) -> Result<(), SendError> {
        loop {
            match self.try_send(message) {
                Err(SendError::Full) => self.head.regions().fabric().relax(),
                done => return done,
            }
        }
    }

    /// Whether every reader has received every message sent so far (as its returned position
    /// says): the ring's acknowledgement.
    pub fn delivered(&self) -> bool {
        self.delivered_up_to(self.position)
    }

    /// How far the ring has been written: a position that [`delivered_up_to`] takes (words,
    /// counted from the ring's start).
    ///
    /// [`delivered_up_to`]: RingWriter::delivered_up_to
    pub fn sent(&self) -> u64 {
        self.position
    }

    /// Whether every reader has received every message sent before [`sent`] said `position`.
    ///
    /// [`sent`]: RingWriter::sent
    pub fn delivered_up_to(&self, position: u64) -> bool {
        self.bufs
            .iter()
            .all(|(m, _)| self.tails.load(*m) >= position)
    }

    /// Waits (only the fiber) until [`delivered`](RingWriter::delivered).
    pub fn wait_delivered(&self) {
        while !self.delivered() {
            self.head.regions().fabric().relax();
        }
    }

    /// Fences every node the ring's messages go to: sent messages have landed when it returns.
    ///
    /// # Errors
    /// A region operation failed.
    pub fn flush(&self) -> Result<(), RegionError> {
        let fabric = self.head.regions().fabric();
        let work = Work::new();
        for (m, buf) in &self.bufs {
            fabric.fence_in(fabric.node_of(buf.of(*m)), &work);
        }
        work.wait()
    }
}

impl<F: Fabric> fmt::Debug for RingWriter<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingWriter")
            .field("capacity", &self.capacity)
            .field("position", &self.position)
            .finish()
    }
}

/// A reader of a [`Ring`].
pub struct RingReader<F: Fabric = Rack> {
    buf: Regions<F>,
    head: SharedArray<F>,
    tails: SharedArray<F>,
    writer: usize,
    capacity: u64,
    /// Words ever read.
    position: u64,
}

impl<F: Fabric> RingReader<F> {
    /// The next message, if one has landed.
    ///
    /// # Errors
    /// The ring's words make no sense (a length past what was written: memory corrupted by
    /// another process), or returning space to the writer failed.
    pub fn try_recv(&mut self) -> Result<Option<Vec<u8>>, RegionError> {
        let head = self.head.load(0);
        if head == self.position {
            return Ok(None);
        }
        let at = |p: u64| (p % self.capacity) as usize;
        let len = self.buf.load(at(self.position));
        let need = usize::try_from(len)
            .ok()
            .map(words_for)
            .filter(|&n| n <= head.wrapping_sub(self.position) && n <= self.capacity);
        let Some(need) = need else {
            return Err(RegionError::Corrupt {
                why: format!(
                    "a ring message of {len} bytes at position {}, with {} words written",
                    self.position,
                    head.wrapping_sub(self.position)
                ),
            });
        };
        let words: Vec<u64> = (1..need)
            .map(|i| self.buf.load(at(self.position + i)))
            .collect();
        self.position += need;
        let me = self.tails.me();
        self.tails.store(me, self.position);
        let work = Work::new();
        self.tails.send_to(self.writer, me, &work);
        work.wait()?;
        Ok(Some(to_bytes(&words, len as usize)))
    }

    /// The next message, waiting (only the fiber) until one lands.
    ///
    /// # Errors
    /// As [`try_recv`](RingReader::try_recv).
    pub fn recv(&mut self) -> Result<Vec<u8>, RegionError> {
        loop {
            if let Some(m) = self.try_recv()? {
                return Ok(m);
            }
            self.head.regions().fabric().relax();
        }
    }
}

impl<F: Fabric> fmt::Debug for RingReader<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingReader")
            .field("capacity", &self.capacity)
            .field("position", &self.position)
            .finish()
    }
}
