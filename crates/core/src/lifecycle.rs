//! One connection's life, from accept to close, without any I/O.
//!
//! Both loops and the simulator drive a [`Lifecycle`] per connection: they
//! tell it what happened on the socket (bytes arrived, the peer closed its
//! sending side, the socket failed, some bytes were sent, time passed) and
//! ask it what to do next: whether to read ([`Lifecycle::wants_read`]) and
//! when ([`Lifecycle::next_read`]), what to send ([`Lifecycle::pending`]),
//! and whether to shut our sending side or close the socket
//! ([`Lifecycle::advance`]). It owns the connection's [`Session`], the
//! output being sent, the pause for unsent answers ([`OUTPUT_PAUSE_BYTES`]),
//! the batching of a busy link's reads ([`crate::read_batch`]) and the
//! linger after our last answers ([`LINGER_MS`]). The loops keep only the
//! syscalls.

use std::io::{BufRead, Write};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;

use crate::access::Acl;
use crate::engine::{ConnId, Now};
use crate::node::Node;
use crate::outbox::Outbox;
use crate::read_batch::{NextRead, ReadBatch};
use crate::session::{Flow, LINGER_MS, OUTPUT_PAUSE_BYTES, Session, take_final_output};

/// What a plain-text client that connects to a TLS port is told (in plain
/// text, which it can read) before the connection closes.
pub(crate) const PLAIN_ON_TLS_ANSWER: &[u8] =
    b"E this port speaks TLS: connect with TLS (ringlock --tls-ca PATH)\n";

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Serving requests (maybe paused: see [`Lifecycle::wants_read`]).
    Open,
    /// Going away: the engine has forgotten it and its last answers are
    /// being sent. Input is read and discarded.
    Closing,
    /// Its last answers are sent and our side is shut: reading and
    /// discarding until the peer closes or the deadline passes, so that
    /// closing does not reset the connection before the peer read them.
    Lingering { until_ms: u64 },
    /// To be closed: the loop frees the socket (once no operation of it is
    /// in flight).
    Closed,
}

/// What the loop does with the socket after [`Lifecycle::advance`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Step {
    /// Nothing about the socket changes.
    Stay,
    /// Our last answers are out: shut the sending side. With a deadline the
    /// connection lingers until then (the loop sets a timer and calls
    /// [`Lifecycle::advance`] when it fires); without, it is closed now.
    Shut { linger_until: Option<u64> },
    /// Close the socket.
    Close,
}

/// A connection's state machine (see the module documentation).
///
/// The bytes [`Lifecycle::pending`] returns stay where they are, unchanged,
/// until [`Lifecycle::sent`] has accounted for all of them: nothing else
/// moves or frees that buffer (not closing, not a failure), only dropping
/// the `Lifecycle`. The io_uring loop relies on this for its sends in
/// flight.
#[derive(Debug)]
pub struct Lifecycle {
    session: Session,
    phase: Phase,
    /// The peer closed its sending side (or the socket failed).
    eof: bool,
    /// The answers being sent, and how much of them is sent.
    out: Vec<u8>,
    sent: usize,
    /// A closing connection's last answers not yet moved to `out`.
    last: Vec<u8>,
    /// TLS between the socket and the session, if the connection has it.
    /// Without it (plain text) every method takes one branch more.
    tls: Option<Box<TlsLayer>>,
    /// Whether its reads wait on the socket or come in batches.
    batch: ReadBatch,
}

/// A TLS connection's state: rustls's (sans-I/O) connection and the TLS
/// records to send. Received records are decrypted into the session; the
/// engine's answers are encrypted into `out`, which
/// [`Lifecycle::pending`] hands to the loop instead of the plaintext.
#[derive(Debug)]
struct TlsLayer {
    conn: rustls::Connection,
    /// TLS records being sent, and how much of them is sent.
    out: Vec<u8>,
    sent: usize,
    /// The handshake must be done by then (loop ms), or the connection is
    /// closed.
    handshake_until: u64,
    /// Nothing received yet: the first byte tells a plain-text client.
    first: bool,
    /// For accepted connections of a node with peers: checks that a
    /// connection's certificate is signed by the peer CA before it may
    /// speak as a peer.
    peer_check: Option<Arc<dyn ClientCertVerifier>>,
    /// For accepted connections of a node with client certificates: the
    /// rules that say what the certificate's identity may do.
    acl: Option<Arc<Acl>>,
    /// Our `close_notify` is queued (a closing connection).
    close_queued: bool,
    /// TLS failed (or the client spoke plain text): nothing more is
    /// encrypted; `out` holds the last bytes (an alert, or a plain `E`).
    failed: Option<TlsFailure>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle::new()
    }
}

