//! Exactly once across crashes: a ledger of deposits made by a session, with one rank killed
//! at each crash point of the durable path, and the job run again until the work is done.
//!
//! Needs gossamer's `crashpoints` feature (`cargo test -p gossamer --features crashpoints
//! --test crash_ledger`, with `GSM_BIN` naming a gsm executable; `scripts/test.sh` runs it).
//!
//! The job: rank 0 drives a [`Session`] making `DEPOSITS` calls, each with its own id, into
//! accounts on ranks 1 and 2: deposits into the checking accounts, and every third call a
//! transfer between savings accounts, which withdraws and then deposits through `Cx::call`
//! (the source's continuation notes it sent). Every fourth deposit carries a memo, a blob
//! the session made, which the account leases, fetches and checks byte for byte before it
//! applies the deposit (and again on every replay). Beside the session, the driver keeps an independent ledger, a
//! file it flushes (`fdatasync`) before each call ("intent") and after its answer ("done").
//! One run has `GSM_CRASH=point:n` on one rank, which kills itself there; fate sharing ends
//! the job. Then the job runs again, without crashing, until the driver has done everything
//! — the way a rerun reopens durable state (a supervisor restarting one rank comes with
//! `gsm run --recover`). The check, offline from the files and in a last job: every id was
//! applied exactly once, to its account; each account's balance is the sum of its
//! deposits; every answer the ledger recorded is the balance right after that deposit; and
//! the session has nothing pending.
//!
//! Under `gsm run --recover` (`GSM_BIN`), one job goes on across the crashes of ranks 1 and 2:
//! at each server-side point, at random kills, at a stopped rank, at a rank down past
//! `GSM_RECOVERY_TIMEOUT`, and across three hosts (network namespaces, see `common/netns.rs`)
//! whose cables are cut for less and for more than `GSM_PEER_TIMEOUT`. And under
//! `gsm run --hosts --recover --shared-state`, with a `gsm daemon` on each of three hosts:
//! ranks killed on every host, a host cut off past the peer timeout (its ranks move), a daemon
//! killed (its ranks move) and started again. The multi-host tests need root, and skip loudly
//! without it unless `GSM_REQUIRE_NETNS=1`.
//!
//! Beside the ledger: a rank killed at `leased`, after a thread's call leased a blob and
//! before it ran, leaves a lease that a free in the next job drops (nothing needs it).

use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use gossamer::Rack;
use gossamer::durable::{Blob, CallError, Cx, Durable, Op, Session, Then};
use serde::{Deserialize, Serialize};

mod common;
// Only the tests that make hosts take this module (it needs `libc`).
#[path = "common/netns.rs"]
mod netns;

use netns::Net;

const DEPOSITS: u64 = 40;
/// Checking accounts 0..3 take deposits; savings accounts 3..6 only transfers among them.
const ACCOUNTS: u64 = 6;
const CHECKING: u64 = 3;

#[derive(Serialize, Deserialize, Default)]
struct Account {
    balance: i64,
    /// The ids of the deposits (and transfers in) applied, in order.
    applied: Vec<u64>,
    /// The ids of the transfers out withdrawn, and of those whose deposit was answered.
    withdrawn: Vec<u64>,
    sent: Vec<u64>,
}

/// Withdraws `amount` and deposits it in `to`.
#[derive(Serialize, Deserialize)]
struct Transfer {
    id: u64,
    amount: i64,
    to: Durable<Account>,
}

impl Op<Account> for Transfer {
    const NAME: &'static str = "ledger.transfer";
    type Output = i64;
    fn apply(self, a: &mut Account, cx: &mut Cx<Account>) -> i64 {
        a.balance -= self.amount;
        a.withdrawn.push(self.id);
        let deposit = Deposit {
            id: self.id,
            amount: self.amount,
            memo: None,
        };
        cx.call(&self.to, deposit, Sent { id: self.id });
        a.balance
    }
}

/// A transfer's deposit was answered.
#[derive(Serialize, Deserialize)]
struct Sent {
    id: u64,
}

impl Then<Account> for Sent {
    const NAME: &'static str = "ledger.sent";
    type Input = i64;
    fn then(self, a: &mut Account, outcome: Result<i64, CallError>, _: &mut Cx<Account>) {
        outcome.expect("a transfer's deposit");
        a.sent.push(self.id);
    }
}

#[derive(Serialize, Deserialize)]
struct Deposit {
    id: u64,
    amount: i64,
    /// A blob of `memo_bytes(id)`, passed by reference.
    memo: Option<Blob>,
}

impl Op<Account> for Deposit {
    const NAME: &'static str = "ledger.deposit";
    type Output = i64;
    fn apply(self, a: &mut Account, cx: &mut Cx<Account>) -> i64 {
        if let Some(memo) = &self.memo {
            let bytes = cx.read(memo).expect("a memo the call carried");
            assert!(
                bytes == memo_bytes(self.id),
                "deposit {}: its memo's bytes differ",
                self.id
            );
        }
        a.balance += self.amount;
        a.applied.push(self.id);
        a.balance
    }
}

gossamer::durable_ops!(Account: Deposit, Transfer; then Sent);

