//! How the members of an object find each other's regions on a rack: each node keeps a
//! directory of its open endpoints (a property exported under [`NAME`]), and a member joins
//! an object by asking every other member's directory for its endpoint.
//!
//! A join that arrives before that member has opened the object waits there (a deferred
//! answer, held by the directory) until it does, or until the joiner's deadline
//! (`GSM_OBJECT_TIMEOUT`) passes; the seed drops such a join silently. The answer is the
//! member's regions, or its signature when it differs from the joiner's, so that the error
//! names both sides. The directory holds a handle to each region of an open endpoint; leaving
//! drops them, and a region is freed once no member holds one.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use gossamer::{Node, Region, Reply, ReplyId, Trust};
use serde::{Deserialize, Serialize};

use crate::error::OpenError;
use crate::signature::Signature;

/// The name each node's directory is exported under.
pub(crate) const NAME: &str = "gossamer.objects/directory";

/// A node's open endpoints, and the joins that wait for one.
#[gossamer::stable_type("gossamer.objects.Directory/1")]
#[derive(Default)]
pub(crate) struct Directory {
    open: HashMap<String, Endpoint>,
    /// Joins that arrived before the endpoint: the asking rank, its signature, its answer.
    waiting: HashMap<String, Vec<(u32, Signature, Reply<Answer>)>>,
}

/// An open endpoint, and who has been answered.
struct Endpoint {
    signature: Signature,
    regions: Vec<Option<Region>>,
    /// The members whose join has been answered: with the regions, or with this signature
    /// when theirs differs.
    answered: BTreeSet<u32>,
    /// This member's open, waiting until every other member has been answered.
    opener: Option<Reply<()>>,
}

impl Endpoint {
    /// Answers `rank`'s join.
    fn answer(&mut self, rank: u32, theirs: &Signature, reply: Reply<Answer>) {
        let answer = if self.signature == *theirs {
            Answer::Joined(self.regions.clone())
        } else {
            Answer::Mismatch(self.signature.clone())
        };
        // A joiner that gave up has its reply forgotten at its deadline, and one that ended
        // cannot be answered; neither counts.
        if reply.send(answer).is_ok() {
            self.answered.insert(rank);
        }
        self.release_opener();
    }

    fn all_answered(&self) -> bool {
        self.signature.members.len() == self.answered.len() + 1
    }

    fn release_opener(&mut self) {
        if self.all_answered()
            && let Some(opener) = self.opener.take()
        {
            let _ = opener.send(());
        }
    }
}

/// What a member's directory answers a join.
#[derive(Serialize, Deserialize)]
pub(crate) enum Answer {
    /// Its regions, in declaration order.
    Joined(Vec<Option<Region>>),
    /// It opened the object as this.
    Mismatch(Signature),
}

/// This node's directory, made by the first open.
fn local() -> Trust<Directory> {
    let here = gossamer::this_node();
    loop {
        if let Ok(d) = here.lookup::<Directory>(NAME) {
            return d;
        }
        let d = gossamer::entrust(Directory::default());
        // Another fiber may have exported one meanwhile: then use that.
        if gossamer::export(NAME, &d).is_ok() {
            return d;
        }
    }
}

fn timeout() -> Duration {
    gossamer::env::object_timeout(|name| std::env::var(name).ok())
        .unwrap_or(gossamer::env::DEFAULT_OBJECT_TIMEOUT)
}

/// Registers this member's endpoint, learns every other member's, and returns once every
/// other member has learnt this one's too: see the module docs.
pub(crate) fn join(
    name: &str,
    signature: &Signature,
    mine: Vec<Option<Region>>,
) -> Result<Vec<Vec<Option<Region>>>, OpenError> {
    let directory = local();
    directory.apply_with(register, (name.to_owned(), signature.clone(), mine.clone()))?;
    let started = Instant::now();
    let deadline = started + timeout();
    let me = gossamer::this_node().rank();
    // Every other member is asked at once; their answers are collected in member order.
    let asked: Vec<_> = signature
        .members
        .iter()
        .map(|&rank| {
            (rank != me).then(|| {
                let left = deadline.saturating_duration_since(Instant::now());
                let ask = Ask {
                    name: name.to_owned(),
                    signature: signature.clone(),
                    from: me,
                    left_us: left.as_micros() as u64,
                };
                gossamer::spawn_on(node(rank), ask_here, ask)
            })
        })
        .collect();
    let mut all = Vec::with_capacity(asked.len());
    let (mut missing, mut mismatch) = (Vec::new(), None);
    for (&rank, handle) in signature.members.iter().zip(asked) {
        match handle.map(|h| h.join()) {
            None => all.push(mine.clone()),
            Some(Some(Answer::Joined(regions))) => all.push(regions),
            Some(Some(Answer::Mismatch(theirs))) => {
                mismatch.get_or_insert((rank, theirs));
            }
            Some(None) => missing.push(rank),
        }
    }
    // Then wait until every other member has had its answer from this endpoint (its regions,
    // or the mismatch), so that none is left asking a member that already closed it, or
    // gave up.
    let answered = directory.apply_deferred_until_with(
        wait_answered,
        name.to_owned(),
        deadline,
        forget_opener,
    );
    if answered.is_err() && mismatch.is_none() && missing.is_empty() {
        missing = directory.apply_with(unanswered, name.to_owned());
    }
    let failure = if let Some((rank, theirs)) = mismatch {
        Some(OpenError::Mismatch {
            name: name.to_owned(),
            rank,
            ours: signature.to_string(),
            theirs: theirs.to_string(),
        })
    } else if !missing.is_empty() {
        Some(OpenError::Missing {
            name: name.to_owned(),
            ranks: missing,
            waited_ms: started.elapsed().as_millis() as u64,
        })
    } else {
        None
    };
    match failure {
        Some(e) => {
            leave(name);
            Err(e)
        }
        None => Ok(all),
    }
}

