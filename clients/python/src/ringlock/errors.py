"""The exceptions the client raises. Every one derives from RinglockError."""

from __future__ import annotations

from typing import Optional

__all__ = [
    "RinglockError",
    "LockTimeout",
    "LockLost",
    "ConnectionFailed",
    "NoActiveNode",
    "ProtocolError",
    "NotAllowed",
    "WrongKind",
    "InvalidArgument",
]


class RinglockError(Exception):
    """Base class of every error this package raises."""


class LockTimeout(RinglockError, TimeoutError):
    """The wait ran out and nothing was granted (nothing is held)."""

    def __init__(self, key: bytes, wait: Optional[float] = None) -> None:
        self.key = key
        self.wait = wait
        what = key.decode("utf-8", "backslashreplace")
        if wait is None:
            super().__init__(f"the lock on {what} is held by someone else")
        else:
            super().__init__(f"timed out after {wait:g} s waiting for the lock on {what}")


class LockLost(RinglockError):
    """A lock that was being renewed is no longer held.

    ``refused`` is True when a node answered that no grant of the key carries
    the token (the lease ran out, the token was used to release it, or the
    grant did not survive a failover); False when no renewal could be
    confirmed before the lease could have run out (``last_error`` says why).
    """

    def __init__(self, key: bytes, token: int, refused: bool, last_error: Optional[str] = None) -> None:
        self.key = key
        self.token = token
        self.refused = refused
        self.last_error = last_error
        what = key.decode("utf-8", "backslashreplace")
        if refused:
            why = "the server no longer has the grant (lease ran out, released, or lost in a failover)"
        else:
            why = "no renewal was confirmed before the lease could have run out"
            if last_error:
                why += f" (last error: {last_error})"
        super().__init__(f"lock on {what} (token {token}) lost: {why}")


class ConnectionFailed(RinglockError, ConnectionError):
    """No connection could carry the request, or a node did not answer in time.

    The message names the node and says what happened (refused, closed,
    stopped answering probes, did not answer within a deadline).
    """


class NoActiveNode(RinglockError):
    """The nodes kept answering that no node is active (``M key -``), or kept
    redirecting, for longer than the no-active timeout (10 s by default); or
    an acquire's wait ran out while it was being redirected (``M``) and no
    node had said the wait ran out."""

    def __init__(self, why: str = "no active node in the cluster") -> None:
        super().__init__(why)


class ProtocolError(RinglockError):
    """A server sent ``E <reason>``, a malformed line, an over-long line or an
    answer that matches no request. The connection is dropped."""


class NotAllowed(RinglockError, PermissionError):
    """A node refused the request for this client's identity: an acquire of a
    key outside the rules of its certificate's identity (the node's ``E``
    reason says "not allowed"; the message holds it). The connection is
    closed by the node; the request is not retried, it would be refused
    again."""


class WrongKind(RinglockError):
    """The key is held or waited for as another kind: a semaphore (of
    another limit) for a shared acquire or a permit, a lock for a permit, a
    semaphore for an exclusive acquire. Nothing changed; the message says
    what the key is (``limit``: the live semaphore's, 0 for a lock). Not
    retried: it would be refused again while the key is that kind."""

    def __init__(self, why: str, limit: int = 0) -> None:
        self.limit = limit
        super().__init__(why)


def broken_error(why: str) -> RinglockError:
    """The error for an ``E`` line or a broken answer: NotAllowed if the
    reason says "not allowed", WrongKind for an exclusive acquire of a
    semaphore key, else ProtocolError."""
    if "not allowed" in why.lower():
        return NotAllowed(why)
    if "is a semaphore of" in why and "acquire it with C" in why:
        return WrongKind(why)
    return ProtocolError(why)


class InvalidArgument(RinglockError, ValueError):
    """Refused before anything was sent: a bad key, lease, wait or token."""
