//! The tarpc baseline: a counter service over tokio TCP, serialized with postcard through a small
//! `tokio_serde` codec (bincode is unmaintained, so tarpc's bincode transport is not used).
//!
//! The server (`--rack-role tarpc`) and the all-to-all ranks (`--rack-role tarpc-rank`) run on a
//! current-thread tokio runtime: one thread, like the rack's one worker per rank.

use std::io;
use std::marker::PhantomData;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use bytes::{Bytes, BytesMut};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tarpc::server::Channel as _;
use tarpc::tokio_util::codec::{Framed, LengthDelimitedCodec};
use tarpc::{client, context};

use super::load::{self, Call, Sent, x_of};

/// The service: `add` on the server's counter 0 (E1–E3), `add_at` on one of its counters (E4).
#[tarpc::service]
pub(crate) trait Counter {
    /// Adds `x` to counter 0 and returns its new value.
    async fn add(x: u64) -> u64;
    /// Adds `x` to counter `i` and returns its new value.
    async fn add_at(i: u32, x: u64) -> u64;
}

/// postcard as a `tokio_serde` codec, for tarpc's serde transport.
pub(crate) struct Postcard<Item, SinkItem>(PhantomData<fn(&SinkItem) -> Item>);

impl<Item, SinkItem> Default for Postcard<Item, SinkItem> {
    fn default() -> Self {
        Postcard(PhantomData)
    }
}

impl<Item, SinkItem: Serialize> tokio_serde::Serializer<SinkItem> for Postcard<Item, SinkItem> {
    type Error = io::Error;

    fn serialize(self: Pin<&mut Self>, item: &SinkItem) -> Result<Bytes, io::Error> {
        postcard::to_allocvec(item)
            .map(Bytes::from)
            .map_err(io::Error::other)
    }
}

impl<Item: DeserializeOwned, SinkItem> tokio_serde::Deserializer<Item>
    for Postcard<Item, SinkItem>
{
    type Error = io::Error;

    fn deserialize(self: Pin<&mut Self>, src: &BytesMut) -> Result<Item, io::Error> {
        postcard::from_bytes(src).map_err(io::Error::other)
    }
}

/// The server's counters.
#[derive(Clone, Debug)]
struct Counters(Arc<Vec<AtomicU64>>);

impl Counter for Counters {
    async fn add(self, _: context::Context, x: u64) -> u64 {
        self.0[0].fetch_add(x, Ordering::Relaxed) + x
    }

    async fn add_at(self, _: context::Context, i: u32, x: u64) -> u64 {
        self.0[i as usize].fetch_add(x, Ordering::Relaxed) + x
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Accepts connections on `listener` and serves each, every request in its own task.
async fn serve_on(listener: tokio::net::TcpListener, counters: Counters) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let transport = tarpc::serde_transport::new(
            Framed::new(stream, LengthDelimitedCodec::new()),
            Postcard::default(),
        );
        // Room for as many responses as the client keeps requests (`connect`); tarpc's default
        // of 100 would hold back the deep pipelines measured.
        let channel = tarpc::server::Config {
            pending_response_buffer: 4096,
        }
        .channel(transport);
        let counters = counters.clone();
        tokio::spawn(
            channel
                .execute(counters.serve())
                .for_each(|call| async move {
                    tokio::spawn(call);
                }),
        );
    }
}

/// `--rack-role tarpc`: one counter, served on a loopback port printed as `ok PORT`.
pub(crate) fn serve() -> anyhow::Result<()> {
    let rt = runtime()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        println!("ok {}", listener.local_addr()?.port());
        serve_on(listener, Counters(Arc::new(vec![AtomicU64::new(0)]))).await;
        Ok(())
    })
}

async fn connect(addr: SocketAddr) -> anyhow::Result<CounterClient> {
    let stream = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::TcpStream::connect(addr),
    )
    .await
    .context("connecting to a tarpc server: timed out")??;
    stream.set_nodelay(true)?;
    let transport = tarpc::serde_transport::new(
        Framed::new(stream, LengthDelimitedCodec::new()),
        Postcard::default(),
    );
    // Room for the deepest pipeline measured (tarpc's default is 1000 in flight).
    let mut config = client::Config::default();
    config.max_in_flight_requests = 1 << 16;
    config.pending_request_buffer = 4096;
    Ok(CounterClient::new(config, transport).spawn())
}

/// A client on its own current-thread runtime (the thread calling it).
#[derive(Debug)]
pub(crate) struct RpcClient {
    rt: tokio::runtime::Runtime,
    client: CounterClient,
    /// The sum of `x` this client has added.
    added: u64,
    /// The counter's value when the client connected.
    base: u64,
    sent: u64,
}

impl RpcClient {
    pub(crate) fn connect(addr: SocketAddr) -> anyhow::Result<RpcClient> {
        let rt = runtime()?;
        let client = rt.block_on(connect(addr))?;
        let base = rt.block_on(client.add(context::current(), 0))?;
        Ok(RpcClient {
            rt,
            client,
            added: 0,
            base,
            sent: 0,
        })
    }

    /// Checks that the counter holds exactly what this client added.
    pub(crate) fn check(&mut self) -> anyhow::Result<()> {
        let v = self.rt.block_on(self.client.add(context::current(), 0))?;
        ensure!(
            v == self.base + self.added,
            "tarpc counter is {v}, {} was added to {}",
            self.added,
            self.base
        );
        Ok(())
    }
}

