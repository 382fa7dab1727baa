//! The README's barrier example: every member puts a word into the next member's replica and
//! does not wait for it; after a fenced barrier every put has landed. Run it on one node, or
//! under `gsm run -n 3`.

use objects::{Barrier, SharedArray, Work};

// `pub(crate)`: the crate's rack test runs this very file on 3 ranks.
pub(crate) fn main() -> std::process::ExitCode {
    gossamer::Rack::from_env().run(|| {
        let members: Vec<_> = gossamer::nodes().collect();
        // `main` runs on rank 0: start each member's part on its node.
        objects::on_members(&members, |members| {
            let mut barrier = objects::open::<Barrier>("example/barrier", &(), &members).unwrap();
            // One word per member, replicated on every member.
            let n = members.len();
            let slots = objects::open::<SharedArray>("example/slots", &n, &members).unwrap();
            let me = slots.me();
            for round in 1..=100 {
                slots.store(me, round);
                slots.send_to((me + 1) % n, me, &Work::new()); // a put, not awaited
                barrier.wait().unwrap(); // fences every node: the put has landed
                let from = (me + n - 1) % n;
                assert_eq!(
                    slots.load(from),
                    round,
                    "member {from}'s put of round {round}"
                );
                barrier.wait_unfenced().unwrap(); // nobody stores the next round before all read
            }
        });
        println!("barrier: 100 rounds on {} members", members.len());
    })
}
