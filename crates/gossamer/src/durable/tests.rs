//! The durable core on a one-node rack: create, call, read, reopen, retries, panics,
//! snapshots and refusals.

use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::format::CallArgs;
use super::{CallError, Cx, Durable, DurableError, Op, cell};
use crate::env::Settings;
use crate::{Rack, durable_ops};

#[derive(Serialize, Deserialize, Default, Debug, PartialEq)]
struct Account {
    balance: i64,
    history: Vec<i64>,
}

#[derive(Serialize, Deserialize)]
struct Deposit(i64);

impl Op<Account> for Deposit {
    const NAME: &'static str = "test.deposit";
    type Output = i64;
    fn apply(self, a: &mut Account, _: &mut Cx<Account>) -> i64 {
        a.balance += self.0;
        a.history.push(self.0);
        a.balance
    }
}

/// Deposits, then panics when the balance would go above the limit: the deposit must vanish.
#[derive(Serialize, Deserialize)]
struct DepositBelow {
    amount: i64,
    limit: i64,
}

impl Op<Account> for DepositBelow {
    const NAME: &'static str = "test.deposit_below";
    type Output = i64;
    fn apply(self, a: &mut Account, _: &mut Cx<Account>) -> i64 {
        a.balance += self.amount;
        a.history.push(self.amount);
        assert!(a.balance <= self.limit, "over the limit");
        a.balance
    }
}

durable_ops!(Account: Deposit, DepositBelow);

/// Racks run one at a time in a process; these tests take turns.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `main` on a one-node rack whose durable state is in `dir`.
fn rack(dir: &Path, durability: &str, main: impl FnOnce() + Send + 'static) {
    rack_with(dir, &[("GSM_DURABILITY", durability)], main);
}

/// [`rack`] with these variables set.
fn rack_with(dir: &Path, vars: &[(&str, &str)], main: impl FnOnce() + Send + 'static) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = dir.to_string_lossy().into_owned();
    let settings = Settings::from_vars(|name| match name {
        "GSM_STATE_DIR" => Some(dir.clone()),
        "GSM_JOB_NAME" => Some("unit".into()),
        _ => vars
            .iter()
            .find(|(var, _)| *var == name)
            .map(|(_, value)| value.to_string()),
    })
    .expect("settings");
    let code = Rack::with_settings(settings)
        .workers(2)
        .try_run(main)
        .expect("rack");
    assert_eq!(code, 0, "the rack's main failed");
}

fn account(name: &str) -> Durable<Account> {
    crate::this_node()
        .durable(name, Account::default)
        .expect("open")
}

/// Snapshots `a` at its next call, and makes one.
fn snapshot(a: &Durable<Account>) {
    fn soon(c: &mut cell::Cell<Account>, (): (), reply: trust::Reply<()>) {
        c.snapshot_soon();
        let _ = reply.send(());
    }
    a.send(soon, ()).unwrap();
    a.call(Deposit(0)).unwrap();
}

#[test]
fn calls_survive_a_restart_and_replay_in_order() {
    let dir = tempfile::tempdir().unwrap();
    rack(dir.path(), "sync", || {
        let a = account("alice");
        assert_eq!(a.call(Deposit(5)), Ok(5));
        assert_eq!(a.call(Deposit(7)), Ok(12));
        assert_eq!(a.read(|a| a.balance).unwrap(), 12);
    });
    rack(dir.path(), "os", || {
        let a = account("alice");
        assert_eq!(a.read(|a| a.history.clone()).unwrap(), vec![5, 7]);
        assert_eq!(a.call(Deposit(1)), Ok(13));
    });
    rack(dir.path(), "sync", || {
        assert_eq!(account("alice").read(|a| a.balance).unwrap(), 13);
        assert_eq!(
            account("bob").read(|a| a.balance).unwrap(),
            0,
            "a new property"
        );
    });
}

#[test]
fn a_retry_is_answered_from_its_record_and_not_run_again() {
    let dir = tempfile::tempdir().unwrap();
    rack(dir.path(), "os", || {
        let a = account("alice");
        let trust = a.resolve().unwrap();
        let args = |seq, ack, amount: i64| CallArgs {
            client: 42,
            seq,
            ack,
            argument: postcard::to_allocvec(&Deposit(amount)).unwrap().into(),
            passing: None,
        };
        let call = |args| {
            cell::output::<i64>(
                "alice",
                "d",
                trust.apply_deferred_with(cell::run::<Account, Deposit>, args),
            )
            .unwrap()
        };
        assert_eq!(call(args(1, 1, 5)), 5);
        assert_eq!(call(args(1, 1, 5)), 5, "the same call again");
        assert_eq!(call(args(2, 1, 3)), 8);
        assert_eq!(call(args(1, 1, 5)), 5, "an old call, not yet acknowledged");
        assert_eq!(call(args(3, 3, 1)), 9, "acknowledges 1 and 2");
        assert_eq!(a.read(|a| a.history.clone()).unwrap(), vec![5, 3, 1]);
        let stale = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call(args(1, 3, 5))));
        let message = *stale.unwrap_err().downcast::<String>().unwrap();
        assert!(message.contains("acknowledged"), "{message}");
    });
}

