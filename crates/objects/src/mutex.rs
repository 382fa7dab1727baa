//! [`Mutex`] and [`LockArray`]: locks made of a compare-and-exchange word.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

use gossamer::RegionError;

use crate::error::OpenError;
use crate::fabric::{Fabric, Rack};
use crate::object::{Declare, Object, On, Parts, Regions};
use crate::var::fence_all;
use crate::work::{Landing, Work};

/// Where a lock's word is: a member and a word of its region.
#[derive(Debug, Clone, Copy)]
struct Word {
    member: usize,
    index: usize,
}

/// Takes the lock word for member `me`: compare-and-exchange 0 → `me + 1` until it holds.
fn acquire<F: Fabric>(words: &Regions<F>, at: Word) -> Result<(), RegionError> {
    let fabric = words.fabric();
    let mine = words.me() as u64 + 1;
    loop {
        let got = if at.member == words.me() {
            fabric.swap_local(words.mine(), at.index, 0, mine)
        } else {
            let work = Work::new();
            let landing = Landing::new();
            fabric.compare_exchange(words.of(at.member), at.index, 0, mine, landing.fill(&work));
            work.wait()?;
            landing.take().expect("a waited operation completed")?
        };
        if got.is_ok() {
            return Ok(());
        }
        fabric.relax();
    }
}

/// Releases the lock word: fences every node first, so that whatever was written under the
/// lock has landed before the next holder can take it (a fenced release; the seed adds the
/// same fence to its map and to Sherman's).
fn release<F: Fabric>(words: &Regions<F>, at: Word) -> Result<(), RegionError> {
    let fabric = words.fabric();
    let work = Work::new();
    fence_all(fabric, &work);
    work.wait()?;
    let mine = words.me() as u64 + 1;
    let got = if at.member == words.me() {
        fabric.swap_local(words.mine(), at.index, mine, 0)
    } else {
        let landing = Landing::new();
        fabric.compare_exchange(words.of(at.member), at.index, mine, 0, landing.fill(&work));
        work.wait()?;
        landing.take().expect("a waited operation completed")?
    };
    match got {
        Ok(_) => Ok(()),
        Err(holder) => Err(RegionError::Corrupt {
            why: format!(
                "a lock released by member {} was held by {holder} (0: free, else member + 1)",
                words.me()
            ),
        }),
    }
}

/// A lock among an object's members, one word on its home member. [`lock`](Mutex::lock)
/// spins (letting other fibers run) on a remote compare-and-exchange; dropping the guard, or
/// [`MutexGuard::unlock`], fences every node and frees the word, so that what the holder
/// wrote, anywhere, has landed before the next holder enters. A member's fibers queue for
/// the lock among themselves first, so one of them at a time competes for the word.
///
/// It is the seed's lock, and as unfair: the home member takes it with a local
/// compare-and-exchange while another member's travels, so under constant contention the
/// home can take it again and again before the far member's arrives (`bench objects-locks`
/// measured a far process over TCP that never got it within its window). Keep critical
/// sections short and contention bounded.
///
/// ```
/// let code = gossamer::Rack::from_env().run(|| {
///     let members: Vec<_> = gossamer::nodes().collect();
///     objects::on_members(&members, |members| {
///         let lock = objects::open::<objects::Mutex>("doc-mutex", &0, &members).unwrap();
///         let guard = lock.lock().unwrap();
///         // ... one member at a time here ...
///         guard.unlock().unwrap();
///     });
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
pub struct Mutex<F: Fabric = Rack> {
    word: Regions<F>,
    home: usize,
    /// Whether a fiber of this member holds or is taking the lock (see [`Cohort`]).
    here: Cohort,
}

impl<F: Fabric> Object<F> for Mutex<F> {
    /// The home member: where the lock word is.
    type Params = usize;

    fn declare(d: &mut Declare, home: &usize) {
        d.region("word", 1, On::Member(*home));
    }

    fn build(parts: Parts<F>, home: &usize) -> Result<Self, OpenError> {
        Ok(Mutex {
            word: parts.region("word"),
            home: *home,
            here: Cohort::new(1),
        })
    }
}

impl<F: Fabric> Mutex<F> {
    fn at(&self) -> Word {
        Word {
            member: self.home,
            index: 0,
        }
    }

    /// Waits (only the fiber) until this member holds the lock.
    ///
    /// # Errors
    /// The lock's word is gone (its home left the object).
    pub fn lock(&self) -> Result<MutexGuard<'_, F>, RegionError> {
        lock(&self.word, self.at(), self.here.flag(0))
    }
}

impl<F: Fabric> fmt::Debug for Mutex<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex").field("home", &self.home).finish()
    }
}

