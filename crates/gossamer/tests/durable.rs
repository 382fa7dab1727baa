//! Durable properties across the processes of a rack: calls from any rank to a property on
//! any other, handles that travel in calls and in durable state, and state that a second job
//! with the same `GSM_STATE_DIR` and `GSM_JOB_NAME` reopens.
//!
//! Its own test driver (`harness = false`), like `rack.rs`: without `GSM_RANK` it starts jobs
//! of itself; with it, it is one rank playing `RACK_SCENARIO`.

use std::time::Duration;

use gossamer::Rack;
use gossamer::durable::{Blob, BlobError, Cx, Durable, Op, Session};
use serde::{Deserialize, Serialize};

mod common;

use common::job::{finish, start};

#[derive(Serialize, Deserialize, Default)]
struct Account {
    balance: i64,
}

#[derive(Serialize, Deserialize)]
struct Deposit(i64);

impl Op<Account> for Deposit {
    const NAME: &'static str = "account.deposit";
    type Output = i64;
    fn apply(self, a: &mut Account, _: &mut Cx<Account>) -> i64 {
        a.balance += self.0;
        a.balance
    }
}

/// Handles kept in durable state: after a restart they are (rank, name) and are found again.
#[derive(Serialize, Deserialize, Default)]
struct Directory {
    accounts: Vec<Durable<Account>>,
}

#[derive(Serialize, Deserialize)]
struct Register(Durable<Account>);

impl Op<Directory> for Register {
    const NAME: &'static str = "directory.register";
    type Output = usize;
    fn apply(self, d: &mut Directory, _: &mut Cx<Directory>) -> usize {
        d.accounts.push(self.0);
        d.accounts.len()
    }
}

/// Sums of the blobs it was passed, and their handles (blobs kept in durable state).
#[derive(Serialize, Deserialize, Default)]
struct Archive {
    sums: Vec<u64>,
    passed: Vec<Blob>,
}

#[derive(Serialize, Deserialize)]
struct Ingest(Blob);

impl Op<Archive> for Ingest {
    const NAME: &'static str = "archive.ingest";
    type Output = Result<u64, BlobError>;
    fn apply(self, a: &mut Archive, cx: &mut Cx<Archive>) -> Result<u64, BlobError> {
        let sum = cx.read(&self.0)?.iter().map(|&b| u64::from(b)).sum();
        a.sums.push(sum);
        a.passed.push(self.0);
        Ok(sum)
    }
}

/// Makes a blob of the bytes `blob_bytes(n)` and returns it.
#[derive(Serialize, Deserialize)]
struct Make(usize);

impl Op<Archive> for Make {
    const NAME: &'static str = "archive.make";
    type Output = Blob;
    fn apply(self, _: &mut Archive, cx: &mut Cx<Archive>) -> Blob {
        cx.blob(&blob_bytes(self.0))
    }
}

gossamer::durable_ops!(Account: Deposit);
gossamer::durable_ops!(Directory: Register);
gossamer::durable_ops!(Archive: Ingest, Make);

/// `n` bytes of a pattern, large enough to travel in chunks.
fn blob_bytes(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 253) as u8).collect()
}

fn sum(bytes: &[u8]) -> u64 {
    bytes.iter().map(|&b| u64::from(b)).sum()
}

fn main() -> std::process::ExitCode {
    if let Ok(scenario) = std::env::var("RACK_SCENARIO") {
        return Rack::from_env().run(move || play(&scenario));
    }
    common::run_all(
        "durable",
        &[(
            "calls_across_ranks_survive_the_job",
            calls_across_ranks_survive_the_job,
        )],
    )
}

fn play(scenario: &str) {
    match scenario {
        "first" => first(),
        "second" => second(),
        other => panic!("unknown scenario {other}"),
    }
}