#[test]
fn a_panicking_op_has_no_effect_even_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    rack(dir.path(), "os", || {
        let a = account("carol");
        assert_eq!(a.call(Deposit(5)), Ok(5));
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            a.call(DepositBelow {
                amount: 10,
                limit: 8,
            })
        }));
        let message = *panicked.unwrap_err().downcast::<String>().unwrap();
        assert!(message.contains("over the limit"), "{message}");
        assert_eq!(
            a.read(|a| (a.balance, a.history.clone())).unwrap(),
            (5, vec![5])
        );
        assert_eq!(
            a.call(DepositBelow {
                amount: 2,
                limit: 8
            }),
            Ok(7)
        );
    });
    rack(dir.path(), "os", || {
        assert_eq!(
            account("carol")
                .read(|a| (a.balance, a.history.clone()))
                .unwrap(),
            (7, vec![5, 2])
        );
    });
}

#[test]
fn many_calls_snapshot_compact_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let n = super::SNAPSHOT_RECORDS as i64 * 2 + 100;
    rack(dir.path(), "os", move || {
        let a = account("dave");
        let done = std::rc::Rc::new(std::cell::Cell::new(0));
        for i in 0..n {
            let counted = done.clone();
            a.call_then(Deposit(1), move |r| {
                assert!(r.unwrap() > 0, "deposit {i}");
                counted.set(counted.get() + 1);
            });
            if i % 256 == 255 {
                while done.get() < i - 64 {
                    crate::yield_now();
                }
            }
        }
        while done.get() < n {
            crate::yield_now();
        }
        assert_eq!(a.read(|a| a.balance).unwrap(), n);
    });
    rack(dir.path(), "os", move || {
        let a = account("dave");
        assert_eq!(
            a.read(|a| (a.balance, a.history.len() as i64)).unwrap(),
            (n, n)
        );
    });
}

#[test]
fn a_dump_shows_properties_records_and_what_a_crash_left() {
    let dir = tempfile::tempdir().unwrap();
    rack(dir.path(), "os", || {
        let a = account("alice");
        a.call(Deposit(5)).unwrap();
        a.call(Deposit(6)).unwrap();
    });
    let rank = dir.path().join("unit/rank-0");
    let text = super::dump(&rank).unwrap();
    assert!(text.contains("property \"alice\""), "{text}");
    assert_eq!(
        text.matches(": test.deposit from client").count(),
        2,
        "{text}"
    );
    let mut segments: Vec<_> = std::fs::read_dir(rank.join("log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    segments.sort();
    let newest = segments.pop().unwrap();
    let before = std::fs::read(&newest).unwrap();
    std::fs::write(&newest, [&before[..], &[7, 0, 0]].concat()).unwrap();
    let text = super::dump(&rank).unwrap();
    assert!(text.contains("the tail a crash tore"), "{text}");
    assert_eq!(
        std::fs::read(&newest).unwrap().len(),
        before.len() + 3,
        "a dump changes nothing"
    );
}

#[test]
fn a_property_of_another_type_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    rack(dir.path(), "os", || {
        account("erin");
        let wrong = crate::this_node().durable("erin", || 0u64).unwrap_err();
        assert!(matches!(wrong, DurableError::Type { .. }), "{wrong}");
        assert!(wrong.to_string().contains("Account"), "{wrong}");
    });
    rack(dir.path(), "os", || {
        let wrong = crate::this_node().durable("erin", || 0u64).unwrap_err();
        assert!(matches!(wrong, DurableError::Type { .. }), "{wrong}");
    });
}

#[test]
fn a_second_process_on_the_same_state_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    rack(dir.path(), "os", move || {
        account("frank");
        let again = super::store::Store::open(
            &path.join("unit").join("rank-0"),
            crate::env::Durability::Os,
            "test",
        )
        .unwrap_err();
        assert!(matches!(again, DurableError::InUse { .. }), "{again}");
    });
}

#[test]
fn a_handle_with_nothing_behind_it_says_so() {
    let dir = tempfile::tempdir().unwrap();
    rack(dir.path(), "os", || {
        let ghost: Durable<Account> =
            postcard::from_bytes(&postcard::to_allocvec(&(0u32, "ghost", None::<()>)).unwrap())
                .unwrap();
        let err = ghost.call(Deposit(1)).unwrap_err();
        assert!(
            matches!(err, CallError::Open(DurableError::NotFound { .. })),
            "{err}"
        );
    });
}

mod window {
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::time::{Duration, Instant};

    use super::super::{WINDOW, client};
    use super::*;

    #[test]
    fn a_thread_holds_its_calls_past_the_window_until_earlier_ones_are_answered() {
        let dir = tempfile::tempdir().unwrap();
        rack(dir.path(), "os", || {
            let a = account("alice");
            let calls = 3 * WINDOW;
            let outputs: Rc<RefCell<Vec<i64>>> = Rc::default();
            // In delegated context nothing can wait: every call is made before any answer.
            let held: Rc<RefCell<Option<usize>>> = Rc::default();
            let (a2, into, held_after) = (a.clone(), outputs.clone(), held.clone());
            trust::defer(move || {
                for _ in 0..calls {
                    let into = into.clone();
                    a2.call_then(Deposit(1), move |b| into.borrow_mut().push(b.unwrap()));
                }
                *held_after.borrow_mut() = Some(client::held_calls());
            });
            trust::yield_now();
            assert_eq!(*held.borrow(), Some((calls - WINDOW) as usize));
            let deadline = Instant::now() + Duration::from_secs(60);
            while outputs.borrow().len() < calls as usize {
                assert!(
                    Instant::now() < deadline,
                    "answers to {calls} calls, {} in",
                    outputs.borrow().len()
                );
                trust::yield_now();
            }
            assert_eq!(client::held_calls(), 0);
            let mut seen = outputs.borrow().clone();
            seen.sort_unstable();
            assert_eq!(seen, (1..=calls as i64).collect::<Vec<_>>());
            assert_eq!(a.call(Deposit(1)), Ok(calls as i64 + 1), "blocking, too");
        });
    }

