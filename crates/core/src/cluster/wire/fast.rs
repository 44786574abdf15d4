//! The fast path of [`super::parse`]: the `P g` and `P x` lines, most of
//! what a follower reads, split in one pass and checked field by field.
//!
//! It accepts only what the general parser accepts, as the same message
//! (the tests compare the two over many valid and invalid lines); anything
//! else it hands to the general parser, which accepts or refuses it with
//! its reason. So it never refuses a line itself.
//!
//! Every byte a `P g` or `P x` line may hold after its kind is a key byte
//! (0x21 to 0x7e, or 0x80 and up) or a space between two fields: a key and
//! a holder address are keys, a hex number is digits, an owner label and
//! an identity are printable ASCII. So one pass over the line, eight bytes
//! at a time, finds every byte that is not a key byte; each must be a space
//! that ends a field. That pass both splits the line and checks the key's
//! and the address's bytes; what is left to check of each field is its
//! length, and the numbers' and labels' own forms.

use super::hex::parse_hex_in;
use super::{MAX_REMAINING_MS, PeerMsg, WireError};
use crate::access::is_valid_identity;
use crate::engine::token::MAX_TOKEN;
use crate::proto::{Holder, MAX_HOLDER_ADDR, MAX_KEY, is_valid_owner};

/// The most spaces a line the fast path takes has: six fields.
const MAX_SPACES: usize = 5;

/// The line's message if it is a well-formed `P g` or `P x` (without its
/// `\n`, and without the `\r` before it that [`super::parse`] strips);
/// any other line, valid or not, goes to `general`. The message is made
/// where it is returned (an `Option` of it, matched by the caller, was
/// copied whole into the caller's `Result`).
#[inline(always)]
pub(super) fn parse_replication<'a>(
    line: &'a [u8],
    general: fn(&'a [u8]) -> Result<PeerMsg<'a>, WireError>,
) -> Result<PeerMsg<'a>, WireError> {
    let Some((kind, body)) = line.split_first_chunk::<4>() else {
        return general(line);
    };
    let grant = match kind {
        b"P g " => true,
        b"P x " => false,
        _ => return general(line),
    };
    let mut spaces = [0; MAX_SPACES];
    let Some(count) = find_spaces(body, &mut spaces) else {
        return general(line);
    };
    let spaces = spaces.get(..count).unwrap_or_default();
    if grant {
        if let Some(msg) = parse_grant(body, spaces) {
            return Ok(msg);
        }
    } else if let Some(msg) = parse_release(body, spaces) {
        return Ok(msg);
    }
    general(line)
}

/// `<key> <token> <remaining-ms> <addr> <owner> [<identity>]`.
#[inline(always)]
fn parse_grant<'a>(body: &'a [u8], spaces: &[usize]) -> Option<PeerMsg<'a>> {
    // A space's index is below `body.len()`: `+ 1` does not overflow.
    let (a, b, c, addr, owner, identity) = match *spaces {
        [a, b, c, d] => (
            a,
            b,
            c,
            field(body, c + 1, d)?,
            field(body, d + 1, body.len())?,
            None,
        ),
        [a, b, c, d, e] => (
            a,
            b,
            c,
            field(body, c + 1, d)?,
            field(body, d + 1, e)?,
            Some(field(body, e + 1, body.len())?),
        ),
        _ => return None,
    };
    let key = field(body, 0, a)?;
    if key.len() > MAX_KEY {
        return None;
    }
    // An empty number does not parse.
    let token = parse_hex_in(body, a + 1, b).filter(|&t| t <= MAX_TOKEN)?;
    let remaining_ms = parse_hex_in(body, b + 1, c).filter(|&ms| ms <= MAX_REMAINING_MS)?;
    // The address's bytes are key bytes (the pass), and there is one.
    let addr = Some(addr).filter(|&a| a != b"-");
    if addr.is_some_and(|a| a.len() > MAX_HOLDER_ADDR) {
        return None;
    }
    let owner = Some(owner).filter(|&o| o != b"-");
    if owner.is_some_and(|o| !is_valid_owner(o)) {
        return None;
    }
    let identity = identity.filter(|&i| i != b"-");
    if identity.is_some_and(|i| !is_valid_identity(i)) {
        return None;
    }
    Some(PeerMsg::Grant {
        key,
        token,
        remaining_ms,
        holder: Holder {
            addr,
            owner,
            identity,
        },
    })
}

/// `<key> <token>`.
#[inline(always)]
fn parse_release<'a>(body: &'a [u8], spaces: &[usize]) -> Option<PeerMsg<'a>> {
    let [a] = *spaces else {
        return None;
    };
    let key = field(body, 0, a)?;
    if key.len() > MAX_KEY {
        return None;
    }
    let token = parse_hex_in(body, a + 1, body.len()).filter(|&t| t <= MAX_TOKEN)?;
    Some(PeerMsg::Release { key, token })
}

/// `body[start..end]`, if that is a field: not empty.
#[inline(always)]
fn field(body: &[u8], start: usize, end: usize) -> Option<&[u8]> {
    body.get(start..end).filter(|f| !f.is_empty())
}

