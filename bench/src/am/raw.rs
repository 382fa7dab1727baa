//! The raw TCP server of `bench am` (`--rack-role am-raw`), in a file of its own: the rack's
//! role table names it, and the rest of `am` uses the rack.

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, TcpListener};

/// `--rack-role am-raw`: serves one connection after another; each request is a `u32` length
/// and that many bytes, each answer the sum of the bytes as a `u64`.
pub(crate) fn serve_raw() -> anyhow::Result<()> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    println!("ok {}", listener.local_addr()?.port());
    for stream in listener.incoming() {
        let mut s = stream?;
        s.set_nodelay(true)?;
        let mut buf = Vec::new();
        loop {
            let mut len = [0u8; 4];
            if s.read_exact(&mut len).is_err() {
                break;
            }
            buf.resize(u32::from_le_bytes(len) as usize, 0);
            if s.read_exact(&mut buf).is_err() {
                break;
            }
            let sum: u64 = buf.iter().map(|&b| u64::from(b)).sum();
            if s.write_all(&sum.to_le_bytes()).is_err() {
                break;
            }
        }
    }
    Ok(())
}
