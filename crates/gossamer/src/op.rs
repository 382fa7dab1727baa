//! Function identity across nodes: how a frame names the code a request runs.
//!
//! Every remote operation (applying a closure type `F` to a property of type `T`, building a
//! property of type `T` on a node) has one *descriptor*: a constant [`Op`] holding a magic
//! number, the operation's kind and a plain function pointer to its trampoline. A frame names
//! an operation by the descriptor's address minus the address of [`ANCHOR`], a static of this
//! crate. ASLR moves the whole executable image, so that offset is the same in every node
//! running the same build (which the handshake checks), and no node needs ASLR turned off.
//!
//! # The protocol that makes [`resolve`] sound
//! An offset read from the network is never trusted. Before the descriptor it names is read:
//! - the address must be aligned for [`Op`];
//! - the whole descriptor must lie inside one *read-only, non-executable* mapping of this
//!   process's executable file, as listed in `/proc/self/maps` when the rack starts
//!   (descriptors are promoted constants: they live in `.rodata` or, because they hold
//!   function pointers, in `.data.rel.ro`, which is read-only once relocation is done). Such
//!   mappings are never unmapped or written while the process runs, so reading there is
//!   neither a fault nor a data race. Executable mappings are left out: the code segment's last
//!   page also maps the file's first bytes of `.data.rel.ro`, where every descriptor appears
//!   a second time *unrelocated*, with null function pointers (the scan test found one);
//! - the descriptor must start with [`MAGIC`], 128 random bits that only descriptors contain.
//!   The check never compares against `MAGIC` itself, which the compiler would store as a
//!   16-byte constant of its own in the image, a copy that would pass: it compares each word
//!   XORed with a key the compiler cannot see through ([`is_magic`]). A test scans the whole
//!   image to confirm that every aligned copy of `MAGIC` is a descriptor.
//!
//! The two words are read with a plain machine load ([`load_words`]), not a Rust read: the
//! address may lie between Rust objects (in padding, or in a sanitizer's red zone around a
//! global), where the image is mapped and readable but no Rust object lives. Only once they
//! hold `MAGIC` is the address read as an `Op`, and its trampoline checks the rest: the
//! property's type (a failed downcast is an error answer, never a call) and the argument's
//! encoding.
//!
//! A trampoline answers through a [`Reply`]: the request's id and where its answer goes. The
//! lane layer above makes replies and hands this module the function that stages an answer
//! on a lane, so that operations and their answers name no lane.

use std::any::Any;
use std::fmt;
use std::sync::OnceLock;

use crate::codec::{self, Encoded};
use crate::export::{Life, Shared};
use crate::hash::ByNumber;
use crate::wire::Status;

/// The first field of every descriptor.
pub(crate) const MAGIC: [u64; 2] = [0x8f3a_61c2_57d0_e94b, 0x2c7e_b1a4_f068_3d95];

/// What [`is_magic`] XORs each word with before comparing.
const MAGIC_KEY: u64 = 0x5b1d_e2a7_39c4_0f86;

/// [`MAGIC`] XORed with [`MAGIC_KEY`], computed at compile time: what the image holds instead
/// of a copy of `MAGIC`.
const MAGIC_XORED: [u64; 2] = [MAGIC[0] ^ MAGIC_KEY, MAGIC[1] ^ MAGIC_KEY];

/// Whether two words are [`MAGIC`], compared without placing `MAGIC` in the image.
fn is_magic(words: [u64; 2]) -> bool {
    let key = std::hint::black_box(MAGIC_KEY);
    (words[0] ^ key) == MAGIC_XORED[0] && (words[1] ^ key) == MAGIC_XORED[1]
}

