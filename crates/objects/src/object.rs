//! Objects: what they declare, how a member opens its endpoint, and the parts it is built of.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use gossamer::{Node, Wire};
use serde::{Deserialize, Serialize};

use crate::error::OpenError;
use crate::fabric::{Fabric, Rack};
use crate::signature::Signature;
use crate::work::Work;

/// A distributed object: the regions and sub-objects it declares, and how an endpoint is
/// built from them once every member has opened it.
///
/// An object's full name is its parent's, a `/`, and its own; a region's is its object's, a
/// `.`, and its own (`bar0/sst.counts`), as the seed's channels.
pub trait Object<F: Fabric = Rack>: Sized {
    /// What every member must open it with, alike (checked when they join).
    type Params: Wire + Eq + fmt::Debug;

    /// Declares the object's regions and sub-objects.
    fn declare(d: &mut Declare, params: &Self::Params);

    /// Builds this member's endpoint from its parts.
    ///
    /// # Errors
    /// The parameters do not make an object.
    fn build(parts: Parts<F>, params: &Self::Params) -> Result<Self, OpenError>;
}

/// Where a region is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum On {
    /// Every member has one (a replica, or a member's own part).
    EachMember,
    /// Only the member of this index in the member list.
    Member(usize),
}

/// What an object declares: see [`Object::declare`].
#[derive(Debug)]
pub struct Declare {
    prefix: String,
    members: usize,
    regions: Vec<(String, usize, On)>,
}

impl Declare {
    /// Declares a region of `len` zeroed 64-bit words, named `name` within the object.
    pub fn region(&mut self, name: &str, len: usize, on: On) {
        self.regions
            .push((format!("{}.{name}", self.prefix), len.max(1), on));
    }

    /// Declares the sub-object `name` of type `T`.
    pub fn object<F: Fabric, T: Object<F>>(&mut self, name: &str, params: &T::Params) {
        let outer = std::mem::take(&mut self.prefix);
        self.prefix = format!("{outer}/{name}");
        T::declare(self, params);
        self.prefix = outer;
    }

    /// How many members the object has.
    pub fn members(&self) -> usize {
        self.members
    }
}

/// FNV-1a: a stable hash of the parameters' bytes (std's hasher may change between builds).
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Withdraws a member's endpoint when the last part of it is dropped.
struct Endpoint<F: Fabric> {
    fabric: F,
    name: String,
}

impl<F: Fabric> Drop for Endpoint<F> {
    fn drop(&mut self) {
        self.fabric.leave(&self.name);
    }
}

/// The regions of one name, one per member that has it: part of an endpoint.
#[derive(Clone)]
pub struct Regions<F: Fabric> {
    fabric: F,
    me: usize,
    per_member: Vec<Option<F::Region>>,
    _endpoint: Arc<Endpoint<F>>,
}

impl<F: Fabric> fmt::Debug for Regions<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Regions")
            .field("me", &self.me)
            .field("per_member", &self.per_member)
            .finish()
    }
}

impl<F: Fabric> Regions<F> {
    /// The fabric they live in.
    pub fn fabric(&self) -> &F {
        &self.fabric
    }

    /// This member's index.
    pub fn me(&self) -> usize {
        self.me
    }

    /// How many members there are.
    pub fn members(&self) -> usize {
        self.per_member.len()
    }

    /// Member `m`'s region.
    ///
    /// # Panics
    /// If it has none (the object declared it on another member).
    pub fn of(&self, m: usize) -> &F::Region {
        self.per_member[m]
            .as_ref()
            .unwrap_or_else(|| panic!("member {m} has no such region"))
    }

    /// This member's region.
    pub fn mine(&self) -> &F::Region {
        self.of(self.me)
    }

    /// Word `i` of this member's region.
    #[inline]
    pub fn load(&self, i: usize) -> u64 {
        self.fabric.load(self.mine(), i)
    }

    /// Stores `v` in word `i` of this member's region.
    #[inline]
    pub fn store(&self, i: usize, v: u64) {
        self.fabric.store(self.mine(), i, v);
    }

    /// Puts `words` at `i` of member `m`'s region, tracked in `work`.
    #[inline]
    pub fn put(&self, m: usize, i: usize, words: &[u64], work: &Work) {
        self.fabric.put_in(self.of(m), i, words, work);
    }

