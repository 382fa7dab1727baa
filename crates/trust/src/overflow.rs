//! A readable report when a fiber overflows its stack.
//!
//! Each fiber stack has a guard page at its low end; running into it raises `SIGSEGV`
//! (or `SIGBUS`). Without help the process dies with a bare "Segmentation fault", because the
//! standard library's handler only recognizes the guard pages of thread stacks. This module
//! installs a handler, once per process, that runs on the thread's alternate signal stack
//! (which the standard library sets up for every thread it starts): if the faulting address is
//! in the guard page of the fiber running on this thread, it prints what happened and how to
//! fix it, then aborts. Any other fault goes to the handler installed before, unchanged.
//!
//! The handler only reads a thread-local pair of integers and calls `write` and `abort`, both
//! async-signal-safe.

use std::cell::Cell;
use std::sync::Once;

thread_local! {
    /// `[low, high)`: the guard page of the fiber running on this thread, or empty.
    static GUARD: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

static INSTALL: Once = Once::new();
static mut PREVIOUS_SEGV: Option<libc::sigaction> = None;
static mut PREVIOUS_BUS: Option<libc::sigaction> = None;

/// Installs the handler (once per process).
pub(crate) fn install() {
    INSTALL.call_once(|| {
        // SAFETY: `sigaction` with a zeroed, then filled, struct; the previous actions are stored
        // before any fiber can fault (this runs before the first worker starts), and only read
        // afterwards, by the handler.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = handler as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGSEGV, &action, &mut old) == 0 {
                PREVIOUS_SEGV = Some(old);
            }
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &action, &mut old) == 0 {
                PREVIOUS_BUS = Some(old);
            }
        }
    });
}

/// Records the guard page of the fiber about to run on this thread (`None` when none runs).
pub(crate) fn set_running(guard: Option<(usize, usize)>) {
    GUARD.with(|g| g.set(guard.unwrap_or((0, 0))));
}

/// The guard page of a fiber stack whose mapping starts at `limit` (corosensei's
/// `Stack::limit` of a `DefaultStack`, which maps the guard page at the low end).
pub(crate) fn guard_page(limit: usize) -> (usize, usize) {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    (limit, limit + page)
}

const MESSAGE: &[u8] = b"\ntrust: a fiber overflowed its stack (it ran into the guard page). \
Give fibers more room with Runtime::builder().stack_size(bytes), or move large values to the heap.\n";

extern "C" fn handler(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid `siginfo_t` for SA_SIGINFO handlers of SIGSEGV/SIGBUS.
    let address = unsafe { (*info).si_addr() } as usize;
    let (low, high) = GUARD.try_with(Cell::get).unwrap_or((0, 0));
    if low <= address && address < high {
        // SAFETY: write and abort are async-signal-safe; MESSAGE is a static buffer.
        unsafe {
            libc::write(2, MESSAGE.as_ptr().cast(), MESSAGE.len());
            libc::abort();
        }
    }
    // SAFETY: the previous actions were stored by `install` before this handler could run and
    // are never written again.
    let previous = unsafe {
        if signal == libc::SIGBUS {
            (*std::ptr::addr_of!(PREVIOUS_BUS)).as_ref()
        } else {
            (*std::ptr::addr_of!(PREVIOUS_SEGV)).as_ref()
        }
    };
    match previous {
        Some(previous)
            if previous.sa_sigaction != libc::SIG_DFL && previous.sa_sigaction != libc::SIG_IGN =>
        {
            if previous.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: an SA_SIGINFO handler has this signature.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(previous.sa_sigaction) };
                f(signal, info, context);
            } else {
                // SAFETY: a plain handler has this signature.
                let f: extern "C" fn(libc::c_int) =
                    unsafe { std::mem::transmute(previous.sa_sigaction) };
                f(signal);
            }
        }
        _ => {
            // Restore the default action; returning re-runs the faulting instruction, which
            // then terminates the process as it would have without us.
            // SAFETY: resetting a signal's disposition to the default.
            unsafe {
                libc::signal(signal, libc::SIG_DFL);
            }
        }
    }
}
