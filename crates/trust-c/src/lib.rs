//! The trust runtime for C programs: delegation from legacy code, through a C library
//! (`libtrust_c.so`, `libtrust_c.a`) and its header `include/trust.h`, which cbindgen
//! generates from this file (`header/tests/header.rs` fails when it is stale and says how to
//! regenerate it).
//!
//! ```c
//! #include "trust.h"
//!
//! static void *add(void *property, void *arg) {
//!     long *counter = property;
//!     *counter += (long)(intptr_t)arg;
//!     return (void *)(intptr_t)*counter;
//! }
//!
//! trust_runtime *rt;
//! trust_runtime_new(2, 0, &rt);                   // two workers; 0 = one per core
//! long *counter = calloc(1, sizeof *counter);
//! trust_trust *t;
//! trust_entrust(rt, counter, free, &t);           // the trustee owns it from now on
//! void *now;
//! trust_apply(t, add, (void *)(intptr_t)5, &now); // from any thread: runs on the trustee
//! trust_release(t);                               // the last handle: free(counter) there
//! trust_runtime_free(rt);
//! ```
//!
//! `c/counter_table.c` is a whole program: a counter and a chained hash table shared by
//! threads under a `pthread_mutex_t`, a `pthread_spinlock_t`, `trust_apply` and
//! `trust_apply_then`, as an example and a benchmark (`bench capi`).
//!
//! # The contract with C
//! * A property is a `void *` and a destructor. Entrusting it hands both to the runtime: from
//!   then on the property is touched only by functions run on its trustee (a worker thread),
//!   one at a time, and the destructor runs once, when the last handle is released — on the
//!   trustee, or on the releasing thread once the runtime is freed. Whatever a property points
//!   to must be usable from that thread.
//! * A function run on a trustee (`trust_fn`) and a `then` callback (`trust_then_fn`) run in
//!   *delegated context*: they must return promptly and may not block. Calls that would wait
//!   there (`trust_apply`, `trust_join`, `trust_event_wait`, `trust_yield`, freeing the
//!   runtime) fail with `TRUST_ERROR_DELEGATED_CONTEXT` instead. They must return normally:
//!   unwinding out of them (a C++ exception) aborts the process, and `longjmp` out of them is
//!   undefined behaviour, as through any Rust frame.
//! * `arg`, `ctx` and results are passed through untouched; they must be safe to use on the
//!   thread that receives them (the trustee for `arg`, the caller's worker for `ctx`).
//! * No Rust panic crosses into C: each function catches any, and returns
//!   `TRUST_ERROR_PANIC` with the panic's message in [`trust_last_error`].
//! * Handles are plain pointers: using one after releasing (or freeing) it is undefined, as
//!   with `free`. NULL where a handle is required is an error, `TRUST_ERROR_NULL`.
//!
//! # Where waiting happens
//! `trust_apply` and `trust_join` wait: a plain thread spins, then sleeps; a fiber (started
//! by [`trust_spawn`]) suspends, and its worker runs other fibers meanwhile. `trust_apply_then`
//! does not wait in a fiber: `then` runs later on the same worker, in the order the requests
//! were made to that trustee. On a plain thread, which has no worker to run it later, it
//! waits and runs `then` before returning. A fiber waits for its callbacks with a
//! [`trust_event`]: the callback that finds the last answer sets it.
//!
//! # Unsafe code here
//! Every exported function dereferences the pointers C passes in: each states what it
//! requires of them (its `# Safety`), and each `unsafe` block why those requirements make it
//! sound. The property and the C arguments cross threads in `Shared`, whose `Send` is
//! C's promise above.

#![allow(non_camel_case_types)]

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::ffi::{CString, c_char, c_void};
use std::future::poll_fn;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::task::{Poll, Waker};
use std::thread::ThreadId;

use trust::{JoinHandle, Runtime, Trust};