/// Reads the two words at `address` with one machine load each, outside Rust's memory model.
///
/// # Safety
/// `address..address + 16` must be readable: inside a mapping that stays mapped, and that no
/// one writes.
unsafe fn load_words(address: usize) -> [u64; 2] {
    let (a, b): (u64, u64);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller guarantees both words are readable; the asm only loads them.
    unsafe {
        std::arch::asm!(
            "mov {a}, qword ptr [{p}]",
            "mov {b}, qword ptr [{p} + 8]",
            p = in(reg) address,
            a = out(reg) a,
            b = out(reg) b,
            options(nostack, preserves_flags, readonly),
        );
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above.
    unsafe {
        std::arch::asm!(
            "ldp {a}, {b}, [{p}]",
            p = in(reg) address,
            a = out(reg) a,
            b = out(reg) b,
            options(nostack, preserves_flags, readonly),
        );
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    // SAFETY: the caller guarantees both words are readable and unwritten; on other targets a
    // volatile read stands in for the machine load.
    unsafe {
        a = std::ptr::read_volatile(address as *const u64);
        b = std::ptr::read_volatile((address + 8) as *const u64);
    }
    [a, b]
}

/// The fixed point that operation offsets are measured from.
static ANCHOR: u8 = 0;

/// A remote operation's descriptor. `#[repr(C)]` keeps `magic` first.
#[repr(C)]
pub(crate) struct Op {
    pub(crate) magic: [u64; 2],
    /// The closure's type name, for error messages.
    pub(crate) name: fn() -> &'static str,
    pub(crate) run: Run,
}

/// What an operation does, and its trampoline.
#[derive(Clone, Copy)]
pub(crate) enum Run {
    /// Runs on a property of this worker's export table, with the request's argument bytes;
    /// answers through the reply.
    Apply(fn(&Shared, &[u8], Reply)),
    /// Needs no property: builds one, or starts a fiber, from the argument bytes.
    Free(fn(&[u8], Reply)),
}

/// A descriptor, for the `const` items of the operation types: `descriptor!(name, run)`.
///
/// A macro, not a `const fn`: a function is also compiled to run, with a copy of [`MAGIC`] of
/// its own in the image, a copy that is not a descriptor.
macro_rules! descriptor {
    ($name:expr, $run:expr) => {
        $crate::op::Op {
            magic: $crate::op::MAGIC,
            name: $name,
            run: $run,
        }
    };
}
pub(crate) use descriptor;

impl Op {
    /// This descriptor's offset from the anchor: what a frame carries.
    pub(crate) fn offset(&'static self) -> u64 {
        (self as *const Op as usize).wrapping_sub(anchor()) as u64
    }
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Op").field("name", &(self.name)()).finish()
    }
}

fn anchor() -> usize {
    &ANCHOR as *const u8 as usize
}

/// Why an offset names no operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OpError {
    Misaligned(u64),
    OutsideImage(u64),
    NoDescriptor(u64),
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpError::Misaligned(o) => write!(f, "unknown op {o:#x}: misaligned"),
            OpError::OutsideImage(o) => {
                write!(f, "unknown op {o:#x}: outside this build's read-only image")
            }
            OpError::NoDescriptor(o) => write!(f, "unknown op {o:#x}: no descriptor there"),
        }
    }
}

/// A read-only mapping of this executable: `[start, end)` and whether it holds code.
#[derive(Debug, Clone, Copy)]
struct Mapping {
    start: usize,
    end: usize,
    executable: bool,
}

/// The read-only mappings of this executable.
fn mappings() -> &'static [Mapping] {
    static MAPPINGS: OnceLock<Vec<Mapping>> = OnceLock::new();
    MAPPINGS.get_or_init(|| read_only_mappings().unwrap_or_default())
}

/// Where descriptors may be: the read-only mappings of this executable that hold no code.
fn image() -> impl Iterator<Item = (usize, usize)> {
    mappings()
        .iter()
        .filter(|m| !m.executable)
        .map(|m| (m.start, m.end))
}

/// Reads `/proc/self/maps` for the read-only mappings of the file `/proc/self/exe` names.
fn read_only_mappings() -> std::io::Result<Vec<Mapping>> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let exe = exe.to_string_lossy();
    let exe = exe.trim_end_matches(" (deleted)");
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut ranges = Vec::new();
    for line in maps.lines() {
        // start-end perms offset dev inode path
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let path = fields.nth(3).unwrap_or("");
        if path.trim_end_matches(" (deleted)") != exe || !perms.starts_with('r') {
            continue;
        }
        if perms.as_bytes().get(1) != Some(&b'-') {
            continue; // writable: a read there could race a write
        }
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        if let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) {
            ranges.push(Mapping {
                start,
                end,
                executable: perms.as_bytes().get(2) == Some(&b'x'),
            });
        }
    }
    Ok(ranges)
}

/// Finds the descriptor an offset names, checking it as the module docs describe.
pub(crate) fn resolve(offset: u64) -> Result<&'static Op, OpError> {
    thread_local! {
        static KNOWN: std::cell::RefCell<ByNumber<&'static Op>> = Default::default();
        /// The last descriptor found: a batch usually names one operation many times.
        static LAST: std::cell::Cell<Option<(u64, &'static Op)>> = const { std::cell::Cell::new(None) };
    }
    if let Some((last, op)) = LAST.get()
        && last == offset
    {
        return Ok(op);
    }
    let op = match KNOWN.with(|k| k.borrow().get(&offset).copied()) {
        Some(op) => op,
        None => {
            let op = resolve_uncached(offset)?;
            KNOWN.with(|k| k.borrow_mut().insert(offset, op));
            op
        }
    };
    LAST.set(Some((offset, op)));
    Ok(op)
}