impl Lifecycle {
    /// A connection just opened in the engine (`Node::open` and kin).
    pub fn new() -> Lifecycle {
        Lifecycle {
            session: Session::new(),
            phase: Phase::Open,
            eof: false,
            out: Vec::new(),
            sent: 0,
            last: Vec::new(),
            tls: None,
            batch: ReadBatch::default(),
        }
    }

    /// A connection that speaks TLS: `conn` is a rustls server connection
    /// (accepted) or client connection (a dialed peer link). Its handshake
    /// must be over by `handshake_until` ([`Lifecycle::handshake_expired`]).
    /// With `peer_check` (accepted, node with peers), peer lines are
    /// refused unless the certificate passes it. With `acl` (accepted, node
    /// with client certificates) the certificate's identity is the
    /// connection's, with what `acl` allows it ([`crate::access`]).
    pub fn with_tls(
        conn: rustls::Connection,
        handshake_until: u64,
        peer_check: Option<Arc<dyn ClientCertVerifier>>,
        acl: Option<Arc<Acl>>,
    ) -> Lifecycle {
        let mut life = Lifecycle::new();
        if matches!(conn, rustls::Connection::Server(_)) {
            // Until the handshake shows a peer certificate.
            life.session.refuse_peer_lines(true);
        }
        life.tls = Some(Box::new(TlsLayer {
            conn,
            out: Vec::new(),
            sent: 0,
            handshake_until,
            first: true,
            peer_check,
            acl,
            close_queued: false,
            failed: None,
        }));
        life
    }

    /// True for a TLS connection: after it receives bytes it may have some
    /// to send (its handshake), so the loop looks at [`Lifecycle::pending`].
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// True for a TLS connection whose handshake is not over: until then a
    /// dialed link's plaintext waits in rustls, unencrypted and unsent.
    pub fn is_handshaking(&self) -> bool {
        self.tls.as_deref().is_some_and(|t| t.conn.is_handshaking())
    }

    /// Why a TLS connection's TLS failed, if it did. It is then closing
    /// (the failure was logged); nothing more is read or encrypted.
    pub fn tls_failure(&self) -> Option<TlsFailure> {
        self.tls.as_deref().and_then(|t| t.failed)
    }

