//! Tests of the reactor and the TCP types, on loopback only.
//!
//! Blocking calls here run on plain threads, through `fiber::wait` and the shared
//! `trust-net` reactor. `run_worker` below plays a runtime worker: one thread, one entered
//! `Reactor`, many tasks, polling the reactor the way the runtime loop does, so the per-worker
//! path is exercised with the `poll_*` methods (a fiber's `block_on` is a task that polls).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use super::reactor::{Reactor, Unparker, enter};
use super::{TcpListener, TcpStream};

/// A waker that counts its wake-ups.
#[derive(Default)]
struct WakeCount(AtomicUsize);

impl Wake for WakeCount {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Relaxed);
    }
}

/// Stress multiplier: connection counts and transfer sizes scale with it. The whole module
/// runs in about two seconds on two cores; it is not built under Miri (no epoll there).
const SCALE: usize = 8;

/// Runs `f` on its own thread and fails the test if it takes longer than `secs` (a lost
/// wake-up shows up as a hang).
fn with_timeout<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(value) => {
            handle.join().unwrap();
            value
        }
        // The thread panicked (the sender was dropped): re-raise its panic.
        Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the test thread ended without a result"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!(
            "gave up after {secs} s waiting for {} to finish (a lost wake-up?)",
            thread::current().name().unwrap_or("the test")
        ),
    }
}

/// Bytes `start..start + len` of a deterministic stream, to check transfers byte for byte.
fn pattern(start: usize, len: usize) -> Vec<u8> {
    (start..start + len)
        .map(|i| (i.wrapping_mul(31) ^ (i >> 8)) as u8)
        .collect()
}

/// Echoes everything from `stream` back until end of stream.
fn echo(stream: &TcpStream) -> io::Result<u64> {
    let mut buf = vec![0; 64 * 1024];
    let mut total = 0;
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            stream.shutdown(Shutdown::Write)?;
            return Ok(total);
        }
        stream.write_all(&buf[..n])?;
        total += n as u64;
    }
}

/// An echo server on plain threads: one thread per connection, `conns` connections.
fn spawn_echo_server(conns: usize) -> (SocketAddr, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || {
        let handlers: Vec<_> = (0..conns)
            .map(|_| {
                let (stream, _) = listener.accept().unwrap();
                thread::spawn(move || echo(&stream).unwrap())
            })
            .collect();
        for handler in handlers {
            handler.join().unwrap();
        }
    });
    (addr, server)
}

// ---------------------------------------------------------------------------------------------
// A stand-in worker: one thread, one reactor, many tasks.

type Task = Pin<Box<dyn Future<Output = ()>>>;

#[derive(Clone)]
struct Spawner(Rc<RefCell<Vec<Task>>>);

impl Spawner {
    fn spawn(&self, task: impl Future<Output = ()> + 'static) {
        self.0.borrow_mut().push(Box::pin(task));
    }
}

struct TaskWaker {
    id: usize,
    queue: Arc<Mutex<VecDeque<usize>>>,
    unparker: Unparker,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Publish, then unpark: the protocol the reactor documents.
        self.queue.lock().unwrap().push_back(self.id);
        self.unparker.unpark();
    }
}

/// Runs the task made by `main` and every task it spawns on this thread, the way a runtime
/// worker would: run ready tasks, poll the reactor without blocking while busy, park in the
/// reactor when idle. Returns when every task has finished.
fn run_worker<F: Future<Output = ()> + 'static>(main: impl FnOnce(Spawner) -> F) {
    let reactor = Reactor::new().unwrap();
    let _entered = enter(&reactor);
    let queue = Arc::new(Mutex::new(VecDeque::new()));
    let spawner = Spawner(Rc::new(RefCell::new(Vec::new())));
    spawner.spawn(main(spawner.clone()));
    let mut tasks: Vec<Option<(Task, Waker)>> = Vec::new();
    let mut live = 0;
    loop {
        for task in spawner.0.borrow_mut().drain(..) {
            let id = tasks.len();
            let waker = Waker::from(Arc::new(TaskWaker {
                id,
                queue: queue.clone(),
                unparker: reactor.unparker(),
            }));
            tasks.push(Some((task, waker)));
            queue.lock().unwrap().push_back(id);
            live += 1;
        }
        let batch: Vec<usize> = queue.lock().unwrap().drain(..).collect();
        if batch.is_empty() {
            if live == 0 {
                return;
            }
            // Idle: park in the reactor. Spurious returns are fine; the loop checks again.
            reactor.poll(None).unwrap();
            continue;
        }
        for id in batch {
            if let Some((task, waker)) = &mut tasks[id] {
                let mut cx = Context::from_waker(waker);
                if task.as_mut().poll(&mut cx).is_ready() {
                    tasks[id] = None;
                    live -= 1;
                }
            }
        }
        // Busy: collect readiness without blocking.
        reactor.poll(Some(Duration::ZERO)).unwrap();
    }
}

