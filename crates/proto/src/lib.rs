//! The wire format of protocol version 1, and nothing else.
//!
//! Requests are parsed in place: [`parse_request`] finds the end of the first
//! line with memchr and returns a [`Request`] that borrows its key from the
//! caller's buffer. A buffer that does not yet hold a whole line is "need more
//! bytes" (`Ok(None)`), never an error, unless it already holds
//! [`MAX_LINE`] bytes without a `\n`: the protocol says that is enough to
//! break the connection.
//!
//! Answers are written by [`Answer::encode`] into a caller's `Vec<u8>`; the
//! client side reads them back with [`parse_answer`].

#![deny(unsafe_code)]

mod answer;
mod request;

pub use answer::Holder;
pub use answer::{Answer, AnswerError, Held, Kind, Role, parse_answer};
pub use request::{ParseError, Quoted, Request, SplitSpaces, parse_request, quoted, split_spaces};

/// Longest request line, counting its `\n` and any `\r`.
pub const MAX_LINE: usize = 512;
/// Longest key, in bytes.
pub const MAX_KEY: usize = 250;
/// Longest lease or wait: 86400 seconds, in milliseconds.
pub const MAX_DURATION_MS: u64 = 86_400_000;
/// The most locks one `L` answer lists.
pub const MAX_LIST: u32 = 1000;
/// Longest owner label (`O <owner>`), in bytes.
pub const MAX_OWNER: usize = 128;
/// Longest holder address in `W` and `Q` answers and on the peer link:
/// a socket address as text is at most 58 bytes (`[v6%scope]:port`).
pub const MAX_HOLDER_ADDR: usize = 64;
/// The most waiters one `Q` answer lists (`J` lines); it counts them all.
pub const MAX_QUEUE_LISTED: usize = 100;
/// The highest limit of a semaphore (`C <key> <limit> ...`).
pub const MAX_PERMITS: u32 = 65_536;

/// True for a byte the protocol allows in a key: 0x21..=0x7E or >= 0x80.
#[inline]
pub fn is_key_byte(b: u8) -> bool {
    (0x21..=0x7e).contains(&b) || b >= 0x80
}

/// True if `key` is a valid key: 1 to [`MAX_KEY`] allowed bytes.
pub fn is_valid_key(key: &[u8]) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY && !request::has_non_key_byte(key)
}

/// True if `owner` is a valid owner label: 1 to [`MAX_OWNER`] bytes of
/// printable ASCII without the space (0x21..=0x7E), and not `-` (which
/// stands for "no label" in answers).
pub fn is_valid_owner(owner: &[u8]) -> bool {
    !owner.is_empty()
        && owner.len() <= MAX_OWNER
        && owner != b"-"
        && owner.iter().all(|&b| (0x21..=0x7e).contains(&b))
}

/// "00" to "99": two digits per division when writing numbers.
const DIGIT_PAIRS: &[u8; 200] = b"\
    0001020304050607080910111213141516171819\
    2021222324252627282930313233343536373839\
    4041424344454647484950515253545556575859\
    6061626364656667686970717273747576777879\
    8081828384858687888990919293949596979899";

/// Appends the decimal form of `n` (no leading zeros) to `out`, in one
/// copy from a stack buffer. A 19-digit token is cut into blocks of eight
/// digits (two 64-bit divisions); each block is written as four digit pairs
/// with 32-bit arithmetic, which needs no loop and no data-dependent branch.
#[inline]
pub fn write_u64(out: &mut Vec<u8>, n: u64) {
    const E8: u64 = 100_000_000;
    let mut buf = [0u8; 24];
    let start = if n < E8 {
        write_head(&mut buf, 24, n as u32)
    } else if n < E8 * E8 {
        write_block(&mut buf, 16, (n % E8) as u32);
        write_head(&mut buf, 16, (n / E8) as u32)
    } else {
        let high = n / E8;
        write_block(&mut buf, 16, (n % E8) as u32);
        write_block(&mut buf, 8, (high % E8) as u32);
        // u64::MAX / 10^16 < 10^4: at most four digits are left.
        write_head(&mut buf, 8, (high / E8) as u32)
    };
    out.extend_from_slice(&buf[start..]);
}

