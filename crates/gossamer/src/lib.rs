//! Gossamer: the rack. `Trust<T>` across processes and machines over TCP.
//!
//! A rack program is one binary started once per node (process). Each node runs a `trust`
//! runtime; a property lives on one trustee worker of one node, and any fiber on any node
//! applies closures to it. This crate adds what crossing a process boundary needs on top of
//! `trust`, which stays network-free:
//!
//! - [`env`]: every `GSM_*` setting and how rank, size and the coordinator are found;
//! - `handshake`: what every connection proves before its first frame;
//! - `wire`: the frame format, decoded without trusting a byte.

pub mod env;
mod handshake;
mod wire;

/// Entry points for the fuzz targets in `fuzz/`; not part of the API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    /// Decodes `data` as a stream of rack frames under small limits (1 KiB frames, 64 KiB
    /// messages) and checks every frame the decoder accepts: a strict prefix of it is
    /// incomplete, and re-encoded it decodes to the same value. Panics when a check fails.
    pub fn rack_frame(data: &[u8]) {
        let limits = crate::wire::Limits {
            frame: 1024,
            max_message: 64 * 1024,
        };
        crate::wire::check_frames(data, &limits);
    }
}