async fn accept(listener: &TcpListener) -> io::Result<(TcpStream, SocketAddr)> {
    poll_fn(|cx| listener.poll_accept(cx)).await
}

async fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let stream = TcpStream::start_connect(addr)?;
    poll_fn(|cx| stream.poll_connect(cx)).await?;
    Ok(stream)
}

async fn read(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    poll_fn(|cx| stream.poll_read(cx, buf)).await
}

async fn write_all(stream: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        let n = poll_fn(|cx| stream.poll_write(cx, buf)).await?;
        buf = &buf[n..];
    }
    Ok(())
}

async fn read_to_end(stream: &TcpStream) -> io::Result<Vec<u8>> {
    let mut all = Vec::new();
    let mut buf = vec![0; 64 * 1024];
    loop {
        match read(stream, &mut buf).await? {
            0 => return Ok(all),
            n => all.extend_from_slice(&buf[..n]),
        }
    }
}

async fn echo_async(stream: TcpStream) -> io::Result<()> {
    let mut buf = vec![0; 16 * 1024];
    loop {
        match read(&stream, &mut buf).await? {
            0 => return stream.shutdown(Shutdown::Write),
            n => write_all(&stream, &buf[..n]).await?,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Echo and transfers.

#[test]
fn types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<TcpStream>();
    send_sync::<TcpListener>();
    send_sync::<Unparker>();
}

#[test]
fn echo_many_connections_on_plain_threads() {
    with_timeout(60, || {
        let conns = 4 * SCALE;
        let (addr, server) = spawn_echo_server(conns);
        let clients: Vec<_> = (0..conns)
            .map(|c| {
                thread::spawn(move || {
                    let stream = TcpStream::connect(addr).unwrap();
                    stream.set_nodelay(true).unwrap();
                    for round in 0..50 {
                        let message = pattern(c * 1000 + round, 1 + (round * 97) % 3000);
                        stream.write_all(&message).unwrap();
                        let mut back = vec![0; message.len()];
                        (&stream).read_exact(&mut back).unwrap();
                        assert_eq!(back, message);
                    }
                    stream.shutdown(Shutdown::Write).unwrap();
                    assert_eq!(stream.read(&mut [0; 8]).unwrap(), 0);
                })
            })
            .collect();
        for client in clients {
            client.join().unwrap();
        }
        server.join().unwrap();
    });
}

#[test]
fn echo_many_connections_on_one_worker() {
    with_timeout(60, || {
        let conns = 32 * SCALE;
        let done = Rc::new(RefCell::new(0));
        run_worker(|spawner| async move {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            for c in 0..conns {
                let done = done.clone();
                spawner.spawn(async move {
                    let stream = connect(addr).await.unwrap();
                    for round in 0..10 {
                        let message = pattern(c * 100 + round, 1 + (c * 131 + round) % 20_000);
                        write_all(&stream, &message).await.unwrap();
                        let mut back = vec![0; message.len()];
                        let mut got = 0;
                        while got < back.len() {
                            let n = read(&stream, &mut back[got..]).await.unwrap();
                            assert_ne!(n, 0, "early end of stream");
                            got += n;
                        }
                        assert_eq!(back, message);
                    }
                    drop(stream);
                    *done.borrow_mut() += 1;
                });
            }
            for _ in 0..conns {
                let (stream, _) = accept(&listener).await.unwrap();
                spawner.spawn(async move { echo_async(stream).await.unwrap() });
            }
        });
    });
}

#[test]
fn large_transfer_both_directions_on_plain_threads() {
    with_timeout(60, || {
        let len = SCALE << 20; // 8 MiB each way
        let (addr, server) = spawn_echo_server(1);
        let stream = TcpStream::connect(addr).unwrap();
        thread::scope(|scope| {
            // One thread writes while another reads the echo: the same stream, concurrently.
            scope.spawn(|| {
                for (i, chunk) in pattern(0, len).chunks(100_000).enumerate() {
                    stream.write_all(chunk).unwrap();
                    if i % 16 == 0 {
                        thread::yield_now();
                    }
                }
                stream.shutdown(Shutdown::Write).unwrap();
            });
            let mut back = Vec::with_capacity(len);
            (&stream).read_to_end(&mut back).unwrap();
            assert_eq!(back.len(), len);
            assert!(back == pattern(0, len), "echoed bytes differ");
        });
        server.join().unwrap();
    });
}

#[test]
fn large_transfer_both_directions_on_one_worker() {
    with_timeout(60, || {
        let len = SCALE << 19; // 4 MiB each way
        run_worker(move |spawner| async move {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            spawner.spawn({
                let spawner = spawner.clone();
                async move {
                    // Reader and writer are two tasks sharing the stream, as two fibers would.
                    let stream = Rc::new(connect(addr).await.unwrap());
                    let writer = stream.clone();
                    spawner.spawn(async move {
                        write_all(&writer, &pattern(7, len)).await.unwrap();
                        writer.shutdown(Shutdown::Write).unwrap();
                    });
                    let back = read_to_end(&stream).await.unwrap();
                    assert_eq!(back.len(), len);
                    assert!(back == pattern(7, len), "echoed bytes differ");
                }
            });
            let (stream, _) = accept(&listener).await.unwrap();
            echo_async(stream).await.unwrap();
        });
    });
}

// ---------------------------------------------------------------------------------------------
// Closing, resets, errors.

#[test]
fn half_close_then_reply() {
    with_timeout(30, || {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            (&stream).read_to_end(&mut request).unwrap();
            // The client's writing side is closed, ours is open: answer.
            stream.write_all(&request.repeat(3)).unwrap();
        });
        let stream = TcpStream::connect(addr).unwrap();
        stream.write_all(b"abc").unwrap();
        stream.shutdown(Shutdown::Write).unwrap();
        let mut reply = Vec::new();
        (&stream).read_to_end(&mut reply).unwrap();
        assert_eq!(reply, b"abcabcabc");
        server.join().unwrap();
    });
}