/// Runs on the directory's trustee: records an endpoint, and answers the joins waiting for it.
fn register(
    d: &mut Directory,
    (name, signature, regions): (String, Signature, Vec<Option<Region>>),
) -> Result<(), OpenError> {
    if d.open.contains_key(&name) {
        return Err(OpenError::Duplicate { name });
    }
    let mut endpoint = Endpoint {
        signature,
        regions,
        answered: BTreeSet::new(),
        opener: None,
    };
    for (rank, theirs, reply) in d.waiting.remove(&name).unwrap_or_default() {
        endpoint.answer(rank, &theirs, reply);
    }
    d.open.insert(name, endpoint);
    Ok(())
}

fn wait_answered(d: &mut Directory, name: String, reply: Reply<()>) {
    match d.open.get_mut(&name) {
        Some(endpoint) if !endpoint.all_answered() => endpoint.opener = Some(reply),
        _ => {
            let _ = reply.send(());
        }
    }
}

fn forget_opener(d: &mut Directory, id: ReplyId) {
    for endpoint in d.open.values_mut() {
        if endpoint.opener.as_ref().is_some_and(|r| r.id() == id) {
            endpoint.opener = None;
        }
    }
}

/// The other members the endpoint `name` has not answered.
fn unanswered(d: &mut Directory, name: String) -> Vec<u32> {
    let Some(endpoint) = d.open.get(&name) else {
        return Vec::new();
    };
    let me = gossamer::this_node().rank();
    endpoint
        .signature
        .members
        .iter()
        .filter(|&&r| r != me && !endpoint.answered.contains(&r))
        .copied()
        .collect()
}

/// A join's question to another member.
#[derive(Serialize, Deserialize)]
struct Ask {
    name: String,
    signature: Signature,
    /// The asking rank.
    from: u32,
    /// How long it waits, in microseconds.
    left_us: u64,
}

/// Runs on the member asked, in a fiber: its directory's answer, `None` if it has not opened
/// the object in the time left.
fn ask_here(ask: Ask) -> Option<Answer> {
    let deadline = Instant::now() + Duration::from_micros(ask.left_us);
    local()
        .apply_deferred_until_with(wait_for, ask, deadline, forget)
        .ok()
}

fn wait_for(d: &mut Directory, ask: Ask, reply: Reply<Answer>) {
    match d.open.get_mut(&ask.name) {
        Some(endpoint) => endpoint.answer(ask.from, &ask.signature, reply),
        None => d
            .waiting
            .entry(ask.name)
            .or_default()
            .push((ask.from, ask.signature, reply)),
    }
}

fn forget(d: &mut Directory, id: ReplyId) {
    for waiting in d.waiting.values_mut() {
        waiting.retain(|(_, _, r)| r.id() != id);
    }
    d.waiting.retain(|_, w| !w.is_empty());
}

/// Withdraws this node's endpoint of `name`, without waiting on a worker (an endpoint may be
/// dropped in delegated context); a plain thread, which has no worker to run a callback,
/// waits. A later open of the name from the same worker is ordered after it: both are
/// requests from one worker to one trustee. The endpoint's region handles are dropped on the
/// directory's trustee.
pub(crate) fn leave(name: &str) {
    if trust::current_worker().is_some() {
        local().apply_then_with(withdraw, name.to_owned(), |()| {});
    } else {
        local().apply_with(withdraw, name.to_owned());
    }
}

fn withdraw(d: &mut Directory, name: String) {
    d.open.remove(&name);
}

/// The node of rank `rank`.
fn node(rank: u32) -> Node {
    gossamer::nodes()
        .nth(rank as usize)
        .unwrap_or_else(|| panic!("rank {rank} is not in the job"))
}
