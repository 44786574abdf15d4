//! The loopback floor: a line echo server with the same shape as ringlock's
//! epoll loop (one thread, edge-triggered epoll through mio, one `read` and
//! one `write` per connection per turn, `TCP_NODELAY`) and no work besides.
//! What it does per round trip is the least any single-threaded TCP server
//! on this machine can do, so ringlock's numbers are stated as a ratio to
//! it.
//!
//! `--spin-us N` polls without sleeping for N µs after the last event before
//! blocking again, like ringlock's planned `--spin-us`: the floor for a
//! server that trades a core for latency.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct EchoArgs {
    /// Address to listen on (port 0: any free port; the bound address is
    /// printed on stderr).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Busy-poll this many microseconds after the last event before sleeping.
    #[arg(long, default_value_t = 0)]
    pub spin_us: u64,
}

const LISTENER: Token = Token(usize::MAX - 1);

struct Conn {
    stream: TcpStream,
    /// Bytes read and not yet written back.
    pending: Vec<u8>,
    /// The socket may have input we have not read.
    readable: bool,
}

pub(crate) fn main(args: EchoArgs) -> crate::Result<ExitCode> {
    let addr = crate::load::resolve_addr(&args.listen)?;
    let std_listener = std::net::TcpListener::bind(addr)?;
    std_listener.set_nonblocking(true)?;
    let mut listener = TcpListener::from_std(std_listener);
    let mut poll = Poll::new()?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    eprintln!(
        "ringlock-bench echo-server: listening on {} (spin: {} µs)",
        listener.local_addr()?,
        args.spin_us
    );
    let mut events = Events::with_capacity(1024);
    let mut conns: Slab<Conn> = Slab::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut ready: VecDeque<usize> = VecDeque::new();
    let spin = Duration::from_micros(args.spin_us);
    let mut last_event = Instant::now();
    loop {
        let timeout = if !ready.is_empty() || last_event.elapsed() < spin {
            Some(Duration::ZERO)
        } else {
            None
        };
        match poll.poll(&mut events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
        if !events.is_empty() {
            last_event = Instant::now();
        }
        for event in events.iter() {
            if event.token() == LISTENER {
                accept(&listener, &poll, &mut conns, &mut ready)?;
                continue;
            }
            let id = event.token().0;
            if let Some(conn) = conns.get_mut(id) {
                if event.is_readable() || event.is_read_closed() || event.is_error() {
                    conn.readable = true;
                }
                ready.push_back(id);
            }
        }
        // Each ready connection: write back what is pending, then one read
        // and its echo. Connections that may have more stay ready.
        for _ in 0..ready.len() {
            let Some(id) = ready.pop_front() else { break };
            let Some(conn) = conns.get_mut(id) else {
                continue;
            };
            match serve(conn, &mut buf) {
                Ok(true) => ready.push_back(id),
                Ok(false) => {}
                Err(_) => {
                    let mut conn = conns.remove(id);
                    let _ = poll.registry().deregister(&mut conn.stream);
                }
            }
        }
        ready.make_contiguous().sort_unstable();
        let mut last = None;
        ready.retain(|&id| {
            let keep = last != Some(id);
            last = Some(id);
            keep
        });
    }
}

fn accept(
    listener: &TcpListener,
    poll: &Poll,
    conns: &mut Slab<Conn>,
    ready: &mut VecDeque<usize>,
) -> io::Result<()> {
    loop {
        match listener.accept() {
            Ok((mut stream, _)) => {
                stream.set_nodelay(true)?;
                let entry = conns.vacant_entry();
                poll.registry().register(
                    &mut stream,
                    Token(entry.key()),
                    Interest::READABLE | Interest::WRITABLE,
                )?;
                ready.push_back(entry.key());
                entry.insert(Conn {
                    stream,
                    pending: Vec::new(),
                    readable: true,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                eprintln!("echo-server: accept: {e}");
                return Ok(());
            }
        }
    }
}

/// Flushes, reads once and echoes. `Ok(true)`: more may be readable now;
/// `Err`: the connection is over.
fn serve(conn: &mut Conn, buf: &mut [u8]) -> io::Result<bool> {
    if !write_some(&mut conn.stream, &mut conn.pending)? {
        return Ok(false); // wait for writable: backpressure
    }
    if !conn.readable {
        return Ok(false);
    }
    let n = match conn.stream.read(buf) {
        Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            conn.readable = false;
            return Ok(false);
        }
        Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(true),
        Err(e) => return Err(e),
    };
    if n < buf.len() {
        // A short read emptied the socket; new data brings a new edge.
        conn.readable = false;
    }
    conn.pending.extend_from_slice(&buf[..n]);
    write_some(&mut conn.stream, &mut conn.pending)?;
    Ok(conn.readable)
}

/// Writes what the socket takes; `Ok(true)` when nothing is left.
fn write_some(stream: &mut TcpStream, out: &mut Vec<u8>) -> io::Result<bool> {
    let mut written = 0;
    while written < out.len() {
        match stream.write(&out[written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    out.drain(..written);
    Ok(out.is_empty())
}