    /// Reads `len` words at `i` of member `m`'s region, waiting (only the fiber) for them.
    ///
    /// # Errors
    /// The region is gone, or the words are past its end.
    pub fn get(&self, m: usize, i: usize, len: usize) -> Result<Vec<u64>, gossamer::RegionError> {
        let work = Work::new();
        let landing = crate::work::Landing::new();
        self.fabric.get(self.of(m), i, len, landing.fill(&work));
        work.wait()?;
        landing.take().expect("a waited get completed")
    }

    /// Puts words `i..i + len` of this member's region to the same words of every other
    /// member's (never itself: a loopback put could undo a later local store).
    pub fn broadcast(&self, i: usize, len: usize, work: &Work) {
        // A barrier's or a ring head's one word needs no allocation.
        let mut small = [0u64; 8];
        let large: Vec<u64>;
        let words: &[u64] = if len <= small.len() {
            for (w, j) in small.iter_mut().zip(i..i + len) {
                *w = self.load(j);
            }
            &small[..len]
        } else {
            large = (i..i + len).map(|j| self.load(j)).collect();
            &large
        };
        for m in (0..self.members()).filter(|&m| m != self.me) {
            self.put(m, i, words, work);
        }
    }
}

/// What an endpoint is built of: its regions and sub-objects, by name (see [`Object::build`]).
pub struct Parts<F: Fabric> {
    prefix: String,
    me: usize,
    members: Arc<[u32]>,
    regions: Arc<HashMap<String, Vec<Option<F::Region>>>>,
    endpoint: Arc<Endpoint<F>>,
}

impl<F: Fabric> fmt::Debug for Parts<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Parts")
            .field("prefix", &self.prefix)
            .field("me", &self.me)
            .finish()
    }
}

impl<F: Fabric> Parts<F> {
    /// The fabric.
    pub fn fabric(&self) -> &F {
        &self.endpoint.fabric
    }

    /// This member's index in the member list.
    pub fn me(&self) -> usize {
        self.me
    }

    /// The members' ranks, in order.
    pub fn members(&self) -> &[u32] {
        &self.members
    }

    /// The object's full name.
    pub fn name(&self) -> &str {
        &self.prefix
    }

    /// The region the object declared as `name`.
    ///
    /// # Panics
    /// If it declared no such region (a bug of the object).
    pub fn region(&self, name: &str) -> Regions<F> {
        let full = format!("{}.{name}", self.prefix);
        let per_member = self
            .regions
            .get(&full)
            .unwrap_or_else(|| panic!("object `{}` declared no region `{name}`", self.prefix))
            .clone();
        Regions {
            fabric: self.fabric().clone(),
            me: self.me,
            per_member,
            _endpoint: self.endpoint.clone(),
        }
    }

    /// Builds the sub-object the object declared as `name`.
    ///
    /// # Errors
    /// Its parameters do not make one.
    pub fn object<T: Object<F>>(&self, name: &str, params: &T::Params) -> Result<T, OpenError> {
        let parts = Parts {
            prefix: format!("{}/{name}", self.prefix),
            me: self.me,
            members: self.members.clone(),
            regions: self.regions.clone(),
            endpoint: self.endpoint.clone(),
        };
        T::build(parts, params)
    }
}

/// Whether `name` can name an object.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 200 && name.bytes().all(|b| b.is_ascii_graphic())
}

/// Opens this member's endpoint of the object `name` on `fabric`: see [`open`].
///
/// # Errors
/// As [`open`].
pub fn open_on<F: Fabric, T: Object<F>>(
    fabric: &F,
    name: &str,
    params: &T::Params,
    members: &[u32],
) -> Result<T, OpenError> {
    if !valid_name(name) {
        return Err(OpenError::BadName {
            name: name.to_owned(),
        });
    }
    let me = check_members(fabric, members)?;
    let mut d = Declare {
        prefix: name.to_owned(),
        members: members.len(),
        regions: Vec::new(),
    };
    T::declare(&mut d, params);
    let signature = Signature {
        type_name: std::any::type_name::<T>().to_owned(),
        params: format!("{params:?}"),
        params_hash: fnv(&postcard::to_stdvec(params).expect("parameters encode")),
        members: members.to_vec(),
    };
    let mut mine = Vec::with_capacity(d.regions.len());
    for (_, len, on) in &d.regions {
        let here = match on {
            On::EachMember => true,
            On::Member(m) if *m < members.len() => *m == me,
            On::Member(m) => {
                return Err(OpenError::BadParams {
                    why: format!(
                        "a region on member {m} of an object of {} members",
                        members.len()
                    ),
                });
            }
        };
        mine.push(if here {
            Some(fabric.alloc(*len)?)
        } else {
            None
        });
    }
    let all = fabric.join(name, &signature, mine)?;
    let endpoint = Arc::new(Endpoint {
        fabric: fabric.clone(),
        name: name.to_owned(),
    });
    let regions = d
        .regions
        .iter()
        .enumerate()
        .map(|(i, (full, _, _))| (full.clone(), all.iter().map(|m| m[i].clone()).collect()))
        .collect();
    let parts = Parts {
        prefix: name.to_owned(),
        me,
        members: members.into(),
        regions: Arc::new(regions),
        endpoint,
    };
    T::build(parts, params)
}