fn resolve_uncached(offset: u64) -> Result<&'static Op, OpError> {
    let address = anchor().wrapping_add(offset as usize);
    if !address.is_multiple_of(align_of::<Op>()) {
        return Err(OpError::Misaligned(offset));
    }
    let end = address
        .checked_add(size_of::<Op>())
        .ok_or(OpError::OutsideImage(offset))?;
    if !image().any(|(s, e)| s <= address && end <= e) {
        return Err(OpError::OutsideImage(offset));
    }
    // SAFETY: `address..end` lies in a read-only mapping of this executable, which stays mapped
    // and unwritten for the life of the process.
    if !is_magic(unsafe { load_words(address) }) {
        return Err(OpError::NoDescriptor(offset));
    }
    // SAFETY: only descriptors begin with `MAGIC` (module docs), so this is a live, immutable
    // `Op` constant of this build, valid for the rest of the process.
    Ok(unsafe { &*(address as *const Op) })
}

/// The error answer for a property of the wrong type.
pub(crate) fn type_mismatch(op: fn() -> &'static str, expected: &str, export: &Shared) -> String {
    format!(
        "type mismatch: {} works on a {expected}, but the property is a {}",
        op(),
        export.type_name
    )
}

/// The property a trampoline works on, downcast to its type.
pub(crate) fn property<P: Any>(export: &Shared) -> Option<&P> {
    export.property.downcast_ref::<P>()
}

/// Where an operation's answer goes. It is `Send`, so that a fiber that answers later
/// (`spawn_on`) may hold it; it is used only on the worker that made it.
#[derive(Debug)]
pub(crate) struct Reply {
    /// The request's id in its lane.
    id: u64,
    /// The life of the rank the answer goes to: results are encoded for it.
    peer: Life,
    /// Where the operation runs, `(rank, worker)`, for panic messages.
    here: (u32, u32),
    /// The export `(slot, generation)` the request named, if any.
    property: Option<(u32, u32)>,
    /// The worker of the peer whose link the request came on.
    peer_worker: u32,
    to: AnswerTo,
}

/// Who made a request on a property, as its first home tells them where it went (see
/// `redirect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Origin {
    /// The caller's rank, its life, and its worker whose link the request came on.
    pub(crate) rank: u32,
    pub(crate) incarnation: u32,
    pub(crate) worker: u32,
    /// The worker of this rank that link ends on.
    pub(crate) via: u32,
    /// The export the request named.
    pub(crate) slot: u32,
    pub(crate) generation: u32,
}

impl Origin {
    /// The caller's rank's life.
    pub(crate) fn life(&self) -> Life {
        Life {
            rank: self.rank,
            incarnation: self.incarnation,
        }
    }
}

/// How an answer leaves this worker.
#[derive(Debug)]
pub(crate) enum AnswerTo {
    /// On link `index` of this worker, staged by `stage(index, id, status, bytes)`.
    Link {
        index: usize,
        stage: fn(usize, u64, Status, &[u8]),
    },
    /// Into a list, for tests that dispatch requests without a connection.
    #[cfg(test)]
    Log(AnswerLog),
}

/// Answers as `(request, status, bytes)`.
#[cfg(test)]
pub(crate) type AnswerLog = std::sync::Arc<std::sync::Mutex<Vec<(u64, Status, Vec<u8>)>>>;

impl Reply {
    /// Where to answer request `id` of `peer`'s worker `peer_worker`, which named the
    /// export `property`, run `here`.
    pub(crate) fn new(
        id: u64,
        (peer, peer_worker): (Life, u32),
        here: (u32, u32),
        property: Option<(u32, u32)>,
        to: AnswerTo,
    ) -> Reply {
        Reply {
            id,
            peer,
            here,
            property,
            peer_worker,
            to,
        }
    }

    /// Who made the request, if it named an export.
    pub(crate) fn origin(&self) -> Option<Origin> {
        let (slot, generation) = self.property?;
        Some(Origin {
            rank: self.peer.rank,
            incarnation: self.peer.incarnation,
            worker: self.peer_worker,
            via: self.here.1,
            slot,
            generation,
        })
    }

    /// The rank the operation runs on.
    pub(crate) fn rank(&self) -> u32 {
        self.here.0
    }

    /// The life of the rank the answer goes to.
    pub(crate) fn peer(&self) -> Life {
        self.peer
    }

