//! Accepting at a bootstrap listener without letting one peer hold up another.
//!
//! An [`Acceptor`] takes connections off its listener on a thread of its own and greets each
//! one (the handshake, and what the caller reads after it) on a thread of that connection's
//! own, so a silent or slow peer costs its own thread and its own [`HANDSHAKE_LIMIT`], never
//! a real peer's time. The caller collects the greeted connections with [`Acceptor::next`],
//! which returns at the caller's deadline whatever arrives.
//!
//! An attacker can pin at most [`MAX_GREETING`] threads and sockets: a connection accepted
//! while that many are being greeted cuts the oldest (shuts its socket down, which ends its
//! greeting at once). The listener itself is drained as fast as connections come, so its
//! backlog never fills for the real peers. A real peer greets in well under a millisecond,
//! so it would take [`MAX_GREETING`] new connections within that time to cut it, and one
//! that is cut dials again (`bootstrap::dial`).
//!
//! [`HANDSHAKE_LIMIT`]: crate::handshake::HANDSHAKE_LIMIT

use std::collections::VecDeque;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Connections greeted at once, at most; a new one past this cuts the oldest.
pub(crate) const MAX_GREETING: usize = 64;

/// How often the accepting thread looks for new connections and for the end.
const POLL: Duration = Duration::from_millis(5);

/// A greeting thread needs little: the handshake's buffers and one small message (the margin
/// is for unoptimized and sanitizer builds; untouched stack costs no memory).
const GREETING_STACK: usize = 512 << 10;

/// What one greeting came to: the peer's address, and what `greet` made of the connection or
/// why it was refused.
pub(crate) type Greeted<T> = (SocketAddr, Result<T, String>);

/// A listener whose connections are greeted concurrently (see the module docs). Dropping it
/// stops accepting, closes the listener and cuts every greeting still running.
#[derive(Debug)]
pub(crate) struct Acceptor<T> {
    greeted: mpsc::Receiver<Greeted<T>>,
    stop: Arc<AtomicBool>,
    accepting: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> Acceptor<T> {
    /// Starts accepting on `listener`, greeting each connection with `greet`, which should
    /// finish within the handshake's limit (each socket read it makes needs a timeout).
    pub(crate) fn start<G>(listener: TcpListener, name: &str, greet: G) -> io::Result<Acceptor<T>>
    where
        G: Fn(TcpStream, SocketAddr) -> Result<T, String> + Send + Sync + 'static,
    {
        listener.set_nonblocking(true)?;
        let (tx, greeted) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let accepting = {
            let stop = stop.clone();
            let greet = Arc::new(greet);
            let name = name.to_owned();
            thread::Builder::new()
                .name(name.clone())
                .spawn(move || accept(&listener, &name, &stop, &greet, &tx))?
        };
        Ok(Acceptor {
            greeted,
            stop,
            accepting: Some(accepting),
        })
    }

    /// The next greeted connection, or `None` once `deadline` has passed.
    pub(crate) fn next(&self, deadline: Instant) -> Option<Greeted<T>> {
        let left = deadline.checked_duration_since(Instant::now())?;
        self.greeted.recv_timeout(left).ok()
    }
}

impl<T> Drop for Acceptor<T> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(accepting) = self.accepting.take() {
            // It looks at `stop` every POLL and cuts what it greets on the way out.
            let _ = accepting.join();
        }
    }
}

/// One connection being greeted, as the accepting thread sees it.
struct Greeting {
    /// A second handle on the socket, to cut it.
    socket: TcpStream,
    state: Arc<AtomicU8>,
    thread: JoinHandle<()>,
}

/// [`Greeting::state`]: still greeting; greeted, the socket belongs to the caller now; cut.
/// The greeting thread and the accepting thread each move it out of `GREETING` with a
/// compare-exchange, so exactly one of them decides the connection's fate: a socket handed
/// to the caller is never cut, and a cut one is never handed over.
const GREETING: u8 = 0;
const GREETED: u8 = 1;
const CUT: u8 = 2;

impl Greeting {
    fn cut(&self) {
        if self
            .state
            .compare_exchange(GREETING, CUT, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let _ = self.socket.shutdown(Shutdown::Both);
        }
    }
}

