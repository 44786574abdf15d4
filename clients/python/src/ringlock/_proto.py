"""The wire format of docs/protocol.md: request lines, answer parsing,
argument checks. Pure functions, no I/O."""

from __future__ import annotations

import datetime
import math
from typing import Callable, NamedTuple, Optional, Union

from .errors import InvalidArgument

MAX_KEY = 250
#: Longest owner label (``O <owner>``).
MAX_OWNER = 128
#: Longest holder address in ``W`` and ``Q`` answers.
MAX_HOLDER_ADDR = 64
#: Longest line of a listing answer (``K`` lines with a holder are at most
#: about 500 bytes).
MAX_LIST_LINE = 4096
MAX_SECONDS_MS = 86_400_000
MAX_TOKEN = (1 << 64) - 1
#: Longest answer line read on a pooled connection, ``\n`` included. The
#: server's answers to the requests this client pools (A, R, N, S) are at
#: most 504 bytes (an ``M`` with a 250-byte key and address); ``E`` lines a
#: few hundred.
MAX_ANSWER_LINE = 4096
#: Longest ``H`` answer read (problems quote whole ``--peers`` lists).
MAX_HEALTH_LINE = 64 * 1024
#: The shortest wait the protocol allows (a wait of 0 means no limit).
TRY_WAIT_MS = 1

Key = Union[str, bytes, bytearray, memoryview]
Seconds = Union[int, float, datetime.timedelta]

_DIGITS = frozenset(b"0123456789")


def is_key_byte(b: int) -> bool:
    return 0x21 <= b <= 0x7E or b >= 0x80


def check_key(key: Key) -> bytes:
    """The key as bytes (a str is UTF-8 encoded), or InvalidArgument."""
    if isinstance(key, str):
        raw = key.encode("utf-8")
    elif isinstance(key, (bytes, bytearray, memoryview)):
        raw = bytes(key)
    else:
        raise InvalidArgument(f"a key is str or bytes, not {type(key).__name__}")
    if not raw:
        raise InvalidArgument("empty key")
    if len(raw) > MAX_KEY:
        raise InvalidArgument(f"key too long ({len(raw)} bytes, at most {MAX_KEY})")
    for b in raw:
        if not is_key_byte(b):
            raise InvalidArgument(f"forbidden byte 0x{b:02x} in key (spaces, control bytes and 0x7f are not allowed)")
    return raw


def check_owner(owner: str) -> bytes:
    """An owner label as bytes: 1 to 128 bytes of printable ASCII without
    spaces, not ``-``; else InvalidArgument."""
    if not isinstance(owner, str):
        raise InvalidArgument(f"an owner label is a str, not {type(owner).__name__}")
    raw = owner.encode("utf-8")
    if not raw or len(raw) > MAX_OWNER or raw == b"-" or not all(0x21 <= b <= 0x7E for b in raw):
        raise InvalidArgument(f"bad owner label {owner!r}: 1 to {MAX_OWNER} bytes of printable ASCII without spaces, not '-'")
    return raw


def _seconds(value: Seconds, what: str) -> float:
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{what} is a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise InvalidArgument(f"{what} must be a finite number of seconds >= 0, not {value!r}")
    return float(value)


def lease_ms(lease: Seconds) -> int:
    """A lease in whole milliseconds, rounded down: 1 ms to 86400 s."""
    seconds = _seconds(lease, "lease")
    ms = int(math.floor(seconds * 1000 + 1e-6))
    if ms < 1 or ms > MAX_SECONDS_MS:
        raise InvalidArgument(f"lease must be from 0.001 to 86400 seconds, not {lease!r}")
    return ms


def wait_ms(wait: Optional[Seconds]) -> int:
    """A wait in whole milliseconds, rounded up; 0 for None (no limit).

    A wait of zero is refused: on the wire it would mean "no limit", which is
    not what ``wait=0`` says in Python. Use ``None`` for no limit, or
    ``try_acquire``/``try_lock`` for a single attempt.
    """
    if wait is None:
        return 0
    seconds = _seconds(wait, "wait")
    if seconds == 0:
        raise InvalidArgument("wait=0: use wait=None to wait without limit, or try_lock()/try_acquire() for one attempt")
    ms = int(math.ceil(seconds * 1000 - 1e-6))
    ms = max(ms, 1)
    if ms > MAX_SECONDS_MS:
        raise InvalidArgument(f"wait must be at most 86400 seconds, not {wait!r}")
    return ms