#[test]
fn peer_close_mid_transfer_fails_the_writer() {
    with_timeout(30, || {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut buf = vec![0; 64 * 1024];
            let mut got = 0;
            while got < 256 * 1024 {
                got += stream.read(&mut buf).unwrap();
            }
            // Closing with unread data sends a reset.
        });
        let stream = TcpStream::connect(addr).unwrap();
        let chunk = pattern(0, 64 * 1024);
        let mut sent = 0usize;
        let error = loop {
            match stream.write(&chunk) {
                Ok(n) => sent += n,
                Err(e) => break e,
            }
            assert!(
                sent < 1 << 30,
                "writes kept succeeding after the peer closed"
            );
        };
        assert!(
            matches!(
                error.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ),
            "unexpected error: {error:?}"
        );
        server.join().unwrap();
    });
}

#[test]
fn peer_close_mid_transfer_ends_the_reader() {
    with_timeout(30, || {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let len = 3 << 20;
        let server = thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            stream.write_all(&pattern(0, len)).unwrap();
            // A clean close after a partial "transfer": the reader sees all bytes, then 0.
        });
        let stream = TcpStream::connect(addr).unwrap();
        let mut back = Vec::new();
        (&stream).read_to_end(&mut back).unwrap();
        assert!(back == pattern(0, len));
        server.join().unwrap();
    });
}

#[test]
fn reset_wakes_a_blocked_reader_with_an_error() {
    with_timeout(30, || {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (accepted_tx, accepted_rx) = mpsc::channel();
        let server = thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            accepted_rx.recv().unwrap();
            // Let the client block in `read`, then reset (our receive queue holds its bytes).
            thread::sleep(Duration::from_millis(50));
            drop(stream);
        });
        let stream = TcpStream::connect(addr).unwrap();
        stream.write_all(b"unread").unwrap();
        accepted_tx.send(()).unwrap();
        let error = stream.read(&mut [0; 16]).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionReset, "{error:?}");
        server.join().unwrap();
    });
}

