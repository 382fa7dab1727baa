//! The members' side of `bench objects-map` (O4): a map open on every rank of the rack
//! between commands, filled once, then driven by fibers on every rank.
//!
//! Commands (answers follow `ok`):
//! - `obj-map-open DESIGN SLOTS KEYS`: opens a map of `SLOTS` slots (`dmap`: a `DMap` with
//!   `SLOTS / N` slots on each member; `shardmap`: a `ShardMap`, one shard per rank) and
//!   inserts keys 1..=`KEYS`, each member its share (key `k` by member `k % N`) from
//!   [`FILL_FIBERS`] fibers. Answers `NAME SECONDS`, the map's name for the next commands and
//!   the fill's time.
//! - `obj-map NAME DIST ALPHA WRITES FIBERS WINDOW_MS`: every member runs `FIBERS` fibers (the
//!   window: operations in flight per rank), each doing one operation at a time: an update
//!   (`insert` of an existing key) for `WRITES` percent of them, a `get` otherwise, of keys
//!   drawn `uniform`ly or `zipf` with exponent `ALPHA`, for a quarter window of warm-up, then
//!   one window counted. Answers `OPERATIONS SECONDS`; checks that every get found its key
//!   with a value written for it.
//! - `obj-map-close NAME`: closes the map on every member (once all are done with it).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ::objects::{Barrier, DMap, DMapParams, ShardMap};
use anyhow::{Context as _, bail, ensure};
use gossamer::Wire;
use serde::{Deserialize, Serialize};

use crate::objects::parts::{Window, err, members, on_each};
use crate::workload::{Dist, Stream, mix};

/// Fibers per member that fill a map.
pub(crate) const FILL_FIBERS: u64 = 128;

/// A map open on this rank, by name.
enum Open {
    D(Arc<DMap>, Barrier),
    S(ShardMap),
}

/// The maps open on this rank (each member keeps its endpoint between commands).
static OPEN: LazyLock<Mutex<HashMap<String, Open>>> = LazyLock::new(Mutex::default);

/// The operations of one map: a handle every fiber can use.
#[derive(Clone)]
enum Handle {
    D(Arc<DMap>),
    S(ShardMap),
}

fn handle(name: &str) -> Result<Handle, String> {
    let open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
    match open.get(name) {
        Some(Open::D(m, _)) => Ok(Handle::D(m.clone())),
        Some(Open::S(m)) => Ok(Handle::S(m.clone())),
        None => Err(format!("no map `{name}` is open here")),
    }
}

impl Handle {
    fn get(&self, key: u64) -> Result<Option<u64>, String> {
        match self {
            Handle::D(m) => m.get(key).map_err(err),
            Handle::S(m) => Ok(m.get(key)),
        }
    }

    fn insert(&self, key: u64, value: u64) -> Result<Option<u64>, String> {
        match self {
            Handle::D(m) => m.insert(key, value).map_err(err),
            Handle::S(m) => Ok(m.insert(key, value)),
        }
    }
}

/// The value written for `key` at `stamp`: its low half names the key, so that a read can
/// tell a value of its key from any other.
fn value(key: u64, stamp: u64) -> u64 {
    (stamp << 32) | (mix(key) & 0xFFFF_FFFF)
}

fn holds(key: u64, v: u64) -> bool {
    v & 0xFFFF_FFFF == mix(key) & 0xFFFF_FFFF
}

/// What every member of one command is told.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct Job {
    ranks: Vec<u32>,
    name: String,
    /// `obj-map-open`: the design's parameters; `None` for the other commands.
    open: Option<OpenJob>,
    keys: u64,
    zipf: Option<f64>,
    writes: u32,
    fibers: u64,
    window: Duration,
}

#[derive(Clone, Serialize, Deserialize)]
struct OpenJob {
    /// `Some`: the shard map, made by rank 0; `None`: a `DMap` of `slots` slots in all.
    shards: Option<ShardMap>,
    slots: u64,
}

/// One member's result: operations counted, seconds.
type Part = Result<(u64, f64), String>;

/// Rank 0's record of the maps it opened: their key counts.
#[derive(Debug, Default)]
pub(crate) struct Maps {
    keys: HashMap<String, u64>,
}

impl Maps {
    /// Runs one `obj-map...` command; the answer's words after `ok`.
    pub(crate) fn command(&mut self, words: &[&str], name: String) -> anyhow::Result<String> {
        let ranks: Vec<u32> = gossamer::nodes().map(|n| n.rank()).collect();
        let mut job = Job {
            ranks,
            name,
            open: None,
            keys: 0,
            zipf: None,
            writes: 0,
            fibers: FILL_FIBERS,
            window: Duration::ZERO,
        };
        match words {
            ["obj-map-open", design, slots, keys] => {
                let nodes: Vec<_> = gossamer::nodes().collect();
                let shards = match *design {
                    "dmap" => None,
                    "shardmap" => Some(ShardMap::new(&nodes, 1)),
                    _ => bail!("obj-map-open: unknown design `{design}`"),
                };
                job.open = Some(OpenJob {
                    shards,
                    slots: slots.parse()?,
                });
                job.keys = keys.parse()?;
                ensure!(job.keys >= 1, "obj-map-open: at least one key");
                let started = Instant::now();
                on_each(open_part, &job, &job.ranks)?;
                self.keys.insert(job.name.clone(), job.keys);
                Ok(format!("{} {}", job.name, started.elapsed().as_secs_f64()))
            }
            ["obj-map", name, dist, alpha, writes, fibers, window] => {
                job.name = (*name).to_owned();
                job.keys = *self.keys.get(*name).context("no such map")?;
                job.zipf = match *dist {
                    "uniform" => None,
                    "zipf" => Some(alpha.parse()?),
                    _ => bail!("obj-map: unknown distribution `{dist}`"),
                };
                job.writes = writes.parse()?;
                ensure!(job.writes <= 100, "obj-map: writes is a percentage");
                job.fibers = fibers.parse()?;
                ensure!(job.fibers >= 1, "obj-map: at least one fiber");
                job.window = Duration::from_millis(window.parse()?);
                let parts = on_each(run_part, &job, &job.ranks)?;
                let ops: u64 = parts.iter().map(|p| p.0).sum();
                let secs = parts.iter().map(|p| p.1).fold(0.0, f64::max);
                Ok(format!("{ops} {secs}"))
            }
            ["obj-map-close", name] => {
                job.name = (*name).to_owned();
                self.keys.remove(*name).context("no such map")?;
                on_each(close_part, &job, &job.ranks)?;
                Ok(String::new())
            }
            _ => bail!("unknown objects command `{}`", words.join(" ")),
        }
    }
}

