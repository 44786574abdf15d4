"""What the two Python adapters share: the ADAPTER.md lines, the mapping of
options and errors. The package is imported from this checkout
(clients/python/src, or RINGLOCK_PYTHON_SRC), not from an installed copy."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, Dict, Optional

# RINGLOCK_PYTHON_SRC: another copy of the package's source to check (a
# modified one, to see which scenarios catch a change).
sys.path.insert(0, os.environ.get("RINGLOCK_PYTHON_SRC") or str(Path(__file__).resolve().parents[2] / "python" / "src"))

import ringlock  # noqa: E402

_out = threading.Lock()

# ADAPTER.md's option names -> the client's keyword arguments (seconds).
OPTIONS = {
    "connect_timeout_ms": "connect_timeout",
    "probe_interval_ms": "probe_interval",
    "probe_timeout_ms": "probe_timeout",
    "acquire_grace_ms": "acquire_grace",
    "request_timeout_ms": "request_timeout",
    "retry_every_ms": "retry_every",
    "retry_for_ms": "retry_for",
    "redial_interval_ms": "redial_interval",
    "no_active_timeout_ms": "no_active_timeout",
}


def write(msg: Dict[str, Any]) -> None:
    line = json.dumps(msg) + "\n"
    with _out:
        sys.stdout.write(line)
        sys.stdout.flush()


def settings(cmd: Dict[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for name, value in (cmd.get("options") or {}).items():
        if name not in OPTIONS:
            raise Unsupported(f"option {name}")
        out[OPTIONS[name]] = value / 1000
    tls = cmd.get("tls")
    if tls:
        out["tls"] = ringlock.TlsConfig(tls["ca_file"], cert=tls.get("cert_file"), key=tls.get("key_file"), server_name=tls.get("server_name"))
    return out


def wait_s(cmd: Dict[str, Any]) -> Optional[float]:
    w = cmd.get("wait_ms")
    return None if not w else w / 1000


class Unsupported(Exception):
    pass


def error(cid: int, e: BaseException) -> Dict[str, Any]:
    if isinstance(e, Unsupported):
        kind = "unsupported"
    elif isinstance(e, ringlock.ConnectionFailed):
        kind = "connection"
    elif isinstance(e, ringlock.NoActiveNode):
        kind = "no_active"
    elif isinstance(e, ringlock.NotAllowed):
        kind = "not_allowed"
    elif isinstance(e, ringlock.ProtocolError):
        kind = "protocol"
    elif isinstance(e, ringlock.InvalidArgument):
        kind = "invalid_argument"
    elif isinstance(e, ringlock.LockTimeout):
        kind = "timeout"
    elif isinstance(e, ringlock.RinglockError) and "closed" in str(e):
        kind = "closed"
    else:
        kind = "other"
    return {"id": cid, "ok": False, "error": kind, "message": f"{type(e).__name__}: {e}"}


def granted(cid: int, grant: Any, **more: Any) -> Dict[str, Any]:
    if grant is None:
        return {"id": cid, "ok": True, "granted": False}
    return {"id": cid, "ok": True, "granted": True, "token": str(grant.token), **more}


def lost_event(lock_id: int, lost: Any) -> Dict[str, Any]:
    reason = "refused" if lost.refused else "expired"
    return {"event": "lost", "lock": lock_id, "reason": reason, "message": str(lost)}


def status_reply(cid: int, statuses: Any) -> Dict[str, Any]:
    nodes = []
    for s in statuses:
        if s.status is not None:
            nodes.append({"addr": s.addr, "ok": True, "role": s.status.role, "active": s.status.active or "-", "token": str(s.status.token)})
        else:
            e = error(0, s.error)
            nodes.append({"addr": s.addr, "ok": False, "error": e["error"], "message": e["message"]})
    return {"id": cid, "ok": True, "nodes": nodes}


def parse(line: str) -> Dict[str, Any]:
    try:
        cmd = json.loads(line)
    except ValueError:
        return {"id": 0, "cmd": "unparsable"}
    if not isinstance(cmd, dict):
        return {"id": 0, "cmd": "unparsable"}
    return cmd