/// What a call did: `TRUST_OK`, or why it failed ([`trust_last_error`] has the details).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum trust_status {
    /// Done.
    TRUST_OK = 0,
    /// A pointer that must not be NULL was NULL.
    TRUST_ERROR_NULL = 1,
    /// The runtime could not be started (no threads, too many trustees for the workers).
    TRUST_ERROR_START = 2,
    /// A call that waits was made in delegated context: inside a function run on a trustee or
    /// a `then` callback, where waiting would stall the trustee.
    TRUST_ERROR_DELEGATED_CONTEXT = 3,
    /// A call that must not be made on a worker of the runtime was (freeing the runtime, which
    /// waits for its workers).
    TRUST_ERROR_ON_WORKER = 4,
    /// An event was used on a thread other than the one that made it.
    TRUST_ERROR_WRONG_THREAD = 5,
    /// An event was waited for by two fibers at once, or freed while one waits.
    TRUST_ERROR_BUSY = 6,
    /// A wait that nothing could end: an event not yet set, waited for outside a fiber.
    TRUST_ERROR_WOULD_BLOCK_FOREVER = 7,
    /// The runtime failed the call (it shut down before the request ran, say); the message
    /// says how.
    TRUST_ERROR_PANIC = 8,
}

use trust_status::*;

/// A function run on a property's trustee: `property` is the entrusted pointer, `arg` the
/// caller's; what it returns is the call's result.
pub type trust_fn =
    Option<unsafe extern "C" fn(property: *mut c_void, arg: *mut c_void) -> *mut c_void>;

/// A callback run with a request's result, on the worker that made the request.
pub type trust_then_fn = Option<unsafe extern "C" fn(result: *mut c_void, ctx: *mut c_void)>;

/// A property's destructor, run once when its last handle is released.
pub type trust_drop_fn = Option<unsafe extern "C" fn(value: *mut c_void)>;

/// A function run in a fiber.
pub type trust_fiber_fn = Option<unsafe extern "C" fn(arg: *mut c_void)>;

/// A runtime: its worker threads and the trustees among them.
#[derive(Debug)]
pub struct trust_runtime {
    runtime: Runtime,
}

/// A counted handle to an entrusted property.
#[derive(Debug)]
pub struct trust_trust {
    trust: Trust<Property>,
}

/// A started fiber, to be joined.
#[derive(Debug)]
pub struct trust_fiber {
    handle: JoinHandle<()>,
}

/// A one-permit signal between the callbacks and the fibers of one worker thread (see
/// [`trust_event_new`]).
pub struct trust_event {
    thread: ThreadId,
    permit: Cell<bool>,
    waiting: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl std::fmt::Debug for trust_event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("trust_event")
            .field("set", &self.permit.get())
            .field("waiting", &self.waiting.get())
            .finish_non_exhaustive()
    }
}

/// A pointer C hands over to another thread of the runtime.
#[derive(Debug, Clone, Copy)]
struct Shared(*mut c_void);

// SAFETY: C's side of the contract (module docs): what it passes as a property, an `arg`, a
// `ctx` or a result is safe to use on the thread that receives it.
unsafe impl Send for Shared {}

impl Shared {
    /// The pointer. A method, so that closures capture the whole `Shared` (which is `Send`)
    /// rather than its field.
    fn get(self) -> *mut c_void {
        self.0
    }
}

/// An entrusted C value and its destructor.
#[derive(Debug)]
struct Property {
    value: Shared,
    drop: trust_drop_fn,
}

impl Drop for Property {
    fn drop(&mut self) {
        if let Some(drop) = self.drop {
            // SAFETY: C gave this destructor for this value (`trust_entrust`), and the last
            // handle is gone, so nothing uses the value after it.
            unsafe { drop(self.value.get()) };
        }
    }
}

thread_local! {
    /// The message of the last call on this thread that failed.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error and returns `status`.
fn fail(status: trust_status, message: impl Into<String>) -> trust_status {
    let mut message = message.into();
    message.retain(|c| c != '\0');
    let message = CString::new(message).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = message);
    status
}