/// The calls the driver makes: `LEDGER_CALLS`, else `DEPOSITS` (it stops early when the file
/// `LEDGER_STOP` names exists).
fn calls() -> u64 {
    std::env::var("LEDGER_CALLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(DEPOSITS)
}

/// The bytes of deposit `id`'s memo, if it has one: a few KiB, different for each.
fn memo_bytes(id: u64) -> Vec<u8> {
    (0..4096 + id as usize)
        .map(|i| (i as u64 * 31 + id) as u8)
        .collect()
}

fn has_memo(id: u64) -> bool {
    id.is_multiple_of(4)
}

fn amount(id: u64) -> i64 {
    id as i64 + 1
}

fn is_transfer(id: u64) -> bool {
    id % 3 == 2
}

/// The account a call goes to: a deposit's checking account, a transfer's source.
fn account_of(id: u64) -> u64 {
    if is_transfer(id) {
        CHECKING + (id / 3) % (ACCOUNTS - CHECKING)
    } else {
        id % CHECKING
    }
}

/// A transfer's destination.
fn destination_of(id: u64) -> u64 {
    CHECKING + (id / 3 + 1) % (ACCOUNTS - CHECKING)
}

fn main() -> std::process::ExitCode {
    if let Ok(scenario) = std::env::var("RACK_SCENARIO") {
        // The first restarted life takes its time to come back (`unavailable`).
        let first_restart = std::env::var("GSM_INCARNATION").is_ok_and(|i| i == "1");
        if let (true, Ok(ms)) = (first_restart, std::env::var("LEDGER_STALL_MS")) {
            std::thread::sleep(Duration::from_millis(ms.parse().expect("LEDGER_STALL_MS")));
        }
        // For the random killer: which process is this rank now.
        if let (Ok(dir), Ok(rank)) = (std::env::var("LEDGER_PIDS"), std::env::var("GSM_RANK")) {
            let pid = std::process::id().to_string();
            std::fs::write(Path::new(&dir).join(format!("rank-{rank}")), pid).expect("pid file");
        }
        return Rack::from_env().run(move || play(&scenario));
    }
    common::run_all(
        "crash_ledger",
        &[
            ("every_point_sync", || every_point("sync")),
            ("every_point_os", || every_point("os")),
            ("recovered_os", || recovered("os")),
            ("recovered_sync", || recovered("sync")),
            ("random_kills_os", || random_kills("os", 44)),
            ("random_kills_sync", || random_kills("sync", 20)),
            ("stopped_rank_is_fenced", stopped_rank_is_fenced),
            ("unavailable_then_resumed", unavailable_then_resumed),
            ("across_3_hosts_with_cut_cables", across_hosts),
            ("across_3_daemons_recovering", across_daemons),
            ("regions_of_a_lost_life_fail", regions_of_a_lost_life),
            (
                "a_lease_whose_call_never_ran_is_dropped_by_a_free",
                a_lease_whose_call_never_ran_is_dropped_by_a_free,
            ),
            (
                "a_handle_lost_on_its_way_is_released",
                a_handle_lost_on_its_way_is_released,
            ),
            (
                "a_blob_file_whose_making_was_not_logged_goes_at_open",
                a_blob_file_whose_making_was_not_logged_goes_at_open,
            ),
        ],
    )
}

/// The crash points with the rank that passes them, the pass to crash at, and how many runs
/// in a row crash there. Rank 0's points (the client's side) crash three times per mode, as
/// only reruns reach them; the server's are crashed again under `gsm run --recover`.
const POINTS: [(&str, u32, u32, u32); 11] = [
    ("a1-logged", 0, 7, 3),
    ("a2-received", 0, 9, 3),
    ("a2-logged", 0, 11, 3),
    ("received", 1, 5, 1),
    ("executed", 1, 6, 1),
    ("appended", 1, 6, 1),
    ("synced", 1, 7, 1),
    ("replied", 1, 8, 1),
    ("half-record", 1, 5, 1),
    ("snapshot-written", 1, 2, 1),
    ("renamed", 1, 3, 1),
];

fn every_point(durability: &str) {
    for (point, rank, pass, times) in POINTS {
        let dir = tempfile::tempdir().expect("a state directory");
        let ledger = dir.path().join("ledger.txt");
        let crash = format!("{point}:{pass}");
        for time in 1..=times {
            let crashed = run_job(dir.path(), durability, "drive", Some((rank, &crash)));
            assert!(
                !crashed.iter().all(|(ok, _)| *ok),
                "{durability} {crash} on rank {rank}, run {time}: the job was not cut short; \
                 output:\n{}",
                crashed.iter().map(|(_, o)| o.as_str()).collect::<String>()
            );
        }
        let again = run_job(dir.path(), durability, "drive", None);
        assert_all_ok(
            &again,
            &format!("{durability} {crash}: the run after the crash"),
        );
        let check = run_job(dir.path(), durability, "check", None);
        assert_all_ok(&check, &format!("{durability} {crash}: the check"));
        let all: String = check.iter().map(|(_, o)| o.as_str()).collect();
        assert!(all.contains("ledger checked"), "{all}");
        check_ledger(&ledger, &all);
        // Offline, the state of every rank decodes (what `gsm state dump` prints).
        for rank in 0..3 {
            let state = dir.path().join(format!("state/ledger/rank-{rank}"));
            let text = gossamer::durable::dump(&state)
                .unwrap_or_else(|e| panic!("{durability} {crash}: rank {rank}'s state: {e}"));
            let want = if rank == 0 {
                "gossamer.session"
            } else {
                "property \"account-"
            };
            assert!(
                text.contains(want),
                "{durability} {crash}: rank {rank}:\n{text}"
            );
        }
        println!("  {durability}: {crash} on rank {rank}, {times} runs: exactly once");
    }
}

/// The crash points rank 1 passes, with the pass to crash at and how many of its lives crash
/// there, for jobs under `gsm run --recover`: rank 1 is restarted and the driver's one job
/// carries on to the end. A property is snapshotted when it is made, which only the first
/// life does here: those points are crashed at two passes instead.
const SERVER_POINTS: [(&str, u32, u32); 10] = [
    ("received", 5, 2),
    ("executed", 6, 2),
    ("appended", 6, 2),
    ("synced", 7, 2),
    ("replied", 8, 2),
    ("half-record", 5, 2),
    ("snapshot-written", 2, 1),
    ("snapshot-written", 3, 1),
    ("renamed", 3, 1),
    ("renamed", 1, 1),
];

/// Each server-side crash point under the supervisor: one job drives every call to the end
/// across rank 1's restarts, then a plain job checks.
fn recovered(durability: &str) {
    let gsm = std::env::var("GSM_BIN")
        .expect("GSM_BIN: the gsm executable to supervise the job (scripts/test.sh sets it)");
    for (point, pass, lives) in SERVER_POINTS {
        let dir = tempfile::tempdir().expect("a state directory");
        let crash = format!("{point}:{pass}");
        let (ok, out) = run_supervised(&gsm, dir.path(), durability, &crash, lives);
        let what =
            format!("{durability} {crash} in {lives} lives of rank 1 under gsm run --recover");
        assert!(ok, "{what}: the job failed:\n{out}");
        assert!(
            out.contains(&format!("restarting it as incarnation {lives}")),
            "{what}: rank 1 was not restarted {lives} times:\n{out}"
        );
        assert!(out.contains("ledger driven"), "{what}:\n{out}");
        let check = run_job(dir.path(), durability, "check", None);
        assert_all_ok(&check, &format!("{what}: the check"));
        let all: String = check.iter().map(|(_, o)| o.as_str()).collect();
        check_ledger(&dir.path().join("ledger.txt"), &all);
        println!("  {what}: exactly once, in one job");
    }
}

/// Runs the driving job of 3 ranks under `gsm run --recover`, rank 1 crashing at `crash` in
/// its first `lives` lives; returns whether it succeeded and gsm's output.
fn run_supervised(
    gsm: &str,
    dir: &Path,
    durability: &str,
    crash: &str,
    lives: u32,
) -> (bool, String) {
    let mut cmd = supervised(gsm, dir, durability, &[]);
    cmd.env("GSM_CRASH", crash)
        .env("GSM_CRASH_RANK", "1")
        .env("GSM_CRASH_LIVES", lives.to_string());
    let child = cmd.spawn().expect("start gsm run --recover");
    let done = common::finish(vec![child], Duration::from_secs(90), "the supervised job");
    let (status, out, err) = &done[0];
    (status.success(), format!("{out}{err}"))
}

/// The driving job of 3 ranks under `gsm run --recover`, its output piped; each rank's
/// command is `through` followed by this test's executable. The ranks take their transport
/// from this test's environment (`GSM_TRANSPORT`, `UCX_TLS`: the test command runs these
/// jobs over UCX too).
fn supervised(gsm: &str, dir: &Path, durability: &str, through: &[&str]) -> std::process::Command {
    let exe = std::env::current_exe().expect("this test's executable");
    let mut cmd = std::process::Command::new(gsm);
    cmd.args(["run", "-n", "3", "--workers", "2", "--recover", "--"])
        .args(through)
        .arg(exe)
        .env("RACK_SCENARIO", "drive")
        .env("GSM_STATE_DIR", dir.join("state"))
        .env("GSM_JOB_NAME", "ledger")
        .env("GSM_DURABILITY", durability)
        .env("GSM_PEER_TIMEOUT", "2s")
        .env("GSM_RECOVERY_TIMEOUT", "30s")
        .env("LEDGER_FILE", dir.join("ledger.txt"))
        .env_remove("GSM_CRASH")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd
}

/// One job under `gsm run --recover` while a killer SIGKILLs rank 1 or 2 at random moments,
/// `kills` times, each new life as soon as it runs; then the driver stops and a plain job
/// checks. The seed is printed (and taken from `LEDGER_SEED`) to replay a failure.
fn random_kills(durability: &str, kills: u32) {
    let gsm = std::env::var("GSM_BIN").expect("GSM_BIN: the gsm executable (see `recovered`)");
    let seed: u64 = std::env::var("LEDGER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            now.expect("a clock after 1970").as_nanos() as u64
        });
    let what = format!("{durability}, {kills} random kills, LEDGER_SEED={seed}");
    let dir = tempfile::tempdir().expect("a state directory");
    let pids = dir.path().join("pids");
    std::fs::create_dir(&pids).expect("the pid directory");
    let stop = dir.path().join("stop");
    let ledger = dir.path().join("ledger.txt");
    let mut cmd = supervised(&gsm, dir.path(), durability, &[]);
    cmd.env("LEDGER_PIDS", &pids)
        .env("LEDGER_STOP", &stop)
        .env("LEDGER_CALLS", "100000");
    let mut child = cmd.spawn().expect("start gsm run --recover");
    let mut rng = seed | 1;
    let mut next = move |n: u64| {
        // xorshift64: a reproducible stream from the seed.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut killed = [String::new(), String::new(), String::new()];
    let mut done = 0;
    while done < kills {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: only {done} kills in 120 s"
        );
        if child.try_wait().expect("gsm's status").is_some() {
            break;
        }
        let started = std::fs::read_to_string(&ledger).is_ok_and(|l| !l.is_empty());
        let rank = 1 + next(2) as usize;
        let pid = std::fs::read_to_string(pids.join(format!("rank-{rank}"))).unwrap_or_default();
        if !started || pid.is_empty() || pid == killed[rank] {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        std::thread::sleep(Duration::from_millis(50 + next(350)));
        let pid: i32 = pid.trim().parse().expect("a pid");
        // SAFETY: kill(2) with a pid this job's rank wrote and a valid signal.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        killed[rank] = pid.to_string();
        done += 1;
    }
    std::fs::write(&stop, "").expect("the stop file");
    let finished = common::finish(vec![child], Duration::from_secs(90), "the killed job");
    let (status, out, err) = &finished[0];
    let out = format!("{out}{err}");
    assert!(status.success(), "{what}: the job failed:\n{out}");
    assert_eq!(done, kills, "{what}: the job ended first:\n{out}");
    assert!(out.contains("ledger driven"), "{what}:\n{out}");
    let check = run_job(dir.path(), durability, "check", None);
    assert_all_ok(&check, &format!("{what}: the check"));
    let all: String = check.iter().map(|(_, o)| o.as_str()).collect();
    check_ledger(&ledger, &all);
    let (_, answered) = read_ledger(&ledger);
    println!("  {what}: {} calls, each exactly once", answered.len());
}

/// A rank that stays down longer than `GSM_RECOVERY_TIMEOUT`: the call waiting for it fails
/// with `CallError::Unavailable`, and the session's `resume` later finishes it, once.
fn unavailable_then_resumed() {
    play_supervised(
        "unavailable",
        &[("GSM_RECOVERY_TIMEOUT", "1s"), ("LEDGER_STALL_MS", "3000")],
        "unavailable, then resumed once",
    );
}

/// Runs the supervised job with rank 0 playing `scenario`, with `env` beside the usual, and
/// checks that it succeeds and prints `printed`.
fn play_supervised(scenario: &str, env: &[(&str, &str)], printed: &str) {
    let gsm = std::env::var("GSM_BIN").expect("GSM_BIN: the gsm executable (see `recovered`)");
    let dir = tempfile::tempdir().expect("a state directory");
    let mut cmd = supervised(&gsm, dir.path(), "os", &[]);
    cmd.env("RACK_SCENARIO", scenario).envs(env.iter().copied());
    let child = cmd.spawn().expect("start gsm run --recover");
    let finished = common::finish(vec![child], Duration::from_secs(90), scenario);
    let (status, out, err) = &finished[0];
    let out = format!("{out}{err}");
    assert!(status.success(), "{scenario}: the job failed:\n{out}");
    assert!(
        out.contains(printed),
        "{scenario}: no {printed:?} in\n{out}"
    );
}

/// Rank 0 of `unavailable_then_resumed`: deposits, kills rank 1 (whose next life stalls 3 s),
/// deposits again and gets `Unavailable` after the 1 s timeout; `resume` then runs that
/// deposit once rank 1 is back. Then it kills rank 1 again (its next life comes back at once)
/// and a `call_then` made meanwhile is sent again and answered, once.
fn unavailable(accounts: &[Durable<Account>]) {
    let session = Session::open("driver").expect("open the session");
    let account = &accounts[0]; // on rank 1
    session
        .call(
            account,
            Deposit {
                id: 0,
                amount: 1,
                memo: None,
            },
        )
        .expect("the first deposit");
    kill_rank(account.node());
    match session.call(
        account,
        Deposit {
            id: 1,
            amount: 2,
            memo: None,
        },
    ) {
        Err(CallError::Unavailable { rank: 1, waited }) => {
            assert!(waited >= Duration::from_secs(1), "waited only {waited:?}");
        }
        other => panic!("a deposit to a rank down past the timeout: {other:?}"),
    }
    let pending = session.pending();
    assert_eq!(pending.len(), 1, "the unavailable call is pending");
    // Each try waits the 1 s timeout for rank 1; its next life is back within 3 s or so.
    let mut tries = 0;
    let resumed = loop {
        match session.resume() {
            Ok(resumed) => break resumed,
            Err(CallError::Unavailable { .. }) if tries < 30 => tries += 1,
            Err(e) => panic!("resume after {tries} tries: {e}"),
        }
    };
    assert_eq!(resumed.len(), 1);
    assert_eq!(
        resumed[0].output::<i64>(),
        Some(Ok(3)),
        "deposit 1 after deposit 0"
    );
    assert_eq!(
        account.read(|a| a.applied.clone()).unwrap(),
        vec![0, 1],
        "each deposit once"
    );
    kill_rank(account.node());
    let (tx, rx) = std::sync::mpsc::channel();
    account.call_then(
        Deposit {
            id: 2,
            amount: 4,
            memo: None,
        },
        move |r| drop(tx.send(r)),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let answer = loop {
        if let Ok(answer) = rx.try_recv() {
            break answer;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no answer to call_then in 30 s"
        );
        gossamer::yield_now();
    };
    assert_eq!(answer, Ok(7), "the call_then made while rank 1 was down");
    assert_eq!(
        account.read(|a| a.applied.clone()).unwrap(),
        vec![0, 1, 2],
        "each deposit once"
    );
    println!("unavailable, then resumed once");
}

/// A rank that stops (SIGSTOP) rather than dies: its peers find it silent, rank 0 has the
/// supervisor kill it, and its next life carries on.
fn stopped_rank_is_fenced() {
    let gsm = std::env::var("GSM_BIN").expect("GSM_BIN: the gsm executable (see `recovered`)");
    let dir = tempfile::tempdir().expect("a state directory");
    let (pids, stop, ledger) = (
        dir.path().join("pids"),
        dir.path().join("stop"),
        dir.path().join("ledger.txt"),
    );
    std::fs::create_dir(&pids).expect("the pid directory");
    let mut cmd = supervised(&gsm, dir.path(), "os", &[]);
    cmd.env("LEDGER_PIDS", &pids)
        .env("LEDGER_STOP", &stop)
        .env("LEDGER_CALLS", "100000");
    let child = cmd.spawn().expect("start gsm run --recover");
    let pid_of_2 = || pid_of(&pids, 2);
    let lines = || ledger_lines(&ledger);
    wait_until("the first calls", &|| {
        lines() > 10 && !pid_of_2().is_empty()
    });
    let stopped = pid_of_2();
    signal(&stopped, libc::SIGSTOP);
    wait_until("rank 2's next life", &|| pid_of_2() != stopped);
    let before = lines();
    wait_until("calls after the restart", &|| lines() > before + 20);
    std::fs::write(&stop, "").expect("the stop file");
    let finished = common::finish(vec![child], Duration::from_secs(90), "the job");
    let (status, out, err) = &finished[0];
    let out = format!("{out}{err}");
    assert!(status.success(), "the job failed:\n{out}");
    assert!(
        out.contains("fencing rank 2"),
        "rank 2 was not fenced:\n{out}"
    );
    let check = run_job(dir.path(), "os", "check", None);
    assert_all_ok(&check, "the check after a fence");
    let all: String = check.iter().map(|(_, o)| o.as_str()).collect();
    check_ledger(&ledger, &all);
    println!("  a stopped rank 2 was fenced and restarted; every call exactly once");
}

/// The supervised job with one rank on each of three hosts (network namespaces joined by a
/// switch, see `common/netns.rs`), while host 2's cable is pulled twice and rank 1 is
/// killed: a cut shorter than `GSM_PEER_TIMEOUT` loses no rank (TCP carries the calls over
/// it); a longer one loses rank 2, which gsm kills and starts again, and whose next life joins
/// once the cable is back. Then a plain job checks every call exactly once.
fn across_hosts() {
    let Some(net) = hosts("the crash ledger across hosts", "ledger") else {
        return;
    };
    let gsm = std::env::var("GSM_BIN").expect("GSM_BIN: the gsm executable (see `recovered`)");
    let dir = tempfile::tempdir().expect("a state directory");
    let (pids, stop, ledger, log) = (
        dir.path().join("pids"),
        dir.path().join("stop"),
        dir.path().join("ledger.txt"),
        dir.path().join("gsm.log"),
    );
    std::fs::create_dir(&pids).expect("the pid directory");
    let peer_timeout = Duration::from_secs(3);
    // gsm starts each rank through `sh`, which moves it (the same process) into its host,
    // where it listens at the host's address and finds rank 0 at host 0's.
    let enter = "eval \"host=\\$LEDGER_HOST_$GSM_RANK addr=\\$LEDGER_ADDR_$GSM_RANK\"; \
                 export GSM_HOST=$addr GSM_COORD=$LEDGER_COORD; \
                 exec \"$LEDGER_IP\" netns exec \"$host\" \"$@\"";
    let mut cmd = supervised(&gsm, dir.path(), "os", &["sh", "-c", enter, "sh"]);
    for (h, host) in net.hosts.iter().enumerate() {
        cmd.env(format!("LEDGER_HOST_{h}"), host)
            .env(format!("LEDGER_ADDR_{h}"), Net::addr(h).to_string());
    }
    let output = std::fs::File::create(&log).expect("gsm's log");
    cmd.env("LEDGER_COORD", format!("{}:7000", Net::addr(0)))
        .env("LEDGER_IP", netns::ip_program())
        .env("LEDGER_PIDS", &pids)
        .env("LEDGER_STOP", &stop)
        .env("LEDGER_CALLS", "100000")
        .env("GSM_PEER_TIMEOUT", format!("{}s", peer_timeout.as_secs()))
        .stdout(output.try_clone().expect("gsm's log"))
        .stderr(output);
    let child = cmd.spawn().expect("start gsm run --recover");
    let printed = || std::fs::read_to_string(&log).unwrap_or_default();
    let lines = || ledger_lines(&ledger);
    let wait = |what: &str, done: &dyn Fn() -> bool| wait_showing(what, done, &printed);
    wait("the first calls", &|| {
        lines() > 10 && !pid_of(&pids, 1).is_empty() && !pid_of(&pids, 2).is_empty()
    });
    // A cut of a sixth of GSM_PEER_TIMEOUT: no rank is lost, whatever the load.
    let cut = std::time::Instant::now();
    net.unplug(2);
    std::thread::sleep(peer_timeout / 6);
    net.plug(2);
    let before = lines();
    wait("calls after the short cut", &|| lines() > before + 20);
    std::thread::sleep(
        (cut + peer_timeout + Duration::from_secs(1))
            .saturating_duration_since(std::time::Instant::now()),
    );
    assert!(
        !printed().contains("lost rank"),
        "a cut shorter than GSM_PEER_TIMEOUT lost a rank:\n{}",
        printed()
    );
    // A cut past GSM_PEER_TIMEOUT: rank 2 is lost and started again, and its next life waits
    // for the cable.
    let first = pid_of(&pids, 2);
    net.unplug(2);
    wait("rank 2 lost", &|| printed().contains("lost rank 2"));
    wait("rank 2's next life", &|| pid_of(&pids, 2) != first);
    net.plug(2);
    wait("rank 2 back", &|| {
        printed().contains("rank 2 rejoined the job")
    });
    let killed = pid_of(&pids, 1);
    signal(&killed, libc::SIGKILL);
    wait("rank 1 back", &|| {
        printed().contains("rank 1 rejoined the job")
    });
    let before = lines();
    wait("calls after both restarts", &|| lines() > before + 20);
    std::fs::write(&stop, "").expect("the stop file");
    let finished = common::finish(vec![child], Duration::from_secs(90), "the job across hosts");
    let out = printed();
    assert!(finished[0].0.success(), "the job failed:\n{out}");
    assert!(out.contains("ledger driven"), "{out}");
    let check = run_job(dir.path(), "os", "check", None);
    assert_all_ok(&check, "the check after the job across hosts");
    let all: String = check.iter().map(|(_, o)| o.as_str()).collect();
    check_ledger(&ledger, &all);
    println!(
        "  3 hosts: a short cut lost nothing; a long one and a kill restarted ranks 2 and 1; {} \
         calls, each exactly once",
        read_ledger(&ledger).1.len()
    );
}

/// Three hosts tagged `tag` for the test `what`, or `None` when it must skip (see
/// `netns::required`).
fn hosts(what: &str, tag: &str) -> Option<Net> {
    match netns::required(what) {
        Ok(true) => Some(Net::new(tag).unwrap_or_else(|e| panic!("building the hosts: {e}"))),
        Ok(false) => None,
        Err(why) => panic!("{why}"),
    }
}

/// The port of the daemons, each in its own host.
const DAEMON_PORT: u16 = 7420;

/// The driving job of 4 ranks under `gsm run --hosts --recover --shared-state`, a
/// `gsm daemon` on each of three hosts (ranks 0 and 3 on host 0, 1 on host 1, 2 on host 2;
/// the state directory is on the one file system all three see): `LEDGER_KILLS` rounds
/// (default 2) of SIGKILL to a rank on every host, each restarted on its host; rank 1
/// stopped (SIGSTOP: rank 0 has gsm fence it through host 1's daemon); host 2 cut off
/// past `GSM_PEER_TIMEOUT` (rank 2 moves to host 1 once its old life is fenced: that process
/// must be gone by the time the new life starts); then host 1's daemon killed (its
/// guardian kills ranks 1 and 2, which move to host 0) and started again. Every call is checked
/// exactly once; at the end no property is left exported on any rank, the only blob files
/// are those of the memos the session made (the killed ranks have none), and no host's mark
/// is left in the state directory.
fn across_daemons() {
    let Some(net) = hosts("the crash ledger across daemons", "ledgerd") else {
        return;
    };
    let gsm = std::env::var("GSM_BIN").expect("GSM_BIN: the gsm executable (see `recovered`)");
    let rounds: u32 = std::env::var("LEDGER_KILLS").map_or(2, |k| k.parse().expect("LEDGER_KILLS"));
    let dir = tempfile::tempdir().expect("a state directory");
    let path = |name: &str| dir.path().join(name);
    let (pids, stop, ledger, log) = (
        path("pids"),
        path("stop"),
        path("ledger.txt"),
        path("gsm.log"),
    );
    std::fs::create_dir(&pids).expect("the pid directory");
    let key = path("cluster.key");
    let made = std::process::Command::new(&gsm)
        .arg("cluster-key")
        .arg(&key)
        .output()
        .expect("run gsm cluster-key");
    assert!(made.status.success(), "gsm cluster-key: {made:?}");
    // The ranks take their RACK_SCENARIO and LEDGER_* from their daemon's environment.
    let start_daemon = |h: usize| {
        let out = std::fs::File::create(path(&format!("daemon-{h}.log"))).expect("a log");
        let script = format!(
            "exec {gsm} daemon --listen 0.0.0.0:{DAEMON_PORT} --key {} --store {}",
            key.display(),
            path(&format!("store-{h}")).display()
        );
        let child = std::process::Command::new(netns::ip_program())
            .args(["netns", "exec", &net.hosts[h], "sh", "-c", &script])
            .env("RACK_SCENARIO", "drive")
            .env("LEDGER_FILE", &ledger)
            .env("LEDGER_PIDS", &pids)
            .env("LEDGER_STOP", &stop)
            .env("LEDGER_CALLS", "100000")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(out)
            .spawn()
            .expect("start a daemon");
        let daemon_log =
            || std::fs::read_to_string(path(&format!("daemon-{h}.log"))).unwrap_or_default();
        wait_showing(
            &format!("daemon {h} listening"),
            &|| daemon_log().contains("listening on"),
            &daemon_log,
        );
        Daemon(child)
    };
    let mut daemons: Vec<Daemon> = (0..3).map(start_daemon).collect();
    let hosts: Vec<String> = (0..3).map(|h| Net::addr(h).to_string()).collect();
    let output = std::fs::File::create(&log).expect("gsm's log");
    let exe = std::env::current_exe().expect("this test's executable");
    let peer_timeout = Duration::from_secs(2);
    let child = std::process::Command::new(netns::ip_program())
        .args([
            "netns",
            "exec",
            &net.hosts[0],
            &gsm,
            "run",
            "--hosts",
            &hosts.join(","),
        ])
        .arg("--key")
        .arg(&key)
        .args([
            "-n",
            "4",
            "--workers",
            "2",
            "--recover",
            "--shared-state",
            "--",
        ])
        .arg(exe)
        .env("RACK_SCENARIO", "drive")
        .env("GSM_STATE_DIR", path("state"))
        .env("GSM_JOB_NAME", "ledger")
        .env("GSM_DURABILITY", "os")
        .env("GSM_PEER_TIMEOUT", format!("{}s", peer_timeout.as_secs()))
        .env("GSM_RECOVERY_TIMEOUT", "30s")
        .env_remove("GSM_CRASH")
        .stdout(output.try_clone().expect("gsm's log"))
        .stderr(output)
        .spawn()
        .expect("start gsm run --hosts --recover");
    let printed = || std::fs::read_to_string(&log).unwrap_or_default();
    // What a failed wait shows: gsm's output and the daemons' logs.
    let shown = || {
        let mut all = printed();
        for h in 0..3 {
            let daemon = std::fs::read_to_string(path(&format!("daemon-{h}.log")));
            all.push_str(&format!("--- daemon {h}:\n{}", daemon.unwrap_or_default()));
        }
        all
    };
    let rejoined = |rank: u32| {
        printed()
            .matches(&format!("rank {rank} rejoined the job"))
            .count()
    };
    let lines = || ledger_lines(&ledger);
    let wait = |what: &str, done: &dyn Fn() -> bool| wait_showing(what, done, &shown);
    wait("the first calls", &|| {
        lines() > 10 && (1..4).all(|r| !pid_of(&pids, r).is_empty())
    });
    // Kills on every host, each life restarted where it ran.
    let mut failures = 0;
    let mut in_place = Vec::new();
    for round in 0..rounds {
        for rank in [3, 1, 2] {
            let (pid, before, calls) = (pid_of(&pids, rank), rejoined(rank), lines());
            let killed = std::time::Instant::now();
            signal(&pid, libc::SIGKILL);
            failures += 1;
            wait(&format!("rank {rank} back after kill {round}"), &|| {
                rejoined(rank) > before && pid_of(&pids, rank) != pid
            });
            in_place.push(killed.elapsed());
            wait("calls after a kill", &|| lines() > calls + 5);
        }
    }
    in_place.sort();
    // A stopped rank on host 1: rank 0 loses it and asks for a fence, which gsm has host 1's
    // daemon carry out; then it restarts there.
    let (stopped, before, calls) = (pid_of(&pids, 1), rejoined(1), lines());
    signal(&stopped, libc::SIGSTOP);
    failures += 1;
    wait("the stopped rank 1 fenced and back", &|| {
        rejoined(1) > before && gone(&stopped)
    });
    assert!(
        printed().contains(&format!("fencing rank 1 (pid {}", stopped.trim())),
        "{}",
        printed()
    );
    wait("calls after the fence", &|| lines() > calls + 5);
    // Host 2 cut off past the peer timeout: rank 2 moves to host 1 once its old life is fenced.
    let (old, before) = (pid_of(&pids, 2), rejoined(2));
    let cut = std::time::Instant::now();
    net.unplug(2);
    failures += 1;
    // The next life writes its pid first thing: by then the old one must be gone.
    wait("rank 2's next life", &|| pid_of(&pids, 2) != old);
    assert!(
        gone(&old),
        "rank 2's old life (pid {old}) still runs after its next life started:\n{}",
        printed()
    );
    wait("rank 2 moved", &|| rejoined(2) > before);
    let moved_in = cut.elapsed();
    assert!(
        printed().contains("restarting rank 2 as incarnation"),
        "{}",
        printed()
    );
    net.plug(2);
    let calls = lines();
    wait("calls after the move", &|| lines() > calls + 10);
    // Host 1's daemon killed: its guardian kills ranks 1 and 2, which move to host 0.
    let (before1, before2) = (rejoined(1), rejoined(2));
    let killed = std::time::Instant::now();
    daemons[1].kill();
    failures += 1;
    wait("ranks 1 and 2 moved off host 1", &|| {
        rejoined(1) > before1 && rejoined(2) > before2
    });
    let serving_in = killed.elapsed();
    daemons[1] = start_daemon(1);
    let calls = lines();
    wait("calls after the daemon's death", &|| lines() > calls + 10);
    std::fs::write(&stop, "").expect("the stop file");
    let finished = common::finish(
        vec![child],
        Duration::from_secs(90),
        "the job across daemons",
    );
    let out = printed();
    assert!(finished[0].0.success(), "the job failed:\n{out}");
    assert!(out.contains("ledger driven"), "{out}");
    let check = run_job(dir.path(), "os", "check", None);
    assert_all_ok(&check, "the check after the job across daemons");
    let all: String = check.iter().map(|(_, o)| o.as_str()).collect();
    check_ledger(&ledger, &all);
    let marks = path("state/ledger/.gsm-hosts");
    assert!(!marks.exists(), "hosts' marks left in {}", marks.display());
    assert!(out.contains("exports left: 0"), "{out}");
    // Blob files: one per memo the session made (rank 0, never killed, makes each once), and
    // none on the ranks that were killed.
    let files = |rank: u32| {
        std::fs::read_dir(path(&format!("state/ledger/rank-{rank}/blobs"))).map_or(0, |d| d.count())
    };
    let memos = read_ledger(&ledger)
        .1
        .iter()
        .filter(|(id, _)| has_memo(*id) && !is_transfer(*id))
        .count();
    assert_eq!(
        files(0),
        memos,
        "rank 0's blob files against the memos it made"
    );
    for rank in 1..4 {
        assert_eq!(files(rank), 0, "blob files on rank {rank}");
    }
    println!(
        "  3 daemons: {failures} failures (kills on every host, a stop, a cut host, a killed \
         daemon); kill to rejoined on the same host {:.2} s (median of {}), cut to rank 2 \
         rejoined on host 1 {:.2} s (peer timeout {} s), daemon killed to ranks 1 and 2 \
         rejoined on host 0 {:.2} s; {} calls, each exactly once",
        in_place[in_place.len() / 2].as_secs_f64(),
        in_place.len(),
        moved_in.as_secs_f64(),
        peer_timeout.as_secs(),
        serving_in.as_secs_f64(),
        read_ledger(&ledger).1.len()
    );
}

/// A daemon of [`across_daemons`], killed when dropped.
struct Daemon(Child);

impl Daemon {
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether process `pid` has ended (gone, or a zombie not reaped yet).
fn gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())) {
        Err(_) => true,
        // The state follows the command's closing parenthesis.
        Ok(stat) => stat
            .rsplit(") ")
            .next()
            .is_some_and(|rest| rest.starts_with('Z')),
    }
}

