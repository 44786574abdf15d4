//! Output: which connections the loop collects, in which order.

use super::*;
use crate::outbox::cid;

#[test]
fn peer_links_are_collected_before_the_clients_they_replicate() {
    let mut h = Harness::new(4);
    let mut dirty = Vec::new();
    // A client answered, then a link written to, then another client.
    h.send(cid(0), "A a 5 0").unwrap();
    h.out.write_link(cid(3), b"P X a 1\n");
    h.send(cid(1), "A b 5 0").unwrap();
    h.out.write_link(cid(2), b"P X b 1\n");
    h.out.write_link(cid(3), b"P HB\n");
    assert_eq!(h.out.take_dirty(&mut dirty), 2, "two links in front");
    assert_eq!(dirty, [3, 2, 0, 1].map(ConnId::new));
    for c in 0..4 {
        h.out.output_mut(cid(c)).clear();
    }
    // A link closed after its output, its id taken again by a client in
    // the same turn: listed once, among the clients; and the other way.
    h.out.write_link(cid(2), b"P HB\n");
    h.engine.close(cid(2), &mut h.out);
    h.engine.open(cid(2), &mut h.out);
    h.send(cid(0), "A e 5 0").unwrap();
    h.send(cid(2), "A c 5 0").unwrap();
    h.send(cid(1), "A d 5 0").unwrap();
    h.engine.close(cid(1), &mut h.out);
    h.engine.open(cid(1), &mut h.out);
    h.out.write_link(cid(1), b"P HELLO\n");
    assert_eq!(
        h.out.take_dirty(&mut dirty),
        1,
        "the closed link is no link"
    );
    assert_eq!(dirty, [1, 0, 2].map(ConnId::new));
    assert_eq!(h.out.take_dirty(&mut dirty), 0);
    assert!(dirty.is_empty(), "{dirty:?}");
}
