//! The README's range-lock example: run it on one node, or under `gsm run -n 3`.

use rangelock::{Mode, RangeLock};
use std::time::{Duration, Instant};

// `pub(crate)`: the crate's rack test runs this very file on 3 ranks.
pub(crate) fn main() -> std::process::ExitCode {
    gossamer::Rack::from_env().run(|| {
        let home = gossamer::nodes().last().unwrap(); // the table lives on the last node
        let locks = RangeLock::entrust_on(home, 1 << 16); // units 0..65536
        let mut w = locks.write(0..64).unwrap(); // only this fiber waits; Err: a bad range
        let soon = Instant::now() + Duration::from_millis(10);
        assert!(locks.read_until(32..40, soon).is_err()); // TimedOut: 32..40 is written
        assert!(locks.try_write(300..310).is_ok()); // never waits (Err: WouldBlock)
        let upper = w.split_at(32).unwrap(); // partial unlock: dropping `upper` frees 32..64
        drop(upper);
        let r = w.downgrade(); // write → read without a gap
        let both = locks
            .lock_all(&[(100..108, Mode::Write), (900..910, Mode::Read)])
            .unwrap();
        let group = gossamer::Group::new(); // to wait for the callback
        let then = group.track(|g: rangelock::Guard| assert_eq!(g.ranges().len(), 1));
        locks.lock_then(400..410, Mode::Write, then).unwrap(); // allowed in delegated context
        group.wait();
        drop((r, both));
        println!("range locks served by rank {}", home.rank());
    })
}
