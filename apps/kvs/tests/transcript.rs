//! Replays a transcript recorded from Debian's memcached 1.6.18 by `differential.py --record`
//! against the kvs engine, comparing every answer (cas uniques, stats values and the version
//! masked, exactly as the differential test does).
//!
//! Re-record with (memcached on 22122 and 22123):
//! `python3 apps/kvs/tests/differential.py --seed 11 --rounds 600 --record apps/kvs/tests/data/memcached-1.6.18.trace`

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use common::{CasSeen, normalize, resolve, rounds, show, split, trace};
use kvs::config::Config;
use kvs::conn::{Engine, Input};

#[test]
fn kvs_engine_answers_like_memcached_1_6_18() {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let rounds = rounds(&trace());
    assert!(
        rounds.len() > 100,
        "transcript too short: {} rounds",
        rounds.len()
    );
    for shards in [1, 3] {
        let mut engine = Engine::new(
            Config {
                shards,
                ..Config::default()
            },
            now,
        );
        let mut conns: Vec<(Input, CasSeen)> =
            (0..3).map(|_| (engine.connect(), CasSeen::new())).collect();
        for (n, round) in rounds.iter().enumerate() {
            let (conn, cas) = &mut conns[round.conn];
            let mut send = resolve(&round.template, cas);
            if round.sentinel {
                send.extend_from_slice(b"mn\r\n");
            }
            let (out, open) = engine.feed(conn, &send, now);
            let (mut lines, seen) = split(&out, round.sentinel);
            if !seen {
                lines.push(if open {
                    b"<TIMEOUT>".to_vec()
                } else {
                    b"<EOF>".to_vec()
                });
            }
            let got = normalize(&lines, cas);
            assert_eq!(
                show(&got),
                show(&round.expect),
                "round {n} ({shards} shards) differs; sent {:?}",
                String::from_utf8_lossy(&send[..send.len().min(400)])
            );
            if !open || !round.sentinel {
                let (old, _) =
                    std::mem::replace(&mut conns[round.conn], (engine.connect(), CasSeen::new()));
                engine.disconnect(old);
            }
        }
    }
}