fn my_index(job: &Job) -> Result<u64, String> {
    let me = gossamer::this_node().rank();
    job.ranks
        .iter()
        .position(|&r| r == me)
        .map(|i| i as u64)
        .ok_or_else(|| "not a member".to_owned())
}

/// Opens the map on this member and inserts its share of the keys.
fn open_part(job: Job) -> Part {
    let nodes = members(&job.ranks);
    let n = nodes.len() as u64;
    let me = my_index(&job)?;
    let open = job.open.as_ref().ok_or("no map to open")?;
    let entry = match &open.shards {
        Some(shards) => Open::S(shards.clone()),
        None => {
            let params = DMapParams {
                slots: open.slots.div_ceil(n) as usize,
                locks: 1024 * n as usize,
            };
            let map = ::objects::open::<DMap>(&format!("{}/map", job.name), &params, &nodes)
                .map_err(err)?;
            let barrier = ::objects::open::<Barrier>(&format!("{}/barrier", job.name), &(), &nodes)
                .map_err(err)?;
            Open::D(Arc::new(map), barrier)
        }
    };
    OPEN.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(job.name.clone(), entry);
    let map = handle(&job.name)?;
    let fibers: Vec<_> = (0..job.fibers)
        .map(|f| {
            let (map, keys, step) = (map.clone(), job.keys, n * job.fibers);
            gossamer::spawn(move || {
                let mut key = 1 + me + f * n;
                while key <= keys {
                    if map.insert(key, value(key, 0))?.is_some() {
                        return Err(format!("key {key} was in the map before it was filled"));
                    }
                    key += step;
                }
                Ok(())
            })
        })
        .collect();
    for f in fibers {
        f.join()?;
    }
    barrier(&job.name)?;
    Ok((0, 0.0))
}

/// A fenced barrier of a `DMap`'s members (every member's inserts have landed and been
/// acknowledged); nothing for a shard map, whose calls are done when they return. The entry
/// is out of the registry while its fiber waits: no lock is held across the wait.
fn barrier(name: &str) -> Result<(), String> {
    let entry = OPEN
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(name);
    let mut entry = entry.ok_or_else(|| format!("no map `{name}` is open here"))?;
    let waited = match &mut entry {
        Open::D(_, b) => b.wait().map_err(err),
        Open::S(_) => Ok(()),
    };
    OPEN.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(name.to_owned(), entry);
    waited
}

/// One member's fibers driving the map for a window.
fn run_part(job: Job) -> Part {
    let me = my_index(&job)?;
    let map = handle(&job.name)?;
    let (dist, alpha) = match job.zipf {
        Some(a) => (Dist::Zipf, a),
        None => (Dist::Uniform, 1.0),
    };
    let stream = Stream::with_exponent(dist, alpha, job.keys as usize, 0x5EED + me);
    let window = Window::after_warm_up(job.window);
    let fibers: Vec<_> = (0..job.fibers)
        .map(|f| {
            let (map, mut cursor) = (map.clone(), stream.cursor((me * job.fibers + f) as usize));
            let writes = job.writes;
            gossamer::spawn(move || {
                let mut stamp = 0u64;
                window.run(|| {
                    let write = cursor.is_write(writes);
                    let key = cursor.next_index() as u64 + 1;
                    if write {
                        stamp += 1;
                        let old = map.insert(key, value(key, stamp))?;
                        if !old.is_some_and(|v| holds(key, v)) {
                            return Err(format!("an update of key {key} found {old:?}"));
                        }
                    } else {
                        let got = map.get(key)?;
                        if !got.is_some_and(|v| holds(key, v)) {
                            return Err(format!("a get of key {key} found {got:?}"));
                        }
                    }
                    Ok(())
                })
            })
        })
        .collect();
    let (mut counted, mut end) = (0, window.until);
    for f in fibers {
        let (n, last) = f.join()?;
        counted += n;
        end = end.max(last);
    }
    let out = (counted, window.seconds_to(end));
    // Every member's updates have landed before the next command reads.
    barrier(&job.name)?;
    Ok(out)
}

/// Closes the map on this member once every member is done with it.
fn close_part(job: Job) -> Part {
    barrier(&job.name)?;
    let entry = OPEN
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&job.name);
    if let Some(Open::D(map, mut barrier)) = entry {
        drop(map);
        // No member's monitor is gone while another still writes to its tracker.
        barrier.wait().map_err(err)?;
    }
    Ok((0, 0.0))
}

/// `Wire` is what `spawn_on` sends; asserted here so a change of `Job` fails to compile here.
const _: fn() = || {
    fn wire<T: Wire>() {}
    wire::<Job>();
    wire::<Part>();
};
