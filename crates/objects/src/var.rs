//! Replicated variables: [`SharedArray`], [`SharedVar`], [`OwnedVar`] (the seed's sv library).

use std::fmt;
use std::marker::PhantomData;

use crate::error::OpenError;
use crate::fabric::{Fabric, Rack};
use crate::object::{Declare, Object, On, Parts, Regions};
use crate::work::{Landing, Work};

/// A value that fits one 64-bit word, stored as its bits.
pub trait Pod: Copy + 'static {
    /// Its bits in a word.
    fn to_word(self) -> u64;
    /// The value of those bits.
    fn from_word(word: u64) -> Self;
}

macro_rules! pod_int {
    ($($t:ty),*) => {$(
        impl Pod for $t {
            #[inline]
            fn to_word(self) -> u64 { self as u64 }
            #[inline]
            fn from_word(word: u64) -> Self { word as $t }
        }
    )*};
}
pod_int!(u8, u16, u32, u64, usize, i8, i16, i32, i64, isize);

impl Pod for bool {
    fn to_word(self) -> u64 {
        u64::from(self)
    }
    fn from_word(word: u64) -> Self {
        word != 0
    }
}

impl Pod for f64 {
    fn to_word(self) -> u64 {
        self.to_bits()
    }
    fn from_word(word: u64) -> Self {
        f64::from_bits(word)
    }
}

impl Pod for f32 {
    fn to_word(self) -> u64 {
        u64::from(self.to_bits())
    }
    fn from_word(word: u64) -> Self {
        f32::from_bits(word as u32)
    }
}

/// An array of `len` words replicated on every member: each member loads and stores its own
/// replica, and [`broadcast`](SharedArray::broadcast) puts words of it to every other
/// member's (never its own, §4.2 of the seed: a loopback put could undo a later store).
///
/// Nothing orders two members' stores to one word: objects built on it give each word one
/// writer (a barrier's counts, one per member).
///
/// ```
/// let code = gossamer::Rack::from_env().run(|| {
///     let members: Vec<_> = gossamer::nodes().collect();
///     objects::on_members(&members, |members| {
///         let counts = objects::open::<objects::SharedArray>("doc-sst", &4, &members).unwrap();
///         let work = objects::Work::new();
///         counts.store(1, 7);
///         counts.broadcast(1, &work);
///         work.wait().unwrap();
///         assert_eq!(counts.load(1), 7);
///     });
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
pub struct SharedArray<F: Fabric = Rack> {
    words: Regions<F>,
    len: usize,
}

impl<F: Fabric> Object<F> for SharedArray<F> {
    /// The number of words.
    type Params = usize;

    fn declare(d: &mut Declare, len: &usize) {
        d.region("words", *len, On::EachMember);
    }

    fn build(parts: Parts<F>, len: &usize) -> Result<Self, OpenError> {
        if *len == 0 {
            return Err(OpenError::BadParams {
                why: "a shared array of 0 words".into(),
            });
        }
        Ok(SharedArray {
            words: parts.region("words"),
            len: *len,
        })
    }
}

impl<F: Fabric> SharedArray<F> {
    /// Its length in words.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no words (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Word `i` of this member's replica.
    #[inline]
    pub fn load(&self, i: usize) -> u64 {
        self.words.load(i)
    }

    /// Stores `v` in word `i` of this member's replica (seen by others after a broadcast).
    #[inline]
    pub fn store(&self, i: usize, v: u64) {
        self.words.store(i, v);
    }

    /// Puts word `i` of this replica to every other member's, tracked in `work`.
    pub fn broadcast(&self, i: usize, work: &Work) {
        self.words.broadcast(i, 1, work);
    }

    /// Puts word `i` of this replica to member `m`'s only.
    pub fn send_to(&self, m: usize, i: usize, work: &Work) {
        let w = self.load(i);
        self.words.put(m, i, &[w], work);
    }

    /// Fences every node of the job: each earlier operation of this worker has landed when
    /// `work` completes (the seed's global fence).
    pub fn fence_all(&self, work: &Work) {
        fence_all(self.words.fabric(), work);
    }

    /// This member's index.
    pub fn me(&self) -> usize {
        self.words.me()
    }

    /// How many members share it.
    pub fn members(&self) -> usize {
        self.words.members()
    }

    pub(crate) fn regions(&self) -> &Regions<F> {
        &self.words
    }
}

/// A fence to every node of the job, tracked in `work`.
pub(crate) fn fence_all<F: Fabric>(fabric: &F, work: &Work) {
    for node in 0..fabric.nodes() {
        fabric.fence_in(node, work);
    }
}

impl<F: Fabric> fmt::Debug for SharedArray<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedArray")
            .field("len", &self.len)
            .field("me", &self.me())
            .finish()
    }
}

/// One value of a [`Pod`] type replicated on every member: a [`SharedArray`] of one word.
///
/// ```
/// let code = gossamer::Rack::from_env().run(|| {
///     let members: Vec<_> = gossamer::nodes().collect();
///     objects::on_members(&members, |members| {
///         let mut flag = objects::open::<objects::SharedVar<bool>>("doc-flag", &(), &members).unwrap();
///         flag.store(true);
///         let work = objects::Work::new();
///         flag.broadcast(&work);
///         work.wait().unwrap();
///         assert!(flag.load());
///     });
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
pub struct SharedVar<T: Pod, F: Fabric = Rack> {
    array: SharedArray<F>,
    _type: PhantomData<fn() -> T>,
}

impl<T: Pod, F: Fabric> Object<F> for SharedVar<T, F> {
    type Params = ();