    /// For the loop's handshake deadline: a TLS connection still in its
    /// handshake at `now` past its deadline is closed (logged). True if so.
    pub fn handshake_expired(&mut self, node: &mut Node, now: Now, conn: ConnId) -> bool {
        let Some(tls) = self.tls.as_deref() else {
            return false;
        };
        if self.phase != Phase::Open || !tls.conn.is_handshaking() || now.ms < tls.handshake_until {
            return false;
        }
        node.tls_log(now, conn, || {
            "TLS handshake not finished in time (a stalled or very slow client)".into()
        });
        self.failed(node, now, conn);
        true
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// True once the socket is to be closed.
    pub fn is_closed(&self) -> bool {
        self.phase == Phase::Closed
    }

    /// True while input is kept back by a pause: the session stopped in the
    /// middle of what it was given and goes on once answers are sent.
    pub fn holds_input(&self) -> bool {
        self.session.has_stash()
    }

    /// A closing connection's last answers that [`Lifecycle::pending`] has
    /// not handed out yet (empty otherwise): what the engine had when the
    /// connection began closing, ending with the `E` line of a protocol
    /// break.
    pub fn last_answers(&self) -> &[u8] {
        &self.last
    }

    /// The deadline of a lingering connection.
    pub fn linger_until(&self) -> Option<u64> {
        match self.phase {
            Phase::Lingering { until_ms } => Some(until_ms),
            _ => None,
        }
    }

    /// Whether the loop should read the socket now: not while the unsent
    /// answers of an open connection pass [`OUTPUT_PAUSE_BYTES`] or input is
    /// kept back by that pause (TCP backpressure: reading resumes once the
    /// peer has taken enough answers), not after the peer's end of stream,
    /// not once closed. A closing or lingering connection is read to discard
    /// its input and notice the peer's close.
    pub fn wants_read(&self, outbox: &Outbox, conn: ConnId) -> bool {
        match self.phase {
            Phase::Open => {
                !self.eof
                    && !self.session.has_stash()
                    && self.unsent(outbox, conn) <= OUTPUT_PAUSE_BYTES
            }
            Phase::Closing | Phase::Lingering { .. } => !self.eof,
            Phase::Closed => false,
        }
    }

    /// When to read, if [`Lifecycle::wants_read`]: as bytes arrive, or (a
    /// busy link in batches, [`crate::read_batch`]) without waiting at a
    /// given time. Only an open connection is read in batches.
    pub fn next_read(&self) -> NextRead {
        match self.phase {
            Phase::Open => self.batch.next(),
            Phase::Closing | Phase::Lingering { .. } | Phase::Closed => NextRead::Waiting,
        }
    }

    /// A read without waiting ([`NextRead::At`]) found the socket empty:
    /// the link is quiet, and the loop waits on it again.
    pub fn read_nothing(&mut self) {
        self.batch.found_nothing();
    }

    /// Answers of an open connection not yet taken by the socket.
    fn unsent(&self, outbox: &Outbox, conn: ConnId) -> usize {
        debug_assert!(self.sent <= self.out.len());
        let tls = self.tls.as_deref().map_or(0, |t| t.out.len() - t.sent);
        outbox.len(conn) + (self.out.len() - self.sent) + tls
    }

    /// Bytes arrived. An open connection feeds them to the engine (a
    /// protocol break starts closing it); any other discards them.
    /// A read of an open connection decides when it reads next
    /// ([`Lifecycle::next_read`]).
    pub fn received(&mut self, node: &mut Node, now: Now, conn: ConnId, data: &[u8]) {
        if self.phase != Phase::Open {
            return;
        }
        if !data.is_empty() {
            if self.batch.next() != NextRead::Waiting {
                node.count_batched_read();
            }
            self.batch.found_bytes(now.us, node.read_batch_us(conn));
        }
        if self.tls.is_some() {
            return self.received_tls(node, now, conn, data);
        }
        debug_assert!(!self.session.has_stash(), "read while paused");
        if self.session.feed(node, now, conn, data) == Flow::Broken {
            self.finish(node, now, conn);
        }
    }

    /// [`Lifecycle::received`] for a TLS connection: the records are
    /// decrypted and their plaintext fed to the session; a TLS failure is
    /// logged and the connection closed (after the alert rustls queued).
    fn received_tls(&mut self, node: &mut Node, now: Now, conn: ConnId, mut data: &[u8]) {
        let Some(tls) = self.tls.as_deref_mut() else {
            return;
        };
        if tls.failed.is_some() {
            return;
        }
        if std::mem::take(&mut tls.first)
            && matches!(tls.conn, rustls::Connection::Server(_))
            && data.first().is_some_and(|&b| b != 0x16)
        {
            // Not a TLS handshake record: most likely a plain-text client.
            // It gets its answer in plain text, which it can read.
            node.tls_log(now, conn, || {
                "the client spoke plain text to the TLS port (it must connect with TLS)".into()
            });
            tls.failed = Some(TlsFailure::PlainText);
            tls.out.clear();
            tls.sent = 0;
            tls.out.extend_from_slice(PLAIN_ON_TLS_ANSWER);
            self.finish(node, now, conn);
            return;
        }
        let mut broken = false;
        while !data.is_empty() && !broken {
            let was_handshaking = tls.conn.is_handshaking();
            let failure = match tls.conn.read_tls(&mut data) {
                Ok(_) => tls.conn.process_new_packets().err().map(|e| {
                    let kind = match e {
                        rustls::Error::AlertReceived(rustls::AlertDescription::CloseNotify)
                            if was_handshaking =>
                        {
                            TlsFailure::ClosedInHandshake
                        }
                        _ => TlsFailure::Broken,
                    };
                    let why = (kind, describe(&e));
                    // The alert rustls queued for the other side.
                    while tls.conn.wants_write() {
                        if tls.conn.write_tls(&mut tls.out).is_err() {
                            break;
                        }
                    }
                    why
                }),
                Err(e) => Some((TlsFailure::Broken, format!("TLS input refused: {e}"))),
            };
            if let Some((kind, why)) = failure {
                if matches!(tls.conn, rustls::Connection::Client(_)) {
                    // A peer link we dialed.
                    node.peer_tls_failed(now, conn, &why);
                }
                node.tls_log(now, conn, || why);
                tls.failed = Some(kind);
                broken = true;
                break;
            }
            if was_handshaking && !tls.conn.is_handshaking() {
                // The handshake is done.
                broken = handshake_done(tls, &mut self.session, node, now, conn);
            }
            if broken {
                break;
            }
            // The plaintext, fed where rustls decrypted it.
            loop {
                let mut reader = tls.conn.reader();
                let n = match reader.fill_buf() {
                    Ok(plain) if !plain.is_empty() => {
                        if self.session.feed_or_keep(node, now, conn, plain) == Flow::Broken {
                            broken = true;
                        }
                        plain.len()
                    }
                    // Empty, or `WouldBlock`: no more plaintext for now;
                    // an error: the peer closed without `close_notify`,
                    // which the socket's end of stream will tell.
                    _ => break,
                };
                reader.consume(n);
                if broken {
                    break;
                }
            }
        }
        if broken {
            self.finish(node, now, conn);
        }
    }

    /// The peer closed its sending side (a read returned 0): an open
    /// connection's decided answers are sent and its waiting acquires
    /// withdrawn (docs/protocol.md); a lingering one is closed now.
    pub fn peer_closed(&mut self, node: &mut Node, now: Now, conn: ConnId) {
        self.eof = true;
        match self.phase {
            Phase::Open => self.finish(node, now, conn),
            Phase::Lingering { .. } => self.phase = Phase::Closed,
            Phase::Closing | Phase::Closed => {}
        }
    }

    /// The socket failed (reset, a send refused): closed now, nothing more
    /// is sent.
    pub fn failed(&mut self, node: &mut Node, now: Now, conn: ConnId) {
        self.eof = true;
        if self.phase == Phase::Open {
            node.close(now, conn);
        }
        self.phase = Phase::Closed;
    }

    /// Our side ends the connection (a protocol break, the node gave up on
    /// it, the server shuts down): its unsent answers (ending with the `E`
    /// line, if any) are its last, then it is shut and lingers.
    pub fn finish(&mut self, node: &mut Node, now: Now, conn: ConnId) {
        if self.phase != Phase::Open {
            return;
        }
        debug_assert!(self.last.is_empty());
        self.last = take_final_output(node, now, conn);
        self.phase = Phase::Closing;
    }

    /// What to send next: the rest of the answers being sent or, once they
    /// are all sent, the next ones (swapped out of the node's outbox, not
    /// copied). Empty if there is nothing to send. See the type's
    /// documentation for how long these bytes stay put.
    pub fn pending(&mut self, node: &mut Node, conn: ConnId) -> &[u8] {
        if self.tls.is_some() {
            return self.pending_tls(node, conn);
        }
        if self.sent == self.out.len() {
            match self.phase {
                Phase::Open => {
                    self.out.clear();
                    self.sent = 0;
                    std::mem::swap(&mut self.out, node.output_mut(conn));
                }
                Phase::Closing => {
                    self.out.clear();
                    self.sent = 0;
                    std::mem::swap(&mut self.out, &mut self.last);
                }
                Phase::Lingering { .. } | Phase::Closed => return &[],
            }
        }
        match self.phase {
            Phase::Open | Phase::Closing => self.out.get(self.sent..).unwrap_or_default(),
            Phase::Lingering { .. } | Phase::Closed => &[],
        }
    }

    /// [`Lifecycle::pending`] for a TLS connection: once the records being
    /// sent are all out, the next answers are encrypted into new ones (and
    /// rustls's own records: handshake, alerts, `close_notify`).
    fn pending_tls(&mut self, node: &mut Node, conn: ConnId) -> &[u8] {
        let Some(tls) = self.tls.as_deref_mut() else {
            return &[];
        };
        if tls.sent == tls.out.len() {
            tls.out.clear();
            tls.sent = 0;
            if tls.failed.is_some() {
                self.last.clear(); // nothing more can be sent
            } else {
                match self.phase {
                    Phase::Open => encrypt(&mut tls.conn, node.output_mut(conn)),
                    Phase::Closing => {
                        encrypt(&mut tls.conn, &mut self.last);
                        if self.last.is_empty() && !tls.close_queued {
                            tls.conn.send_close_notify();
                            tls.close_queued = true;
                        }
                    }
                    Phase::Lingering { .. } | Phase::Closed => {}
                }
                while tls.conn.wants_write() {
                    if tls.conn.write_tls(&mut tls.out).is_err() {
                        break;
                    }
                }
            }
        }
        match self.phase {
            Phase::Open | Phase::Closing => tls.out.get(tls.sent..).unwrap_or_default(),
            Phase::Lingering { .. } | Phase::Closed => &[],
        }
    }

    /// True once a closing connection's last bytes are all sent.
    fn all_sent(&self) -> bool {
        let plain = self.sent == self.out.len() && self.last.is_empty();
        match self.tls.as_deref() {
            None => plain,
            Some(tls) => {
                plain
                    && tls.sent == tls.out.len()
                    && (tls.failed.is_some() || (tls.close_queued && !tls.conn.wants_write()))
            }
        }
    }

    /// The socket took `n` bytes of [`Lifecycle::pending`]. Once the peer
    /// has taken enough answers, input kept back by a pause is processed.
    pub fn sent(&mut self, node: &mut Node, now: Now, conn: ConnId, n: usize) {
        if let Some(tls) = self.tls.as_deref_mut() {
            debug_assert!(n <= tls.out.len() - tls.sent, "sent more than pending");
            tls.sent = tls.sent.saturating_add(n).min(tls.out.len());
        } else {
            debug_assert!(n <= self.out.len() - self.sent, "sent more than pending");
            self.sent = self.sent.saturating_add(n).min(self.out.len());
        }
        if self.phase == Phase::Open
            && self.session.has_stash()
            && self.unsent(node.outbox(), conn) <= OUTPUT_PAUSE_BYTES
            && self.session.resume(node, now, conn) == Flow::Broken
        {
            self.finish(node, now, conn);
        }
    }

    /// Moves the connection on after the loop's I/O: a closing connection
    /// whose last answers are all sent is shut (and lingers unless the peer
    /// already closed); a lingering one whose deadline passed is closed.
    pub fn advance(&mut self, now_ms: u64) -> Step {
        match self.phase {
            Phase::Closing if self.all_sent() => {
                if self.eof {
                    self.phase = Phase::Closed;
                    Step::Shut { linger_until: None }
                } else {
                    let until_ms = now_ms.saturating_add(LINGER_MS);
                    self.phase = Phase::Lingering { until_ms };
                    Step::Shut {
                        linger_until: Some(until_ms),
                    }
                }
            }
            Phase::Lingering { until_ms } if now_ms >= until_ms => {
                self.phase = Phase::Closed;
                Step::Close
            }
            Phase::Closed => Step::Close,
            Phase::Open | Phase::Closing | Phase::Lingering { .. } => Step::Stay,
        }
    }
}

/// Moves as much of `plain` into rustls as it takes (it buffers a bounded
/// amount); the rest stays in `plain` for the next round.
fn encrypt(conn: &mut rustls::Connection, plain: &mut Vec<u8>) {
    if plain.is_empty() {
        return;
    }
    let taken = conn.writer().write(plain).unwrap_or(0);
    if taken >= plain.len() {
        plain.clear();
    } else {
        plain.drain(..taken);
    }
}

/// A TLS connection's handshake just ended: may it speak as a peer (its
/// certificate is signed by the peer CA), and, on a node with client
/// certificates, what is its identity and what may it do? True if the
/// connection is refused (its `E` line is in its output): a client whose
/// certificate names no usable identity.
fn handshake_done(
    tls: &TlsLayer,
    session: &mut Session,
    node: &mut Node,
    now: Now,
    conn: ConnId,
) -> bool {
    let rustls::Connection::Server(server) = &tls.conn else {
        session.refuse_peer_lines(false);
        return false;
    };
    let peer = tls.peer_check.as_ref().map(|check| {
        server
            .peer_certificates()
            .is_some_and(|chain| is_peer_certificate(&**check, chain, now.unix_ns))
    });
    session.refuse_peer_lines(peer == Some(false));
    let Some(acl) = &tls.acl else {
        return false;
    };
    let end = server.peer_certificates().and_then(|chain| chain.first());
    let why = match end.map(|cert| crate::access::identity_of(cert)) {
        Some(Ok(identity)) => {
            node.set_access(conn, acl.access(&identity));
            return false;
        }
        // A node of the cluster whose certificate names no usable identity
        // is still a peer (it locks nothing).
        _ if peer == Some(true) => return false,
        Some(Err(why)) => why.to_string(),
        None => "the client presented no certificate".to_string(),
    };
    node.identity_refused(now, conn, &why);
    let reason = format!("not allowed: {why}");
    crate::proto::Answer::Error {
        reason: reason.as_bytes(),
    }
    .encode(node.output_mut(conn));
    true
}

/// Whether the certificate chain an accepted connection presented is signed
/// by the peer CA, at the wall-clock time `unix_ns`.
fn is_peer_certificate(
    check: &dyn ClientCertVerifier,
    chain: &[CertificateDer<'_>],
    unix_ns: u64,
) -> bool {
    let at = UnixTime::since_unix_epoch(std::time::Duration::from_nanos(unix_ns));
    match chain.split_first() {
        Some((end, intermediates)) => check.verify_client_cert(end, intermediates, at).is_ok(),
        None => false,
    }
}

/// Why a connection's TLS failed ([`Lifecycle::tls_failure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFailure {
    /// The other side spoke plain text to a TLS port.
    PlainText,
    /// The other side closed (`close_notify`) before the handshake was
    /// over: it gave up on the connection, which is not broken.
    ClosedInHandshake,
    /// Anything else: a record that did not decrypt, a certificate
    /// refused, an alert.
    Broken,
}

/// Says what a TLS failure means for the person reading the log.
fn describe(err: &rustls::Error) -> String {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    match err {
        E::NoCertificatesPresented => {
            "the client presented no certificate, and --tls-client-ca requires one".into()
        }
        E::InvalidCertificate(c) => {
            let what = match c {
                C::UnknownIssuer => "is not signed by a trusted CA (unknown issuer)".to_string(),
                C::Expired | C::ExpiredContext { .. } => "has expired".to_string(),
                C::NotValidYet | C::NotValidYetContext { .. } => "is not valid yet".to_string(),
                C::NotValidForName | C::NotValidForNameContext { .. } => {
                    "does not name the address dialed".to_string()
                }
                C::BadSignature => "has a bad signature".to_string(),
                other => format!("was refused: {other:?}"),
            };
            format!("the other side's certificate {what}")
        }
        E::AlertReceived(alert) => {
            let why = match alert {
                A::UnknownCA => "it does not trust our certificate's CA",
                A::CertificateExpired => "our certificate has expired",
                A::BadCertificate => "it refused our certificate",
                A::CertificateRequired => "it requires a certificate and we sent none",
                A::HandshakeFailure => "no common TLS parameters",
                _ => "",
            };
            if why.is_empty() {
                format!("the other side ended TLS with alert {alert:?}")
            } else {
                format!("the other side ended TLS: {why} (alert {alert:?})")
            }
        }
        E::InvalidMessage(m) => format!("not TLS, or a corrupt TLS record ({m:?})"),
        other => format!("TLS error: {other}"),
    }
}

#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod tests;