/// Runs `body`, turning a panic into `TRUST_ERROR_PANIC` with the panic's message.
fn guard(body: impl FnOnce() -> trust_status) -> trust_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(status) => status,
        Err(panic) => fail(TRUST_ERROR_PANIC, panic_message(&*panic)),
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// Fails with `TRUST_ERROR_DELEGATED_CONTEXT` in delegated context, where `what` would wait.
fn may_wait(what: &str) -> Result<(), trust_status> {
    if trust::in_delegated_context() {
        return Err(fail(
            TRUST_ERROR_DELEGATED_CONTEXT,
            format!(
                "{what} waits, and was called in delegated context (a function run on a trustee \
                 or a then callback); use trust_apply_then there"
            ),
        ));
    }
    Ok(())
}

/// Fails with `TRUST_ERROR_NULL` naming `what` if `p` is NULL.
#[inline(always)]
fn non_null<T>(p: *const T, what: &'static str) -> Result<(), trust_status> {
    if p.is_null() {
        return Err(null(what));
    }
    Ok(())
}

/// The failure of a NULL `what`: out of line, so that the checks cost a test and a branch.
#[cold]
#[inline(never)]
fn null(what: &'static str) -> trust_status {
    fail(TRUST_ERROR_NULL, format!("{what} is NULL"))
}

/// The message of the last call on the calling thread that failed: a NUL-terminated string,
/// empty if none has. It stays valid until the next failing call on this thread; fibers of
/// one worker share a thread, so read it before the fiber waits again.
#[unsafe(no_mangle)]
pub extern "C" fn trust_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Starts a runtime of `workers` worker threads (0: one per core), of which the last
/// `dedicated_trustees` only serve as trustees, and stores it in `*out`.
///
/// # Safety
/// `out` must be NULL or valid for writing a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trust_runtime_new(
    workers: usize,
    dedicated_trustees: usize,
    out: *mut *mut trust_runtime,
) -> trust_status {
    guard(|| {
        if let Err(status) = non_null(out, "out") {
            return status;
        }
        let mut builder = Runtime::builder().dedicated_trustees(dedicated_trustees);
        if workers > 0 {
            builder = builder.workers(workers);
        }
        match builder.build() {
            Ok(runtime) => {
                let rt = Box::into_raw(Box::new(trust_runtime { runtime }));
                // SAFETY: `out` is valid for writing (caller), and not NULL (checked).
                unsafe { out.write(rt) };
                TRUST_OK
            }
            Err(e) => fail(TRUST_ERROR_START, format!("the runtime did not start: {e}")),
        }
    })
}

/// Stops a runtime: lets its workers finish what they run, waits for them, and frees it.
/// Handles to its properties stay valid to release (destructors then run on the releasing
/// thread); applying through them fails. NULL is ignored.
///
/// # Safety
/// `rt` must be NULL or a runtime from [`trust_runtime_new`] not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trust_runtime_free(rt: *mut trust_runtime) -> trust_status {
    guard(|| {
        if rt.is_null() {
            return TRUST_OK;
        }
        if let Err(status) = may_wait("trust_runtime_free") {
            return status;
        }
        if trust::current_worker().is_some() {
            return fail(
                TRUST_ERROR_ON_WORKER,
                "trust_runtime_free was called on a worker thread, which it would wait for; \
                 call it from a plain thread",
            );
        }
        // SAFETY: a runtime from `trust_runtime_new` (caller), freed once: this is its end.
        drop(unsafe { Box::from_raw(rt) });
        TRUST_OK
    })
}