    #[test]
    fn a_call_past_its_clients_window_is_refused_and_not_run() {
        let dir = tempfile::tempdir().unwrap();
        rack(dir.path(), "os", || {
            let a = account("alice");
            let trust = a.resolve().unwrap();
            let client = client::session_id(&[b"a window test"]);
            let call = |seq, ack| {
                let args = CallArgs {
                    client,
                    seq,
                    ack,
                    argument: postcard::to_allocvec(&Deposit(1)).unwrap().into(),
                    passing: None,
                };
                let answer = trust.apply_deferred_with(cell::run::<Account, Deposit>, args);
                std::panic::catch_unwind(|| cell::output::<i64>("alice", "d", answer))
            };
            assert_eq!(call(WINDOW, 1).unwrap(), Ok(1), "the last seq within");
            let message = *call(WINDOW + 1, 1)
                .unwrap_err()
                .downcast::<String>()
                .unwrap();
            assert!(message.contains("window of 1024"), "{message}");
            assert_eq!(
                a.read(|a| a.history.clone()).unwrap(),
                vec![1],
                "the refused call never ran"
            );
        });
    }
}

mod sessions {
    use super::super::session::Session;
    use super::*;

    /// The calls a session sends until the process "ends" after logging a1 (and, with
    /// `sent`, after its property ran it), without a2.
    fn crash_after_a1(session: &Session, acct: &Durable<Account>, amount: i64, sent: bool) {
        session.begin_for_test(acct, Deposit(amount), sent);
    }

    #[test]
    fn a_session_numbers_its_calls_across_processes() {
        let dir = tempfile::tempdir().unwrap();
        rack(dir.path(), "os", || {
            let s = Session::open("driver").unwrap();
            let a = account("alice");
            assert_eq!(s.call(&a, Deposit(5)), Ok(5));
            assert_eq!(s.call(&a, Deposit(2)), Ok(7));
            assert!(s.pending().is_empty());
        });
        rack(dir.path(), "sync", || {
            let s = Session::open("driver").unwrap();
            assert!(s.pending().is_empty());
            assert!(s.resume().unwrap().is_empty());
            assert_eq!(s.call(&account("alice"), Deposit(1)), Ok(8));
        });
    }

    #[test]
    fn resume_runs_a_call_that_never_left_once() {
        let dir = tempfile::tempdir().unwrap();
        rack(dir.path(), "os", || {
            let s = Session::open("driver").unwrap();
            let a = account("alice");
            assert_eq!(s.call(&a, Deposit(5)), Ok(5));
            crash_after_a1(&s, &a, 100, false);
        });
        rack(dir.path(), "os", || {
            let s = Session::open("driver").unwrap();
            let pending = s.pending();
            assert_eq!(pending.len(), 1);
            assert_eq!(pending[0].op(), "test.deposit");
            assert_eq!(pending[0].output::<i64>(), None);
            let resumed = s.resume().unwrap();
            assert_eq!(resumed[0].output::<i64>(), Some(Ok(105)));
            assert!(s.resume().unwrap().is_empty(), "nothing pending any more");
            assert_eq!(
                account("alice").read(|a| a.history.clone()).unwrap(),
                vec![5, 100]
            );
            assert_eq!(s.call(&account("alice"), Deposit(1)), Ok(106));
        });
    }

    #[test]
    fn a_session_open_twice_in_a_process_is_refused_and_one_handle_serves_many_fibers() {
        let dir = tempfile::tempdir().unwrap();
        rack(dir.path(), "os", || {
            let first = Session::open("driver").unwrap();
            let err = Session::open("driver").expect_err("a second handle of one session");
            assert_eq!(
                err,
                DurableError::SessionOpen {
                    name: "driver".into()
                }
            );
            assert!(err.to_string().contains("share that Session"), "{err}");
            let other = Session::open("another").expect("another name opens");
            drop(other);
            // One handle, shared by fibers: every call takes effect once.
            fn shareable<S: Send + Sync>() {}
            shareable::<Session>();
            let shared = std::sync::Arc::new(first);
            let a = account("alice");
            let fibers: Vec<_> = (0..4)
                .map(|_| {
                    let (s, a) = (shared.clone(), a.clone());
                    trust::spawn(move || {
                        for _ in 0..50 {
                            s.call(&a, Deposit(1)).unwrap();
                        }
                    })
                })
                .collect();
            fibers.into_iter().for_each(|f| f.join());
            assert_eq!(
                a.read(|a| a.balance).unwrap(),
                200,
                "every call took effect"
            );
            drop(shared);
            let again = Session::open("driver").expect("open again once dropped");
            assert_eq!(again.call(&a, Deposit(1)), Ok(201));
        });
    }

