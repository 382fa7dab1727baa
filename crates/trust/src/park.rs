//! Parking an idle thread and waking it when someone publishes work to it.
//!
//! # Protocol
//!
//! A [`Parker`] belongs to one thread (a worker, or an external client thread). Its `state` is
//! `AWAKE` or `SLEEPING`.
//!
//! * The owner, finding nothing to do, calls [`Parker::prepare`]: it stores `SLEEPING`, then
//!   issues a `SeqCst` fence. It then checks every place work can arrive (published batches,
//!   answered batches, its injection queue) once more. If it finds work it calls
//!   [`Parker::cancel`]; otherwise [`Parker::park`] sleeps until the state leaves `SLEEPING`.
//! * A publisher first makes its work visible (a release store of a sequence number, or a
//!   push under a lock), then calls [`Parker::wake`]: a `SeqCst` fence, then a load of `state`;
//!   if it is `SLEEPING`, a swap to `AWAKE` and a futex wake.
//!
//! The two fences are ordered one way or the other in the single total order of `SeqCst`
//! fences. If the owner's fence comes first, the publisher's load after its own fence sees
//! `SLEEPING` and wakes it. If the publisher's fence comes first, the owner's re-check after
//! its fence sees the published work. Either way no wake-up is lost. The fast path of a
//! publisher costs one fence and one load of a line that is only written when the owner sleeps.
//!
//! The futex wait itself re-checks the state in the kernel, so a wake between the owner's
//! last check and its sleep is not lost either.

use crate::loom::sync::atomic::{AtomicU32, Ordering, fence};

const AWAKE: u32 = 0;
const SLEEPING: u32 = 1;

/// The sleep state of one thread. See the module docs for the protocol.
#[repr(align(128))]
pub(crate) struct Parker {
    state: AtomicU32,
    #[cfg(loom)]
    lock: loom::sync::Mutex<()>,
    #[cfg(loom)]
    condvar: loom::sync::Condvar,
    /// Set by a layer above when the owner may sleep somewhere other than the futex (the
    /// `net` reactor's `epoll_wait`): called on every wake-up that finds the owner asleep.
    wake_hook: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for Parker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parker")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl Parker {
    pub(crate) fn new() -> Self {
        Parker {
            state: AtomicU32::new(AWAKE),
            #[cfg(loom)]
            lock: loom::sync::Mutex::new(()),
            #[cfg(loom)]
            condvar: loom::sync::Condvar::new(),
            wake_hook: std::sync::OnceLock::new(),
        }
    }

    /// Sets the function that wakes the owner where it sleeps besides the futex (once; later
    /// calls are ignored).
    #[cfg_attr(not(feature = "net"), allow(dead_code))]
    pub(crate) fn set_wake_hook(&self, hook: Box<dyn Fn() + Send + Sync>) {
        let _ = self.wake_hook.set(hook);
    }

    /// Owner: announces the intention to sleep. Re-check for work afterwards.
    pub(crate) fn prepare(&self) {
        self.state.store(SLEEPING, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Owner: found work after [`Parker::prepare`]; stays awake.
    pub(crate) fn cancel(&self) {
        self.state.store(AWAKE, Ordering::Relaxed);
    }

    /// Owner: sleeps until woken. Spurious returns are possible; callers loop.
    pub(crate) fn park(&self) {
        self.park_for(None);
    }

    /// Owner: sleeps until woken or until `timeout` has passed. Spurious returns are
    /// possible; callers loop. (Under loom the timeout is ignored: models have no clock.)
    pub(crate) fn park_timeout(&self, timeout: std::time::Duration) {
        self.park_for(Some(timeout));
    }

    #[cfg_attr(loom, allow(unused_variables))]
    fn park_for(&self, timeout: Option<std::time::Duration>) {
        #[cfg(not(loom))]
        {
            if self.state.load(Ordering::Acquire) == SLEEPING {
                futex_wait(&self.state, SLEEPING, timeout);
            }
        }
        #[cfg(loom)]
        {
            let mut guard = self.lock.lock().unwrap();
            while self.state.load(Ordering::Acquire) == SLEEPING {
                guard = self.condvar.wait(guard).unwrap();
            }
        }
        self.state.store(AWAKE, Ordering::Relaxed);
    }

    /// Whether the owner is awake now: a hint for a caller deciding how to wait for it (it
    /// may fall asleep or wake up right after), never part of the protocol.
    pub(crate) fn is_awake(&self) -> bool {
        self.state.load(Ordering::Relaxed) == AWAKE
    }

    /// Publisher: wakes the owner if it sleeps or is about to. Call after publishing the work.
    #[inline]
    pub(crate) fn wake(&self) {
        fence(Ordering::SeqCst);
        if self.state.load(Ordering::Relaxed) == SLEEPING {
            self.wake_slow();
        }
    }

    #[cold]
    fn wake_slow(&self) {
        if self.state.swap(AWAKE, Ordering::Release) == SLEEPING {
            #[cfg(not(loom))]
            futex_wake(&self.state);
            if let Some(hook) = self.wake_hook.get() {
                hook();
            }
            #[cfg(loom)]
            {
                drop(self.lock.lock().unwrap());
                self.condvar.notify_one();
            }
        }
    }
}

#[cfg(not(loom))]
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<std::time::Duration>) {
    // A relative timeout, as FUTEX_WAIT takes it; a huge one saturates.
    let timespec = timeout.map(|t| libc::timespec {
        tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: t.subsec_nanos().into(),
    });
    let timespec_ptr = timespec
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT on a valid, aligned u32 that lives as long as the call, with a null
    // or valid timespec; the kernel returns at once if the word no longer holds `expected`.
    // Errors (EINTR, EAGAIN, ETIMEDOUT) are spurious wake-ups, which callers tolerate.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            timespec_ptr,
        );
    }
}

#[cfg(not(loom))]
fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a valid, aligned u32; waking nobody is harmless.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        );
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::sync::atomic::AtomicBool;

    /// The owner sleeps only when no work was published, and a publisher always wakes a
    /// sleeping owner: the model would deadlock (and loom report it) on a lost wake-up.
    #[test]
    fn no_lost_wakeup() {
        loom::model(|| {
            let parker = Arc::new(Parker::new());
            let work = Arc::new(AtomicBool::new(false));
            let publisher = {
                let (parker, work) = (parker.clone(), work.clone());
                loom::thread::spawn(move || {
                    work.store(true, Ordering::Release);
                    parker.wake();
                })
            };
            loop {
                if work.load(Ordering::Acquire) {
                    break;
                }
                parker.prepare();
                if work.load(Ordering::Acquire) {
                    parker.cancel();
                    break;
                }
                parker.park();
            }
            publisher.join().unwrap();
        });
    }
}