    fn declare(d: &mut Declare, (): &()) {
        d.object::<F, SharedArray<F>>("var", &1);
    }

    fn build(parts: Parts<F>, (): &()) -> Result<Self, OpenError> {
        Ok(SharedVar {
            array: parts.object("var", &1)?,
            _type: PhantomData,
        })
    }
}

impl<T: Pod, F: Fabric> SharedVar<T, F> {
    /// This member's replica.
    #[inline]
    pub fn load(&self) -> T {
        T::from_word(self.array.load(0))
    }

    /// Stores `v` in this member's replica.
    #[inline]
    pub fn store(&mut self, v: T) {
        self.array.store(0, v.to_word());
    }

    /// Puts this replica to every other member's.
    pub fn broadcast(&self, work: &Work) {
        self.array.broadcast(0, work);
    }
}

impl<T: Pod + fmt::Debug, F: Fabric> fmt::Debug for SharedVar<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedVar")
            .field("value", &self.load())
            .finish()
    }
}

/// A value with one writer, its owner (the member of index `owner`): the owner's copy is the
/// true value, which it [`publish`](OwnedWriter::publish)es to the others' replicas; a reader
/// loads its replica, possibly stale, or [`fetch`](OwnedReader::fetch)es the owner's.
///
/// Roles are types: [`OwnedVar::role`] gives the owner an [`OwnedWriter`] and every other
/// member an [`OwnedReader`]; only the writer can store.
///
/// ```
/// use objects::{Owned, OwnedVar};
/// let code = gossamer::Rack::from_env().run(|| {
///     let members: Vec<_> = gossamer::nodes().collect();
///     objects::on_members(&members, |members| {
///         let v = objects::open::<OwnedVar<u64>>("doc-owned", &0, &members).unwrap();
///         match v.role() {
///             Owned::Writer(mut w) => {
///                 w.store(5);
///                 w.publish().wait().unwrap();
///             }
///             Owned::Reader(r) => {
///                 let _maybe_stale = r.load();
///                 let _true_value = r.fetch().unwrap();
///             }
///         }
///     });
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
pub struct OwnedVar<T: Pod, F: Fabric = Rack> {
    array: SharedArray<F>,
    owner: usize,
    _type: PhantomData<fn() -> T>,
}

impl<T: Pod, F: Fabric> Object<F> for OwnedVar<T, F> {
    /// The owner's index among the members.
    type Params = usize;

    fn declare(d: &mut Declare, _: &usize) {
        d.object::<F, SharedArray<F>>("var", &1);
    }

    fn build(parts: Parts<F>, owner: &usize) -> Result<Self, OpenError> {
        if *owner >= parts.members().len() {
            return Err(OpenError::BadParams {
                why: format!(
                    "owner {owner} of an owned variable of {} members",
                    parts.members().len()
                ),
            });
        }
        Ok(OwnedVar {
            array: parts.object("var", &1)?,
            owner: *owner,
            _type: PhantomData,
        })
    }
}

/// A member's role in an [`OwnedVar`].
#[derive(Debug)]
pub enum Owned<T: Pod, F: Fabric = Rack> {
    /// The owner.
    Writer(OwnedWriter<T, F>),
    /// Any other member.
    Reader(OwnedReader<T, F>),
}

impl<T: Pod, F: Fabric> OwnedVar<T, F> {
    /// This member's role.
    pub fn role(self) -> Owned<T, F> {
        if self.array.me() == self.owner {
            Owned::Writer(OwnedWriter { var: self })
        } else {
            Owned::Reader(OwnedReader { var: self })
        }
    }
}

impl<T: Pod, F: Fabric> fmt::Debug for OwnedVar<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedVar")
            .field("owner", &self.owner)
            .finish()
    }
}

/// The owner's side of an [`OwnedVar`].
pub struct OwnedWriter<T: Pod, F: Fabric = Rack> {
    var: OwnedVar<T, F>,
}

impl<T: Pod, F: Fabric> OwnedWriter<T, F> {
    /// The true value.
    pub fn load(&self) -> T {
        T::from_word(self.var.array.load(0))
    }

    /// Sets the true value (readers' replicas change at the next publish).
    pub fn store(&mut self, v: T) {
        self.var.array.store(0, v.to_word());
    }

    /// Puts the value to every reader's replica; the returned work completes when the puts
    /// are issued (fence for them to land).
    pub fn publish(&self) -> Work {
        let work = Work::new();
        self.var.array.broadcast(0, &work);
        work
    }
}

impl<T: Pod, F: Fabric> fmt::Debug for OwnedWriter<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedWriter").finish()
    }
}

/// A reader's side of an [`OwnedVar`].
pub struct OwnedReader<T: Pod, F: Fabric = Rack> {
    var: OwnedVar<T, F>,
}

impl<T: Pod, F: Fabric> OwnedReader<T, F> {
    /// This member's replica: the value of some earlier publish.
    pub fn load(&self) -> T {
        T::from_word(self.var.array.load(0))
    }

    /// The owner's value now (one get). The replica is left as it is: a publish may land
    /// after this get read, and must not be overwritten by an older value.
    ///
    /// # Errors
    /// The owner's region is gone.
    pub fn fetch(&self) -> Result<T, gossamer::RegionError> {
        let regions = self.var.array.regions();
        let work = Work::new();
        let landing = Landing::new();
        regions
            .fabric()
            .get(regions.of(self.var.owner), 0, 1, landing.fill(&work));
        work.wait()?;
        let word = landing.take().expect("a waited get completed")?[0];
        Ok(T::from_word(word))
    }
}

impl<T: Pod, F: Fabric> fmt::Debug for OwnedReader<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedReader").finish()
    }
}