def check_token(token: int) -> int:
    if isinstance(token, bool) or not isinstance(token, int):
        raise InvalidArgument(f"a token is an int, not {type(token).__name__}")
    if token < 1 or token > MAX_TOKEN:
        raise InvalidArgument(f"token must be from 1 to {MAX_TOKEN}, not {token}")
    return token


def fmt_ms(ms: int) -> bytes:
    """Milliseconds in the protocol's seconds form (``30``, ``1.5``, ``0.001``)."""
    whole, frac = divmod(ms, 1000)
    if frac == 0:
        return str(whole).encode()
    return f"{whole}.{frac:03d}".rstrip("0").encode()


def acquire_line(key: bytes, lease: int, wait: int) -> bytes:
    return b"A " + key + b" " + fmt_ms(lease) + b" " + fmt_ms(wait) + b"\n"


#: The most permits a semaphore key may have (``C``'s limit).
MAX_PERMITS = 65536


def check_kind(shared: bool, permits: Optional[int]) -> "tuple[str, int]":
    """The op (``A``, ``G`` or ``C``) and limit (0 unless ``C``) of an
    acquire, or InvalidArgument."""
    if not isinstance(shared, bool):
        raise InvalidArgument(f"shared is a bool, not {type(shared).__name__}")
    if permits is None:
        return ("G" if shared else "A"), 0
    if shared:
        raise InvalidArgument("shared=True and permits=N ask for two kinds: a key is a read/write lock or a semaphore")
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise InvalidArgument(f"permits is an int, not {type(permits).__name__}")
    if not 1 <= permits <= MAX_PERMITS:
        raise InvalidArgument(f"permits must be from 1 to {MAX_PERMITS}, not {permits}")
    return "C", permits


def acquire_kind_line(op: str, key: bytes, limit: int, lease: int, wait: int) -> bytes:
    """An ``A``, ``G`` or ``C`` line (see check_kind)."""
    if op == "A":
        return acquire_line(key, lease, wait)
    head = b"G " + key if op == "G" else b"C " + key + b" " + str(limit).encode()
    return head + b" " + fmt_ms(lease) + b" " + fmt_ms(wait) + b"\n"


def release_line(key: bytes, token: int) -> bytes:
    return b"R " + key + b" " + str(token).encode() + b"\n"


def renew_line(key: bytes, token: int, lease: int) -> bytes:
    return b"N " + key + b" " + str(token).encode() + b" " + fmt_ms(lease) + b"\n"


class Answer(NamedTuple):
    """One parsed answer line.

    ``op`` is one of ``A T M R N S E H G C``. ``key`` is the echoed key
    (``S``: the role; ``E``/``H``: the text). ``value``: the token for
    ``A`` and ``S``; the flag for ``R`` and ``N``; the address (or None for
    ``-``) for ``M``; for ``G`` and ``C`` the token, 0 when the wait ran
    out, or a refusal: ``("semaphore", limit)`` or ``("lock", 0)``; None
    otherwise. ``addr``: the active node named by ``S``.
    """

    op: str
    key: bytes
    value: object = None
    addr: Optional[str] = None


class MalformedAnswer(Exception):
    """An answer line that breaks the protocol (internal; surfaced as
    ProtocolError)."""


def parse_u64(field: bytes) -> Optional[int]:
    if not field or len(field) > 20 or not all(b in _DIGITS for b in field):
        # (leading zeros are allowed: 20 digits is only a bound on garbage,
        # a longer run of zeros is refused too)
        return None
    n = int(field)
    return n if n <= MAX_TOKEN else None


def _addr(field: bytes) -> Optional[str]:
    if field == b"-":
        return None
    # Addresses are dialled as host:port; keep them printable.
    if not all(0x21 <= b <= 0x7E for b in field):
        raise MalformedAnswer(f"address with unprintable bytes: {field!r}")
    return field.decode("ascii")


