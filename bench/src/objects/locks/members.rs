//! The members' side of `bench objects-locks` (O3): each rank of the rack runs `fibers`
//! fibers that take locks (or delegate) in a loop for a window.
//!
//! Commands (answers follow `ok`):
//! - `obj-lock DESIGN FIBERS WINDOW_MS`: one contended lock: the `objects` design locks a
//!   `Mutex`, gets a counter word of member 0, puts it back plus 1 and unlocks (the release
//!   fences: the put has landed); the `delegated` design adds 1 to a `Trust<u64>` on rank 0
//!   (`apply_with`), which is the same critical section run by its trustee.
//! - `obj-transfer DESIGN FIBERS ACCOUNTS WINDOW_MS`: transfers of 1 to 50 between two random
//!   accounts of `ACCOUNTS`, account `a` on member `a % N` at word `j = a / N`. `objects`:
//!   the accounts' locks, in order (lock `(j % 341) × N + a % N` of a `LockArray`, homed on
//!   the account's member: 341 per member, as many as Open MPI's windows), a get of each
//!   balance, a put of each new one, two releases. `delegated`: each member's accounts in a
//!   `Trust<Vec<u64>>` on it; a transfer is a call to the first account's trustee (take the
//!   amount if the balance has it), then one to the second's (add it).
//!
//! Each answers `OPERATIONS SECONDS SLOWEST`: operations by every fiber of every member started
//! within one window (after a quarter window of warm-up), the longest member's window, and
//! the operations of the member that did fewest (a lock can starve a member); and checks its
//! own results: the counter holds every increment made, the balances add up to what they
//! started at.

use std::sync::Arc;
use std::time::Duration;

use ::objects::{Barrier, LockArray, Mutex, Object, On, OpenError, Parts, Rack, Regions, Work};
use anyhow::{bail, ensure};
use gossamer::{Node, Trust, Wire};
use serde::{Deserialize, Serialize};

use crate::objects::parts::{Window, err, members, on_each};

/// Locks per member for transfers: Open MPI's most windows (seed 004, App. B.1).
pub(crate) const LOCKS_PER_MEMBER: u64 = 341;

/// Every account's starting balance.
const START: u64 = 1000;

/// The delegated design's state, made by rank 0 and sent to every member.
#[derive(Clone, Serialize, Deserialize)]
enum Delegated {
    /// One lock: a counter on rank 0.
    Counter(Trust<u64>),
    /// Transfers: member `m`'s accounts, on member `m`.
    Bank(Vec<Trust<Vec<u64>>>),
}

/// What every member of one command is told.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct Job {
    ranks: Vec<u32>,
    /// The prefix of the objects' names (the `objects` design).
    name: String,
    fibers: u64,
    /// 1: the one-lock counter; more: transfers between this many accounts.
    accounts: u64,
    window: Duration,
    /// `None`: the `objects` design.
    delegated: Option<Delegated>,
}

/// One member's result: operations counted in the window, the window's seconds (to the last
/// operation's end), operations done in all (warm-up too), and what this member holds at the end (the
/// counter on member 0; its accounts' sum). The delegated design's holdings are read by rank 0.
type Part = Result<(u64, f64, u64, u64), String>;