/// Entrusts `value` to a trustee of `rt` (chosen round-robin) and stores the first handle to
/// it in `*out`. `drop` (may be NULL) runs once with `value` when the last handle is released.
///
/// # Safety
/// `rt` must be a live runtime; `out` valid for writing a pointer; `value` and `drop` must
/// meet the contract in the module docs (used only on the trustee from now on).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trust_entrust(
    rt: *const trust_runtime,
    value: *mut c_void,
    drop: trust_drop_fn,
    out: *mut *mut trust_trust,
) -> trust_status {
    guard(|| {
        if let Err(status) = non_null(rt, "the runtime").and(non_null(out, "out")) {
            return status;
        }
        // SAFETY: a live runtime (caller), not NULL (checked).
        let rt = unsafe { &*rt };
        let trust = rt.runtime.entrust(Property {
            value: Shared(value),
            drop,
        });
        // SAFETY: `out` is valid for writing (caller), and not NULL (checked).
        unsafe { out.write(Box::into_raw(Box::new(trust_trust { trust }))) };
        TRUST_OK
    })
}

/// A new handle to the property of `t`; NULL if `t` is NULL.
///
/// # Safety
/// `t` must be NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trust_clone(t: *const trust_trust) -> *mut trust_trust {
    if t.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a live handle (caller), not NULL (checked). Cloning a `Trust` counts a reference
    // and cannot panic.
    let trust = unsafe { &*t }.trust.clone();
    Box::into_raw(Box::new(trust_trust { trust }))
}

/// Releases a handle; the last one's release destroys the property on its trustee. NULL is
/// ignored.
///
/// # Safety
/// `t` must be NULL or a live handle, not used after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trust_release(t: *mut trust_trust) -> trust_status {
    guard(|| {
        if !t.is_null() {
            // SAFETY: a live handle (caller), released once: this is its end.
            drop(unsafe { Box::from_raw(t) });
        }
        TRUST_OK
    })
}

/// Runs `fn(property, arg)` on the property's trustee and waits for it; stores what it
/// returned in `*result` (if `result` is not NULL). From any thread; in a fiber only the fiber
/// waits. Not in delegated context (`TRUST_ERROR_DELEGATED_CONTEXT`).
///
/// # Safety
/// `t` must be a live handle; `result` NULL or valid for writing a pointer; `fn` and `arg`
/// must meet the contract in the module docs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trust_apply(
    t: *const trust_trust,
    r#fn: trust_fn,
    arg: *mut c_void,
    result: *mut *mut c_void,
) -> trust_status {
    guard(|| {
        if let Err(status) = non_null(t, "the trust").and(may_wait("trust_apply")) {
            return status;
        }
        let Some(f) = r#fn else {
            return null("the function");
        };
        let arg = Shared(arg);
        // SAFETY: a live handle (caller), not NULL (checked).
        let t = unsafe { &*t };
        let answer = t.trust.apply(move |p| {
            // SAFETY: `f` takes the property and `arg` (caller); on the trustee, the only
            // place the property is used.
            Shared(unsafe { f(p.value.get(), arg.get()) })
        });
        if !result.is_null() {
            // SAFETY: `result` is valid for writing (caller), and not NULL (checked).
            unsafe { result.write(answer.get()) };
        }
        TRUST_OK
    })
}

/// Runs `fn(property, arg)` on the property's trustee without waiting; `then(result, ctx)`
/// runs later on the calling worker with what it returned (may be NULL: nothing runs). The
/// requests one worker makes to one trustee run in order, and so do their `then`s. Allowed
/// in delegated context. On a plain thread it waits and runs `then` before returning.
///
/// # Safety
/// `t` must be a live handle; `fn`, `arg`, `then` and `ctx` must meet the contract in the
/// module docs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trust_apply_then(
    t: *const trust_trust,
    r#fn: trust_fn,
    arg: *mut c_void,
    then: trust_then_fn,
    ctx: *mut c_void,
) -> trust_status {
    guard(|| {
        if let Err(status) = non_null(t, "the trust") {
            return status;
        }
        let Some(f) = r#fn else {
            return null("the function");
        };
        let (arg, ctx) = (Shared(arg), Shared(ctx));
        // SAFETY: a live handle (caller), not NULL (checked).
        let t = unsafe { &*t };
        let run = move |p: &mut Property| {
            // SAFETY: as in `trust_apply`.
            Shared(unsafe { f(p.value.get(), arg.get()) })
        };
        let deliver = move |answer: Shared| {
            if let Some(then) = then {
                // SAFETY: `then` takes the result and `ctx` (caller), on this thread.
                unsafe { then(answer.get(), ctx.get()) }
            }
        };
        if trust::current_worker().is_some() {
            t.trust.apply_then(run, deliver);
        } else {
            // A plain thread has no worker to run `then` later (Rust's `apply_then` refuses
            // there): the C call keeps its documented behaviour and waits.
            deliver(t.trust.apply(run));
        }
        TRUST_OK
    })
}

