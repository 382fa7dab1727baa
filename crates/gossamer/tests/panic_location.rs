//! A panic that reports a misuse of the API (a call outside `Rack::run`, a worker a node does
//! not have) points at the caller's line, not into the crate. The panic hook is process-wide,
//! so this binary holds a single test.

use std::panic::{self, AssertUnwindSafe, Location};
use std::sync::{Arc, Mutex};

use gossamer::env::Settings;

/// Runs `misuse`, which must panic, and returns the file the panic was reported at.
fn panic_file(what: &str, misuse: impl FnOnce()) -> String {
    let seen: Arc<Mutex<Option<String>>> = Arc::default();
    let record = seen.clone();
    let previous = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        let at = info.location().map(Location::file).unwrap_or("no location");
        record.lock().unwrap().get_or_insert_with(|| at.to_string());
    }));
    let outcome = panic::catch_unwind(AssertUnwindSafe(misuse));
    panic::set_hook(previous);
    assert!(outcome.is_err(), "{what} did not panic");
    let file = seen.lock().unwrap().take();
    file.unwrap_or_else(|| panic!("{what} panicked without reaching the panic hook"))
}

/// A named misuse of the API, and the call that makes it.
type Misuse<'a> = (&'static str, Box<dyn FnOnce() + 'a>);

#[test]
fn misuse_panics_point_at_the_caller() {
    let here = file!();
    let outside: Vec<Misuse> = vec![
        (
            "this_node outside Rack::run",
            Box::new(|| {
                let _ = gossamer::this_node();
            }),
        ),
        (
            "nodes outside Rack::run",
            Box::new(|| drop(gossamer::nodes())),
        ),
        (
            "entrust outside Rack::run",
            Box::new(|| drop(gossamer::entrust(1u32))),
        ),
        (
            "unexport outside Rack::run",
            Box::new(|| {
                gossamer::unexport("counters/1");
            }),
        ),
    ];
    for (what, misuse) in outside {
        assert_eq!(panic_file(what, misuse), here, "{what}");
    }
    let settings = Settings::from_vars(|_| None).expect("the settings of a one-node rack");
    let (tx, rx) = std::sync::mpsc::channel();
    let code = gossamer::Rack::with_settings(settings)
        .workers(1)
        .run(move || {
            let what = "Node::trustee out of range";
            let file = panic_file(what, || {
                let _ = gossamer::this_node().trustee(99);
            });
            tx.send((what, file)).unwrap();
            let what = "Trust::apply in delegated context";
            let (outer, inner) = (gossamer::entrust(0u64), gossamer::entrust(0u64));
            let file = panic_file(what, || {
                outer.local().unwrap().apply(move |_| inner.apply(|c| *c));
            });
            tx.send((what, file)).unwrap();
        });
    assert_eq!(code, std::process::ExitCode::SUCCESS, "the rack's main");
    for _ in 0..2 {
        let (what, file) = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the rack's main to report each misuse inside the rack");
        assert_eq!(file, here, "{what}");
    }
}
