//! End-to-end tests of the `kvs` binary over loopback TCP: the memcached 1.6.18 transcript
//! replayed over the network, pipelining, races between connections, the connection limit
//! and eviction. Each test starts its own server on a free port and kills it afterwards.

mod common;

use common::{CasSeen, PATIENCE, normalize, resolve, rounds, show, split, talk, trace, wait_for};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};

use kvs::config::Config;
use kvs::conn::Engine;

/// A `kvs` process, killed on drop.
struct Kvs {
    child: Child,
    port: u16,
}

impl Kvs {
    /// Starts `kvs` on a free port. Tests run in parallel, so another server may take the
    /// port between our probe and the child's bind: the child then exits, or the port answers
    /// with someone else's server. Either way, try another port; a server counts as started
    /// once its `stats` names our child's pid.
    fn start(args: &[&str]) -> Kvs {
        for _ in 0..10 {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let child = Command::new(env!("CARGO_BIN_EXE_kvs"))
                .args(["-l", "127.0.0.1", "-p", &port.to_string()])
                .args(args)
                .stdin(Stdio::null())
                .spawn()
                .expect("start kvs");
            let mut kvs = Kvs { child, port };
            if kvs.wait_until_serving() {
                return kvs;
            }
        }
        panic!("kvs did not start on any of 10 free ports");
    }

    /// Waits until this child answers on its port; false if it exited or another process
    /// answers there.
    fn wait_until_serving(&mut self) -> bool {
        let pid = format!("STAT pid {}\r\n", self.child.id());
        wait_for("kvs to listen on its port", || {
            if self.child.try_wait().unwrap().is_some() {
                return Some(false);
            }
            let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
            s.set_read_timeout(Some(PATIENCE)).unwrap();
            let stats = talk(&mut s, b"stats\r\n", b"END\r\n");
            Some(stats.windows(pid.len()).any(|w| w == pid.as_bytes()))
        })
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        s
    }
}

impl Drop for Kvs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn server_answers_like_memcached_1_6_18() {
    let kvs = Kvs::start(&["-t", "2", "--shards", "3"]);
    let mut conns: Vec<(TcpStream, CasSeen)> =
        (0..3).map(|_| (kvs.connect(), CasSeen::new())).collect();
    let mut s = kvs.connect();
    talk(&mut s, b"flush_all\r\n", b"OK\r\n");
    let mut buf = vec![0; 1 << 16];
    for (n, round) in rounds(&trace()).iter().enumerate() {
        let (stream, cas) = &mut conns[round.conn];
        let mut send = resolve(&round.template, cas);
        if round.sentinel {
            send.extend_from_slice(b"mn\r\n");
        }
        // The server may close before reading everything (an overlong line).
        let _ = stream.write_all(&send);
        let mut out = Vec::new();
        let lines = loop {
            let (lines, seen) = split(&out, round.sentinel);
            if seen {
                break lines;
            }
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => {
                    let mut lines = split(&out, round.sentinel).0;
                    lines.push(b"<EOF>".to_vec());
                    break lines;
                }
                Ok(k) => out.extend_from_slice(&buf[..k]),
            }
        };
        let got = normalize(&lines, cas);
        assert_eq!(
            show(&got),
            show(&round.expect),
            "round {n} differs; sent {:?}",
            String::from_utf8_lossy(&send[..send.len().min(400)])
        );
        if !round.sentinel || got.last().map(Vec::as_slice) == Some(b"<EOF>") {
            conns[round.conn] = (kvs.connect(), CasSeen::new());
        }
    }
}

#[test]
fn pipelined_answers_come_in_request_order() {
    let kvs = Kvs::start(&["-t", "2", "--shards", "4"]);
    let mut s = kvs.connect();
    let n = 2000;
    let mut req = Vec::new();
    let mut want = Vec::new();
    for i in 0..n {
        req.extend_from_slice(
            format!("set p{i} {i} 0 {}\r\n{i}\r\n", i.to_string().len()).as_bytes(),
        );
        want.extend_from_slice(b"STORED\r\n");
    }
    for i in 0..n {
        req.extend_from_slice(format!("get p{i}\r\nincr p{i} 1\r\n").as_bytes());
        want.extend_from_slice(
            format!(
                "VALUE p{i} {i} {}\r\n{i}\r\nEND\r\n{}\r\n",
                i.to_string().len(),
                i + 1
            )
            .as_bytes(),
        );
    }
    let out = talk(&mut s, &req, &want[want.len() - 30..]);
    assert_eq!(
        String::from_utf8_lossy(&out),
        String::from_utf8_lossy(&want)
    );
}