def parse_answer(line: bytes) -> Answer:
    """Parses one answer line without its ``\\n``. Raises MalformedAnswer."""
    if line.endswith(b"\r"):
        line = line[:-1]
    if line.startswith(b"E "):
        return Answer("E", line[2:])
    if line.startswith(b"H "):
        return Answer("H", line[2:])
    fields = line.split(b" ")
    bad = MalformedAnswer(f"malformed answer {line[:200]!r}")
    if len(fields) < 2 or len(fields) > 4:
        raise bad
    op, first = fields[0], fields[1]
    rest = fields[2:]

    def key() -> bytes:
        if not first or len(first) > MAX_KEY or not all(is_key_byte(b) for b in first):
            raise bad
        return first

    if op == b"A" and len(rest) == 1:
        token = parse_u64(rest[0])
        if not token:
            raise bad
        return Answer("A", key(), token)
    if op == b"T" and not rest:
        return Answer("T", key())
    if op == b"M" and len(rest) == 1 and rest[0]:
        return Answer("M", key(), _addr(rest[0]))
    if op in (b"R", b"N") and len(rest) == 1 and rest[0] in (b"0", b"1"):
        return Answer(op.decode(), key(), rest[0] == b"1")
    if op in (b"G", b"C") and len(rest) == 1:
        if rest[0] == b"lock" and op == b"C":
            return Answer("C", key(), ("lock", 0))
        token = parse_u64(rest[0])
        if token is None:
            raise bad
        return Answer(op.decode(), key(), token)
    if op in (b"G", b"C") and len(rest) == 2 and rest[0] == b"semaphore":
        limit = parse_u64(rest[1])
        if limit is None or not 1 <= limit <= MAX_PERMITS:
            raise bad
        return Answer(op.decode(), key(), ("semaphore", limit))
    if op == b"S" and len(rest) == 2 and rest[0] and first in (b"active", b"standby"):
        token = parse_u64(rest[1])
        if token is None:
            raise bad
        return Answer("S", first, token, _addr(rest[0]))
    raise bad


def _dash(field: bytes, valid: "Callable[[bytes], bool]") -> Optional[str]:
    if field == b"-":
        return None
    if not valid(field):
        raise MalformedAnswer(f"bad field {field[:100]!r}")
    return field.decode("utf-8", "backslashreplace")


def _is_addr(field: bytes) -> bool:
    return 0 < len(field) <= MAX_KEY and all(is_key_byte(b) for b in field)


def _is_holder_addr(field: bytes) -> bool:
    return len(field) <= MAX_HOLDER_ADDR and _is_addr(field)


def _is_owner(field: bytes) -> bool:
    return 0 < len(field) <= MAX_OWNER and all(0x21 <= b <= 0x7E for b in field)


class ListLine(NamedTuple):
    """One line of a ``W``/``L``/``Q`` answer. ``kind``: ``K`` (a lock:
    key, token, lease_ms, waiters, and with a holder held_ms, addr, owner),
    ``J`` (a waiter: ms waited, addr, owner), ``W``/``L`` (the end: the
    cursor in ``numbers``), ``Q`` (the end: key, waiters), ``E`` (key: the
    reason)."""

    kind: str
    key: bytes = b""
    numbers: "tuple[int, ...]" = ()
    addr: Optional[str] = None
    owner: Optional[str] = None
    with_holder: bool = False


def parse_list_line(line: bytes) -> ListLine:
    """Parses one line of a listing answer. Raises MalformedAnswer."""
    if line.endswith(b"\r"):
        line = line[:-1]
    if line.startswith(b"E "):
        return ListLine("E", line[2:])
    f = line.split(b" ")
    bad = MalformedAnswer(f"malformed answer {line[:200]!r}")

    def nums(fields: "list[bytes]") -> "tuple[int, ...]":
        out = tuple(parse_u64(x) for x in fields)
        if any(n is None for n in out):
            raise bad
        return out  # type: ignore[return-value]

    def key(field: bytes) -> bytes:
        if not _is_addr(field):
            raise bad
        return field

    try:
        if f[0] == b"K" and len(f) == 5:
            return ListLine("K", key(f[1]), nums(f[2:5]))
        if f[0] == b"K" and len(f) == 8:
            return ListLine("K", key(f[1]), nums(f[2:6]), _dash(f[6], _is_holder_addr), _dash(f[7], _is_owner), True)
        if f[0] == b"J" and len(f) == 4:
            return ListLine("J", b"", nums(f[1:2]), _dash(f[2], _is_holder_addr), _dash(f[3], _is_owner), True)
        if f[0] in (b"W", b"L") and len(f) == 2:
            return ListLine(f[0].decode(), b"", nums(f[1:2]))
        if f[0] == b"Q" and len(f) == 3:
            return ListLine("Q", key(f[1]), nums(f[2:3]))
    except MalformedAnswer:
        raise bad from None
    raise bad


def split_addr(addr: str) -> "tuple[str, int]":
    """``host:port`` (``[v6]:port`` too) into host and port."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"bad address {addr!r}: expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)
