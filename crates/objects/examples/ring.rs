//! The README's ring example: member 0 broadcasts messages of many sizes, every other member
//! receives each once, in order. Run it under `gsm run -n 3` (a ring needs a reader).

use objects::{Ring, RingParams};

// `pub(crate)`: the crate's rack test runs this very file on 3 ranks.
pub(crate) fn main() -> std::process::ExitCode {
    gossamer::Rack::from_env().run(|| {
        let members: Vec<_> = gossamer::nodes().collect();
        let received = objects::on_members(&members, |members| {
            let params = RingParams {
                writer: 0,
                capacity: 4096,
            }; // 32 KiB of messages
            let message = |i: usize| vec![i as u8; i % 700]; // 0 to 699 bytes
            match objects::open::<Ring>("example/ring", &params, &members).unwrap() {
                Ring::Writer(mut w) => {
                    for i in 0..10_000 {
                        w.send(&message(i)).unwrap(); // waits while a reader is behind
                    }
                    0
                }
                Ring::Reader(mut r) => {
                    for i in 0..10_000 {
                        assert_eq!(r.recv().unwrap(), message(i));
                    }
                    10_000
                }
            }
        });
        println!("ring: {received:?} messages received by each member");
    })
}
