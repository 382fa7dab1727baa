//! Sockets used from fibers bind to their worker's reactor and suspend only the fiber.
#![cfg(feature = "net")]

mod common;

use std::io::Read;
use trust::net::{TcpListener, TcpStream};

fn net_thread_running() -> bool {
    std::fs::read_dir("/proc/self/task").unwrap().any(|t| {
        std::fs::read_to_string(t.unwrap().path().join("comm"))
            .unwrap()
            .trim()
            == "trust-net"
    })
}

#[test]
fn echo_in_fibers_on_worker_reactors() {
    let rt = trust::Runtime::builder().workers(2).build().unwrap();
    let start = std::time::Instant::now();
    // Reads and accepts block the fibers; a lost wake-up would hang them.
    common::within("50 echo connections served in fibers", move || {
        rt.block_on(|| {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let server = trust::spawn(move || {
                for _ in 0..50 {
                    let (s, _) = listener.accept().unwrap();
                    trust::spawn(move || {
                        let mut buf = [0; 16384];
                        loop {
                            let n = s.read(&mut buf).unwrap();
                            if n == 0 {
                                break;
                            }
                            s.write_all(&buf[..n]).unwrap();
                        }
                    });
                }
            });
            let clients: Vec<_> = (0..50)
                .map(|i| {
                    trust::spawn(move || {
                        let s = std::sync::Arc::new(TcpStream::connect(addr).unwrap());
                        let msg: Vec<u8> = (0..1_000_000).map(|j| (i * 7 + j) as u8).collect();
                        let w = s.clone();
                        let m2 = msg.clone();
                        // writer and reader as two fibers of one worker
                        let writer = trust::spawn(move || {
                            w.write_all(&m2).unwrap();
                            w.shutdown(std::net::Shutdown::Write).unwrap();
                        });
                        let mut back = Vec::new();
                        (&*s).read_to_end(&mut back).unwrap();
                        writer.join();
                        assert!(back == msg);
                    })
                })
                .collect();
            for c in clients {
                c.join();
            }
            server.join();
        })
    });
    eprintln!("took {:?}", start.elapsed());
    assert!(
        !net_thread_running(),
        "fiber I/O went through the off-worker reactor"
    );
}