    #[test]
    fn a_call_a_window_past_an_unsettled_one_fails_instead_of_waiting_forever() {
        use super::super::WINDOW;
        use std::time::{Duration, Instant};
        let dir = tempfile::tempdir().unwrap();
        rack(dir.path(), "os", || {
            let s = Session::open("driver").unwrap();
            crash_after_a1(&s, &account("alice"), 100, false); // seq 1, never answered
        });
        rack(dir.path(), "os", || {
            let s = std::sync::Arc::new(Session::open("driver").unwrap());
            let b = account("bob");
            for _ in 1..WINDOW {
                s.call(&b, Deposit(1)).unwrap(); // seqs 2..=1024: within seq 1's window
            }
            let (s2, b2) = (s.clone(), b.clone());
            let past = trust::spawn(move || s2.call(&b2, Deposit(1)));
            let deadline = Instant::now() + Duration::from_secs(60);
            while !past.is_finished() {
                assert!(
                    Instant::now() < deadline,
                    "the call a window past the unsettled call 1 still waits after 60 s"
                );
                trust::sleep(Duration::from_millis(10));
            }
            let err = past.join().expect_err("a window past an unsettled call");
            assert_eq!(
                err,
                CallError::Unsettled {
                    seq: 1,
                    property: "alice".into()
                }
            );
            assert!(err.to_string().contains("Session::resume"), "{err}");
            assert_eq!(
                b.read(|b| b.balance).unwrap(),
                i64::try_from(WINDOW - 1).unwrap()
            );
            let resumed = s.resume().unwrap();
            assert_eq!(resumed[0].output::<i64>(), Some(Ok(100)));
            assert_eq!(s.call(&b, Deposit(1)), Ok(i64::try_from(WINDOW).unwrap()));
        });
    }

    #[test]
    fn resume_answers_a_call_that_ran_from_its_record() {
        let dir = tempfile::tempdir().unwrap();
        rack(dir.path(), "sync", || {
            let s = Session::open("driver").unwrap();
            crash_after_a1(&s, &account("alice"), 100, true);
            assert_eq!(account("alice").read(|a| a.balance).unwrap(), 100, "it ran");
        });
        rack(dir.path(), "sync", || {
            let s = Session::open("driver").unwrap();
            let resumed = s.resume().unwrap();
            assert_eq!(resumed.len(), 1);
            assert_eq!(
                resumed[0].output::<i64>(),
                Some(Ok(100)),
                "the recorded output"
            );
            assert_eq!(
                account("alice").read(|a| a.history.clone()).unwrap(),
                vec![100],
                "ran once"
            );
        });
    }
}

mod blobs {
    use std::time::{Duration, Instant};

    use super::super::session::Session;
    use super::super::{Blob, BlobError};
    use super::*;

    /// Adds up the bytes of the blob it carries, and keeps the sum.
    #[derive(Serialize, Deserialize)]
    struct Ingest(Blob);

    impl Op<Account> for Ingest {
        const NAME: &'static str = "test.ingest";
        type Output = Result<i64, BlobError>;
        fn apply(self, a: &mut Account, cx: &mut Cx<Account>) -> Result<i64, BlobError> {
            let sum = cx.read(&self.0)?.iter().map(|&b| i64::from(b)).sum();
            a.history.push(sum);
            Ok(sum)
        }
    }

    /// Makes a blob of `n` bytes `byte` and returns it; with `panic`, then panics.
    #[derive(Serialize, Deserialize)]
    struct Produce {
        n: usize,
        byte: u8,
        panic: bool,
    }

    impl Op<Account> for Produce {
        const NAME: &'static str = "test.produce";
        type Output = Blob;
        fn apply(self, _: &mut Account, cx: &mut Cx<Account>) -> Blob {
            let blob = cx.blob(&vec![self.byte; self.n]);
            assert!(!self.panic, "made a blob, then panicked");
            blob
        }
    }

    /// Frees a blob.
    #[derive(Serialize, Deserialize)]
    struct Release(Blob);

    impl Op<Account> for Release {
        const NAME: &'static str = "test.release";
        type Output = Result<(), BlobError>;
        fn apply(self, _: &mut Account, cx: &mut Cx<Account>) -> Result<(), BlobError> {
            cx.free(&self.0)
        }
    }

    durable_ops!(Account: Ingest, Produce, Release);

    fn bytes() -> Vec<u8> {
        (0..10_000u32).map(|i| (i % 251) as u8).collect()
    }

    fn sum(bytes: &[u8]) -> i64 {
        bytes.iter().map(|&b| i64::from(b)).sum()
    }

