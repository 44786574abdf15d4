//! Peer authentication: a secret shared by every node of a cluster, and a
//! mutual challenge–response on every peer link before anything on it is
//! believed or sent.
//!
//! ```text
//! dialer D                                         acceptor A
//!   P HELLO 2 <fp_d> <d_index> <d_addr> <d_incarnation> <nonce_d>  ->
//!   <-  P CHALLENGE <fp_a> <a_index> <a_addr> <nonce_a> <mac_a>
//!   P AUTH <mac_d>                                              ->
//! ```
//!
//! `mac_a` and `mac_d` are HMAC-SHA256 under the secret over the same
//! transcript (both nodes' fingerprints, indexes, addresses and nonces, and
//! D's incarnation), each with its own label, so neither can be reflected
//! as the other. A's nonce is fresh, so a recorded AUTH is useless later;
//! D's nonce is fresh, so a recorded CHALLENGE is too. Each side compares the
//! other's MAC in constant time (`Mac::verify_slice`). Nonces are HMAC
//! outputs over (incarnation, counter): unique per process (the incarnation
//! is 64 random bits) and unpredictable without the secret, while the state
//! machine stays deterministic for the simulator.
//!
//! This stops strangers who can reach the port. It does not stop a
//! man-in-the-middle who can rewrite a live TCP stream after the handshake:
//! that takes TLS (see docs/cluster.md, "Security model").

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

pub const NONCE_LEN: usize = 16;
pub const MAC_LEN: usize = 32;

pub type Nonce = [u8; NONCE_LEN];
pub(crate) type MacBytes = [u8; MAC_LEN];

/// A digest of the ordered peer list and the peer protocol version: two
/// nodes with different lists (or order) have different fingerprints. The
/// lower of two serves while they conflict (its order matters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fingerprint(pub u64);

impl Fingerprint {
    /// Its 8 bytes, big-endian: what MACs cover and the wire shows in hex.
    pub const fn to_be_bytes(self) -> [u8; 8] {
        self.0.to_be_bytes()
    }

    pub const fn from_be_bytes(bytes: [u8; 8]) -> Fingerprint {
        Fingerprint(u64::from_be_bytes(bytes))
    }
}

impl std::fmt::LowerHex for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::LowerHex::fmt(&self.0, f)
    }
}

/// The cluster's shared secret. Its `Debug` does not show it.
#[derive(Clone)]
pub struct Secret(Box<[u8]>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A secret from its bytes (tests and the simulator).
    pub fn from_bytes(bytes: &[u8]) -> Secret {
        Secret(bytes.into())
    }

    fn hmac(&self) -> HmacSha256 {
        // HMAC takes a key of any length.
        match HmacSha256::new_from_slice(&self.0) {
            Ok(mac) => mac,
            Err(_) => unreachable!("HMAC accepts keys of every length"),
        }
    }

    /// The `counter`th nonce of the process with `incarnation`.
    pub fn nonce(&self, incarnation: u64, counter: u64) -> Nonce {
        let mut mac = self.hmac();
        mac.update(b"ringlock peer nonce\0");
        mac.update(&incarnation.to_be_bytes());
        mac.update(&counter.to_be_bytes());
        let full = mac.finalize().into_bytes();
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&full[..NONCE_LEN]);
        nonce
    }

    /// The MAC the side `by` sends over `transcript`.
    pub fn sign(&self, by: Side, transcript: &Transcript<'_>) -> MacBytes {
        self.keyed(by, transcript).finalize().into_bytes().into()
    }

    /// True if `mac` is what the side `by` must send over `transcript`
    /// (compared in constant time).
    pub fn verify(&self, by: Side, transcript: &Transcript<'_>, mac: &MacBytes) -> bool {
        self.keyed(by, transcript).verify_slice(mac).is_ok()
    }

    fn keyed(&self, by: Side, t: &Transcript<'_>) -> HmacSha256 {
        let mut mac = self.hmac();
        mac.update(match by {
            Side::Dialer => b"ringlock peer auth v2: dialer\0",
            Side::Acceptor => b"ringlock peer auth v2: acceptor",
        });
        for id in [&t.dialer, &t.acceptor] {
            mac.update(&id.fingerprint.to_be_bytes());
            mac.update(&id.index.to_be_bytes());
            mac.update(&(id.addr.len() as u64).to_be_bytes());
            mac.update(id.addr);
            mac.update(&id.nonce);
        }
        mac.update(&t.dialer_incarnation.to_be_bytes());
        mac
    }
}

/// Which end of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Dialer,
    Acceptor,
}

