//! Durable properties across the processes of a rack: calls from any rank to a property on
//! any other, handles that travel in calls and in durable state, and state that a second job
//! with the same `GSM_STATE_DIR` and `GSM_JOB_NAME` reopens.
//!
//! Its own test driver (`harness = false`), like `rack.rs`: without `GSM_RANK` it starts jobs
//! of itself; with it, it is one rank playing `RACK_SCENARIO`.

use std::process::Child;
use std::time::{Duration, Instant};

use gossamer::durable::{Blob, BlobError, CallError, Cx, Durable, Op, Session, WINDOW};
use gossamer::{JoinError, Rack};
use serde::{Deserialize, Serialize};

mod common;

use common::job::{Job, finish, free_port, rank, start};

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
        &[
            (
                "calls_across_ranks_survive_the_job",
                calls_across_ranks_survive_the_job,
            ),
            (
                "a_handle_from_before_a_restart_reaches_the_next_life",
                a_handle_from_before_a_restart_reaches_the_next_life,
            ),
            (
                "a_rank_that_stays_down_gives_errors_not_panics_or_hangs",
                a_rank_that_stays_down_gives_errors_not_panics_or_hangs,
            ),
            (
                "a_blob_larger_than_a_message_travels_in_pieces",
                a_blob_larger_than_a_message_travels_in_pieces,
            ),
        ],
    )
}