/// Runs one `obj-lock` or `obj-transfer` command; the answer's words after `ok`.
pub(crate) fn command(words: &[&str], name: String) -> anyhow::Result<String> {
    let ms = |w: &str| -> anyhow::Result<Duration> { Ok(Duration::from_millis(w.parse()?)) };
    let (design, fibers, accounts, window) = match words {
        ["obj-lock", design, fibers, window] => (*design, fibers.parse()?, 1, ms(window)?),
        ["obj-transfer", design, fibers, accounts, window] => {
            (*design, fibers.parse()?, accounts.parse()?, ms(window)?)
        }
        _ => bail!("unknown objects command `{}`", words.join(" ")),
    };
    ensure!(fibers >= 1, "{}: at least one fiber", words[0]);
    ensure!(
        words[0] == "obj-lock" || accounts >= 2,
        "obj-transfer: at least 2 accounts"
    );
    let ranks: Vec<u32> = gossamer::nodes().map(|n| n.rank()).collect();
    let nodes: Vec<Node> = gossamer::nodes().collect();
    let n = nodes.len() as u64;
    let delegated = match design {
        "objects" => None,
        "delegated" if accounts == 1 => Some(Delegated::Counter(nodes[0].entrust(0u64))),
        "delegated" => Some(Delegated::Bank(
            nodes
                .iter()
                .enumerate()
                .map(|(m, node)| {
                    let mine = (accounts + n - 1 - m as u64) / n;
                    node.entrust_with(|len| vec![START; len as usize], mine)
                })
                .collect(),
        )),
        _ => bail!("{}: unknown design `{design}`", words[0]),
    };
    let job = Job {
        ranks,
        name,
        fibers,
        accounts,
        window,
        delegated: delegated.clone(),
    };
    let parts = on_each(part, &job, &job.ranks)?;
    let counted: u64 = parts.iter().map(|p| p.0).sum();
    let secs = parts.iter().map(|p| p.1).fold(0.0, f64::max);
    let done: u64 = parts.iter().map(|p| p.2).sum();
    match &delegated {
        None if accounts == 1 => ensure!(
            parts[0].3 == done,
            "the counter holds {}, {done} increments were made",
            parts[0].3
        ),
        Some(Delegated::Counter(c)) => {
            let held = c.apply(|c| *c);
            ensure!(
                held == done,
                "the counter holds {held}, {done} increments were made"
            );
        }
        None => {
            let total: u64 = parts.iter().map(|p| p.3).sum();
            ensure!(
                total == accounts * START,
                "the balances add up to {total}, not {}",
                accounts * START
            );
        }
        Some(Delegated::Bank(bank)) => {
            let total: u64 = bank
                .iter()
                .map(|b| b.apply(|b| b.iter().sum::<u64>()))
                .sum();
            ensure!(
                total == accounts * START,
                "the balances add up to {total}, not {}",
                accounts * START
            );
        }
    }
    let slowest = parts.iter().map(|p| p.0).min().unwrap_or(0);
    Ok(format!("{counted} {secs} {slowest}"))
}

/// Accounts (or the one counter) spread over the members: account `a` is word `a / N` of
/// member `a % N`'s region.
struct Accounts {
    balances: Regions<Rack>,
}

impl Object for Accounts {
    /// How many accounts.
    type Params = u64;

    fn declare(d: &mut ::objects::Declare, accounts: &u64) {
        let per_member = accounts.div_ceil(d.members() as u64) as usize;
        d.region("balances", per_member, On::EachMember);
    }

    fn build(parts: Parts<Rack>, _: &u64) -> Result<Self, OpenError> {
        Ok(Accounts {
            balances: parts.region("balances"),
        })
    }
}

impl Accounts {
    /// Account `a`'s member and word.
    fn at(&self, a: u64) -> (usize, usize) {
        let n = self.balances.members() as u64;
        ((a % n) as usize, (a / n) as usize)
    }

    fn get(&self, a: u64) -> Result<u64, String> {
        let (m, i) = self.at(a);
        if m == self.balances.me() {
            return Ok(self.balances.load(i));
        }
        Ok(self.balances.get(m, i, 1).map_err(err)?[0])
    }

    /// Sets account `a`; landed by the next fence (a lock's release).
    fn put(&self, a: u64, v: u64) {
        let (m, i) = self.at(a);
        if m == self.balances.me() {
            self.balances.store(i, v);
        } else {
            self.balances.put(m, i, &[v], &Work::new());
        }
    }
}

/// What a member's fibers drive: one of the four (design, measurement) pairs.
enum Design {
    /// `objects`, one lock: the counter (account 0) under a `Mutex`.
    Counter(Accounts, Mutex),
    /// `objects`, transfers: the accounts under a `LockArray`.
    Bank(Accounts, LockArray),
    /// `delegated`, either measurement.
    Delegated(Delegated),
}

/// What a member's fibers share.
struct Shared {
    /// Accounts in all (1: the counter).
    accounts: u64,
    me: u64,
    design: Design,
}