/// How one end of a link introduced itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity<'a> {
    pub fingerprint: Fingerprint,
    pub index: u64,
    pub addr: &'a [u8],
    pub nonce: Nonce,
}

/// Everything both MACs of a handshake cover.
#[derive(Debug, Clone, Copy)]
pub struct Transcript<'a> {
    pub dialer: Identity<'a>,
    pub dialer_incarnation: u64,
    pub acceptor: Identity<'a>,
}

/// The fingerprint of an ordered peer list under peer protocol `version`.
pub fn fingerprint(version: u64, peers: &[String]) -> Fingerprint {
    let mut digest = Sha256::new();
    digest.update(b"ringlock peers\0");
    digest.update(version.to_be_bytes());
    digest.update((peers.len() as u64).to_be_bytes());
    for peer in peers {
        digest.update((peer.len() as u64).to_be_bytes());
        digest.update(peer.as_bytes());
    }
    let full = digest.finalize();
    let mut head = [0u8; 8];
    head.copy_from_slice(&full[..8]);
    Fingerprint::from_be_bytes(head)
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    s
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Decodes exactly `N` bytes of lowercase hex; `None` for anything else.
pub(crate) fn unhex<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        *byte = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript<'a>(d_addr: &'a [u8], a_addr: &'a [u8]) -> Transcript<'a> {
        Transcript {
            dialer: Identity {
                fingerprint: Fingerprint(1),
                index: 1,
                addr: d_addr,
                nonce: [1; NONCE_LEN],
            },
            dialer_incarnation: 7,
            acceptor: Identity {
                fingerprint: Fingerprint(1),
                index: 0,
                addr: a_addr,
                nonce: [2; NONCE_LEN],
            },
        }
    }

    #[test]
    fn a_mac_verifies_only_with_the_same_secret_side_and_transcript() {
        let secret = Secret::from_bytes(b"0123456789abcdef0123456789abcdef");
        let t = transcript(b"a:1", b"b:2");
        let mac = secret.sign(Side::Dialer, &t);
        assert!(secret.verify(Side::Dialer, &t, &mac));
        // Reflected as the other side's MAC: refused.
        assert!(!secret.verify(Side::Acceptor, &t, &mac));
        // Another secret.
        let other = Secret::from_bytes(b"0123456789abcdef0123456789abcdeX");
        assert!(!other.verify(Side::Dialer, &t, &mac));
        // Any field changed.
        let mut changed = t;
        changed.acceptor.nonce[0] ^= 1;
        assert!(!secret.verify(Side::Dialer, &changed, &mac));
        let mut changed = t;
        changed.dialer_incarnation += 1;
        assert!(!secret.verify(Side::Dialer, &changed, &mac));
        let mut changed = t;
        changed.dialer.fingerprint = Fingerprint(2);
        assert!(!secret.verify(Side::Dialer, &changed, &mac));
        // Address bytes moved between fields.
        let shifted = transcript(b"a:1b", b":2");
        assert!(!secret.verify(Side::Dialer, &shifted, &mac));
    }

    #[test]
    fn nonces_differ_by_counter_and_incarnation() {
        let secret = Secret::from_bytes(b"0123456789abcdef0123456789abcdef");
        assert_ne!(secret.nonce(1, 0), secret.nonce(1, 1));
        assert_ne!(secret.nonce(1, 0), secret.nonce(2, 0));
        assert_eq!(secret.nonce(3, 4), secret.nonce(3, 4));
    }

    #[test]
    fn fingerprints_see_order_and_membership() {
        let list = |s: &[&str]| s.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        let ab = fingerprint(2, &list(&["a:1", "b:1"]));
        assert_eq!(ab, fingerprint(2, &list(&["a:1", "b:1"])));
        assert_ne!(ab, fingerprint(2, &list(&["b:1", "a:1"])));
        assert_ne!(ab, fingerprint(2, &list(&["a:1", "b:1", "c:1"])));
        assert_ne!(ab, fingerprint(3, &list(&["a:1", "b:1"])));
        assert_ne!(
            fingerprint(2, &list(&["a:1b", ":1"])),
            fingerprint(2, &list(&["a:1", "b:1"]))
        );
    }

    #[test]
    fn hex_round_trips_and_refuses_anything_else() {
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(hex(&bytes), "0001abff");
        assert_eq!(unhex::<4>(b"0001abff"), Some(bytes));
        assert_eq!(unhex::<4>(b"0001ABFF"), None);
        assert_eq!(unhex::<4>(b"0001abf"), None);
        assert_eq!(unhex::<4>(b"0001abfff0"), None);
        assert_eq!(unhex::<4>(b"0001abfg"), None);
    }
}
