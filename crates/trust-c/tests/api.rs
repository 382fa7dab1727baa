//! The C API's contract, driven from Rust through the exported functions: errors instead of
//! panics, destructors run once, events bound to their thread.

use std::ffi::{CStr, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering};

use trust_c::trust_status::*;
use trust_c::*;

fn last_error() -> String {
    // SAFETY: `trust_last_error` returns a NUL-terminated string valid until the next failing
    // call on this thread.
    unsafe { CStr::from_ptr(trust_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn runtime(workers: usize) -> *mut trust_runtime {
    let mut rt = null_mut();
    // SAFETY: `rt` is valid for writing.
    assert_eq!(unsafe { trust_runtime_new(workers, 0, &mut rt) }, TRUST_OK);
    rt
}

/// An integer passed where C passes a pointer.
fn int(n: usize) -> *mut c_void {
    std::ptr::without_provenance_mut(n)
}

unsafe extern "C" fn free_counter(value: *mut c_void) {
    // SAFETY: the value is a `Box<u64>` entrusted by a test.
    drop(unsafe { Box::from_raw(value.cast::<u64>()) });
}

/// Destructor runs of the one test that counts them (tests run in parallel: no other test
/// may use this destructor).
static DROPPED: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn free_counted(value: *mut c_void) {
    // SAFETY: as `free_counter`.
    unsafe { free_counter(value) };
    DROPPED.fetch_add(1, Ordering::SeqCst);
}

/// A counter at 0 entrusted to `rt`, freed by `drop`.
fn entrusted(rt: *mut trust_runtime, drop: trust_drop_fn) -> *mut trust_trust {
    let mut t = null_mut();
    let value = Box::into_raw(Box::new(0u64)).cast();
    // SAFETY: a live runtime (the caller's); `t` is valid for writing; the value is a fresh
    // `Box<u64>`, used only on its trustee from now on and freed by `drop`.
    let status = unsafe { trust_entrust(rt, value, drop, &mut t) };
    assert_eq!(status, TRUST_OK);
    t
}

unsafe extern "C" fn add(property: *mut c_void, arg: *mut c_void) -> *mut c_void {
    // SAFETY: the property is a `u64`, used only here on its trustee.
    let counter = unsafe { &mut *property.cast::<u64>() };
    *counter += arg as u64;
    *counter as *mut c_void
}

#[test]
fn apply_clone_release_and_the_destructor_runs_once_after_the_last_handle() {
    let rt = runtime(2);
    let t = entrusted(rt, Some(free_counted));
    // SAFETY: live handles to a live runtime, each released once.
    unsafe {
        let copy = trust_clone(t);
        let mut result = null_mut();
        assert_eq!(trust_apply(t, Some(add), int(5), &mut result), TRUST_OK);
        assert_eq!(trust_apply(copy, Some(add), int(2), &mut result), TRUST_OK);
        assert_eq!(result as u64, 7);
        assert_eq!(trust_release(t), TRUST_OK);
        assert_eq!(DROPPED.load(Ordering::SeqCst), 0, "a handle is left");
        assert_eq!(trust_release(copy), TRUST_OK);
        assert_eq!(trust_runtime_free(rt), TRUST_OK);
        assert_eq!(DROPPED.load(Ordering::SeqCst), 1);
    }
}

#[test]
fn null_arguments_are_errors_with_messages() {
    // SAFETY: every pointer passed is NULL or valid; NULLs are the point.
    unsafe {
        assert_eq!(trust_runtime_new(1, 0, null_mut()), TRUST_ERROR_NULL);
        assert!(last_error().contains("out is NULL"), "{}", last_error());
        assert_eq!(
            trust_apply(std::ptr::null(), Some(add), null_mut(), null_mut()),
            TRUST_ERROR_NULL
        );
        assert!(last_error().contains("trust"), "{}", last_error());
        assert_eq!(trust_join(null_mut()), TRUST_ERROR_NULL);
        assert!(trust_clone(std::ptr::null()).is_null());
        assert_eq!(trust_release(null_mut()), TRUST_OK);
        assert_eq!(trust_runtime_free(null_mut()), TRUST_OK);
    }
}

#[test]
fn a_runtime_that_cannot_start_is_an_error() {
    let mut rt = null_mut();
    // SAFETY: `rt` is valid for writing.
    let status = unsafe { trust_runtime_new(2, 2, &mut rt) };
    assert_eq!(status, TRUST_ERROR_START);
    assert!(rt.is_null());
    assert!(
        last_error().contains("dedicated_trustees"),
        "{}",
        last_error()
    );
}

#[test]
fn applying_after_the_runtime_is_freed_fails_without_a_panic_reaching_c() {
    let rt = runtime(1);
    let t = entrusted(rt, Some(free_counter));
    // SAFETY: a live runtime, then a live handle to a property of a freed one.
    unsafe {
        assert_eq!(trust_runtime_free(rt), TRUST_OK);
        let status = trust_apply(t, Some(add), int(1), null_mut());
        assert_eq!(status, TRUST_ERROR_PANIC);
        assert!(last_error().contains("shut down"), "{}", last_error());
        assert_eq!(trust_release(t), TRUST_OK);
    }
}

#[test]
fn events_belong_to_their_thread_and_never_wait_forever() {
    let mut e = null_mut();
    // SAFETY: `e` is valid for writing, then a live event.
    unsafe {
        assert_eq!(trust_event_new(&mut e), TRUST_OK);
        assert_eq!(trust_event_wait(e), TRUST_ERROR_WOULD_BLOCK_FOREVER);
        assert_eq!(trust_event_set(e), TRUST_OK);
        assert_eq!(
            trust_event_wait(e),
            TRUST_OK,
            "a set event lets one wait return"
        );
        let address = e as usize;
        let other = std::thread::spawn(move || {
            let status = trust_event_set(address as *const trust_event);
            (status, last_error())
        })
        .join()
        .expect("the thread ran");
        assert_eq!(other.0, TRUST_ERROR_WRONG_THREAD);
        assert!(other.1.contains("another thread"), "{}", other.1);
        assert_eq!(trust_event_free(e), TRUST_OK);
    }
}

struct Waiting {
    t: *mut trust_trust,
    event: *mut trust_event,
    answers: u64,
    sum: u64,
}

unsafe extern "C" fn answered(result: *mut c_void, ctx: *mut c_void) {
    // SAFETY: `ctx` is the fiber's `Waiting`, and callbacks run on the fiber's worker.
    let w = unsafe { &mut *ctx.cast::<Waiting>() };
    w.answers += 1;
    w.sum = result as u64;
    if w.answers == 100 {
        // SAFETY: the fiber's live event, on its thread.
        assert_eq!(unsafe { trust_event_set(w.event) }, TRUST_OK);
    }
}

unsafe extern "C" fn in_fiber(arg: *mut c_void) {
    // SAFETY: `arg` is the test's `Waiting`, used only by this fiber and its callbacks.
    let w = unsafe { &mut *arg.cast::<Waiting>() };
    // SAFETY: `event` is valid for writing; the trust is live; callbacks get `w`.
    unsafe {
        assert_eq!(trust_event_new(&mut w.event), TRUST_OK);
        for _ in 0..100 {
            let ctx = (w as *mut Waiting).cast();
            assert_eq!(
                trust_apply_then(w.t, Some(add), int(1), Some(answered), ctx),
                TRUST_OK
            );
        }
        assert_eq!(trust_event_wait(w.event), TRUST_OK);
        assert_eq!(trust_event_free(w.event), TRUST_OK);
    }
}

#[test]
fn a_fiber_waits_for_its_callbacks_with_an_event() {
    let rt = runtime(2);
    let t = entrusted(rt, Some(free_counter));
    // SAFETY: a live runtime; the fiber's argument outlives it (joined below).
    unsafe {
        let mut w = Waiting {
            t,
            event: null_mut(),
            answers: 0,
            sum: 0,
        };
        let mut fiber = null_mut();
        let arg = (&mut w as *mut Waiting).cast();
        assert_eq!(trust_spawn(rt, Some(in_fiber), arg, &mut fiber), TRUST_OK);
        assert_eq!(trust_join(fiber), TRUST_OK);
        assert_eq!(
            (w.answers, w.sum),
            (100, 100),
            "answers came in request order"
        );
        assert_eq!(trust_release(t), TRUST_OK);
        assert_eq!(trust_runtime_free(rt), TRUST_OK);
    }
}