/// Writes the eight digits of `x` (< 10^8, with leading zeros) into
/// `buf[at..at + 8]`.
#[inline(always)]
fn write_block(buf: &mut [u8; 24], at: usize, x: u32) {
    debug_assert!(x < 100_000_000);
    let (high, low) = (x / 10_000, x % 10_000);
    for (i, pair) in [high / 100, high % 100, low / 100, low % 100]
        .into_iter()
        .enumerate()
    {
        let p = pair as usize * 2;
        buf[at + 2 * i..at + 2 * i + 2].copy_from_slice(&DIGIT_PAIRS[p..p + 2]);
    }
}

/// Writes `x` (< 10^8) without leading zeros so that it ends at `buf[end]`;
/// returns where it starts.
#[inline(always)]
fn write_head(buf: &mut [u8; 24], end: usize, mut x: u32) -> usize {
    debug_assert!(x < 100_000_000 && end >= 8);
    let mut i = end;
    while x >= 100 {
        let p = (x % 100) as usize * 2;
        x /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&DIGIT_PAIRS[p..p + 2]);
    }
    if x >= 10 {
        let p = x as usize * 2;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&DIGIT_PAIRS[p..p + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + x as u8;
    }
    i
}

/// Appends a duration in milliseconds as protocol seconds (`30`, `1.5`,
/// `0.001`), the shortest exact form.
pub fn write_seconds(out: &mut Vec<u8>, ms: u64) {
    write_u64(out, ms / 1000);
    let frac = ms % 1000;
    if frac != 0 {
        out.push(b'.');
        let digits = [
            b'0' + (frac / 100) as u8,
            b'0' + (frac / 10 % 10) as u8,
            b'0' + (frac % 10) as u8,
        ];
        let len = if frac.is_multiple_of(100) {
            1
        } else if frac.is_multiple_of(10) {
            2
        } else {
            3
        };
        out.extend_from_slice(&digits[..len]);
    }
}

/// Parses a protocol duration: `DIGITS` or `DIGITS.D`, `.DD`, `.DDD` seconds,
/// leading zeros allowed, into milliseconds. `None` if the form is wrong; the
/// range is the caller's to check (the result saturates at `u64::MAX`).
pub fn parse_seconds(field: &[u8]) -> Option<u64> {
    // One pass: the whole seconds up to a '.', then at most three decimals.
    let mut ms: u64 = 0;
    let mut i = 0;
    while let Some(&b) = field.get(i) {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            break;
        }
        ms = ms.saturating_mul(10).saturating_add(u64::from(digit));
        i += 1;
    }
    if i == 0 {
        return None;
    }
    ms = ms.saturating_mul(1000);
    if i == field.len() {
        return Some(ms);
    }
    if field[i] != b'.' {
        return None;
    }
    let frac = &field[i + 1..];
    if frac.is_empty() || frac.len() > 3 {
        return None;
    }
    let mut scale = 100;
    for &b in frac {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        ms = ms.saturating_add(u64::from(digit) * scale);
        scale /= 10;
    }
    Some(ms)
}

/// The value of eight ASCII digits, or `None` if any byte is not one
/// (the SWAR method: validate all eight, then combine pairs, quads, halves).
#[inline(always)]
fn eight_digits(chunk: &[u8]) -> Option<u64> {
    const ZEROS: u64 = 0x3030_3030_3030_3030;
    const HIGH_NIBBLES: u64 = 0xf0f0_f0f0_f0f0_f0f0;
    let w = u64::from_le_bytes(chunk.try_into().ok()?);
    // Each byte 0x30..=0x39: high nibble 3, and adding 6 keeps it 3.
    if w & HIGH_NIBBLES != ZEROS || w.wrapping_add(0x0606_0606_0606_0606) & HIGH_NIBBLES != ZEROS {
        return None;
    }
    // Little-endian: the first digit is the lowest byte.
    let w = w - ZEROS;
    let w = (w * 10 + (w >> 8)) & 0x00ff_00ff_00ff_00ff;
    let w = (w * 100 + (w >> 16)) & 0x0000_ffff_0000_ffff;
    Some((w * 10_000 + (w >> 32)) & 0xffff_ffff)
}

