//! ringlock: a distributed lock server with FIFO fairness and fencing tokens.
//!
//! The sans-I/O server (engine, cluster, node, connection lifecycle) is
//! the `ringlock-core` crate, re-exported here under its module names;
//! this crate keeps what does I/O:
//!
//! - [`proto`]: the wire format, re-exported from the `ringlock-proto` crate
//!   (zero-copy request parser, answer encoder).
//! - [`io`]: the event loops (io_uring, epoll fallback) that move bytes between
//!   sockets and the core, and the dialer thread.
//! - [`server`], [`metrics`], [`tls`], [`secret`], [`log`]: `ringlock serve`,
//!   the metrics HTTP server, TLS configuration files, the cluster's secret
//!   file, logging.
//! - [`cli`]: the command line for people (`acquire`, `release`, `run`, ...).
//!
//! Unsafe code is denied in the whole crate but the io_uring backend
//! ([`io::uring`]), which allows it for its kernel interface.

#![deny(unsafe_code)]

pub mod cli;
pub mod io;
pub mod log;
pub mod metrics;
pub mod secret;
pub mod server;
#[doc(hidden)]
pub mod testing;
pub mod tls;

pub use ringlock_core::{access, cluster, driver, engine, node, outbox, read_batch, stats};
pub use ringlock_proto as proto;
