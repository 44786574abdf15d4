"""The official Python client of ringlock, a distributed lock server.

Blocking::

    from ringlock import Client
    with Client(["db1:7171", "db2:7171"]) as client:
        with client.lock("nightly-report", lease=30, wait=10) as lock:
            write_report(fence=lock.token)

asyncio::

    from ringlock import AsyncClient
    async with AsyncClient(["db1:7171", "db2:7171"]) as client:
        async with client.lock("nightly-report", lease=30, wait=10) as lock:
            await write_report(fence=lock.token)

TLS: ``Client(addrs, tls=TlsConfig(ca="node-ca.pem"))`` (or
``tls=TlsConfig.from_env()``).

See docs/python.md in the ringlock repository.
"""

from ._aio import AddrStatus, AsyncClient, AsyncLock, Grant, HolderInfo, LockInfo, NodeStatus, QueueInfo, Timeouts
from ._aio import list_locks as async_list_locks
from ._aio import lock_queue as async_lock_queue
from ._aio import locks as async_locks
from ._aio import node_problem as async_node_problem
from ._aio import node_status as async_node_status
from ._sync import Client, Lock, list_locks, lock_queue, locks, node_problem, node_status
from ._tls import TlsConfig
from .errors import (
    ConnectionFailed,
    InvalidArgument,
    LockLost,
    LockTimeout,
    NoActiveNode,
    NotAllowed,
    ProtocolError,
    RinglockError,
    WrongKind,
)

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Lock",
    "AsyncClient",
    "AsyncLock",
    "Grant",
    "NodeStatus",
    "AddrStatus",
    "Timeouts",
    "TlsConfig",
    "node_status",
    "node_problem",
    "async_node_status",
    "async_node_problem",
    "HolderInfo",
    "LockInfo",
    "QueueInfo",
    "list_locks",
    "locks",
    "lock_queue",
    "async_list_locks",
    "async_locks",
    "async_lock_queue",
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