/// One member's part: its fibers' loops, then its holdings.
fn part(job: Job) -> Part {
    let nodes = members(&job.ranks);
    let n = nodes.len() as u64;
    let me = job
        .ranks
        .iter()
        .position(|&r| r == gossamer::this_node().rank())
        .ok_or("not a member")? as u64;
    // The `objects` design's barrier: fenced, so every member's writes have landed.
    let mut barrier = None;
    let design = match job.delegated {
        Some(d) => Design::Delegated(d),
        None => {
            let name = &job.name;
            let accounts =
                ::objects::open::<Accounts>(&format!("{name}/accounts"), &job.accounts, &nodes)
                    .map_err(err)?;
            barrier = Some(
                ::objects::open::<Barrier>(&format!("{name}/barrier"), &(), &nodes).map_err(err)?,
            );
            if job.accounts == 1 {
                let lock =
                    ::objects::open::<Mutex>(&format!("{name}/lock"), &0, &nodes).map_err(err)?;
                Design::Counter(accounts, lock)
            } else {
                for i in 0..job.accounts.div_ceil(n) as usize {
                    // Words past the last account stay 0.
                    if (i as u64) * n + me < job.accounts {
                        accounts.balances.store(i, START);
                    }
                }
                let len = (LOCKS_PER_MEMBER * n) as usize;
                let locks = ::objects::open::<LockArray>(&format!("{name}/locks"), &len, &nodes)
                    .map_err(err)?;
                Design::Bank(accounts, locks)
            }
        }
    };
    if let Some(b) = &mut barrier {
        b.wait().map_err(err)?;
    }
    let shared = Arc::new(Shared {
        accounts: job.accounts,
        me,
        design,
    });
    let window = Window::after_warm_up(job.window);
    let fibers: Vec<_> = (0..job.fibers)
        .map(|f| {
            let shared = shared.clone();
            gossamer::spawn(move || {
                let mut rng = (shared.me * 1000 + f + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let mut done = 0u64;
                let (counted, end) = window.run(|| {
                    done += 1;
                    operation(&shared, &mut rng)
                })?;
                Ok::<_, String>((counted, end, done))
            })
        })
        .collect();
    let mut out = (0, 0.0, 0, 0);
    let mut end = window.until;
    for f in fibers {
        let (counted, last, done) = f.join()?;
        out.0 += counted;
        out.2 += done;
        end = end.max(last);
    }
    out.1 = window.seconds_to(end);
    if let (Some(b), Design::Counter(accounts, _) | Design::Bank(accounts, _)) =
        (&mut barrier, &shared.design)
    {
        // Every member's writes have landed (the barrier fences).
        b.wait().map_err(err)?;
        let per_member = job.accounts.div_ceil(n) as usize;
        out.3 = (0..per_member).map(|i| accounts.balances.load(i)).sum();
        // Nobody closes the objects while another member still reads.
        b.wait().map_err(err)?;
    }
    Ok(out)
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// One increment or transfer.
fn operation(shared: &Shared, rng: &mut u64) -> Result<(), String> {
    let accounts = shared.accounts;
    let mut transfer = || {
        let (x, y) = (next(rng), next(rng));
        let a = x % accounts;
        let mut b = y % accounts;
        if a == b {
            b = (b + 1) % accounts;
        }
        (a, b, 1 + (y >> 40) % 50)
    };
    match &shared.design {
        Design::Counter(acc, lock) => {
            let guard = lock.lock().map_err(err)?;
            let v = acc.get(0)?;
            acc.put(0, v + 1);
            guard.unlock().map_err(err)
        }
        Design::Delegated(Delegated::Counter(c)) => {
            c.apply_with(|c, ()| *c += 1, ());
            Ok(())
        }
        Design::Bank(acc, locks) => {
            let (a, b, amount) = transfer();
            let n = acc.balances.members() as u64;
            let lock_of = |a: u64| (((a / n) % LOCKS_PER_MEMBER) * n + a % n) as usize;
            let (la, lb) = (lock_of(a), lock_of(b));
            let first = locks.lock(la.min(lb)).map_err(err)?;
            let second = if la == lb {
                None
            } else {
                Some(locks.lock(la.max(lb)).map_err(err)?)
            };
            let (va, vb) = (acc.get(a)?, acc.get(b)?);
            if va >= amount {
                acc.put(a, va - amount);
                acc.put(b, vb + amount);
            }
            if let Some(second) = second {
                second.unlock().map_err(err)?;
            }
            first.unlock().map_err(err)
        }
        Design::Delegated(Delegated::Bank(bank)) => {
            let (a, b, amount) = transfer();
            let n = bank.len() as u64;
            let (ma, ja) = ((a % n) as usize, (a / n) as usize);
            let (mb, jb) = ((b % n) as usize, (b / n) as usize);
            let taken = bank[ma].apply_with(
                |b, (j, amount): (usize, u64)| {
                    let ok = b[j] >= amount;
                    if ok {
                        b[j] -= amount;
                    }
                    ok
                },
                (ja, amount),
            );
            if taken {
                bank[mb].apply_with(|b, (j, amount): (usize, u64)| b[j] += amount, (jb, amount));
            }
            Ok(())
        }
    }
}

/// `Wire` is what `spawn_on` sends; asserted here so a change of `Job` fails to compile here.
const _: fn() = || {
    fn wire<T: Wire>() {}
    wire::<Job>();
    wire::<Part>();
};