/// Starts `fn(arg)` in a fiber on a worker of `rt` (round-robin over the workers that are not
/// dedicated trustees) and stores its handle in `*out`, to be joined. In the fiber,
/// `trust_apply` suspends only the fiber and `trust_apply_then` does not wait.
///
/// # Safety
/// `rt` must be a live runtime; `out` valid for writing a pointer; `arg` safe to use on the
/// worker.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trust_spawn(
    rt: *const trust_runtime,
    r#fn: trust_fiber_fn,
    arg: *mut c_void,
    out: *mut *mut trust_fiber,
) -> trust_status {
    guard(|| {
        if let Err(status) = non_null(rt, "the runtime").and(non_null(out, "out")) {
            return status;
        }
        let Some(f) = r#fn else {
            return null("the function");
        };
        let arg = Shared(arg);
        // SAFETY: a live runtime (caller), not NULL (checked).
        let rt = unsafe { &*rt };
        let handle = rt.runtime.spawn(move || {
            // SAFETY: `f` takes `arg` (caller), which is usable on the worker.
            unsafe { f(arg.get()) }
        });
        // SAFETY: `out` is valid for writing (caller), and not NULL (checked).
        unsafe { out.write(Box::into_raw(Box::new(trust_fiber { handle }))) };
        TRUST_OK
    })
}

/// Waits for a fiber to finish and frees its handle (also when the join fails, unless with
/// `TRUST_ERROR_NULL` or `TRUST_ERROR_DELEGATED_CONTEXT`, which leave it untouched). In a
/// fiber only the fiber waits.
///
/// # Safety
/// `fiber` must be a handle from [`trust_spawn`] not joined before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trust_join(fiber: *mut trust_fiber) -> trust_status {
    guard(|| {
        if let Err(status) = non_null(fiber, "the fiber").and(may_wait("trust_join")) {
            return status;
        }
        // SAFETY: a fiber handle (caller), joined once: this is its end.
        let fiber = unsafe { Box::from_raw(fiber) };
        fiber.handle.join();
        TRUST_OK
    })
}

/// Lets the other fibers of this worker run (and its callbacks, and its requests go out);
/// on a plain thread, yields the thread.
#[unsafe(no_mangle)]
pub extern "C" fn trust_yield() -> trust_status {
    guard(|| {
        if let Err(status) = may_wait("trust_yield") {
            return status;
        }
        trust::yield_now();
        TRUST_OK
    })
}

/// A new event, unset, and stores it in `*out`. An event belongs to the calling thread (a
/// worker, for use by its fibers and callbacks): `trust_event_set` from a callback wakes the
/// fiber in `trust_event_wait`, or lets its next wait return at once. With a counter in
/// `ctx`, it is how a fiber waits for its `apply_then` callbacks:
///
/// ```c
/// struct done { long count, wake_at; trust_event *event; };
/// static void counted(void *result, void *ctx) {
///     struct done *d = ctx;
///     if (++d->count == d->wake_at) trust_event_set(d->event);
/// }
/// // in the fiber, after n trust_apply_then(t, fn, arg, counted, &d):
/// if (d.count < n) { d.wake_at = n; trust_event_wait(d.event); }
/// ```
///
/// # Safety
/// `out` must be NULL or valid for writing a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trust_event_new(out: *mut *mut trust_event) -> trust_status {
    guard(|| {
        if let Err(status) = non_null(out, "out") {
            return status;
        }
        let event = trust_event {
            thread: std::thread::current().id(),
            permit: Cell::new(false),
            waiting: Cell::new(false),
            waker: Cell::new(None),
        };
        // SAFETY: `out` is valid for writing (caller), and not NULL (checked).
        unsafe { out.write(Box::into_raw(Box::new(event))) };
        TRUST_OK
    })
}

