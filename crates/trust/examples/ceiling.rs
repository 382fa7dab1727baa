//! Requests one trustee serves per second: one worker issues `apply_then` increments to a
//! trustee (its own, or a dedicated one) as fast as it can. Used for profiling the hot path:
//! `cargo run --release -p trust --example ceiling -- [requests] [workers]`.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let requests: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    let workers: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let rt = trust::Runtime::builder()
        .workers(workers)
        .dedicated_trustees(workers - 1)
        .build()
        .unwrap();
    let counter = rt.entrust(0u64);
    let c = counter.clone();
    let began = Instant::now();
    rt.spawn_on(0, move || {
        let answered = Rc::new(Cell::new(0u64));
        let waiter: Rc<RefCell<Option<(u64, Waker)>>> = Rc::default();
        let wait_for = |target: u64| {
            trust::block_on(std::future::poll_fn(|cx| {
                if answered.get() >= target {
                    return Poll::Ready(());
                }
                *waiter.borrow_mut() = Some((target, cx.waker().clone()));
                Poll::Pending
            }))
        };
        let mut issued = 0;
        while issued < requests {
            for _ in 0..256 {
                let (a, w) = (answered.clone(), waiter.clone());
                c.apply_then(
                    |n| *n += 1,
                    move |()| {
                        a.set(a.get() + 1);
                        if w.borrow().as_ref().is_some_and(|(t, _)| a.get() >= *t) {
                            w.borrow_mut().take().expect("checked").1.wake();
                        }
                    },
                );
            }
            issued += 256;
            if issued > 2048 {
                wait_for(issued - 1024); // block, do not poll, until half the window is answered
            }
        }
        wait_for(issued);
    })
    .join();
    let elapsed = began.elapsed();
    let served = counter.apply(|n| *n);
    println!(
        "{served} requests in {elapsed:?}: {:.1} M/s, {:.1} ns each",
        served as f64 / elapsed.as_secs_f64() / 1e6,
        elapsed.as_nanos() as f64 / served as f64
    );
}
