//! Tests of [`super`] (lifecycle.rs), kept apart so that the module reads on its own.

use super::*;
use crate::outbox::cid;

fn node() -> (Node, Now) {
    let now = Now {
        ms: 100,
        us: 100_000,
        unix_ns: 5,
    };
    let mut node = Node::new(
        now,
        crate::node::NodeConfig {
            advertise: "x:1".into(),
            cluster: None,
            max_locks: crate::engine::DEFAULT_MAX_LOCKS,
        },
    );
    node.open(cid(0));
    (node, now)
}

/// Sends everything pending, `chunk` bytes at a time; returns it.
fn drain(life: &mut Lifecycle, node: &mut Node, now: Now, chunk: usize) -> Vec<u8> {
    let mut got = Vec::new();
    loop {
        let out = life.pending(node, cid(0));
        if out.is_empty() {
            return got;
        }
        let n = out.len().min(chunk);
        got.extend_from_slice(&out[..n]);
        life.sent(node, now, cid(0), n);
    }
}

#[test]
fn a_pause_stops_reading_until_the_answers_are_taken_and_loses_nothing() {
    let (mut node, now) = node();
    let mut life = Lifecycle::new();
    assert!(life.wants_read(node.outbox(), cid(0)));
    let input = b"S\n".repeat(10_000);
    life.received(&mut node, now, cid(0), &input);
    assert!(!life.wants_read(node.outbox(), cid(0)), "paused");
    // Half of what is pending taken: still past the limit or not, the
    // input kept back is answered once the client takes enough.
    let out = drain(&mut life, &mut node, now, 4096);
    assert_eq!(life.phase(), Phase::Open);
    assert!(life.wants_read(node.outbox(), cid(0)));
    assert_eq!(out, b"S active x:1 0\n".repeat(10_000));
    assert_eq!(life.advance(now.ms), Step::Stay);
}

#[test]
fn the_pause_counts_answers_taken_from_the_engine_but_not_sent() {
    let (mut node, now) = node();
    let mut life = Lifecycle::new();
    // Just enough lines to pass the limit with the last one: nothing is
    // kept back, the answers alone stop the reading.
    let answer = b"S active x:1 0\n".len();
    let lines = OUTPUT_PAUSE_BYTES / answer + 1;
    life.received(&mut node, now, cid(0), &b"S\n".repeat(lines));
    assert!(!life.holds_input());
    assert!(!life.wants_read(node.outbox(), cid(0)), "paused");
    // Moved out of the engine for sending, not yet taken by the socket:
    // still paused.
    let pending = life.pending(&mut node, cid(0)).len();
    assert_eq!(pending, lines * answer);
    assert!(node.output_mut(cid(0)).is_empty());
    assert!(!life.wants_read(node.outbox(), cid(0)), "still paused");
    // Taken down to the limit: reading again.
    life.sent(&mut node, now, cid(0), pending - OUTPUT_PAUSE_BYTES);
    assert!(life.wants_read(node.outbox(), cid(0)));
}

#[test]
fn a_grant_made_while_answers_go_out_is_sent_before_the_loop_sleeps() {
    // Client 1 holds "k" and client 2 waits for it. Client 0's input
    // runs past the pause, and the release of "k" is in what it keeps
    // back: it is handled as client 0's answers are sent, after the
    // loop took the turn's connections with output (as epoll's flush
    // does). The grant to client 2 must go out without waiting for an
    // unrelated event (a timer, another request): the loop must not
    // sleep while it is unsent.
    let (mut node, now) = node();
    node.open(cid(1));
    node.open(cid(2));
    let mut lives = [Lifecycle::new(), Lifecycle::new(), Lifecycle::new()];
    lives[1].received(&mut node, now, cid(1), b"A k 60000 0\n");
    lives[2].received(&mut node, now, cid(2), b"A k 60000 60000\n");
    let mut input = b"S\n".repeat(5_000);
    input.extend_from_slice(b"R k 5\n");
    lives[0].received(&mut node, now, cid(0), &input);
    assert!(
        !lives[0].wants_read(node.outbox(), cid(0)),
        "paused: the release kept back"
    );
    let mut dirty = Vec::new();
    node.take_dirty(now, &mut dirty);
    assert!(
        !dirty.contains(&cid(2)),
        "client 2 waits: nothing for it yet"
    );
    for &conn in &dirty {
        let life = &mut lives[conn.index()];
        loop {
            let n = life.pending(&mut node, conn).len();
            if n == 0 {
                break;
            }
            life.sent(&mut node, now, conn, n);
        }
    }
    assert_eq!(
        node.output_mut(cid(2)).as_slice(),
        b"A k 6\n",
        "granted meanwhile"
    );
    // The loop sleeps until `next_deadline`: it must be now.
    let deadline = node.next_deadline();
    assert!(
        deadline.is_some_and(|d| d <= now.ms),
        "client 2's grant would wait for the lease timer ({deadline:?}; now {})",
        now.ms
    );
    node.take_dirty(now, &mut dirty);
    assert_eq!(dirty, [2].map(ConnId::new));
    assert_eq!(lives[2].pending(&mut node, cid(2)), b"A k 6\n");
    // Once collected, no more hurry: the next deadline is the lease's.
    assert!(node.next_deadline().is_some_and(|d| d > now.ms));
}