#[test]
fn cas_and_incr_races_between_connections() {
    let kvs = Kvs::start(&["-t", "2"]);
    let mut s = kvs.connect();
    talk(
        &mut s,
        b"set ctr 0 0 1\r\n0\r\nset ictr 0 0 1\r\n0\r\n",
        b"STORED\r\nSTORED\r\n",
    );
    let (threads, rounds) = (4, 100);
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let mut s = kvs.connect();
            std::thread::spawn(move || {
                for _ in 0..rounds {
                    wait_for("a cas on ctr to win its race", || {
                        let out = talk(&mut s, b"gets ctr\r\n", b"END\r\n");
                        let text = String::from_utf8(out).unwrap();
                        let mut lines = text.split("\r\n");
                        let head: Vec<&str> = lines.next().unwrap().split(' ').collect();
                        let value: u64 = lines.next().unwrap().parse().unwrap();
                        let next = (value + 1).to_string();
                        let req = format!("cas ctr 0 0 {} {}\r\n{next}\r\n", next.len(), head[4]);
                        match &talk(&mut s, req.as_bytes(), b"\r\n")[..] {
                            b"STORED\r\n" => Some(()),
                            b"EXISTS\r\n" => None,
                            other => panic!("cas answered {:?}", String::from_utf8_lossy(other)),
                        }
                    });
                    talk(&mut s, b"incr ictr 1\r\n", b"\r\n");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let total = threads * rounds;
    let want = format!(
        "VALUE ctr 0 {}\r\n{total}\r\nEND\r\nVALUE ictr 0 {}\r\n{total}\r\nEND\r\n",
        total.to_string().len(),
        total.to_string().len()
    );
    let out = talk(&mut s, b"get ctr\r\nget ictr\r\n", want.as_bytes());
    assert_eq!(String::from_utf8_lossy(&out), want);
}

#[test]
fn connection_limit_is_enforced() {
    let kvs = Kvs::start(&["-t", "2", "-c", "2"]);
    // The start-up probe connection may still count for a moment: retry until accepted.
    let accepted = || {
        wait_for("a connection under the limit to be accepted", || {
            let mut s = kvs.connect();
            talk(&mut s, b"version\r\n", b"\r\n")
                .starts_with(b"VERSION")
                .then_some(s)
        })
    };
    let a = accepted();
    let _b = accepted();
    let mut c = kvs.connect();
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    assert_eq!(out, b"ERROR Too many open connections\r\n");
    drop(a);
    wait_for("a closed connection to be counted off", || {
        let mut d = kvs.connect();
        talk(&mut d, b"version\r\n", b"\r\n")
            .starts_with(b"VERSION")
            .then_some(())
    });
}

#[test]
fn eviction_keeps_memory_under_the_limit() {
    let kvs = Kvs::start(&["-t", "2", "-m", "4"]);
    let mut s = kvs.connect();
    let value = vec![b'e'; 100_000];
    let n = 3 * 4 * 1024 * 1024 / value.len();
    for i in 0..n {
        let mut req = format!("set ev{i} 0 0 {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(&value);
        req.extend_from_slice(b"\r\n");
        assert_eq!(talk(&mut s, &req, b"\r\n"), b"STORED\r\n");
    }
    let stats = String::from_utf8(talk(&mut s, b"stats\r\n", b"END\r\n")).unwrap();
    let stat = |name: &str| -> u64 {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(stat("evictions") > 0);
    assert!(stat("bytes") <= 4 * 1024 * 1024);
    let newest = talk(
        &mut s,
        format!("get ev{}\r\n", n - 1).as_bytes(),
        b"END\r\n",
    );
    assert!(newest.starts_with(b"VALUE"), "newest item evicted");
    assert_eq!(talk(&mut s, b"get ev0\r\n", b"END\r\n"), b"END\r\n");
}

/// The server and the reference engine share one set of answer rules: `stats reset` in the
/// middle of a read zeroes what that read counted so far, and a connection aborted by an
/// overlong line keeps only the answers up to its last `get`.
#[test]
fn answer_rules_match_the_engine() {
    let kvs = Kvs::start(&["-t", "2"]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut engine = Engine::new(Config::default(), now);
    let counters = |out: &[u8]| -> Vec<String> {
        String::from_utf8_lossy(out)
            .lines()
            .filter(|l| {
                ["bytes_read", "cmd_flush", "cmd_get", "cmd_set", "get_hits"]
                    .iter()
                    .any(|k| l.starts_with(&format!("STAT {k} ")))
            })
            .map(str::to_owned)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    };

    let script: &[u8] =
        b"set a 0 0 1\r\nx\r\nflush_all\r\nget a\r\nstats reset\r\nset a 0 0 1\r\ny\r\nget a\r\nstats\r\nmn\r\n";
    let mut s = kvs.connect();
    let served = talk(&mut s, script, b"MN\r\n");
    let mut conn = engine.connect();
    let (reference, open) = engine.feed(&mut conn, script, now);
    assert!(open);
    assert_eq!(counters(&served), counters(&reference));
    assert_eq!(
        counters(&served),
        [
            "STAT bytes_read 0",
            "STAT cmd_flush 0",
            "STAT cmd_get 1",
            "STAT cmd_set 1",
            "STAT get_hits 1"
        ],
        "{}",
        String::from_utf8_lossy(&served)
    );

    let mut script = b"set b 0 0 1\r\nz\r\nget b\r\ndelete b\r\nbogus\r\n".to_vec();
    // Past 2048 bytes without a newline: the connection is closed (in one read, as here).
    script.extend(std::iter::repeat_n(b'x', 3000));
    let mut s = kvs.connect();
    let served = talk(&mut s, &script, b"\0");
    let mut conn = engine.connect();
    let (reference, open) = engine.feed(&mut conn, &script, now);
    assert!(!open);
    assert_eq!(
        String::from_utf8_lossy(&served),
        String::from_utf8_lossy(&reference)
    );
    assert_eq!(reference, b"STORED\r\nVALUE b 0 1\r\nz\r\nEND\r\n");
}