    fn until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !f() {
            assert!(Instant::now() < deadline, "waited 20 s for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_blob_passed_by_reference_is_leased_until_the_callee_snapshot_covers_the_call() {
        let dir = tempfile::tempdir().unwrap();
        rack(dir.path(), "sync", || {
            let a = account("alice");
            let s = Session::open("driver").unwrap();
            let b = s.blob(&bytes()).unwrap();
            assert_eq!(b.len(), 10_000);
            assert_eq!(b.read().unwrap(), bytes());
            assert_eq!(s.call(&a, Ingest(b.clone())).unwrap(), Ok(sum(&bytes())));
            let leased = s.free(&b).unwrap_err();
            assert!(
                matches!(leased, BlobError::Leased { leases: 1, .. }),
                "{leased}"
            );
            snapshot(&a);
            until("the lease to end", || match s.free(&b) {
                Ok(()) => true,
                Err(BlobError::Leased { .. }) => false,
                Err(e) => panic!("{e}"),
            });
            assert!(matches!(b.read(), Err(BlobError::Gone { .. })));
            let refused = s.call(&a, Ingest(b.clone())).unwrap_err();
            assert!(
                matches!(refused, CallError::Blob(BlobError::Gone { .. })),
                "{refused}"
            );
            assert_eq!(
                a.read(|a| a.history.clone()).unwrap(),
                vec![sum(&bytes()), 0]
            );
        });
    }

    /// The blob files under `dir`, wherever the rank's directory is.
    fn blob_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                found.extend(blob_files(&path));
            } else if path.parent().is_some_and(|p| p.ends_with("blobs")) {
                found.push(path);
            }
        }
        found
    }

    #[test]
    fn a_call_whose_blob_cannot_be_fetched_ends_its_lease_and_does_not_run() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        rack(dir.path(), "sync", move || {
            let a = account("alice");
            let s = Session::open("driver").unwrap();
            let b = s.blob(&bytes()).unwrap();
            // The bytes are lost (a disk gone bad): the lease is taken, the fetch fails.
            let files = blob_files(&root);
            assert_eq!(files.len(), 1, "{files:?}");
            std::fs::remove_file(&files[0]).unwrap();
            let refused = s.call(&a, Ingest(b.clone())).unwrap_err();
            assert!(
                matches!(refused, CallError::Blob(BlobError::Gone { .. })),
                "{refused}"
            );
            assert_eq!(a.read(|a| a.history.clone()).unwrap(), Vec::<i64>::new());
            s.free(&b)
                .expect("no lease left by the call that did not run");
        });
    }

    /// The id in the store of this rank's property `name`.
    fn store_id(name: &str) -> u32 {
        let host = super::super::host::host().unwrap();
        host.store.property(name).unwrap().id
    }

    #[test]
    fn blob_files_whose_making_was_never_logged_are_removed_when_their_property_opens() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = dir.path().join("unit/rank-0/blobs");
        let (made, ids) = {
            let blobs = blobs.clone();
            let out = std::sync::Arc::new(Mutex::new(None));
            let put = out.clone();
            rack(dir.path(), "sync", move || {
                let a = account("alice");
                let kept = a
                    .call(Produce {
                        n: 4,
                        byte: 2,
                        panic: false,
                    })
                    .unwrap();
                let s = Session::open("driver").unwrap();
                let session_blob = s.blob(&bytes()).unwrap();
                // An op that made a blob and then panicked: its record is durable, its blob
                // was never made.
                let panicking = Produce {
                    n: 6,
                    byte: 5,
                    panic: true,
                };
                let panicked =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.call(panicking)));
                assert!(panicked.is_err());
                // What a process killed between writing a blob's bytes and logging its
                // making leaves: the file (and a temporary one), for alice and for the
                // session.
                let (alice, session) = (store_id("alice"), store_id("gossamer.session/driver"));
                let orphan = |id: u32, fill: u8, suffix: &str| {
                    let hash = super::super::store::sha256(&[fill; 8]);
                    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
                    std::fs::write(blobs.join(format!("{id:010}-{hex}{suffix}")), [fill; 8])
                        .unwrap();
                };
                orphan(alice, 7, "");
                orphan(alice, 8, ".tmp");
                orphan(session, 9, "");
                *put.lock().unwrap() = Some(((kept, session_blob), (alice, session)));
            });
            out.lock().unwrap().take().unwrap()
        };
        let names = |dir: &Path| {
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        let of = |id: u32| {
            let prefix = format!("{id:010}-");
            names(&blobs)
                .into_iter()
                .filter(|n| n.starts_with(&prefix))
                .count()
        };
        assert_eq!(
            of(ids.0),
            4,
            "alice: its blob, the panicked op's, two orphans"
        );
        assert_eq!(of(ids.1), 2, "the session: its blob and an orphan");
        let (kept, session_blob) = made;
        // Only alice opens: her orphans go, her blob stays, the session's files stay.
        rack(dir.path(), "sync", move || {
            let a = account("alice");
            assert_eq!(a.call(Ingest(kept.clone())).unwrap(), Ok(8));
            assert_eq!(kept.read().unwrap(), vec![2; 4]);
        });
        assert_eq!(
            of(ids.0),
            1,
            "alice keeps only her blob: {:?}",
            names(&blobs)
        );
        assert_eq!(of(ids.1), 2, "the session was not opened");
        rack(dir.path(), "sync", move || {
            let s = Session::open("driver").unwrap();
            assert_eq!(session_blob.read().unwrap(), bytes());
            s.free(&session_blob).unwrap();
        });
        assert_eq!(
            of(ids.1),
            1,
            "the session keeps only its blob (freed, not yet snapshotted)"
        );
    }

    #[test]
    fn a_lease_for_a_call_that_never_ran_ends_when_its_blob_is_freed() {
        use super::super::blob::{Change, Holder, Lease};
        let dir = tempfile::tempdir().unwrap();
        let out = std::sync::Arc::new(Mutex::new(None));
        let put = out.clone();
        rack(dir.path(), "sync", move || {
            let a = account("alice");
            let s = Session::open("driver").unwrap();
            let b = s.blob(&bytes()).unwrap();
            // What a call that leased the blob and never ran leaves at its maker: alice's
            // process ended after the lease was logged and before the call's record was,
            // and the thread that called, in a process ended too, never sends it again.
            let lease = Lease {
                lessee: Holder {
                    rank: 0,
                    property: "alice".into(),
                },
                client: 0x5eed,
                seq: 1,
            };
            super::super::fetch::ask_maker(&b, lease_change(b.id(), lease)).unwrap();
            // A call that ran and that no snapshot covers yet holds its lease.
            assert_eq!(s.call(&a, Ingest(b.clone())).unwrap(), Ok(sum(&bytes())));
            let refused = s.free(&b).unwrap_err();
            assert!(
                matches!(refused, BlobError::Leased { leases: 1, .. }),
                "only the call that ran holds it: {refused}"
            );
            *put.lock().unwrap() = Some(b);
        });
        let b = out.lock().unwrap().take().unwrap();
        rack(dir.path(), "sync", move || {
            let s = Session::open("driver").unwrap();
            let refused = s.free(&b).unwrap_err();
            assert!(
                matches!(refused, BlobError::Leased { leases: 1, .. }),
                "alice's log holds the call that ran: {refused}"
            );
            snapshot(&account("alice"));
            until("the lease of the call that ran to end", || {
                match s.free(&b) {
                    Ok(()) => true,
                    Err(BlobError::Leased { .. }) => false,
                    Err(e) => panic!("{e}"),
                }
            });
            assert!(matches!(b.read(), Err(BlobError::Gone { .. })));
        });
        fn lease_change(id: u64, lease: Lease) -> Change {
            Change::Lease { id, lease, take: 1 }
        }
    }

    #[test]
    fn an_op_refused_a_free_for_a_lease_no_call_needs_frees_it_later() {
        use super::super::blob::{Change, Holder, Lease};
        let dir = tempfile::tempdir().unwrap();
        rack(dir.path(), "sync", || {
            let a = account("alice");
            let _bob = account("bob");
            let made = a
                .call(Produce {
                    n: 3,
                    byte: 4,
                    panic: false,
                })
                .unwrap();
            // A lease bob's process took for a call that never ran.
            let lease = Lease {
                lessee: Holder {
                    rank: 0,
                    property: "bob".into(),
                },
                client: 0x5eed,
                seq: 1,
            };
            let take = Change::Lease {
                id: made.id(),
                lease,
                take: 1,
            };
            super::super::fetch::ask_maker(&made, take).unwrap();
            let refused = a.call(Release(made.clone())).unwrap().unwrap_err();
            assert!(
                matches!(refused, BlobError::Leased { leases: 1, .. }),
                "{refused}"
            );
            until("a later free to go", || {
                match a.call(Release(made.clone())).unwrap() {
                    Ok(()) => true,
                    Err(BlobError::Leased { .. }) => false,
                    Err(e) => panic!("{e}"),
                }
            });
            assert!(matches!(made.read(), Err(BlobError::Gone { .. })));
        });
    }

    #[test]
    fn a_blob_larger_than_a_message_is_made_and_read() {
        let dir = tempfile::tempdir().unwrap();
        rack_with(dir.path(), &[("GSM_MAX_MESSAGE", "64KiB")], || {
            let s = Session::open("driver").unwrap();
            let big: Vec<u8> = (0..300_000u32).map(|i| (i % 241) as u8).collect();
            let b = s.blob(&big).unwrap();
            assert_eq!(b.len(), 300_000);
            assert_eq!(b.read().unwrap(), big);
            let a = account("alice");
            assert_eq!(s.call(&a, Ingest(b)).unwrap(), Ok(sum(&big)));
        });
    }

    #[test]
    fn a_restarted_property_fetches_the_blobs_its_calls_carried() {
        let dir = tempfile::tempdir().unwrap();
        rack(dir.path(), "sync", || {
            let s = Session::open("driver").unwrap();
            let b = s.blob(&bytes()).unwrap();
            s.call(&account("alice"), Ingest(b)).unwrap().unwrap();
        });
        let dump = super::super::dump(&dir.path().join("unit/rank-0")).unwrap();
        assert!(dump.contains("carried blob 0 of"), "{dump}");
        rack(dir.path(), "os", || {
            let a = account("alice");
            assert_eq!(a.read(|a| a.history.clone()).unwrap(), vec![sum(&bytes())]);
            let s = Session::open("driver").unwrap();
            let b = s.blob(&[7; 3]).unwrap();
            assert_eq!(s.call(&a, Ingest(b)).unwrap(), Ok(21));
        });
    }

    #[test]
    fn a_returned_blob_passes_to_the_calling_session_and_a_panic_makes_none() {
        let dir = tempfile::tempdir().unwrap();
        rack(dir.path(), "os", || {
            let a = account("alice");
            let s = Session::open("driver").unwrap();
            let panicking = Produce {
                n: 5,
                byte: 1,
                panic: true,
            };
            let panicked =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.call(&a, panicking)));
            assert!(panicked.is_err());
            let made = s
                .call(
                    &a,
                    Produce {
                        n: 5,
                        byte: 9,
                        panic: false,
                    },
                )
                .unwrap();
            assert!(
                made.to_string().starts_with("blob 0 of"),
                "the panic made none: {made}"
            );
            assert_eq!(made.read().unwrap(), vec![9; 5]);
            // The session controls it now: the property that made it cannot free it (nor
            // does passing a property its own blob lease it).
            let refused = a.call(Release(made.clone())).unwrap().unwrap_err();
            assert!(
                matches!(refused, BlobError::NotController { .. }),
                "{refused}"
            );
            assert_eq!(s.call(&a, Ingest(made.clone())).unwrap(), Ok(45));
            s.free(&made).unwrap();
            assert!(matches!(made.read(), Err(BlobError::Gone { .. })));
            // One a thread had made stays with the property.
            let kept = a
                .call(Produce {
                    n: 2,
                    byte: 3,
                    panic: false,
                })
                .unwrap();
            let refused = s.free(&kept).unwrap_err();
            assert!(
                matches!(refused, BlobError::NotController { .. }),
                "{refused}"
            );
            assert_eq!(a.call(Release(kept.clone())).unwrap(), Ok(()));
            assert!(matches!(kept.read(), Err(BlobError::Gone { .. })));
        });
    }
}

