//! A peer that sends a bad frame ends the job: rank 1 plays a broken peer through
//! `gossamer::fuzzing::send_raw`, so this test needs the `fuzzing` feature (its own target,
//! with `required-features`, so that plain `cargo test` builds without it).
//!
//! Its own driver (`harness = false`), like `rack.rs`: run without `RACK_SCENARIO` it starts
//! itself once per rank.

use std::time::{Duration, Instant};

use gossamer::Rack;

mod common;

use common::job::{self, finish, start};

fn main() -> std::process::ExitCode {
    if let Ok(scenario) = std::env::var("RACK_SCENARIO") {
        return Rack::from_env().run(move || play(&scenario));
    }
    let both: &[(&str, fn())] = &[
        ("a_bad_frame_ends_the_job", a_bad_frame_ends_the_job),
        (
            "a_frame_out_of_sequence_ends_the_job",
            a_frame_out_of_sequence_ends_the_job,
        ),
        (
            "an_answer_to_no_request_ends_the_job",
            an_answer_to_no_request_ends_the_job,
        ),
        (
            "a_credit_for_no_bank_ends_the_job",
            a_credit_for_no_bank_ends_the_job,
        ),
    ];
    let before = job::on_each_transport(both);
    let once: &[(&str, fn())] = &[
        (
            "a_ring_position_past_its_end_ends_the_job",
            a_ring_position_past_its_end_ends_the_job,
        ),
        (
            "a_name_given_out_of_turn_ends_the_job",
            a_name_given_out_of_turn_ends_the_job,
        ),
        (
            "a_call_of_a_name_never_given_ends_the_job",
            a_call_of_a_name_never_given_ends_the_job,
        ),
        #[cfg(feature = "ucx")]
        (
            "a_ucx_message_out_of_sequence_ends_the_job",
            a_ucx_message_out_of_sequence_ends_the_job,
        ),
    ];
    common::conclude_after("bad_frame", before, once)
}

/// What one rank does: rank 1 sends rank 0 the frame the scenario names, after whatever its
/// link has staged.
fn play(scenario: &str) {
    let first = gossamer::nodes().next().unwrap();
    let last = gossamer::nodes().last().unwrap();
    if scenario == "scribble" {
        gossamer::spawn_on(
            last,
            |first: u32| {
                let first = gossamer::nodes().nth(first as usize).unwrap();
                let worker = gossamer::this_node().rank() % 2;
                let broken = gossamer::fuzzing::corrupt_transport(first, worker);
                assert!(broken, "not on shared memory or UCX");
            },
            first.rank(),
        )
        .join();
        std::thread::sleep(Duration::from_secs(10));
        unreachable!("the broken transport ends the job");
    }
    if scenario == "stray-answer" {
        // Answers may come late and in any order, but only to requests that wait: an id never
        // used, or one already answered (a deferred request answered twice), is a bad frame.
        gossamer::spawn_on(
            last,
            |first: u32| {
                let first = gossamer::nodes().nth(first as usize).unwrap();
                let worker = gossamer::this_node().rank() % 2;
                gossamer::fuzzing::send_answer(first, worker, 1 << 40);
            },
            first.rank(),
        )
        .join();
        std::thread::sleep(Duration::from_secs(10));
        unreachable!("the stray answer ends the job");
    }
    if scenario == "stray-credit" {
        // Credits return banks of the window that were asked for: one more is a bad frame.
        gossamer::spawn_on(
            last,
            |first: u32| {
                let first = gossamer::nodes().nth(first as usize).unwrap();
                gossamer::fuzzing::send_credit(first, gossamer::this_node().rank() % 2);
            },
            first.rank(),
        )
        .join();
        std::thread::sleep(Duration::from_secs(10));
        unreachable!("the stray credit ends the job");
    }
    if let Some(given) = scenario.strip_prefix("named-") {
        // A name numbered out of turn, or a request calling an index never given.
        gossamer::spawn_on(
            last,
            |(first, given): (u32, bool)| {
                let first = gossamer::nodes().nth(first as usize).unwrap();
                let worker = gossamer::this_node().rank() % 2;
                let given = given.then_some((3, "test.name"));
                gossamer::fuzzing::send_named(first, worker, given, 7);
            },
            (first.rank(), given == "out-of-turn"),
        )
        .join();
        std::thread::sleep(Duration::from_secs(10));
        unreachable!("the bad name ends the job");
    }
    let frame = match scenario {
        // A requests frame whose count needs more bytes than its body.
        "bad-frame" => header(1, 7_000, 64, 1, &[0; 64]),
        // A well-formed control frame numbered far past the link's next frame.
        "gap" => header(5, 0, 0, 1 << 40, &[]),
        other => panic!("unknown scenario {other}"),
    };
    gossamer::spawn_on(
        last,
        |(first, frame): (u32, Vec<u8>)| {
            let first = gossamer::nodes().nth(first as usize).unwrap();
            gossamer::fuzzing::send_raw(first, gossamer::this_node().rank() % 2, &frame);
        },
        (first.rank(), frame),
    )
    .join();
    std::thread::sleep(Duration::from_secs(10));
    unreachable!("the bad frame ends the job");
}