#[test]
fn a_protocol_break_sends_the_rest_then_lingers_until_the_deadline() {
    let (mut node, now) = node();
    let mut life = Lifecycle::new();
    life.received(&mut node, now, cid(0), b"S\nX\nS\n");
    assert_eq!(life.phase(), Phase::Closing);
    assert_eq!(life.advance(now.ms), Step::Stay, "answers not sent yet");
    let out = drain(&mut life, &mut node, now, 7);
    assert_eq!(
        out,
        b"S active x:1 0\nE unknown op \"X\" in line 2\n".to_vec()
    );
    let until = now.ms + LINGER_MS;
    assert_eq!(
        life.advance(now.ms),
        Step::Shut {
            linger_until: Some(until)
        }
    );
    assert!(life.wants_read(node.outbox(), cid(0)), "reads and discards");
    life.received(&mut node, now, cid(0), b"S\n");
    assert!(life.pending(&mut node, cid(0)).is_empty());
    assert_eq!(life.advance(until - 1), Step::Stay);
    assert_eq!(life.advance(until), Step::Close);
    assert!(life.is_closed() && !life.wants_read(node.outbox(), cid(0)));
}

#[test]
fn the_peer_closing_while_lingering_closes_at_once() {
    let (mut node, now) = node();
    let mut life = Lifecycle::new();
    life.finish(&mut node, now, cid(0));
    assert!(drain(&mut life, &mut node, now, 100).is_empty());
    assert!(matches!(
        life.advance(now.ms),
        Step::Shut {
            linger_until: Some(_)
        }
    ));
    life.peer_closed(&mut node, now, cid(0));
    assert_eq!(life.advance(now.ms), Step::Close);
}

#[test]
fn a_half_close_gets_its_answers_then_shuts_without_lingering() {
    let (mut node, now) = node();
    let mut life = Lifecycle::new();
    life.received(&mut node, now, cid(0), b"A k 1 0\nS\n");
    life.peer_closed(&mut node, now, cid(0));
    assert!(!life.wants_read(node.outbox(), cid(0)));
    assert_eq!(life.phase(), Phase::Closing);
    let out = drain(&mut life, &mut node, now, 1000);
    assert_eq!(out, b"A k 5\nS active x:1 5\n".to_vec());
    assert_eq!(life.advance(now.ms), Step::Shut { linger_until: None });
    assert!(life.is_closed());
}

/// A TLS server lifecycle and an in-memory rustls client for it.
fn tls_pair(now: Now) -> (Lifecycle, rustls::ClientConnection) {
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let provider = || Arc::new(rustls::crypto::ring::default_provider());
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let life = Lifecycle::with_tls(
        rustls::Connection::Server(rustls::ServerConnection::new(Arc::new(server)).unwrap()),
        now.ms + 1000,
        None,
        None,
    );
    let client = rustls::ClientConnection::new(
        Arc::new(client),
        rustls::pki_types::ServerName::try_from("localhost").unwrap(),
    )
    .unwrap();
    (life, client)
}

/// Moves bytes both ways until neither side has any; returns the
/// plaintext the client received. The server's records are taken
/// `chunk` bytes at a time.
fn pump(
    life: &mut Lifecycle,
    client: &mut rustls::ClientConnection,
    node: &mut Node,
    now: Now,
    chunk: usize,
) -> Vec<u8> {
    use std::io::Read;
    let mut plain = Vec::new();
    loop {
        let mut to_server = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut to_server).unwrap();
        }
        if !to_server.is_empty() {
            life.received(node, now, cid(0), &to_server);
        }
        let to_client = drain(life, node, now, chunk);
        let mut rest = &to_client[..];
        while !rest.is_empty() {
            client.read_tls(&mut rest).unwrap();
            client.process_new_packets().unwrap();
            let mut buf = [0u8; 4096];
            while let Ok(n) = client.reader().read(&mut buf) {
                if n == 0 {
                    break;
                }
                plain.extend_from_slice(&buf[..n]);
            }
        }
        if to_server.is_empty() && to_client.is_empty() {
            return plain;
        }
    }
}