mod transfers {
    use super::super::Then;
    use super::*;

    /// Takes `amount` out and deposits it in `to` (through `Cx::call`); refunds it if the
    /// deposit fails.
    #[derive(Serialize, Deserialize)]
    struct Send {
        amount: i64,
        to: Durable<Account>,
        limit: i64,
    }

    impl Op<Account> for Send {
        const NAME: &'static str = "test.send";
        type Output = i64;
        fn apply(self, a: &mut Account, cx: &mut Cx<Account>) -> i64 {
            a.balance -= self.amount;
            cx.call(
                &self.to,
                DepositBelow {
                    amount: self.amount,
                    limit: self.limit,
                },
                Sent {
                    amount: self.amount,
                },
            );
            a.balance
        }
    }

    #[derive(Serialize, Deserialize)]
    struct Sent {
        amount: i64,
    }

    impl Then<Account> for Sent {
        const NAME: &'static str = "test.sent";
        type Input = i64;
        fn then(self, a: &mut Account, outcome: Result<i64, CallError>, _: &mut Cx<Account>) {
            match outcome {
                Ok(_) => a.history.push(-self.amount),
                Err(CallError::Panicked(_)) => a.balance += self.amount, // refunded
                Err(e) => panic!("{e}"),
            }
        }
    }