#[test]
fn connect_refused() {
    with_timeout(30, || {
        let addr = {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        let error = TcpStream::connect(addr).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused, "{error:?}");
        run_worker(move |_| async move {
            let error = connect(addr).await.unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused, "{error:?}");
        });
    });
}

#[test]
fn accept_flood() {
    with_timeout(60, || {
        let per_thread = 16 * SCALE;
        let threads = 4;
        let total = per_thread * threads;
        let (addr_tx, addr_rx) = mpsc::channel();
        let clients = thread::spawn(move || {
            let addr: SocketAddr = addr_rx.recv().unwrap();
            let connectors: Vec<_> = (0..threads)
                .map(|_| {
                    thread::spawn(move || {
                        let streams: Vec<TcpStream> = (0..per_thread)
                            .map(|_| TcpStream::connect(addr).unwrap())
                            .collect();
                        // Every connection is answered by the server with its own local port.
                        for stream in &streams {
                            let mut port = [0; 2];
                            (&*stream).read_exact(&mut port).unwrap();
                            let port = u16::from_be_bytes(port);
                            assert_eq!(port, stream.local_addr().unwrap().port());
                        }
                    })
                })
                .collect();
            for connector in connectors {
                connector.join().unwrap();
            }
        });
        // The server is a worker; the clients are plain threads on the shared reactor.
        run_worker(move |spawner| async move {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            for _ in 0..total {
                let (stream, peer) = accept(&listener).await.unwrap();
                spawner.spawn(async move {
                    write_all(&stream, &peer.port().to_be_bytes())
                        .await
                        .unwrap();
                });
            }
        });
        clients.join().unwrap();
    });
}

#[test]
fn socket_used_on_another_thread_fails_clearly() {
    with_timeout(30, || {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let reactor = Reactor::new().unwrap();
        let stream = {
            let _entered = enter(&reactor);
            TcpStream::start_connect(addr).unwrap()
        };
        let error = thread::spawn(move || stream.write(b"x").unwrap_err())
            .join()
            .unwrap();
        assert_eq!(error.kind(), io::ErrorKind::Other);
        assert!(
            error.to_string().contains("another thread"),
            "unclear message: {error}"
        );
    });
}

#[test]
fn accepted_stream_can_move_to_a_worker_before_first_use() {
    with_timeout(30, || {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = thread::spawn(move || {
            let stream = TcpStream::connect(addr).unwrap();
            stream.write_all(b"to the worker").unwrap();
            stream.shutdown(Shutdown::Write).unwrap();
        });
        let (stream, _) = listener.accept().unwrap();
        let handle = thread::spawn(move || {
            run_worker(move |_| async move {
                assert_eq!(read_to_end(&stream).await.unwrap(), b"to the worker");
            })
        });
        handle.join().unwrap();
        client.join().unwrap();
    });
}

// ---------------------------------------------------------------------------------------------
// The reactor itself.

#[test]
fn dropping_sockets_deregisters_them() {
    with_timeout(30, || {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let reactor = Reactor::new().unwrap();
        let _entered = enter(&reactor);
        assert!(!reactor.has_registrations());
        for _ in 0..3 {
            let streams: Vec<_> = (0..20)
                .map(|_| TcpStream::start_connect(addr).unwrap())
                .collect();
            assert!(reactor.has_registrations());
            // Unaccepted connections complete in the backlog; their events may be pending.
            reactor.poll(Some(Duration::from_millis(1))).unwrap();
            drop(streams);
            assert!(!reactor.has_registrations());
            // Events for the dropped sockets must not reach anyone.
            reactor.poll(Some(Duration::ZERO)).unwrap();
        }
        drop(listener);
    });
}