/// Opens an account on every rank and a directory on rank 0, deposits from rank 0 and from
/// fibers on the other ranks, with handles that travel in calls.
fn first() {
    let nodes: Vec<_> = gossamer::nodes().collect();
    let directory = nodes[0]
        .durable("directory", Directory::default)
        .expect("open the directory");
    for (i, node) in nodes.iter().enumerate() {
        let account = node
            .durable(&format!("account-{i}"), Account::default)
            .expect("open an account");
        assert_eq!(account.call(Deposit(10)), Ok(10));
        assert_eq!(directory.call(Register(account)), Ok(i + 1));
    }
    // Every rank deposits 1 into every account, through handles it got in a call.
    let accounts = directory.read(|d| d.accounts.clone()).unwrap();
    let joins: Vec<_> = nodes
        .iter()
        .map(|&n| {
            gossamer::spawn_on(
                n,
                |accounts: Vec<Durable<Account>>| {
                    for a in &accounts {
                        a.call(Deposit(1)).expect("a deposit from another rank");
                    }
                },
                accounts.clone(),
            )
        })
        .collect();
    joins.into_iter().for_each(|j| j.join());
    for a in &accounts {
        assert_eq!(
            a.read(|a| a.balance).unwrap(),
            10 + nodes.len() as i64,
            "{a:?}"
        );
    }
    // A session here passes a blob by reference to a property on the last rank, which
    // fetches it; that property makes one and returns it, which hands it to the session.
    let archive = nodes
        .last()
        .unwrap()
        .durable("archive", Archive::default)
        .expect("archive");
    let session = Session::open("driver").expect("a session");
    let passed = session.blob(&blob_bytes(300_000)).expect("a blob");
    let ingested = session.call(&archive, Ingest(passed.clone()));
    assert_eq!(ingested, Ok(Ok(sum(&blob_bytes(300_000)))));
    let made = session.call(&archive, Make(70_000)).expect("a made blob");
    assert_eq!(made.read().expect("its bytes"), blob_bytes(70_000));
    session
        .free(&made)
        .expect("the session controls the returned blob");
    println!("first ok");
}

/// A new job on the same state: the directory's handles, stored as (rank, name), reach the
/// accounts again, by blocking calls and by `call_then` from delegated context.
fn second() {
    let nodes: Vec<_> = gossamer::nodes().collect();
    let expected = 10 + nodes.len() as i64;
    let directory = nodes[0]
        .durable("directory", Directory::default)
        .expect("reopen the directory");
    let accounts = directory.read(|d| d.accounts.clone()).unwrap();
    assert_eq!(accounts.len(), nodes.len());
    for a in &accounts {
        assert_eq!(a.read(|a| a.balance).unwrap(), expected, "{a:?}");
    }
    // From rank 1, a handle read out of durable state, never resolved there: `call_then`
    // finds it without blocking.
    let last = *nodes.last().unwrap();
    let got = gossamer::spawn_on(
        last,
        |directory: Durable<Directory>| {
            let accounts = directory.read(|d| d.accounts.clone()).unwrap();
            let done = gossamer::entrust(0usize);
            let n = accounts.len();
            for a in accounts {
                let done = done.clone();
                a.call_then(Deposit(100), move |r| {
                    r.expect("a deposit");
                    done.local().unwrap().apply_then(|d| *d += 1, |_: ()| {});
                });
            }
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while done.apply(|d| *d) < n {
                assert!(
                    std::time::Instant::now() < deadline,
                    "waited 30 s for the deposits' answers"
                );
                gossamer::yield_now();
            }
            n
        },
        directory.clone(),
    )
    .join();
    assert_eq!(got, nodes.len());
    for a in &accounts {
        assert_eq!(a.read(|a| a.balance).unwrap(), expected + 100, "{a:?}");
    }
    // The archive replays its ingest, fetching the blob from this rank again; the blob is
    // still leased, since no snapshot of the archive covers that call yet.
    let archive: Durable<Archive> = nodes
        .last()
        .unwrap()
        .durable("archive", Archive::default)
        .expect("archive");
    assert_eq!(
        archive.read(|a| a.sums.clone()).unwrap(),
        vec![sum(&blob_bytes(300_000))]
    );
    let session = Session::open("driver").expect("the session");
    let passed = archive.read(|a| a.passed[0].clone()).unwrap();
    assert_eq!(passed.read().expect("its bytes"), blob_bytes(300_000));
    let leased = session.free(&passed).expect_err("leased");
    assert!(
        matches!(leased, BlobError::Leased { leases: 1, .. }),
        "{leased}"
    );
    println!("second ok");
}

fn calls_across_ranks_survive_the_job() {
    let dir = tempfile::tempdir().expect("a state directory");
    let settings = [
        ("GSM_STATE_DIR", dir.path().to_string_lossy().into_owned()),
        ("GSM_JOB_NAME", "ledger".to_string()),
        ("GSM_DURABILITY", "sync".to_string()),
    ];
    for (scenario, says) in [("first", "first ok"), ("second", "second ok")] {
        let results = finish(start(3, scenario, &settings), Duration::from_secs(60));
        let all: String = results.iter().map(|r| r.2.clone()).collect();
        for (rank, (status, stdout, _)) in results.iter().enumerate() {
            assert!(
                status.success(),
                "{scenario}: rank {rank} {status}; stderr:\n{all}"
            );
            if rank == 0 {
                assert!(stdout.contains(says), "{scenario}: {stdout}");
            }
        }
    }
    for rank in 0..3 {
        let log = dir.path().join(format!("ledger/rank-{rank}/log"));
        let segments = std::fs::read_dir(&log).map_or(0, |d| d.count());
        assert!(segments > 0, "{} holds no segment", log.display());
    }
}