/// A frame: its 16-byte header (kind, flags 0, count, body length, seq), then `body`.
fn header(kind: u8, count: u16, body_len: u32, seq: u64, body: &[u8]) -> Vec<u8> {
    let mut frame = vec![kind, 0];
    frame.extend_from_slice(&count.to_le_bytes());
    frame.extend_from_slice(&body_len.to_le_bytes());
    frame.extend_from_slice(&seq.to_le_bytes());
    frame.extend_from_slice(body);
    frame
}

/// Runs `scenario` on two ranks: rank 0 ends with [`gossamer::EXIT_BAD_FRAME`], naming the
/// sender and `why`; rank 1 learns from rank 0 why the job ended.
fn ends_the_job(scenario: &str, why: &str) {
    ends_the_job_on(scenario, why, &[]);
}

fn ends_the_job_on(scenario: &str, why: &str, extra: &[(&str, String)]) {
    let started = Instant::now();
    let results = finish(start(2, scenario, extra), Duration::from_secs(20));
    let all: String = results.iter().map(|r| r.2.clone()).collect();
    let (status0, _, err0) = &results[0];
    assert_eq!(
        status0.code(),
        Some(gossamer::EXIT_BAD_FRAME.into()),
        "rank 0; stderr:\n{all}"
    );
    assert!(
        err0.contains("bad frame from rank 1 (worker ") && err0.contains(why),
        "rank 0 names the sender and {why:?}: {err0}"
    );
    assert_eq!(
        results[1].0.code(),
        Some(gossamer::EXIT_PEER_LOST.into()),
        "rank 1; stderr:\n{all}"
    );
    assert!(
        results[1].2.contains("rank 1") && results[1].2.contains("bad frame"),
        "rank 1 learns why: {}",
        results[1].2
    );
    assert!(started.elapsed() < Duration::from_secs(9), "ended late");
}

fn a_bad_frame_ends_the_job() {
    ends_the_job("bad-frame", "count 7000 > length 64");
}

fn a_frame_out_of_sequence_ends_the_job() {
    ends_the_job("gap", "a gap in the sequence");
}

fn a_name_given_out_of_turn_ends_the_job() {
    ends_the_job(
        "named-out-of-turn",
        "name \"test.name\" given index 3: expected index 0",
    );
}

fn a_call_of_a_name_never_given_ends_the_job() {
    ends_the_job("named-never-given", "calls name index 7, never given");
}

fn a_credit_for_no_bank_ends_the_job() {
    ends_the_job("stray-credit", "a credit for no bank");
}

fn an_answer_to_no_request_ends_the_job() {
    ends_the_job("stray-answer", "answer to unknown request 1099511627776");
}

/// A peer that publishes a ring position past the end of what the ring can hold (a broken
/// peer scribbling on the shared mapping) is a bad frame, never a crash or a read out of
/// bounds.
fn a_ring_position_past_its_end_ends_the_job() {
    ends_the_job_on(
        "scribble",
        "shared-memory ring: the producer's position",
        &[("GSM_TRANSPORT", "shm".into())],
    );
}

/// A UCX message whose sequence number was used before (a broken peer) is a bad frame naming
/// the peer, on UCX's TCP and on its shared memory.
#[cfg(feature = "ucx")]
fn a_ucx_message_out_of_sequence_ends_the_job() {
    for tls in ["tcp", "sm"] {
        ends_the_job_on(
            "scribble",
            "UCX message",
            &[("GSM_TRANSPORT", "ucx".into()), ("UCX_TLS", tls.into())],
        );
    }
}
