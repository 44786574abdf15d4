//! One connection's protocol state, without any I/O: the [`Session`] cuts
//! the bytes a connection sent into lines, hands each to the node (a
//! request to the engine, a peer line to the cluster) and says whether the
//! connection may go on ([`Flow`]).

use crate::engine::{ConnId, Now};
use crate::node::Node;
use crate::proto::{Answer, MAX_LINE, parse_request};

/// Answers not yet taken by a client beyond which its connection is not read
/// from (docs/protocol.md, "9. Load and limits").
pub const OUTPUT_PAUSE_BYTES: usize = 64 * 1024;

/// How long a broken or shutting-down connection is given to take its last
/// answers and close its side before the socket is closed anyway.
pub const LINGER_MS: u64 = 2_000;

/// Why a connection whose line does not fit in [`MAX_LINE`] is broken.
const TOO_LONG: &str = "line longer than 512 bytes";
const _: () = assert!(MAX_LINE == 512, "TOO_LONG names the bound");

/// Whether a connection may go on after its input was fed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Open,
    /// Its unsent answers passed [`OUTPUT_PAUSE_BYTES`]: the rest of the
    /// input is kept unprocessed ([`Session::has_stash`]) and the socket must
    /// not be read until the client has taken enough answers and
    /// [`Session::resume`] has run.
    Paused,
    /// It broke the protocol: its output ends with the `E` line, and it must
    /// be closed (see [`Session::feed`]).
    Broken,
}

/// One connection's protocol state: the partial line carried over between
/// reads, input kept back while the connection is paused, and how many lines
/// it has sent (for the `E` reason).
#[derive(Debug, Default)]
pub struct Session {
    partial: Vec<u8>,
    stash: Vec<u8>,
    lines: u64,
    /// Peer lines are refused: a TLS connection that has not shown a
    /// certificate signed by the peer CA (docs/security.md).
    peer_refused: bool,
}

impl Session {
    pub fn new() -> Session {
        Session::default()
    }

    /// True while input is kept back by a pause: call [`Session::resume`]
    /// before reading the socket again.
    pub fn has_stash(&self) -> bool {
        !self.stash.is_empty()
    }

    /// Runs every whole line of `data` through the engine. Whole lines are
    /// parsed where they lie; only a line cut by the end of a read is copied,
    /// to be completed by the next one.
    ///
    /// On a protocol break the `E` line is appended to the connection's
    /// output and [`Flow::Broken`] returned; the caller then takes the output
    /// (see [`take_final_output`]) and closes the connection. Nothing after
    /// the broken line is read.
    pub fn feed(&mut self, node: &mut Node, now: Now, conn: ConnId, mut data: &[u8]) -> Flow {
        debug_assert!(self.stash.is_empty(), "fed while paused: resume first");
        if !self.partial.is_empty() {
            let room = MAX_LINE - self.partial.len();
            match memchr::memchr(b'\n', &data[..data.len().min(room)]) {
                Some(nl) => {
                    let mut line = std::mem::take(&mut self.partial);
                    line.extend_from_slice(&data[..=nl]);
                    data = &data[nl + 1..];
                    let flow = self.run_lines(node, now, conn, &line);
                    debug_assert!(self.partial.is_empty() && self.stash.is_empty());
                    // Keep the allocation for the next partial line.
                    line.clear();
                    self.partial = line;
                    if flow == Flow::Broken {
                        return flow;
                    }
                }
                None if self.partial.len() + data.len() >= MAX_LINE => {
                    self.lines += 1;
                    node.line_too_long(now, conn, TOO_LONG);
                    return broken(node, conn, self.lines, TOO_LONG);
                }
                None => {
                    self.partial.extend_from_slice(data);
                    return Flow::Open;
                }
            }
        }
        self.run_lines(node, now, conn, data)
    }

    /// Refuses (or allows again) peer lines on this connection.
    pub(crate) fn refuse_peer_lines(&mut self, refused: bool) {
        self.peer_refused = refused;
    }

