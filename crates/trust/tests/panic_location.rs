//! A panic that reports a misuse of the API (a call outside a runtime worker, a blocking call
//! in delegated context, a bad worker index) points at the caller's line, not into the crate.
//! The panic hook is process-wide, so this binary holds a single test.

use std::panic::{self, AssertUnwindSafe, Location};
use std::sync::{Arc, Mutex};

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
/// A misuse made inside the runtime.
type SendMisuse = Box<dyn FnOnce() + Send>;

#[test]
fn misuse_panics_point_at_the_caller() {
    let here = file!();
    let rt = trust::Runtime::builder().workers(2).build().unwrap();
    let counter = rt.entrust(0u64);
    let cases: Vec<Misuse> = vec![
        (
            "trust::entrust outside a worker",
            Box::new(|| drop(trust::entrust(1u32))),
        ),
        (
            "trust::spawn outside a worker",
            Box::new(|| drop(trust::spawn(|| ()))),
        ),
        (
            "trust::defer outside a worker",
            Box::new(|| trust::defer(|| ())),
        ),
        (
            "trust::local_trustee outside a worker",
            Box::new(|| drop(trust::local_trustee())),
        ),
        (
            "Runtime::trustee out of range",
            Box::new(|| drop(rt.trustee(99))),
        ),
        (
            "Runtime::spawn_on out of range",
            Box::new(|| drop(rt.spawn_on(99, || ()))),
        ),
    ];
    for (what, misuse) in cases {
        assert_eq!(panic_file(what, misuse), here, "{what}");
    }
    // Misuse inside the runtime: the panic is caught on the worker and re-raised here by
    // block_on, so record it there.
    let files = rt.block_on(|| {
        let inner = counter.clone();
        let cases: Vec<(&str, SendMisuse)> = vec![
            (
                "Trust::apply in delegated context",
                Box::new(move || {
                    counter.apply(move |_| inner.apply(|c| *c));
                }),
            ),
            (
                "yield_now in delegated context",
                Box::new(|| {
                    trust::local_trustee()
                        .entrust(0u8)
                        .apply(|_| trust::yield_now())
                }),
            ),
            (
                "yield_if_busy in delegated context",
                Box::new(|| {
                    trust::local_trustee()
                        .entrust(0u8)
                        .apply(|_| trust::yield_if_busy())
                }),
            ),
        ];
        cases
            .into_iter()
            .map(|(what, misuse)| (what, panic_file(what, misuse)))
            .collect::<Vec<_>>()
    });
    for (what, file) in files {
        assert_eq!(file, here, "{what}");
    }
}