/// Parses a decimal u64 exactly (leading zeros allowed); `None` on a wrong
/// form or overflow.
pub fn parse_u64(field: &[u8]) -> Option<u64> {
    if field.is_empty() {
        return None;
    }
    // Up to 19 digits cannot overflow (10^19 - 1 < 2^64): no checks on the
    // way. Tokens are 19 digits in this century: two steps of eight digits
    // at once, then one at a time.
    if field.len() <= 19 {
        let mut n: u64 = 0;
        let mut chunks = field.chunks_exact(8);
        for chunk in &mut chunks {
            n = n * 100_000_000 + eight_digits(chunk)?;
        }
        for &b in chunks.remainder() {
            let digit = b.wrapping_sub(b'0');
            if digit > 9 {
                return None;
            }
            n = n * 10 + u64::from(digit);
        }
        return Some(n);
    }
    let mut n: u64 = 0;
    for &b in field {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u64_round_trip() {
        // Every length, and each side of every block boundary.
        let mut cases = vec![0, 1, 9, 10, 99, 100, 12345, u64::MAX, u64::MAX - 1];
        let mut p = 1u64;
        while let Some(next) = p.checked_mul(10) {
            cases.extend([p - 1, p, p + 1, next - 1, p * 7 + 3]);
            p = next;
        }
        // A sweep of pseudo-random values of every magnitude.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            cases.push(x >> (x % 64));
        }
        for n in cases {
            let mut out = Vec::new();
            write_u64(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
            assert_eq!(parse_u64(&out), Some(n));
        }
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b"0007"), Some(7));
    }

    /// The word-at-a-time check agrees with the byte rule for every byte at
    /// every position of keys of every length up to 2 words and a bit.
    #[test]
    fn key_validation_matches_the_byte_rule() {
        for len in 1..=19 {
            for at in 0..len {
                for b in 0..=255u8 {
                    let mut key = vec![b'k'; len];
                    key[at] = b;
                    assert_eq!(
                        is_valid_key(&key),
                        is_key_byte(b),
                        "byte {b:#x} at {at} of {len}"
                    );
                }
            }
        }
        assert!(!is_valid_key(b""));
        assert!(is_valid_key(&[0x80; MAX_KEY]));
        assert!(!is_valid_key(&[b'k'; MAX_KEY + 1]));
    }

    /// `split_spaces` gives what `split(' ')` gives, empty fields included,
    /// at every length and position a space may fall.
    #[test]
    fn split_spaces_matches_split() {
        let bytes = b"P G k 1 2  x\r yy";
        for a in 0..=bytes.len() {
            for b in a..=bytes.len() {
                let line = &bytes[a..b];
                let want: Vec<&[u8]> = line.split(|&c| c == b' ').collect();
                assert_eq!(split_spaces(line).collect::<Vec<_>>(), want, "{line:?}");
            }
        }
        let long = [b"a".repeat(17), b"b".repeat(8), Vec::new(), b"c".repeat(9)].join(&b' ');
        let want: Vec<&[u8]> = long.split(|&c| c == b' ').collect();
        assert_eq!(split_spaces(&long).collect::<Vec<_>>(), want);
    }

    #[test]
    fn seconds_forms() {
        assert_eq!(parse_seconds(b"30"), Some(30_000));
        assert_eq!(parse_seconds(b"030"), Some(30_000));
        assert_eq!(parse_seconds(b"1.5"), Some(1_500));
        assert_eq!(parse_seconds(b"1.05"), Some(1_050));
        assert_eq!(parse_seconds(b"0.001"), Some(1));
        assert_eq!(parse_seconds(b"1.0001"), None);
        assert_eq!(parse_seconds(b"1."), None);
        assert_eq!(parse_seconds(b".5"), None);
        assert_eq!(parse_seconds(b"1e3"), None);
        assert_eq!(parse_seconds(b"-1"), None);
        assert_eq!(parse_seconds(b"99999999999999999999999"), Some(u64::MAX));
        for ms in [1, 10, 100, 1_000, 1_500, 1_050, 1_005, 86_400_000] {
            let mut out = Vec::new();
            write_seconds(&mut out, ms);
            assert_eq!(
                parse_seconds(&out),
                Some(ms),
                "{}",
                String::from_utf8_lossy(&out)
            );
        }
    }
}

#[cfg(test)]
mod parser_tests;
#[cfg(test)]
mod reference;