    /// Like [`Session::feed`], but while paused `data` joins the input kept
    /// back (it comes after it). For input that arrives in pieces the loop
    /// cannot hold back, such as the plaintext of one TLS read.
    pub(crate) fn feed_or_keep(
        &mut self,
        node: &mut Node,
        now: Now,
        conn: ConnId,
        data: &[u8],
    ) -> Flow {
        if self.has_stash() {
            self.stash.extend_from_slice(data);
            return Flow::Paused;
        }
        self.feed(node, now, conn, data)
    }

    /// Processes the input kept back by a pause (it may pause again).
    pub fn resume(&mut self, node: &mut Node, now: Now, conn: ConnId) -> Flow {
        if self.stash.is_empty() {
            return Flow::Open;
        }
        let stash = std::mem::take(&mut self.stash);
        self.run_lines(node, now, conn, &stash)
    }

    /// Handles the whole lines of `data` and keeps a trailing partial one;
    /// stops, keeping the rest, once the connection's answers pass
    /// [`OUTPUT_PAUSE_BYTES`].
    fn run_lines(&mut self, node: &mut Node, now: Now, conn: ConnId, mut data: &[u8]) -> Flow {
        loop {
            if !data.is_empty() && node.output_mut(conn).len() > OUTPUT_PAUSE_BYTES {
                self.stash.extend_from_slice(data);
                return Flow::Paused;
            }
            // Only a line that starts with `P` or `E` can be a peer's: one
            // byte looked at on the client path.
            let peer = match data.first() {
                Some(b'P') => data.starts_with(b"P "),
                Some(b'E') => data.starts_with(b"E ") && node.is_peer_link(conn),
                _ => false,
            };
            let refusal = peer && data.starts_with(b"E ");
            if peer && self.peer_refused {
                self.lines += 1;
                return broken(
                    node,
                    conn,
                    self.lines,
                    "peer message on a connection without a certificate signed by the peer CA",
                );
            }
            if peer {
                // A peer line: the cluster's, not the client protocol's (an
                // `E` line on a peer link is the peer giving the link up).
                let window = &data[..data.len().min(MAX_LINE)];
                let Some(nl) = memchr::memchr(b'\n', window) else {
                    if data.len() >= MAX_LINE {
                        self.lines += 1;
                        node.line_too_long(now, conn, TOO_LONG);
                        return broken(node, conn, self.lines, TOO_LONG);
                    }
                    self.partial.extend_from_slice(data);
                    return Flow::Open;
                };
                self.lines += 1;
                if let Err(error) = node.handle_peer_line(now, conn, &data[..nl]) {
                    if refusal {
                        // No `E` answers an `E`: the other side is gone.
                        return Flow::Broken;
                    }
                    node.protocol_error();
                    return broken(node, conn, self.lines, error.reason());
                }
                data = &data[nl + 1..];
                continue;
            }
            match parse_request(data) {
                Ok(Some((request, used))) => {
                    self.lines += 1;
                    if let Err(refusal) = node.handle_request(now, conn, request) {
                        let reason = node.refusal_reason(refusal);
                        return broken(node, conn, self.lines, reason);
                    }
                    data = &data[used..];
                }
                Ok(None) => {
                    self.partial.extend_from_slice(data);
                    return Flow::Open;
                }
                Err(err) => {
                    self.lines += 1;
                    node.protocol_error();
                    return broken(node, conn, self.lines, err);
                }
            }
        }
    }
}

/// Appends `E <reason> in line N` to the connection's output.
fn broken(node: &mut Node, conn: ConnId, line: u64, reason: impl std::fmt::Display) -> Flow {
    let reason = format!("{reason} in line {line}");
    Answer::Error {
        reason: reason.as_bytes(),
    }
    .encode(node.output_mut(conn));
    Flow::Broken
}

