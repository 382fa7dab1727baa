//! Waiting inside a rack job without holding up the worker.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Suspends the calling fiber (not its worker, which keeps serving its links) for `d`.
pub(crate) fn pause(d: Duration) {
    struct Pause {
        until: Instant,
        timer: bool,
    }
    impl Future for Pause {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let now = Instant::now();
            if now >= self.until {
                return Poll::Ready(());
            }
            if !self.timer {
                self.timer = true;
                let (waker, left) = (cx.waker().clone(), self.until - now);
                std::thread::spawn(move || {
                    std::thread::sleep(left);
                    waker.wake();
                });
            }
            Poll::Pending
        }
    }
    gossamer::block_on(Pause {
        until: Instant::now() + d,
        timer: false,
    });
}