/// Under `gsm run --recover`, rank 0 kills rank 1 while it holds a region there: operations
/// on the lost life's region fail (one-sided over UCX too: they must not wait for good, nor
/// reach the next life's heap, where a new region takes the same slot), and a region of the
/// next life works.
fn regions_of_a_lost_life() {
    play_supervised("regions", &[], "regions across a restart: ok");
    println!("  a lost life's region fails; the next life's works");
}

/// Rank 0's side of [`regions_of_a_lost_life`].
fn play_regions() {
    let node = gossamer::nodes().nth(1).expect("rank 1");
    let probe = node
        .durable("probe", Account::default)
        .expect("a durable property on rank 1");
    let old = node.region(4).expect("a region on rank 1");
    if std::env::var("GSM_TRANSPORT").as_deref() == Ok("ucx") {
        // A recovering job's heaps are its own, registered with UCX, never UCX's shared
        // memory (whose segment dies with its rank, and crashed UCX 1.13 unpacking its key).
        assert!(
            old.words().is_none(),
            "rank 1's heap is mapped here in a recovering UCX job"
        );
    }
    old.put(0, &[1, 2, 3, 4]).wait().expect("a put");
    assert_eq!(old.fetch_add(1, 10).wait(), Ok(2));
    gossamer::fence(node).wait().expect("a fence");
    kill_rank(node);
    // Until the loss is known, operations may still complete (on the lost life's words).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let why = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "operations on the killed rank's region still succeed after 30 s"
        );
        match old.fetch_add(0, 1).wait() {
            Ok(_) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => break e,
        }
    };
    eprintln!("an operation on the lost life's region: {why}");
    // A durable call waits for the next life (GSM_RECOVERY_TIMEOUT), which gives a new
    // region, most likely at the old one's slot.
    let deposit = Deposit {
        id: 1,
        amount: 1,
        memo: None,
    };
    probe.call(deposit).expect("a call to rank 1's next life");
    let new = node.region(4).expect("a region on rank 1's next life");
    new.put(0, &[7, 7, 7, 7])
        .wait()
        .expect("a put on the next life");
    gossamer::fence(node)
        .wait()
        .expect("a fence on the next life");
    for _ in 0..3 {
        assert!(old.put(0, &[9]).wait().is_err() || gossamer::fence(node).wait().is_err());
        assert!(
            old.get(0, 4).wait().is_err(),
            "a get on the lost life's region"
        );
        assert!(
            old.fetch_add(0, 100).wait().is_err(),
            "an add on the lost life's region"
        );
        assert!(
            old.compare_exchange(0, 7, 9).wait().is_err(),
            "a compare-exchange on the lost life's region"
        );
        assert!(old.words().is_none(), "the lost life's words");
    }
    assert_eq!(new.get(0, 4).wait(), Ok(vec![7, 7, 7, 7]));
    assert_eq!(new.fetch_add(3, 1).wait(), Ok(7));
    println!("regions across a restart: ok");
}

