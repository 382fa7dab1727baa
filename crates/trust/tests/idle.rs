//! An idle runtime must not burn a core.

mod common;

use std::time::Duration;

fn process_cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct we pass.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

#[test]
fn idle_workers_park() {
    let rt = common::runtime(2);
    let ct = rt.entrust(0);
    ct.apply(|c| *c += 1); // the runtime has worked, then goes idle
    std::thread::sleep(Duration::from_millis(100));
    let before = process_cpu_time();
    std::thread::sleep(Duration::from_secs(1));
    let used = process_cpu_time() - before;
    assert!(
        used < Duration::from_millis(50),
        "idle runtime used {used:?} of CPU in one second"
    );
    // And it wakes up again.
    assert_eq!(ct.apply(|c| *c), 1);
}