    /// Sends the encoded result of a successful operation; a result that cannot be encoded
    /// refuses the request instead.
    pub(crate) fn ok<R: serde::Serialize + 'static>(self, value: &R) {
        if let Some(scalar) = codec::scalar_bytes(value) {
            return self.send(Status::Ok, scalar.as_slice());
        }
        let peer = self.peer;
        let encoded =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| codec::encode(peer, value)));
        match encoded {
            Ok(bytes) => self.send(Status::Ok, bytes.as_slice()),
            Err(p) => self.refuse(codec::panic_message(&*p)),
        }
    }

    /// Sends a result encoded already (a code package's output, which is postcard); one over
    /// `GSM_MAX_MESSAGE` refuses the request instead.
    pub(crate) fn ok_encoded(self, bytes: Encoded) {
        if codec::fits(bytes.len()) {
            self.send(Status::Ok, bytes.as_slice());
        } else {
            let why = format!("a result of {} bytes exceeds GSM_MAX_MESSAGE", bytes.len());
            self.refuse(why);
        }
    }

    /// Answers a named request that did not resolve with its encoded `NamedError`.
    pub(crate) fn unresolved(self, error: Encoded) {
        self.send(Status::Unresolved, error.as_slice());
    }

    /// Reports a panic of the operation, naming where it happened.
    pub(crate) fn panicked(self, message: &str) {
        let (rank, worker) = self.here;
        let text = format!("{} (on rank {rank}, worker {worker})", codec::clip(message));
        self.send(Status::Panicked, codec::encode_message(&text).as_slice());
    }

    /// Refuses the request, saying why.
    pub(crate) fn refuse(self, why: String) {
        self.send(
            Status::Refused,
            codec::encode_message(codec::clip(&why)).as_slice(),
        );
    }

    fn send(self, status: Status, bytes: &[u8]) {
        match self.to {
            AnswerTo::Link { index, stage } => stage(index, self.id, status, bytes),
            #[cfg(test)]
            AnswerTo::Log(log) => log.lock().unwrap().push((self.id, status, bytes.to_vec())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static TEST_OP: Op = descriptor!(|| "test op", Run::Free(|_, _| {}));

    #[test]
    fn a_descriptor_resolves_from_its_offset() {
        const PROMOTED: &Op = &descriptor!(|| "promoted", Run::Free(|_, _| {}));
        for op in [&TEST_OP, PROMOTED] {
            let found = resolve(op.offset()).expect("a real descriptor resolves");
            assert!(std::ptr::eq(found, op));
        }
    }

    #[test]
    fn offsets_that_name_no_descriptor_are_errors() {
        let real = TEST_OP.offset();
        assert_eq!(
            resolve(real + 1).unwrap_err(),
            OpError::Misaligned(real + 1)
        );
        let far = real.wrapping_add(1 << 60);
        assert_eq!(resolve(far).unwrap_err(), OpError::OutsideImage(far));
        // Inside the image, aligned, but not a descriptor: the executable's first bytes.
        let (start, _) = image().next().expect("the image has a mapping");
        let header = (start.wrapping_sub(anchor())) as u64;
        assert_eq!(resolve(header).unwrap_err(), OpError::NoDescriptor(header));
        // Code is outside the image, although readable: the unrelocated copies of descriptors
        // that the last page of code maps must never resolve.
        let code = mappings()
            .iter()
            .find(|m| m.executable)
            .expect("code is mapped");
        let in_code = (code.start.wrapping_sub(anchor())) as u64;
        assert_eq!(
            resolve(in_code).unwrap_err(),
            OpError::OutsideImage(in_code)
        );
        // Every aligned offset around a real descriptor is either it or an error.
        for delta in (-4096i64..4096).step_by(8) {
            let o = real.wrapping_add(delta as u64);
            match resolve(o) {
                Ok(op) => assert!(std::ptr::eq(op, &TEST_OP) || delta != 0),
                Err(_) => assert_ne!(delta, 0),
            }
        }
    }

    /// The image holds `MAGIC` only where a descriptor starts: each aligned copy is followed by
    /// the descriptor's `name`, a pointer into this executable's code.
    #[test]
    fn only_descriptors_hold_the_magic() {
        let in_code = |p: usize| {
            mappings()
                .iter()
                .any(|m| m.executable && m.start <= p && p < m.end)
        };
        let mut found = 0;
        for (start, end) in image() {
            let mut at = start.next_multiple_of(align_of::<Op>());
            while at + size_of::<Op>() <= end {
                // SAFETY: inside a read-only mapping of the image, which stays mapped.
                if is_magic(unsafe { load_words(at) }) {
                    // SAFETY: as above; the word after the magic is the descriptor's `name`.
                    let name = unsafe { load_words(at + 16) }[0] as usize;
                    assert!(
                        in_code(name),
                        "a copy of MAGIC at {at:#x} is not a descriptor (name {name:#x})"
                    );
                    found += 1;
                }
                at += align_of::<Op>();
            }
        }
        assert!(found >= 2, "the scan finds this module's descriptors");
        let _ = resolve(TEST_OP.offset()).unwrap();
    }
}