/// SIGKILLs the process of `node`'s rank, which reports its pid.
fn kill_rank(node: gossamer::Node) {
    let pid = gossamer::spawn_on(node, |()| std::process::id(), ()).join();
    // SAFETY: kill(2) with the pid the rank reported and a valid signal.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
}

/// The pid rank `rank`'s current life wrote to `LEDGER_PIDS` (empty before it did).
fn pid_of(pids: &Path, rank: u32) -> String {
    std::fs::read_to_string(pids.join(format!("rank-{rank}"))).unwrap_or_default()
}

/// Sends `signal` to process `pid` (as a rank wrote it).
fn signal(pid: &str, signal: i32) {
    let pid: i32 = pid.trim().parse().expect("a pid");
    // SAFETY: kill(2) with a pid a rank of this test's job wrote and a valid signal.
    unsafe { libc::kill(pid, signal) };
}

/// The lines of the driver's ledger so far.
fn ledger_lines(ledger: &Path) -> usize {
    std::fs::read_to_string(ledger).map_or(0, |l| l.lines().count())
}

/// Waits up to 60 s for `done`, failing with `what`.
fn wait_until(what: &str, done: &dyn Fn() -> bool) {
    wait_showing(what, done, &String::new);
}

/// [`wait_until`], failing with what `shown` gives then too (the job's output).
fn wait_showing(what: &str, done: &dyn Fn() -> bool, shown: &dyn Fn() -> String) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "waited 60 s for {what}; the job printed:\n{}",
            shown()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_all_ok(results: &[(bool, String)], what: &str) {
    for (rank, (ok, out)) in results.iter().enumerate() {
        assert!(ok, "{what}: rank {rank} failed:\n{out}");
    }
}