impl load::AsyncClient for RpcClient {
    fn runtime(&self) -> &tokio::runtime::Runtime {
        &self.rt
    }

    fn caller(&self) -> Box<dyn Fn(u64) -> Call> {
        let client = self.client.clone();
        Box::new(move |x: u64| -> Call {
            let c = client.clone();
            Box::pin(async move { Ok(c.add(context::current(), x).await?) })
        })
    }

    fn sent(&self) -> u64 {
        self.sent
    }

    fn count(&mut self, sent: Sent) {
        self.sent += sent.calls;
        self.added += sent.added;
    }
}

/// Commands from the parent, read by a plain thread from stdin and handed to the runtime.
fn stdin_lines() -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// `--rack-role tarpc-rank`: one rank of the all-to-all experiment (E4), both server and client.
/// It prints its port as `ok PORT`, then takes commands on stdin:
/// - `peers RANK SIZE PORT...`: connects one client to every other rank;
/// - `a2a DEPTH WINDOW_MS SEED`: applies to random properties for the window, `DEPTH` calls in
///   flight, and answers `ok OPS SECS ADDED CALLS` (`ADDED` the sum of every `x` it sent,
///   `CALLS` how many calls it made, local ones and those answered after the window included);
/// - `sum`: answers `ok SUM`, the sum of the properties this rank holds.
///
/// Property `i` of the [`super::PROPERTIES`] lives on rank `i % SIZE`; a rank adds to its own
/// properties directly, without a call.
pub(crate) fn rank() -> anyhow::Result<()> {
    let rt = runtime()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        println!("ok {}", listener.local_addr()?.port());
        let counters = Counters(Arc::new(
            (0..super::PROPERTIES).map(|_| AtomicU64::new(0)).collect(),
        ));
        tokio::spawn(serve_on(listener, counters.clone()));
        let mut lines = stdin_lines();
        let mut peers: Vec<Option<CounterClient>> = Vec::new();
        let mut rank = 0;
        while let Some(line) = lines.recv().await {
            let words: Vec<&str> = line.split_whitespace().collect();
            let answer = match words.as_slice() {
                ["peers", r, _size, ports @ ..] => {
                    rank = r.parse()?;
                    peers.clear();
                    for (i, port) in ports.iter().enumerate() {
                        peers.push(if i == rank {
                            None
                        } else {
                            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port.parse()?));
                            Some(connect(addr).await?)
                        });
                    }
                    String::new()
                }
                ["a2a", depth, window_ms, seed] => {
                    let window = Duration::from_millis(window_ms.parse()?);
                    let (ops, secs, sent) =
                        all_to_all(&counters, &peers, depth.parse()?, window, seed.parse()?)
                            .await?;
                    format!("{ops} {secs} {} {}", sent.added, sent.calls)
                }
                ["sum"] => {
                    let size = peers.len().max(1);
                    let sum: u64 = (rank..super::PROPERTIES)
                        .step_by(size)
                        .map(|i| counters.0[i].load(Ordering::Relaxed))
                        .sum();
                    sum.to_string()
                }
                _ => anyhow::bail!("unknown command `{line}`"),
            };
            println!("ok {answer}");
        }
        Ok(())
    })
}

async fn all_to_all(
    counters: &Counters,
    peers: &[Option<CounterClient>],
    depth: usize,
    window: Duration,
    seed: u64,
) -> anyhow::Result<(u64, f64, Sent)> {
    let size = peers.len();
    ensure!(size > 0, "`peers` must come before `a2a`");
    let mut rng = super::Rng::new(seed);
    let mut in_flight = FuturesUnordered::new();
    let mut ops = 0u64;
    let mut sent = Sent::default();
    let t0 = Instant::now();
    let mut stopped = None;
    loop {
        while stopped.is_none() && in_flight.len() < depth {
            let i = rng.below(super::PROPERTIES as u64) as usize;
            let x = x_of(sent.calls);
            sent.calls += 1;
            sent.added += x;
            match &peers[i % size] {
                None => {
                    counters.0[i].fetch_add(x, Ordering::Relaxed);
                    ops += 1;
                }
                Some(peer) => {
                    let peer = peer.clone();
                    in_flight
                        .push(async move { peer.add_at(context::current(), i as u32, x).await });
                }
            }
            if t0.elapsed() >= window {
                stopped = Some(t0.elapsed());
            }
        }
        let Some(answer) = in_flight.next().await else {
            break;
        };
        answer?;
        if stopped.is_none() {
            ops += 1;
            if t0.elapsed() >= window {
                stopped = Some(t0.elapsed());
            }
        }
    }
    let secs = stopped.unwrap_or_else(|| t0.elapsed()).as_secs_f64();
    Ok((ops, secs, sent))
}

#[cfg(test)]
mod tests {
    use std::pin::pin;

    use tokio_serde::{Deserializer as _, Serializer as _};

    use super::*;

    #[test]
    fn postcard_codec_round_trips() {
        let mut codec = pin!(Postcard::<(u32, String), (u32, String)>::default());
        let bytes = codec.as_mut().serialize(&(7, "seven".to_owned())).unwrap();
        let back = codec
            .as_mut()
            .deserialize(&BytesMut::from(&bytes[..]))
            .unwrap();
        assert_eq!(back, (7, "seven".to_owned()));
        assert!(codec.deserialize(&BytesMut::from(&b"\xff"[..])).is_err());
    }
}