    durable_ops!(Account: Send; then Sent);

    /// Waits (yielding) until `f` holds, at most 20 s.
    fn until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !f() {
            assert!(
                std::time::Instant::now() < deadline,
                "waited 20 s for {what}"
            );
            crate::yield_now();
        }
    }

    #[test]
    fn a_call_from_an_op_runs_once_and_its_continuation_after() {
        let dir = tempfile::tempdir().unwrap();
        rack(dir.path(), "sync", || {
            let (a, b) = (account("a"), account("b"));
            assert_eq!(a.call(Deposit(100)), Ok(100));
            let send = |amount, limit| Send {
                amount,
                to: b.clone(),
                limit,
            };
            assert_eq!(a.call(send(30, 1000)), Ok(70));
            until("the deposit and its continuation", || {
                a.read(|a| a.history.len()).unwrap() == 2
            });
            assert_eq!(b.read(|b| b.balance).unwrap(), 30);
            assert_eq!(a.read(|a| a.history.clone()).unwrap(), vec![100, -30]);
            // A deposit that panics in `b`: the continuation gets the panic and refunds.
            assert_eq!(a.call(send(50, 60)), Ok(20));
            until("the refund", || a.read(|a| a.balance).unwrap() == 70);
            assert_eq!(
                b.read(|b| (b.balance, b.history.clone())).unwrap(),
                (30, vec![30])
            );
        });
        rack(dir.path(), "os", || {
            // Replayed: the calls were answered, nothing is sent again.
            let (a, b) = (account("a"), account("b"));
            assert_eq!(
                a.read(|a| (a.balance, a.history.clone())).unwrap(),
                (70, vec![100, -30])
            );
            assert_eq!(b.read(|b| b.balance).unwrap(), 30);
        });
    }
}

mod leases {
    use std::time::{Duration, Instant};

    use super::super::session::Session;
    use super::*;

    /// Waits until the rank's log shows a lease record, and returns the log as text.
    fn wait_for_lapse(dir: &Path) -> String {
        let rank = dir.join("unit").join("rank-0");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = crate::durable::dump(&rank).expect("the state reads");
            if text.contains("leases ended") {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "no lease ended within 30 s; the log:\n{text}"
            );
            // Sleeps little at a time: the sweeps need this worker too.
            trust::yield_now();
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_session_quiet_past_its_lease_finds_its_unanswered_call_expired() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        rack_with(
            dir.path(),
            &[("GSM_DURABILITY", "os"), ("GSM_SESSION_LEASE", "1s")],
            move || {
                let s = Session::open("quiet").unwrap();
                // The call runs, and its answer never reaches the session (its process "ends").
                s.begin_for_test(&account("alice"), Deposit(5), true);
                let log = wait_for_lapse(&path);
                assert!(log.contains("below seq 2"), "seq 1 expired:\n{log}");
            },
        );
        // Reopened with the default lease: the lapse was logged, and is replayed.
        rack(dir.path(), "os", || {
            let s = Session::open("quiet").unwrap();
            let resumed = s.resume().unwrap();
            assert_eq!(resumed.len(), 1);
            let err = resumed[0].output::<i64>().unwrap().unwrap_err();
            assert!(
                matches!(&err, CallError::Expired { property, seq: 1 } if property == "alice"),
                "{err}"
            );
            assert!(err.to_string().contains("at most once"), "{err}");
            assert!(s.pending().is_empty(), "an expired call is finished");
            // Later calls are new ones, and the expired call ran once (before its lease ended).
            assert_eq!(s.call(&account("alice"), Deposit(1)), Ok(6));
            assert_eq!(
                account("alice").read(|a| a.history.clone()).unwrap(),
                vec![5, 1]
            );
        });
    }

