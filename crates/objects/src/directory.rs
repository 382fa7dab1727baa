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

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gossamer::{Region, Reply, ReplyId, Trust};
use serde::{Deserialize, Serialize};

use crate::error::OpenError;
use crate::fabric::node;
use crate::object::Signature;

/// The name each node's directory is exported under.
pub(crate) const NAME: &str = "gossamer.objects/directory";

/// A node's open endpoints, and the joins that wait for one.
#[gossamer::stable_type("gossamer.objects.Directory/1")]
#[derive(Default)]
pub(crate) struct Directory {
    open: HashMap<String, (Signature, Vec<Option<Region>>)>,
    waiting: HashMap<String, Vec<(Signature, Reply<Answer>)>>,
}

/// What a member's directory answers a join.
#[derive(Serialize, Deserialize)]
pub(crate) enum Answer {
    /// Its regions, in declaration order.
    Joined(Vec<Option<Region>>),
    /// It opened the object as this.
    Mismatch(Signature),
}

fn answer(open: &(Signature, Vec<Option<Region>>), theirs: &Signature) -> Answer {
    if open.0 == *theirs {
        Answer::Joined(open.1.clone())
    } else {
        Answer::Mismatch(open.0.clone())
    }
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

/// Registers this member's endpoint, then learns every other member's: see the module docs.
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
                let ask = (name.to_owned(), signature.clone(), left.as_micros() as u64);
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
    let open = (signature, regions);
    for (theirs, reply) in d.waiting.remove(&name).unwrap_or_default() {
        // A joiner that gave up has its reply forgotten at its deadline; one that ended
        // meanwhile cannot be answered, and need not be.
        let _ = reply.send(answer(&open, &theirs));
    }
    d.open.insert(name, open);
    Ok(())
}

/// Runs on the member asked, in a fiber: its directory's answer for `name`, `None` if it has
/// not opened it within `left_us`.
fn ask_here((name, signature, left_us): (String, Signature, u64)) -> Option<Answer> {
    let deadline = Instant::now() + Duration::from_micros(left_us);
    local()
        .apply_deferred_until_with(wait_for, (name, signature), deadline, forget)
        .ok()
}

fn wait_for(d: &mut Directory, (name, signature): (String, Signature), reply: Reply<Answer>) {
    match d.open.get(&name) {
        Some(open) => {
            let _ = reply.send(answer(open, &signature));
        }
        None => d.waiting.entry(name).or_default().push((signature, reply)),
    }
}

fn forget(d: &mut Directory, id: ReplyId) {
    for waiting in d.waiting.values_mut() {
        waiting.retain(|(_, r)| r.id() != id);
    }
    d.waiting.retain(|_, w| !w.is_empty());
}

/// Withdraws this node's endpoint of `name` without waiting (an endpoint may be dropped in
/// delegated context); a later open here is ordered after it, both going to one trustee. Its regions' handles are dropped on the directory's trustee.
pub(crate) fn leave(name: &str) {
    local().apply_then_with(withdraw, name.to_owned(), |()| {});
}

fn withdraw(d: &mut Directory, name: String) {
    d.open.remove(&name);
}