/// Runs one job of 3 ranks; returns each rank's success and output (stdout and stderr).
fn run_job(
    dir: &Path,
    durability: &str,
    scenario: &str,
    crash: Option<(u32, &str)>,
) -> Vec<(bool, String)> {
    let coord = format!("127.0.0.1:{}", common::job::free_port());
    let job = format!("{}", std::process::id());
    let children: Vec<Child> = (0..3)
        .map(|r| {
            let mut cmd = common::job::rank(scenario, r, 3, &coord, &job, "ledger-secret");
            cmd.env("GSM_STATE_DIR", dir.join("state"))
                .env("GSM_JOB_NAME", "ledger")
                .env("GSM_DURABILITY", durability)
                .env("GSM_PEER_TIMEOUT", "2s")
                .env("LEDGER_FILE", dir.join("ledger.txt"));
            cmd.env_remove("GSM_CRASH");
            if let Some((rank, point)) = crash
                && rank as usize == r
            {
                cmd.env("GSM_CRASH", point);
            }
            cmd.spawn().expect("start a rank")
        })
        .collect();
    common::finish(children, Duration::from_secs(60), "the ledger job")
        .into_iter()
        .map(|(status, out, err)| (status.success(), format!("{out}{err}")))
        .collect()
}

fn play(scenario: &str) {
    if scenario == "regions" {
        return play_regions();
    }
    if scenario == "handed_on" {
        return play_handed_on();
    }
    let ledger = PathBuf::from(std::env::var("LEDGER_FILE").expect("LEDGER_FILE"));
    let nodes: Vec<_> = gossamer::nodes().collect();
    let accounts: Vec<Durable<Account>> = (0..ACCOUNTS)
        .map(|i| {
            nodes[1 + (i as usize % 2)]
                .durable(&format!("account-{i}"), Account::default)
                .expect("open an account")
        })
        .collect();
    match scenario {
        "drive" => {
            drive(&ledger, &accounts);
            // Once the handles are dropped, no property may be left exported anywhere (their
            // releases travel: counted again for a while until none is left).
            drop(accounts);
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let left = exported_on(&nodes);
                if left.iter().all(|&n| n == 0) || std::time::Instant::now() >= deadline {
                    println!("exports left: {} {left:?}", left.iter().sum::<usize>());
                    break;
                }
                gossamer::sleep(Duration::from_millis(50));
            }
        }
        "check" => check(&accounts),
        "unavailable" => unavailable(&accounts),
        "lease" => lease_and_crash(&ledger, &accounts[0]),
        "free" => free_the_leased(&ledger, &accounts[0]),
        "orphan" => make_two_blobs(&ledger),
        "reopen" => reopen_the_maker(&ledger),
        other => panic!("unknown scenario {other}"),
    }
}