#[test]
fn dropping_the_reactor_fails_waiting_operations() {
    with_timeout(30, || {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let reactor = Reactor::new().unwrap();
        let entered = enter(&reactor);
        let stream = TcpStream::start_connect(listener.local_addr().unwrap()).unwrap();
        let _peer = listener.accept().unwrap();

        let flag = Arc::new(WakeCount::default());
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let mut buf = [0; 8];
        let deadline = Instant::now() + Duration::from_secs(10);
        while stream.poll_connect(&mut cx).is_pending() {
            assert!(Instant::now() < deadline);
            reactor.poll(Some(Duration::from_millis(10))).unwrap();
        }
        assert!(stream.poll_read(&mut cx, &mut buf).is_pending());

        drop(entered);
        drop(reactor);
        assert!(flag.0.load(Relaxed) > 0, "waiter not woken at shutdown");
        match stream.poll_read(&mut cx, &mut buf) {
            Poll::Ready(Err(e)) => assert!(e.to_string().contains("shut down"), "{e}"),
            other => panic!("expected a shutdown error, got {other:?}"),
        }
    });
}

#[test]
fn unpark_before_poll_makes_it_return() {
    with_timeout(30, || {
        let reactor = Reactor::new().unwrap();
        let unparker = reactor.unparker();
        for _ in 0..100 {
            unparker.unpark();
            unparker.unpark();
            assert!(!reactor.poll(None).unwrap());
        }
        // Consumed: a poll with a timeout now times out.
        let start = Instant::now();
        reactor.poll(Some(Duration::from_millis(20))).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(15));
    });
}

#[test]
fn unpark_from_another_thread_interrupts_a_blocked_poll() {
    with_timeout(60, || {
        const ROUNDS: usize = 10_000;
        let reactor = Reactor::new().unwrap();
        let unparker = reactor.unparker();
        let posted = Arc::new(AtomicUsize::new(0));
        let acked = Arc::new(AtomicUsize::new(0));
        let producer = {
            let (posted, acked) = (posted.clone(), acked.clone());
            thread::spawn(move || {
                for round in 1..=ROUNDS {
                    posted.store(round, Release);
                    unparker.unpark();
                    // Wait for the owner to see it; it then goes back into `poll(None)`.
                    while acked.load(Acquire) < round {
                        thread::yield_now();
                    }
                }
            })
        };
        // The owner: check the "queue", then block in poll with no timeout. A lost wake-up
        // leaves it blocked forever and trips the timeout.
        loop {
            let seen = posted.load(Acquire);
            if seen > acked.load(Relaxed) {
                acked.store(seen, Release);
            }
            if seen == ROUNDS {
                break;
            }
            reactor.poll(None).unwrap();
        }
        producer.join().unwrap();
    });
}

#[test]
fn unpark_from_many_threads_coalesces_without_losing_wakeups() {
    with_timeout(60, || {
        const PER_THREAD: usize = 5_000;
        const THREADS: usize = 3;
        let reactor = Reactor::new().unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        let producers: Vec<_> = (0..THREADS)
            .map(|_| {
                let (count, unparker) = (count.clone(), reactor.unparker());
                thread::spawn(move || {
                    for i in 0..PER_THREAD {
                        count.fetch_add(1, Release);
                        unparker.unpark();
                        if i % 64 == 0 {
                            thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut polls = 0usize;
        while count.load(Acquire) < PER_THREAD * THREADS {
            reactor.poll(None).unwrap();
            polls += 1;
        }
        for producer in producers {
            producer.join().unwrap();
        }
        assert!(polls <= PER_THREAD * THREADS);
    });
}

#[test]
fn every_waiting_reader_is_woken_and_waiters_stay_bounded() {
    with_timeout(30, || {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let flags: Vec<Arc<WakeCount>> = (0..100).map(|_| Arc::new(WakeCount::default())).collect();
        for flag in &flags {
            let waker = Waker::from(flag.clone());
            let mut cx = Context::from_waker(&waker);
            assert!(server.poll_read(&mut cx, &mut [0; 8]).is_pending());
        }
        // The list holds at most 64 wakers: the first 64 were evicted (woken) by the 65th.
        let woken =
            |flags: &[Arc<WakeCount>]| flags.iter().filter(|f| f.0.load(Relaxed) > 0).count();
        assert_eq!(woken(&flags), 64);
        // Data wakes the others (through the shared reactor's thread).
        client.write_all(b"x").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while woken(&flags) < flags.len() {
            assert!(Instant::now() < deadline, "a waiting reader was not woken");
            thread::sleep(Duration::from_millis(1));
        }
    });
}