#[test]
fn tls_carries_requests_through_the_pause_and_ends_with_close_notify() {
    use std::io::Write as _;
    let (mut node, now) = node();
    let (mut life, mut client) = tls_pair(now);
    assert!(life.is_tls());
    assert!(pump(&mut life, &mut client, &mut node, now, 1000).is_empty());
    assert!(!client.is_handshaking(), "handshake done");
    // 10 000 requests: their answers pass the 64 KiB pause; all come.
    client.writer().write_all(&b"S\n".repeat(10_000)).unwrap();
    let got = pump(&mut life, &mut client, &mut node, now, 4096);
    assert_eq!(got, b"S active x:1 0\n".repeat(10_000));
    assert!(!life.handshake_expired(
        &mut node,
        Now {
            ms: now.ms + 5000,
            us: (now.ms + 5000) * 1000,
            ..now
        },
        cid(0)
    ));
    // Our side ends it: last answers, then close_notify, then shut.
    client.writer().write_all(b"S\n").unwrap();
    let mut to_server = Vec::new();
    while client.wants_write() {
        client.write_tls(&mut to_server).unwrap();
    }
    life.received(&mut node, now, cid(0), &to_server);
    life.finish(&mut node, now, cid(0));
    assert_eq!(life.advance(now.ms), Step::Stay, "not sent yet");
    let mut rest = &drain(&mut life, &mut node, now, 100)[..];
    while !rest.is_empty() {
        client.read_tls(&mut rest).unwrap();
    }
    let state = client.process_new_packets().unwrap();
    assert!(state.peer_has_closed(), "close_notify sent");
    let mut last = String::new();
    std::io::Read::read_to_string(&mut client.reader(), &mut last).unwrap();
    assert_eq!(last, "S active x:1 0\n");
    assert!(matches!(life.advance(now.ms), Step::Shut { .. }));
}

#[test]
fn plain_text_on_a_tls_connection_gets_a_plain_e_line_and_closes() {
    let (mut node, now) = node();
    let (mut life, _client) = tls_pair(now);
    life.received(&mut node, now, cid(0), b"S\n");
    assert_eq!(life.phase(), Phase::Closing);
    assert_eq!(drain(&mut life, &mut node, now, 7), PLAIN_ON_TLS_ANSWER);
    assert!(matches!(life.advance(now.ms), Step::Shut { .. }));
}

#[test]
fn garbage_after_a_handshake_record_header_closes_without_a_crash() {
    let (mut node, now) = node();
    let (mut life, _client) = tls_pair(now);
    life.received(
        &mut node,
        now,
        cid(0),
        &[0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5],
    );
    life.received(&mut node, now, cid(0), &[0xff; 300]);
    assert_eq!(life.phase(), Phase::Closing);
    // Whatever rustls queued (an alert) goes out, then the socket shuts.
    let _ = drain(&mut life, &mut node, now, 64);
    assert!(matches!(life.advance(now.ms), Step::Shut { .. }));
}

#[test]
fn a_handshake_past_its_deadline_is_closed() {
    let (mut node, now) = node();
    let (mut life, _client) = tls_pair(now);
    life.received(&mut node, now, cid(0), &[0x16, 0x03, 0x01]);
    assert!(!life.handshake_expired(
        &mut node,
        Now {
            ms: now.ms + 999,
            us: (now.ms + 999) * 1000,
            ..now
        },
        cid(0)
    ));
    assert!(life.handshake_expired(
        &mut node,
        Now {
            ms: now.ms + 1000,
            us: (now.ms + 1000) * 1000,
            ..now
        },
        cid(0)
    ));
    assert!(life.is_closed());
    assert_eq!(life.advance(now.ms + 1000), Step::Close);
}

#[test]
fn a_failed_socket_closes_now_and_keeps_the_send_in_flight_in_place() {
    let (mut node, now) = node();
    let mut life = Lifecycle::new();
    life.received(&mut node, now, cid(0), b"S\n");
    let (ptr, len) = {
        let out = life.pending(&mut node, cid(0));
        (out.as_ptr(), out.len())
    };
    life.failed(&mut node, now, cid(0));
    assert_eq!(life.advance(now.ms), Step::Close);
    assert!(life.pending(&mut node, cid(0)).is_empty());
    // The buffer of a send that may still be in flight has not moved.
    assert_eq!((life.out.as_ptr(), life.out.len()), (ptr, len));
}