    #[test]
    fn the_records_of_a_thread_of_an_ended_run_go_after_the_client_lease() {
        let dir = tempfile::tempdir().unwrap();
        rack(dir.path(), "os", || {
            // Its last call stays recorded: no later call acknowledged it.
            assert_eq!(account("alice").call(Deposit(3)), Ok(3));
        });
        let path = dir.path().to_path_buf();
        rack_with(
            dir.path(),
            &[("GSM_DURABILITY", "os"), ("GSM_CLIENT_LEASE", "200ms")],
            move || {
                let a = account("alice");
                assert_eq!(a.call(Deposit(1)), Ok(4));
                let log = wait_for_lapse(&path);
                // One client's lease ended: the earlier run's thread, not this one's.
                let ended = log.lines().filter(|l| l.contains("leases ended")).count();
                assert_eq!(ended, 1, "{log}");
                assert_eq!(a.call(Deposit(1)), Ok(5), "this run's thread calls on");
            },
        );
    }
}

/// Damaged logs and snapshots: refused naming what and where, cut knowingly, and the
/// fallback from an unreadable newer snapshot to the older one.
mod damage {
    use std::fs;
    use std::path::PathBuf;
    use std::sync::Arc;

    use super::*;

    /// A rank's files of one kind (`log` or `snap`), sorted.
    fn files(dir: &Path, kind: &str) -> Vec<PathBuf> {
        let mut all: Vec<_> = fs::read_dir(dir.join("unit/rank-0").join(kind))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        all.sort();
        all
    }

    /// Where each frame of a segment starts, up to its zeros.
    fn frame_starts(bytes: &[u8]) -> Vec<usize> {
        let mut starts = Vec::new();
        let mut at = 0;
        loop {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            if len == 0 {
                return starts;
            }
            starts.push(at);
            at += 8 + len;
        }
    }

    fn flip(path: &Path, at: usize) {
        let mut bytes = fs::read(path).unwrap();
        bytes[at] ^= 0x04;
        fs::write(path, bytes).unwrap();
    }

    /// Alice: deposits 1 to 5, a snapshot, deposits 6 to 40; her history as read then.
    fn alice(dir: &Path) -> Vec<i64> {
        let history = Arc::new(Mutex::new(Vec::new()));
        let read = history.clone();
        rack(dir, "os", move || {
            let a = account("alice");
            for i in 1..=5 {
                a.call(Deposit(i)).unwrap();
            }
            snapshot(&a);
            for i in 6..=40 {
                a.call(Deposit(i)).unwrap();
            }
            *read.lock().unwrap() = a.read(|a| a.history.clone()).unwrap();
        });
        let history = history.lock().unwrap().clone();
        assert_eq!(history.len(), 41, "40 deposits and the snapshot's");
        history
    }

    /// What opening alice in `dir` gives: her history, or the error.
    fn reopen(dir: &Path) -> Result<Vec<i64>, String> {
        let out = Arc::new(Mutex::new(None));
        let put = out.clone();
        rack(dir, "os", move || {
            let opened = crate::this_node().durable("alice", Account::default);
            *put.lock().unwrap() = Some(
                opened
                    .map_err(|e| e.to_string())
                    .and_then(|a| a.read(|a| a.history.clone()).map_err(|e| e.to_string())),
            );
        });
        let opened = out.lock().unwrap().take();
        opened.expect("the rack ran its main")
    }

    #[test]
    fn an_unreadable_newer_snapshot_falls_back_to_the_older_one_and_the_records_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let history = alice(dir.path());
        let snaps = files(dir.path(), "snap");
        assert_eq!(snaps.len(), 2, "{snaps:?}");
        flip(&snaps[1], 20);
        assert_eq!(reopen(dir.path()), Ok(history));
    }

    #[test]
    fn damage_with_records_after_it_is_refused_then_cut_knowingly_and_the_fallback_refused() {
        let dir = tempfile::tempdir().unwrap();
        let history = alice(dir.path());
        let segment = files(dir.path(), "log").pop().unwrap();
        let bytes = fs::read(&segment).unwrap();
        let starts = frame_starts(&bytes);
        // Deposit 30's record: ten more after it.
        let frame = starts[starts.len() - 11];
        flip(&segment, frame + 12);
        let err = reopen(dir.path()).expect_err("damage with records after it is refused");
        assert!(
            err.contains(&format!("{} is damaged at byte {frame}", segment.display()))
                && err.contains("gsm state cut"),
            "{err}"
        );
        let name = segment.file_name().unwrap().to_str().unwrap();
        let rank = dir.path().join("unit/rank-0");
        let report = super::super::cut(&rank, name, frame as u64).unwrap();
        assert!(
            report.contains("property \"alice\" (id 0): 10 records"),
            "{report}"
        );
        // The newer snapshot was made before the cut records: the older one, which needs
        // every record after it, is not used in its stead.
        let newer = files(dir.path(), "snap").pop().unwrap();
        let intact = fs::read(&newer).unwrap();
        flip(&newer, 20);
        let err = reopen(dir.path()).expect_err("no fallback across a cut");
        assert!(err.contains("cut knowingly after it"), "{err}");
        fs::write(&newer, intact).unwrap();
        assert_eq!(
            reopen(dir.path()),
            Ok(history[..history.len() - 11].to_vec())
        );
    }
}