/// The event behind `e`, if the calling thread is the one that made it.
///
/// # Safety
/// `e` must be NULL or a live event.
unsafe fn event_here<'a>(e: *const trust_event) -> Result<&'a trust_event, trust_status> {
    non_null(e, "the event")?;
    // SAFETY: a live event (caller), not NULL (checked).
    let event = unsafe { &*e };
    if event.thread != std::thread::current().id() {
        return Err(fail(
            TRUST_ERROR_WRONG_THREAD,
            "the event was made on another thread; an event serves the fibers and callbacks of \
             one worker",
        ));
    }
    Ok(event)
}

/// Sets the event: wakes the fiber waiting for it, or lets the next wait return at once. Allowed
/// in delegated context (a `then` callback).
///
/// # Safety
/// `e` must be a live event.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trust_event_set(e: *const trust_event) -> trust_status {
    guard(|| {
        // SAFETY: a live event (caller).
        let event = match unsafe { event_here(e) } {
            Ok(event) => event,
            Err(status) => return status,
        };
        event.permit.set(true);
        if let Some(waker) = event.waker.take() {
            waker.wake();
        }
        TRUST_OK
    })
}

/// Waits until the event is set, then unsets it; returns at once if it is set. Only the
/// calling fiber waits. One fiber at a time may wait for an event (`TRUST_ERROR_BUSY`).
///
/// # Safety
/// `e` must be a live event.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trust_event_wait(e: *const trust_event) -> trust_status {
    guard(|| {
        if let Err(status) = may_wait("trust_event_wait") {
            return status;
        }
        // SAFETY: a live event (caller).
        let event = match unsafe { event_here(e) } {
            Ok(event) => event,
            Err(status) => return status,
        };
        if event.permit.replace(false) {
            return TRUST_OK;
        }
        if trust::current_worker().is_none() {
            return fail(
                TRUST_ERROR_WOULD_BLOCK_FOREVER,
                "trust_event_wait on a plain thread for an event not set: only this thread could \
                 set it; wait in a fiber (trust_spawn)",
            );
        }
        if event.waiting.replace(true) {
            return fail(TRUST_ERROR_BUSY, "another fiber waits for this event");
        }
        let waited = catch_unwind(AssertUnwindSafe(|| {
            trust::block_on(poll_fn(|cx| {
                if event.permit.replace(false) {
                    return Poll::Ready(());
                }
                event.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            }))
        }));
        // Not waiting any more, however the wait ended (a runtime shut down under it panics).
        event.waiting.set(false);
        if let Err(panic) = waited {
            std::panic::resume_unwind(panic);
        }
        TRUST_OK
    })
}

/// Frees an event. NULL is ignored.
///
/// # Safety
/// `e` must be NULL or a live event, not used after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trust_event_free(e: *mut trust_event) -> trust_status {
    guard(|| {
        if e.is_null() {
            return TRUST_OK;
        }
        // SAFETY: a live event (caller).
        let event = match unsafe { event_here(e) } {
            Ok(event) => event,
            Err(status) => return status,
        };
        if event.waiting.get() {
            return fail(TRUST_ERROR_BUSY, "a fiber waits for the event");
        }
        // SAFETY: a live event (caller), freed once: this is its end.
        drop(unsafe { Box::from_raw(e) });
        TRUST_OK
    })
}