/// A session makes a memo (its handle kept in a file beside the ledger) and a thread passes
/// it in a deposit to rank 1, which leases it here and dies at crash point `leased`, before
/// the deposit runs; fate sharing ends this process too, so nothing sends the call again.
fn lease_and_crash(ledger: &Path, account: &Durable<Account>) {
    let session = Session::open("memos").expect("a session");
    let memo = session.blob(&memo_bytes(1000)).expect("a memo");
    let kept = postcard::to_allocvec(&memo).expect("a handle serializes");
    std::fs::write(ledger.with_extension("memo"), kept).expect("keep the handle");
    let deposit = Deposit {
        id: 1000,
        amount: 1,
        memo: Some(memo),
    };
    let lost = account.call(deposit);
    panic!("rank 1 was to die before the deposit ran; it answered {lost:?}");
}

/// The next job: the session frees the memo, whose lease the deposit that never ran took;
/// the account asked has no call needing it, so the free goes through.
fn free_the_leased(ledger: &Path, account: &Durable<Account>) {
    let kept = std::fs::read(ledger.with_extension("memo")).expect("the kept handle");
    let memo: Blob = postcard::from_bytes(&kept).expect("a handle");
    let session = Session::open("memos").expect("the session");
    session
        .free(&memo)
        .expect("no call holds the lease of the deposit that never ran");
    assert!(
        account.read(|a| a.applied.clone()).unwrap().is_empty(),
        "the deposit never ran"
    );
    println!("leased memo freed");
}

