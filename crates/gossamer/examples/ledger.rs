//! A ledger whose deposits take effect exactly once, even when a rank is killed midway.
//!
//! ```sh
//! cargo build -p gsm && cargo build -p gossamer --example ledger
//! export GSM_STATE_DIR=$(mktemp -d)
//! target/debug/gsm run -n 3 --recover -- target/debug/examples/ledger 20000 &
//! sleep 1; kill -9 $(pgrep -f '^target/debug/examples/ledger' | tail -1)   # a rank other than 0
//! wait   # gsm restarts that rank and the job finishes the work in one go
//! ```
//!
//! Without `--recover`, killing a rank ends the job; run it again and it finishes the work.
//!
//! Rank 0 is the teller: a session that deposits ids `0..N` into accounts on the other
//! ranks. Each account records the ids it applied and counts any id applied twice. A run
//! first resumes what a killed run left pending, then deposits the ids no account has.

use std::collections::BTreeSet;

use gossamer::durable::{Cx, Durable, Op, Session};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Default)]
struct Account {
    applied: BTreeSet<u64>,
    twice: u64,
}

#[derive(Serialize, Deserialize)]
struct Deposit(u64);

impl Op<Account> for Deposit {
    const NAME: &'static str = "ledger.deposit";
    type Output = usize;
    fn apply(self, a: &mut Account, _: &mut Cx<Account>) -> usize {
        if !a.applied.insert(self.0) {
            a.twice += 1;
        }
        a.applied.len()
    }
}

gossamer::durable_ops!(Account: Deposit);

fn main() -> std::process::ExitCode {
    let n: u64 = std::env::args()
        .nth(1)
        .map_or(1000, |a| a.parse().expect("the number of deposits"));
    gossamer::Rack::from_env().run(move || {
        let nodes: Vec<_> = gossamer::nodes().collect();
        let homes = if nodes.len() > 1 {
            &nodes[1..]
        } else {
            &nodes[..]
        };
        let accounts: Vec<Durable<Account>> = (0..4)
            .map(|i| {
                homes[i % homes.len()]
                    .durable(&format!("account-{i}"), Account::default)
                    .expect("open an account")
            })
            .collect();
        let teller = Session::open("teller").expect("open the session");
        let resumed = teller.resume().expect("resume").len();
        let done: BTreeSet<u64> = accounts
            .iter()
            .flat_map(|a| a.read(|a| a.applied.clone()).unwrap())
            .collect();
        let mut made = 0;
        for id in (0..n).filter(|id| !done.contains(id)) {
            let account = &accounts[(id % 4) as usize];
            teller.call(account, Deposit(id)).expect("a deposit");
            made += 1;
        }
        let applied: usize = accounts
            .iter()
            .map(|a| a.read(|a| a.applied.len()).unwrap())
            .sum();
        let twice: u64 = accounts.iter().map(|a| a.read(|a| a.twice).unwrap()).sum();
        println!(
            "{applied} of {n} deposits applied ({made} made now, {resumed} resumed from a \
             killed run); applied twice: {twice}"
        );
        assert_eq!((applied as u64, twice), (n, 0), "exactly once");
    })
}
