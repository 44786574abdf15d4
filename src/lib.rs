//! ringlock: a distributed lock server with FIFO fairness and fencing tokens.
//!
//! The crate is layered so that each part can be built and tested alone:
//!
//! - [`proto`]: the wire format, re-exported from the `ringlock-proto` crate
//!   (zero-copy request parser, answer encoder).
//! - [`engine`]: the sans-I/O core. It takes `(now, connection, request)` and
//!   writes answers into per-connection output buffers. No sockets, no clock.
//! - [`io`]: the event loops (io_uring, epoll fallback) that move bytes between
//!   sockets and the engine.
//! - [`cli`]: the command line for people (`acquire`, `release`, `run`, ...).
//!
//! Unsafe code is denied in the whole crate but the io_uring backend
//! ([`io::uring`]), which allows it for its kernel interface.

#![deny(unsafe_code)]

pub mod cli;
pub mod cluster;
pub mod engine;
pub mod io;
pub mod log;
pub mod metrics;
pub mod node;
pub mod server;
pub mod stats;
#[doc(hidden)]
pub mod testing;
pub mod tls;

pub use ringlock_proto as proto;