/// A session makes a memo (its handle kept beside the ledger), then another, and this rank
/// dies at crash point `blob-written` (its second pass): the second memo's file is written,
/// its making never logged.
fn make_two_blobs(ledger: &Path) {
    let session = Session::open("memos").expect("a session");
    let memo = session.blob(&memo_bytes(1)).expect("a memo");
    let kept = postcard::to_allocvec(&memo).expect("a handle serializes");
    std::fs::write(ledger.with_extension("memo"), kept).expect("keep the handle");
    let made = session.blob(&memo_bytes(2));
    panic!("this rank was to die making the second memo; it made {made:?}");
}

/// The next job: the session reopens, and the first memo is still whole.
fn reopen_the_maker(ledger: &Path) {
    let kept = std::fs::read(ledger.with_extension("memo")).expect("the kept handle");
    let memo: Blob = postcard::from_bytes(&kept).expect("a handle");
    let _session = Session::open("memos").expect("the session");
    assert_eq!(memo.read().expect("the first memo"), memo_bytes(1));
    println!("maker reopened");
}

/// The bytes of a blob whose making was never logged are deleted when its maker opens
/// again; those of a blob made stay.
fn a_blob_file_whose_making_was_not_logged_goes_at_open() {
    let dir = tempfile::tempdir().expect("a state directory");
    let files = || -> Vec<String> {
        let blobs = dir.path().join("state/ledger/rank-0/blobs");
        let mut names: Vec<String> = std::fs::read_dir(blobs)
            .expect("rank 0's blobs")
            .map(|e| {
                e.expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    };
    let crashed = run_job(dir.path(), "sync", "orphan", Some((0, "blob-written:2")));
    assert!(
        crashed[0].1.contains("crash point blob-written"),
        "rank 0 did not die at the crash point:\n{}",
        crashed[0].1
    );
    assert_eq!(files().len(), 2, "both memos' files: {:?}", files());
    let reopened = run_job(dir.path(), "sync", "reopen", None);
    assert_all_ok(&reopened, "the job after the crash");
    assert!(
        reopened[0].1.contains("maker reopened"),
        "{}",
        reopened[0].1
    );
    let left = files();
    assert_eq!(left.len(), 1, "only the first memo's file: {left:?}");
    let hex: String = {
        use sha2::Digest;
        let hash: [u8; 32] = sha2::Sha256::digest(memo_bytes(1)).into();
        hash.iter().map(|b| format!("{b:02x}")).collect()
    };
    assert!(left[0].ends_with(&hex), "{left:?}");
}

/// A lease whose call never ran (its lessee died before, and no one sends the call again)
/// is dropped when its blob is freed.
fn a_lease_whose_call_never_ran_is_dropped_by_a_free() {
    let dir = tempfile::tempdir().expect("a state directory");
    let crashed = run_job(dir.path(), "sync", "lease", Some((1, "leased:1")));
    assert!(
        crashed[1].1.contains("crash point leased"),
        "rank 1 did not die at the crash point:\n{}",
        crashed[1].1
    );
    let freed = run_job(dir.path(), "sync", "free", None);
    assert_all_ok(&freed, "the job after the crash");
    assert!(freed[0].1.contains("leased memo freed"), "{}", freed[0].1);
}

/// Properties of [`play_handed_on`] dropped on this node.
static PROBES_DROPPED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// The handles this node holds.
static PROBES_HELD: std::sync::Mutex<Vec<gossamer::Trust<Probe>>> =
    std::sync::Mutex::new(Vec::new());

/// A volatile property that counts its drops.
struct Probe;

impl Drop for Probe {
    fn drop(&mut self) {
        PROBES_DROPPED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Rank 0 (the home) hands a property to rank 2, which sends it on to rank 1 and dies at
/// crash point `handed-on`: its toggle reached rank 0, the handle never reached rank 1.
/// Nothing holds the property any more, so rank 0 must drop it.
fn play_handed_on() {
    use std::sync::atomic::Ordering::SeqCst;
    let [_, one, two] = gossamer::nodes().collect::<Vec<_>>()[..] else {
        panic!("handed_on runs on 3 ranks");
    };
    let sent = gossamer::entrust(Probe);
    gossamer::spawn_on(
        two,
        |t: gossamer::Trust<Probe>| PROBES_HELD.lock().unwrap().push(t),
        sent,
    )
    .join();
    let died = gossamer::spawn_on(
        two,
        |()| {
            let handle = PROBES_HELD.lock().unwrap().pop().expect("the handle");
            let one = gossamer::nodes().nth(1).unwrap();
            let push = |t: gossamer::Trust<Probe>| PROBES_HELD.lock().unwrap().push(t);
            gossamer::spawn_on(one, push, handle).join();
        },
        (),
    )
    .try_join();
    assert!(died.is_err(), "rank 2 was to die sending the handle on");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (live, dropped) = (gossamer::exported_properties(), PROBES_DROPPED.load(SeqCst));
        if live == 0 && dropped == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "20 s after rank 2 died: {live} exports live and {dropped} of 1 property dropped \
             (the ticket it handed out to rank 1 still waits)"
        );
        gossamer::sleep(Duration::from_millis(20));
    }
    let held = gossamer::spawn_on(one, |()| PROBES_HELD.lock().unwrap().len(), ()).join();
    assert_eq!(held, 0, "rank 1 never got the handle");
    println!("handed on ok");
}

/// [`play_handed_on`] on 3 ranks that recover lost ranks, rank 2 not restarted.
fn a_handle_lost_on_its_way_is_released() {
    let coord = format!("127.0.0.1:{}", common::job::free_port());
    let job = format!("{}", std::process::id() as u64 * 1000 + 7);
    let children: Vec<Child> = (0..3)
        .map(|r| {
            let mut cmd = common::job::rank("handed_on", r, 3, &coord, &job, "ledger-secret");
            cmd.env("GSM_RECOVER", "1")
                .env("GSM_TRANSPORT", "tcp")
                .env("GSM_INCARNATION", "0")
                .env("GSM_CRASH", "handed-on:1")
                .env("GSM_CRASH_RANK", "2");
            cmd.spawn().expect("start a rank")
        })
        .collect();
    let results = common::finish(children, Duration::from_secs(60), "the handed-on job");
    let all: String = results.iter().map(|r| format!("{}{}", r.1, r.2)).collect();
    assert!(all.contains("crash point handed-on"), "{all}");
    for (rank, (status, ..)) in results[..2].iter().enumerate() {
        assert!(status.success(), "rank {rank} failed:\n{all}");
    }
    assert!(results[0].1.contains("handed on ok"), "{all}");
}

/// How many properties each node exports. A rank restarted at the end may still be joining:
/// it is asked again until it answers.
fn exported_on(nodes: &[gossamer::Node]) -> Vec<usize> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    nodes
        .iter()
        .map(|&n| {
            loop {
                match gossamer::spawn_on(n, |()| gossamer::exported_properties(), ()).try_join() {
                    Ok(left) => break left,
                    Err(e) => {
                        assert!(std::time::Instant::now() < deadline, "exports: {e}");
                        gossamer::sleep(Duration::from_millis(50));
                    }
                }
            }
        })
        .collect()
}

/// Appends `line` to the ledger and flushes it to disk.
fn note(ledger: &Path, line: &str) {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(ledger)
        .expect("open the ledger");
    writeln!(f, "{line}").expect("write the ledger");
    f.sync_data().expect("flush the ledger");
}

/// The ledger's lines: ids with an intent, and ids done with their answers.
fn read_ledger(ledger: &Path) -> (Vec<u64>, Vec<(u64, i64)>) {
    let text = std::fs::read_to_string(ledger).unwrap_or_default();
    let (mut intents, mut done) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["intent", id] => intents.push(id.parse().expect("an id")),
            ["done", id, balance] => {
                done.push((
                    id.parse().expect("an id"),
                    balance.parse().expect("a balance"),
                ));
            }
            // A line a crash cut short is not on disk as a whole line: ignore it.
            _ => {}
        }
    }
    (intents, done)
}