/// Writes the index of every byte of `body` that is not a key byte into
/// `spaces`, in order, and returns how many there are: `None` if one of
/// them is not a space, or there are more than [`MAX_SPACES`], or `body`
/// is shorter than eight bytes (which no grant or release of a real token
/// is: the general parser takes it). Eight bytes at a time; the last (up
/// to) eight as one word that overlaps bytes already seen, which it skips.
#[inline(always)]
fn find_spaces(body: &[u8], spaces: &mut [usize; MAX_SPACES]) -> Option<usize> {
    let last = body.last_chunk::<8>()?;
    let mut count = 0;
    let mut base = 0;
    let mut rest = body;
    while let Some((word, tail)) = rest.split_first_chunk::<8>() {
        let hits = non_key_bytes(u64::from_le_bytes(*word));
        if hits != 0 {
            count = record(body, hits, base, spaces, count)?;
        }
        base += 8;
        rest = tail;
    }
    if !rest.is_empty() {
        // `8 - rest.len()` bytes (1 to 7) of the last word were seen.
        let seen = 8 - rest.len();
        let hits = non_key_bytes(u64::from_le_bytes(*last)) & (u64::MAX << (8 * seen));
        if hits != 0 {
            count = record(body, hits, body.len() - 8, spaces, count)?;
        }
    }
    Some(count)
}

/// Records the bytes of `hits` (of the word at `base`) in `spaces` after
/// the `count` recorded: the new count, or `None` if one is not a space or
/// there are too many.
#[inline(always)]
fn record(
    body: &[u8],
    mut hits: u64,
    base: usize,
    spaces: &mut [usize; MAX_SPACES],
    mut count: usize,
) -> Option<usize> {
    while hits != 0 {
        let at = base + (hits.trailing_zeros() / 8) as usize;
        if body.get(at) != Some(&b' ') {
            return None;
        }
        *spaces.get_mut(count)? = at;
        count += 1;
        // Clears the lowest hit (`hits` is not 0).
        hits &= hits - 1;
    }
    Some(count)
}

/// The high bit of each byte of `w` (little-endian) that is not a key
/// byte: below 0x21, or 0x7f. Exact for every byte (no carry crosses
/// one): a byte under 0x80 is one iff its successor, taken mod 0x80, is
/// under 0x22.
#[inline(always)]
fn non_key_bytes(w: u64) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // Each byte's low seven bits plus one, mod 0x80: at most 0x80 before
    // the mask, so nothing carries into the next byte.
    let next = ((w & LOW7) + ONES) & LOW7;
    // The high bit set iff `next` >= 0x22 (at most 0x7f + 0x5e: no carry).
    let at_least = next + (0x80 - 0x22) * ONES;
    !(at_least | w) & HIGHS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_is_classed_alone() {
        for b in 0..=255u8 {
            let want = b < 0x21 || b == 0x7f;
            for at in 0..8 {
                for fill in [b'k', 0x20, 0x7f, 0x80, 0xff, 0x00] {
                    let mut bytes = [fill; 8];
                    bytes[at] = b;
                    let hits = non_key_bytes(u64::from_le_bytes(bytes));
                    let fill_hit = fill < 0x21 || fill == 0x7f;
                    for i in 0..8 {
                        let want = if i == at { want } else { fill_hit };
                        assert_eq!(
                            hits >> (8 * i + 7) & 1 == 1,
                            want,
                            "{b:#x} at {at} in {fill:#x}"
                        );
                    }
                    assert_eq!(hits & !0x8080_8080_8080_8080, 0);
                }
            }
        }
    }

    #[test]
    fn spaces_are_found_at_every_place() {
        for len in 0..40 {
            let mut spaces = [0; MAX_SPACES];
            let clean = vec![b'k'; len];
            let found = find_spaces(&clean, &mut spaces);
            assert_eq!(found, (len >= 8).then_some(0));
            for a in 0..len {
                for b in a + 1..len {
                    let mut s = clean.clone();
                    s[a] = b' ';
                    s[b] = b' ';
                    let found = find_spaces(&s, &mut spaces);
                    if len < 8 {
                        assert_eq!(found, None);
                        continue;
                    }
                    assert_eq!(found, Some(2), "{a} {b} of {len}");
                    assert_eq!(spaces[..2], [a, b]);
                    // Any other byte no key may hold is refused.
                    for bad in [0u8, b'\t', b'\r', b'\n', 0x7f] {
                        s[b] = bad;
                        assert_eq!(find_spaces(&s, &mut spaces), None);
                    }
                }
            }
            if len >= 8 {
                let six = vec![b' '; len];
                assert_eq!(find_spaces(&six, &mut spaces), None, "too many");
                let mut five = clean.clone();
                for i in 0..MAX_SPACES {
                    five[i * len / MAX_SPACES] = b' ';
                }
                assert_eq!(find_spaces(&five, &mut spaces), Some(MAX_SPACES));
            }
        }
    }
}