/// The accepting thread: takes every connection the listener has, greets each on its own
/// thread, and cuts the oldest greeting when too many run.
fn accept<T, G>(
    listener: &TcpListener,
    name: &str,
    stop: &AtomicBool,
    greet: &Arc<G>,
    greeted: &mpsc::Sender<Greeted<T>>,
) where
    T: Send + 'static,
    G: Fn(TcpStream, SocketAddr) -> Result<T, String> + Send + Sync + 'static,
{
    let mut greeting: VecDeque<Greeting> = VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        let (stream, addr) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                greeting.retain(|g| !g.thread.is_finished());
                thread::sleep(POLL);
                continue;
            }
            // A connection reset before it was taken, or out of descriptors for a moment
            // (greetings end within their limit and give theirs back).
            Err(_) => {
                thread::sleep(POLL);
                continue;
            }
        };
        greeting.retain(|g| !g.thread.is_finished());
        if greeting.len() >= MAX_GREETING
            && let Some(oldest) = greeting.pop_front()
        {
            oldest.cut();
        }
        match start_greeting(stream, addr, name, greet, greeted) {
            Ok(g) => greeting.push_back(g),
            Err(why) => {
                let _ = greeted.send((addr, Err(why)));
            }
        }
    }
    for g in &greeting {
        g.cut();
    }
}

fn start_greeting<T, G>(
    stream: TcpStream,
    addr: SocketAddr,
    name: &str,
    greet: &Arc<G>,
    greeted: &mpsc::Sender<Greeted<T>>,
) -> Result<Greeting, String>
where
    T: Send + 'static,
    G: Fn(TcpStream, SocketAddr) -> Result<T, String> + Send + Sync + 'static,
{
    let socket = stream
        .try_clone()
        .and_then(|s| stream.set_nonblocking(false).map(|()| s))
        .map_err(|e| format!("cannot take the connection: {e}"))?;
    let state = Arc::new(AtomicU8::new(GREETING));
    let thread = {
        let (greet, greeted, state) = (greet.clone(), greeted.clone(), state.clone());
        thread::Builder::new()
            .name(format!("{name}-greet"))
            .stack_size(GREETING_STACK)
            .spawn(move || {
                let result = greet(stream, addr);
                let kept = state
                    .compare_exchange(GREETING, GREETED, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok();
                let result = if kept {
                    result
                } else {
                    Err(format!(
                        "cut: {MAX_GREETING} newer connections arrived before it finished its \
                         handshake"
                    ))
                };
                // The receiver is gone once the bootstrap no longer listens: nothing to do.
                let _ = greeted.send((addr, result));
            })
            .map_err(|e| format!("cannot start a thread for its handshake: {e}"))?
    };
    Ok(Greeting {
        socket,
        state,
        thread,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// Greets by reading one byte, within 5 s.
    fn one_byte(mut s: TcpStream, _: SocketAddr) -> Result<u8, String> {
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        let mut byte = [0u8; 1];
        s.read_exact(&mut byte).map_err(|e| e.to_string())?;
        Ok(byte[0])
    }

    fn listen() -> (TcpListener, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback listener");
        let addr = listener.local_addr().expect("the listener's address");
        (listener, addr)
    }

    #[test]
    fn silent_connections_do_not_hold_up_a_greeting() {
        let (listener, addr) = listen();
        let acceptor = Acceptor::start(listener, "test", one_byte).expect("start accepting");
        let silent: Vec<TcpStream> = (0..3)
            .map(|_| TcpStream::connect(addr).expect("connect"))
            .collect();
        let mut real = TcpStream::connect(addr).expect("connect");
        real.write_all(&[42]).expect("send a byte");
        let started = Instant::now();
        let (_, greeted) = acceptor
            .next(started + Duration::from_secs(4))
            .expect("no greeting within 4 s");
        assert_eq!(greeted, Ok(42));
        assert!(started.elapsed() < Duration::from_secs(4));
        drop(silent);
    }

    #[test]
    fn the_oldest_greeting_is_cut_when_too_many_run() {
        let (listener, addr) = listen();
        let acceptor = Acceptor::start(listener, "test", one_byte).expect("start accepting");
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut held: Vec<TcpStream> = (0..=MAX_GREETING)
            .map(|_| TcpStream::connect(addr).expect("connect"))
            .collect();
        let (_, cut) = acceptor
            .next(deadline)
            .expect("no connection cut within 10 s");
        let why = cut.expect_err("a silent connection cannot be greeted");
        assert!(
            why.starts_with("cut: 64 newer connections arrived"),
            "{why}"
        );
        // The cut one is the first: its socket is closed, the others' are not.
        let mut byte = [0u8; 1];
        held[0]
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("set a read timeout");
        assert_eq!(held[0].read(&mut byte).expect("read the close"), 0);
        held[1].write_all(&[7]).expect("send a byte");
        assert_eq!(acceptor.next(deadline).map(|(_, r)| r), Some(Ok(7)));
    }

    #[test]
    fn next_returns_at_the_deadline() {
        let (listener, addr) = listen();
        let acceptor = Acceptor::start(listener, "test", one_byte).expect("start accepting");
        let _silent = TcpStream::connect(addr).expect("connect");
        let started = Instant::now();
        assert!(
            acceptor
                .next(started + Duration::from_millis(200))
                .is_none()
        );
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(200) && took < Duration::from_secs(3));
    }
}