/// A held lock of a [`Mutex`] or a [`LockArray`]: released by [`unlock`](MutexGuard::unlock),
/// which reports errors, or on drop, which ignores them.
pub struct MutexGuard<'a, F: Fabric = Rack> {
    words: &'a Regions<F>,
    at: Word,
    held: bool,
    here: &'a AtomicBool,
}

impl<F: Fabric> MutexGuard<'_, F> {
    /// Fences every node, then frees the lock.
    ///
    /// # Errors
    /// A fence failed, or the word did not say this member held it.
    pub fn unlock(mut self) -> Result<(), RegionError> {
        self.held = false;
        let released = release(self.words, self.at);
        self.here.store(false, Ordering::Release);
        released
    }
}

impl<F: Fabric> Drop for MutexGuard<'_, F> {
    fn drop(&mut self) {
        if self.held {
            let _ = release(self.words, self.at);
            self.here.store(false, Ordering::Release);
        }
    }
}

/// One flag per lock: whether a fiber of this member holds or is taking it. A fiber takes
/// the flag before the lock's word, so the member's fibers queue for a lock here, and only
/// one of them at a time competes for the word with other members (a compare-and-swap that
/// fails costs a round trip to the lock's home; 128 fibers of one member spinning on a hot
/// lock over TCP took it less often than 3 did).
struct Cohort(Box<[AtomicBool]>);

impl Cohort {
    fn new(len: usize) -> Cohort {
        Cohort((0..len).map(|_| AtomicBool::new(false)).collect())
    }

    fn flag(&self, i: usize) -> &AtomicBool {
        &self.0[i]
    }
}

/// Takes `here` (waiting, only the fiber, for this member's other fibers), then the word at
/// `at`.
fn lock<'a, F: Fabric>(
    words: &'a Regions<F>,
    at: Word,
    here: &'a AtomicBool,
) -> Result<MutexGuard<'a, F>, RegionError> {
    while here
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        words.fabric().relax();
    }
    if let Err(e) = acquire(words, at) {
        here.store(false, Ordering::Release);
        return Err(e);
    }
    Ok(MutexGuard {
        words,
        at,
        held: true,
        here,
    })
}

impl<F: Fabric> fmt::Debug for MutexGuard<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutexGuard")
            .field("member", &self.at.member)
            .field("index", &self.at.index)
            .finish()
    }
}

/// `n` locks striped across the members: lock `i` is a word on member `i % members`. What a
/// transfer between two accounts takes, in the order of their numbers to avoid deadlock.
///
/// ```
/// let code = gossamer::Rack::from_env().run(|| {
///     let members: Vec<_> = gossamer::nodes().collect();
///     objects::on_members(&members, |members| {
///         let locks = objects::open::<objects::LockArray>("doc-locks", &8, &members).unwrap();
///         let (a, b) = (3, 5);
///         let first = locks.lock(a.min(b)).unwrap();
///         let second = locks.lock(a.max(b)).unwrap();
///         drop(second);
///         drop(first);
///     });
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
pub struct LockArray<F: Fabric = Rack> {
    words: Regions<F>,
    len: usize,
    here: Cohort,
}

impl<F: Fabric> Object<F> for LockArray<F> {
    /// How many locks.
    type Params = usize;

    fn declare(d: &mut Declare, len: &usize) {
        let per_member = len.div_ceil(d.members().max(1));
        d.region("words", per_member, On::EachMember);
    }

    fn build(parts: Parts<F>, len: &usize) -> Result<Self, OpenError> {
        if *len == 0 {
            return Err(OpenError::BadParams {
                why: "a lock array of 0 locks".into(),
            });
        }
        Ok(LockArray {
            words: parts.region("words"),
            len: *len,
            here: Cohort::new(*len),
        })
    }
}

impl<F: Fabric> LockArray<F> {
    /// How many locks.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has none (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The member lock `i` lives on.
    pub fn home(&self, i: usize) -> usize {
        i % self.words.members()
    }

    /// Waits (only the fiber) until this member holds lock `i`.
    ///
    /// # Errors
    /// The lock's word is gone.
    ///
    /// # Panics
    /// If `i` is not below [`len`](LockArray::len).
    pub fn lock(&self, i: usize) -> Result<MutexGuard<'_, F>, RegionError> {
        assert!(i < self.len, "lock {i} of a lock array of {}", self.len);
        let at = Word {
            member: self.home(i),
            index: i / self.words.members(),
        };
        lock(&self.words, at, self.here.flag(i))
    }
}

impl<F: Fabric> fmt::Debug for LockArray<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockArray").field("len", &self.len).finish()
    }
}