/// For a connection that is going away: takes its unsent answers and closes
/// it in the engine (its waiting acquires are withdrawn, its grants stay).
pub fn take_final_output(node: &mut Node, now: Now, conn: ConnId) -> Vec<u8> {
    let out = std::mem::take(node.output_mut(conn));
    node.close(now, conn);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::cid;

    fn test_node(now: Now) -> Node {
        Node::new(
            now,
            crate::node::NodeConfig {
                advertise: "x:1".into(),
                cluster: None,
                max_locks: crate::engine::DEFAULT_MAX_LOCKS,
            },
        )
    }

    fn run(chunks: &[&[u8]]) -> (String, Flow) {
        let now = Now {
            ms: 0,
            us: 0,
            unix_ns: 5,
        };
        let mut engine = test_node(now);
        engine.open(cid(0));
        let mut session = Session::new();
        let mut flow = Flow::Open;
        for chunk in chunks {
            flow = session.feed(&mut engine, now, cid(0), chunk);
            if flow == Flow::Broken {
                break;
            }
        }
        let out = String::from_utf8(std::mem::take(engine.output_mut(cid(0)))).unwrap();
        (out, flow)
    }

    #[test]
    fn lines_split_anywhere_give_the_same_answers() {
        let wire = b"S\r\nA k 1 0\nR k 5\nN k 5 1\nS\n";
        let (whole, _) = run(&[wire]);
        assert_eq!(
            whole,
            "S active x:1 0\nA k 5\nR k 1\nN k 0\nS active x:1 5\n"
        );
        for cut in 0..wire.len() {
            let (out, flow) = run(&[&wire[..cut], &wire[cut..]]);
            assert_eq!(
                (out.as_str(), flow),
                (whole.as_str(), Flow::Open),
                "cut at {cut}"
            );
        }
        let bytes: Vec<&[u8]> = wire.chunks(1).collect();
        assert_eq!(run(&bytes).0, whole);
    }

    #[test]
    fn answers_past_the_pause_keep_the_rest_of_the_input_unread() {
        let now = Now {
            ms: 0,
            us: 0,
            unix_ns: 5,
        };
        let mut engine = test_node(now);
        engine.open(cid(0));
        let mut session = Session::new();
        // "S\n" answers with 15 bytes: 5000 of them pass 64 KiB.
        let input = b"S\n".repeat(5000);
        assert_eq!(session.feed(&mut engine, now, cid(0), &input), Flow::Paused);
        let answered = engine.output_mut(cid(0)).len();
        assert!(answered > OUTPUT_PAUSE_BYTES && answered < OUTPUT_PAUSE_BYTES + 64);
        assert!(session.has_stash());
        // Still paused while the client has not taken anything.
        assert_eq!(session.resume(&mut engine, now, cid(0)), Flow::Paused);
        engine.output_mut(cid(0)).clear();
        assert_eq!(session.resume(&mut engine, now, cid(0)), Flow::Open);
        assert!(!session.has_stash());
        let total = answered + engine.output_mut(cid(0)).len();
        assert_eq!(
            total,
            5000 * "S active x:1 0\n".len(),
            "every request answered once"
        );
    }

    #[test]
    fn a_break_answers_what_came_before_then_e_with_the_line_number() {
        let (out, flow) = run(&[b"S\nA k 1 0\nA k x 0\nS\n"]);
        assert_eq!(flow, Flow::Broken);
        assert_eq!(out, "S active x:1 0\nA k 5\nE bad lease \"x\" in line 3\n");
    }

    #[test]
    fn a_long_line_breaks_without_waiting_for_its_end() {
        let long = vec![b'k'; 300];
        let (out, flow) = run(&[b"S\nA ", &long, &long]);
        assert_eq!(flow, Flow::Broken);
        assert_eq!(
            out,
            "S active x:1 0\nE line longer than 512 bytes in line 2\n"
        );
        // "A <250-byte key> 000...01 0\n": exactly 512 bytes with leading zeros.
        let mut line = b"A ".to_vec();
        line.extend(std::iter::repeat_n(b'k', 250));
        line.push(b' ');
        line.extend(std::iter::repeat_n(b'0', MAX_LINE - 257));
        line.extend_from_slice(b"1 0\n");
        assert_eq!(line.len(), MAX_LINE);
        let (out, flow) = run(&[&line[..100], &line[100..]]);
        assert_eq!(flow, Flow::Open, "{out}");
    }
}