fn check_members<F: Fabric>(fabric: &F, members: &[u32]) -> Result<usize, OpenError> {
    let bad = |why: String| Err(OpenError::BadMembers { why });
    if let Some(r) = members.iter().find(|&&r| r >= fabric.nodes()) {
        return bad(format!(
            "rank {r} is not in a job of {} nodes",
            fabric.nodes()
        ));
    }
    let mut sorted = members.to_vec();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return bad(format!("rank {} is named twice", w[0]));
    }
    match members.iter().position(|&r| r == fabric.rank()) {
        Some(me) => Ok(me),
        None => bad(format!(
            "this node (rank {}) is not among {members:?}",
            fabric.rank()
        )),
    }
}

/// Opens this member's endpoint of the object `name`, of type `T`, among `members` (this node
/// one of them): every member does the same, with equal `params`. Returns once every member has
/// opened it, each learning where the others' regions are.
///
/// ```
/// let code = gossamer::Rack::from_env().run(|| {
///     let members: Vec<_> = gossamer::nodes().collect();
///     objects::on_members(&members, |members| {
///         let mut barrier = objects::open::<objects::Barrier>("doc-open", &(), &members).unwrap();
///         barrier.wait().unwrap();
///         // A name is open once per node.
///         let again = objects::open::<objects::Barrier>("doc-open", &(), &members);
///         assert!(again.unwrap_err().to_string().contains("already open"));
///     });
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
///
/// # Errors
/// [`OpenError`]: a bad name or member list, the name already open here, a member that has
/// not opened it within `GSM_OBJECT_TIMEOUT` (10 s; the error names it), or one that opened it
/// with another type, parameters or member list (the error names both sides).
pub fn open<T: Object<Rack>>(
    name: &str,
    params: &T::Params,
    members: &[Node],
) -> Result<T, OpenError> {
    let ranks: Vec<u32> = members.iter().map(|n| n.rank()).collect();
    open_on(&Rack, name, params, &ranks)
}

/// Runs `f(members)` in a fiber on each of `members` and returns what each returned, in member
/// order: how every member of a job opens and uses an object, since a rack's `main` runs on
/// rank 0 only. `f` must capture nothing (it travels to the other nodes by its type, as with
/// [`gossamer::spawn_on`]).
///
/// ```
/// let code = gossamer::Rack::from_env().run(|| {
///     let members: Vec<_> = gossamer::nodes().collect();
///     let ranks = objects::on_members(&members, |members| {
///         let mut barrier = objects::open::<objects::Barrier>("doc-on", &(), &members).unwrap();
///         barrier.wait().unwrap();
///         gossamer::this_node().rank()
///     });
///     assert_eq!(ranks, members.iter().map(|n| n.rank()).collect::<Vec<_>>());
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
pub fn on_members<F, R>(members: &[Node], f: F) -> Vec<R>
where
    F: FnOnce(Vec<Node>) -> R + Copy + Send + 'static,
    R: Wire,
{
    let ranks: Vec<u32> = members.iter().map(|n| n.rank()).collect();
    let runs: Vec<_> = members
        .iter()
        .map(|&node| {
            gossamer::spawn_on(
                node,
                move |ranks: Vec<u32>| {
                    let all: Vec<Node> = gossamer::nodes().collect();
                    f(ranks.iter().map(|&r| all[r as usize]).collect())
                },
                ranks.clone(),
            )
        })
        .collect();
    runs.into_iter().map(|r| r.join()).collect()
}