fn drive(ledger: &Path, accounts: &[Durable<Account>]) {
    let session = Session::open("driver").expect("open the session");
    // Answers an earlier run had logged but not noted (it ended between the two), then the
    // calls it never saw answered.
    let (_, done) = read_ledger(ledger);
    let mut recovered = session.answered();
    recovered.extend(session.resume().expect("resume"));
    for call in recovered {
        let id = session_id_of(&call);
        if !done.iter().any(|(d, _)| *d == id) {
            let balance = call.output::<i64>().expect("answered");
            let balance = balance.unwrap_or_else(|e| panic!("call {id} resumed: {e}"));
            note(ledger, &format!("done {id} {balance}"));
        }
    }
    let (intents, done) = read_ledger(ledger);
    let stop = std::env::var_os("LEDGER_STOP").map(PathBuf::from);
    for id in 0..calls() {
        if done.iter().any(|(d, _)| *d == id) {
            continue;
        }
        if stop.as_ref().is_some_and(|s| s.exists()) {
            break;
        }
        if intents.contains(&id) && applied(accounts, id) {
            // It took effect, yet the session neither answered it nor has it pending.
            panic!("deposit {id} was applied but the session does not know it");
        }
        note(ledger, &format!("intent {id}"));
        let target = &accounts[account_of(id) as usize];
        let amount = amount(id);
        let balance = if is_transfer(id) {
            let to = accounts[destination_of(id) as usize].clone();
            session.call(target, Transfer { id, amount, to })
        } else {
            let memo = has_memo(id).then(|| session.blob(&memo_bytes(id)).expect("a memo"));
            session.call(target, Deposit { id, amount, memo })
        }
        .expect("a call");
        note(ledger, &format!("done {id} {balance}"));
    }
    assert!(session.pending().is_empty(), "calls left pending");
    println!("ledger driven");
}

/// The id a session's call carries.
fn session_id_of(call: &gossamer::durable::SessionCall) -> u64 {
    match call.op() {
        Deposit::NAME => call.argument_as::<Deposit>().map(|d| d.id),
        Transfer::NAME => call.argument_as::<Transfer>().map(|t| t.id),
        _ => None,
    }
    .unwrap_or_else(|| panic!("a deposit or a transfer: {call:?}"))
}

/// Whether call `id` took effect in the account it went to.
fn applied(accounts: &[Durable<Account>], id: u64) -> bool {
    let a = &accounts[account_of(id) as usize];
    if is_transfer(id) {
        a.read(|a| a.withdrawn.clone()).unwrap().contains(&id)
    } else {
        a.read(|a| a.applied.clone()).unwrap().contains(&id)
    }
}

/// The last job: waits for the transfers' continuations, then prints every account's
/// balance, applied ids and sent ids for `check_ledger`.
fn check(accounts: &[Durable<Account>]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while accounts.iter().any(|a| a.calls_in_flight().unwrap() > 0) {
        assert!(
            std::time::Instant::now() < deadline,
            "transfers still in flight after 30 s"
        );
        gossamer::yield_now();
    }
    let list = |ids: &[u64]| ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    for (i, a) in accounts.iter().enumerate() {
        let (balance, applied, sent) = a
            .read(|a| (a.balance, a.applied.clone(), a.sent.clone()))
            .unwrap();
        let withdrawn = a.read(|a| a.withdrawn.clone()).unwrap();
        assert_eq!(
            withdrawn.len(),
            sent.len(),
            "account {i}: every withdrawal sent once"
        );
        println!("account {i} {balance} {} {}", list(&applied), list(&sent));
    }
    let session = Session::open("driver").expect("open the session");
    assert!(
        session.pending().is_empty(),
        "the session has calls pending"
    );
    println!("ledger checked");
}

/// Checks the accounts the last job printed against the ledger.
fn check_ledger(ledger: &Path, printed: &str) {
    let (_, done) = read_ledger(ledger);
    let ids = |w: Option<&str>| -> Vec<u64> {
        w.filter(|w| !w.is_empty() && *w != "-")
            .map(|w| w.split(',').map(|x| x.parse().unwrap()).collect())
            .unwrap_or_default()
    };
    // The driver makes ids in order from 0; any applied beyond its last is a phantom.
    let calls = done.iter().map(|(d, _)| d + 1).max().unwrap_or(0);
    let mut applied_where = vec![Vec::new(); calls as usize];
    let mut sent_where = vec![Vec::new(); calls as usize];
    let mut balances = vec![0i64; ACCOUNTS as usize];
    for line in printed.lines().filter_map(|l| l.split("account ").nth(1)) {
        let words: Vec<&str> = line.split(' ').collect();
        let i: u64 = words[0].parse().unwrap();
        balances[i as usize] = words[1].parse().unwrap();
        let applied = ids(words.get(2).copied());
        let mut running = 0;
        for &id in &applied {
            assert!(id < calls, "call {id} applied, but the driver made {calls}");
            applied_where[id as usize].push(i);
            running += amount(id);
            // A checking account changes only by deposits: each answer the ledger holds is
            // the balance right after it.
            if i < CHECKING
                && let Some((_, answered)) = done.iter().find(|(d, _)| *d == id)
            {
                assert_eq!(*answered, running, "deposit {id}'s answer in the ledger");
            }
        }
        for id in ids(words.get(3).copied()) {
            assert!(id < calls, "call {id} sent, but the driver made {calls}");
            sent_where[id as usize].push(i);
        }
    }
    for id in 0..calls {
        let (applied, sent) = (&applied_where[id as usize], &sent_where[id as usize]);
        if is_transfer(id) {
            assert_eq!(
                applied,
                &vec![destination_of(id)],
                "transfer {id} deposited"
            );
            assert_eq!(sent, &vec![account_of(id)], "transfer {id} sent");
        } else {
            assert_eq!(applied, &vec![account_of(id)], "deposit {id} applied");
            assert!(sent.is_empty(), "deposit {id} noted as sent");
        }
        assert!(
            done.iter().any(|(d, _)| *d == id),
            "call {id} has no answer in the ledger"
        );
    }
    for i in 0..ACCOUNTS {
        let expected: i64 = (0..calls)
            .map(|id| {
                let into = if is_transfer(id) {
                    destination_of(id)
                } else {
                    account_of(id)
                };
                let out = if is_transfer(id) && account_of(id) == i {
                    amount(id)
                } else {
                    0
                };
                if into == i { amount(id) - out } else { -out }
            })
            .sum();
        assert_eq!(balances[i as usize], expected, "account {i}'s balance");
    }
}