fn play(scenario: &str) {
    match scenario {
        "first" => first(),
        "second" => second(),
        "restarted" => restarted(),
        "down" => down(),
        "pieces" => pieces(),
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

/// Under `GSM_MAX_MESSAGE=64KiB`, blobs several times larger cross ranks both ways, whole.
fn pieces() {
    let other = gossamer::nodes().nth(1).unwrap();
    let archive = other.durable("archive", Archive::default).expect("archive");
    let session = Session::open("driver").expect("a session");
    let passed = session
        .blob(&blob_bytes(300_000))
        .expect("a blob of 300,000 bytes");
    let ingested = session.call(&archive, Ingest(passed.clone()));
    assert_eq!(ingested, Ok(Ok(sum(&blob_bytes(300_000)))));
    let read_there = gossamer::spawn_on(
        other,
        |b: Blob| b.read().expect("fetched") == blob_bytes(300_000),
        passed,
    )
    .join();
    assert!(read_there, "rank 1 read other bytes");
    let made = session.call(&archive, Make(200_000)).expect("a made blob");
    assert_eq!(made.read().expect("its bytes"), blob_bytes(200_000));
    println!("pieces ok");
}

fn a_blob_larger_than_a_message_travels_in_pieces() {
    let dir = tempfile::tempdir().expect("a state directory");
    let settings = [
        ("GSM_STATE_DIR", dir.path().to_string_lossy().into_owned()),
        ("GSM_JOB_NAME", "pieces".to_string()),
        ("GSM_MAX_MESSAGE", "64KiB".to_string()),
    ];
    let results = finish(start(2, "pieces", &settings), Duration::from_secs(60));
    common::all_succeed(&results, "pieces ok");
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

/// Rank 1 of 2 ends itself; [`recovering_job`] restarts it or not. What rank 0 saw of it:
/// the fiber that ended it, lost (not a panic).
fn end_rank_1() {
    let one = gossamer::nodes().nth(1).unwrap();
    let ended = gossamer::spawn_on(one, |()| -> u8 { std::process::exit(3) }, ()).try_join();
    assert!(
        matches!(ended, Err(JoinError::Lost { rank: 1, .. })),
        "the fiber that ended rank 1: {ended:?}"
    );
}

/// Rank 0 (of 2, recovering lost ranks): a handle to a property of rank 1 taken in its first
/// life, passed in a `spawn_on` argument to its next life, finds the property there.
fn restarted() {
    let one = gossamer::nodes().nth(1).unwrap();
    let carol = one.durable("carol", Account::default).expect("carol");
    assert_eq!(carol.call(Deposit(1)), Ok(1));
    end_rank_1();
    let deadline = Instant::now() + Duration::from_secs(60);
    let life = loop {
        match gossamer::spawn_on(one, |()| std::env::var("GSM_INCARNATION").ok(), ()).try_join() {
            Ok(life) => break life,
            Err(JoinError::Lost { .. }) if Instant::now() < deadline => {
                gossamer::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("rank 1's next life did not answer within 60 s: {e}"),
        }
    };
    assert_eq!(life.as_deref(), Some("1"), "rank 1's next life");
    let deposited = gossamer::spawn_on(
        one,
        |carol: Durable<Account>| carol.call(Deposit(10)),
        carol.clone(),
    )
    .try_join();
    assert_eq!(
        deposited,
        Ok(Ok(11)),
        "through the handle of the earlier life"
    );
    assert_eq!(carol.read(|c| c.balance), Ok(11));
    println!("restarted ok");
}

/// Rank 0 (of 2, recovering lost ranks, `GSM_RECOVERY_TIMEOUT` 1 s): rank 1 ends and is not
/// restarted. Reads fail with `Unavailable` instead of panicking; a session's failed call
/// holds its window, and a call a window past it fails instead of waiting forever.
fn down() {
    let one = gossamer::nodes().nth(1).unwrap();
    let dave = one.durable("dave", Account::default).expect("dave");
    let erin = gossamer::this_node()
        .durable("erin", Account::default)
        .expect("erin");
    let session = std::sync::Arc::new(Session::open("driver").expect("a session"));
    assert_eq!(session.call(&dave, Deposit(1)), Ok(1));
    end_rank_1();
    let unavailable = |what: &str, r: Result<i64, CallError>| {
        assert!(
            matches!(r, Err(CallError::Unavailable { rank: 1, .. })),
            "{what}: {r:?}"
        );
    };
    unavailable("read", dave.read(|d| d.balance));
    unavailable("read_with", dave.read_with(|d, k: i64| d.balance + k, 1));
    let in_flight = dave.calls_in_flight().map(|n| n as i64);
    unavailable("calls_in_flight", in_flight);
    unavailable("a session's call", session.call(&dave, Deposit(5)));
    let unsettled = session.pending()[0].seq();
    for _ in 1..WINDOW {
        session.call(&erin, Deposit(1)).expect("within the window");
    }
    let (s, e) = (session.clone(), erin.clone());
    let past = gossamer::spawn(move || s.call(&e, Deposit(1)));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !past.is_finished() {
        assert!(
            Instant::now() < deadline,
            "the session's call a window past its failed call {unsettled} still waits after 60 s"
        );
        gossamer::sleep(Duration::from_millis(10));
    }
    let held = past.join();
    assert_eq!(
        held,
        Err(CallError::Unsettled {
            seq: unsettled,
            property: "dave".into()
        })
    );
    assert_eq!(erin.read(|e| e.balance), Ok(WINDOW as i64 - 1));
    println!("down ok");
}

/// Runs `scenario` on 2 ranks that recover lost ranks (this test in the role of `gsm run
/// --recover`): rank 1's first life ends with status 3, and with `restart` it is started again
/// as incarnation 1.
fn recovering_job(scenario: &str, restart: bool, extra: &[(&str, &str)]) {
    let dir = tempfile::tempdir().expect("a state directory");
    let coord = format!("127.0.0.1:{}", free_port());
    let job = format!("{}", std::process::id() as u64 * 1000 + 2);
    let life = |r: usize, incarnation: u32| -> Child {
        let mut cmd = rank(scenario, r, 2, &coord, &job, "test-secret");
        cmd.env("GSM_RECOVER", "1")
            .env("GSM_TRANSPORT", "tcp")
            .env("GSM_INCARNATION", incarnation.to_string())
            .env("GSM_STATE_DIR", dir.path())
            .env("GSM_JOB_NAME", scenario)
            .env("GSM_DURABILITY", "os");
        for (k, v) in extra {
            cmd.env(k, v);
        }
        cmd.spawn().expect("start a rank")
    };
    let mut children = vec![life(0, 0), life(1, 0)];
    let first = children.pop().expect("rank 1");
    let (status, _, stderr) = common::finish(vec![first], Duration::from_secs(60), "rank 1")
        .pop()
        .expect("rank 1's result");
    assert_eq!(status.code(), Some(3), "rank 1's first life: {stderr}");
    if restart {
        children.push(life(1, 1));
    }
    let results = finish(Job { children }, Duration::from_secs(120));
    common::all_succeed(&results, &format!("{scenario} ok"));
}

fn a_handle_from_before_a_restart_reaches_the_next_life() {
    recovering_job("restarted", true, &[]);
}

fn a_rank_that_stays_down_gives_errors_not_panics_or_hangs() {
    recovering_job("down", false, &[("GSM_RECOVERY_TIMEOUT", "1s")]);
}
