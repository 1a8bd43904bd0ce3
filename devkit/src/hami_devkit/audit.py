"""kube-apiserver's audit log, to say which client sent which request (for benches).

``apiserver_request_total`` counts requests per verb and resource but not per client; the audit
log names the user and the user agent of each one (and, for writes of a pod's status, the body). :class:`KubeCluster` with ``audit=True``
passes :func:`apiserver_flags` to kube-apiserver: one JSON line per request at the ``Metadata``
level (no bodies), written in batches so that the requests do not wait on the file.
:func:`read_events` reads the lines written after a byte offset (note the log's size before a
measured window), :func:`tally` groups them by client, verb and resource.

Not for correctness tests: the batch writer flushes about once a second, so read after the
window has been quiet that long. What this module does not do: rotate or trim the log.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

# Every request without its body; a request is counted at its ResponseComplete (or Panic) stage,
# so a watch counts when it ends, not when it starts (ResponseStarted).
POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Request  # what each client changes in a pod's status (small bodies): see samples()
    verbs: ["patch", "update"]
    resources: [{group: "", resources: ["pods/status"]}]
  - level: Metadata
"""

COUNTED_STAGES = frozenset({"ResponseComplete", "Panic"})


def apiserver_flags(policy_file: Path, log_file: Path) -> list[str]:
    """Write the policy to ``policy_file``; the kube-apiserver flags that log to ``log_file``."""
    policy_file.write_text(POLICY)
    return [
        f"--audit-policy-file={policy_file}",
        f"--audit-log-path={log_file}",
        "--audit-log-format=json",
        "--audit-log-mode=batch",
        "--audit-log-maxsize=0",  # no rotation: offsets into the file stay valid
    ]


def log_size(log_file: Path) -> int:
    """The log's size in bytes now (0 before its first line): the offset to read from later."""
    try:
        return log_file.stat().st_size
    except FileNotFoundError:
        return 0


def read_events(log_file: Path, offset: int = 0) -> Iterator[dict]:
    """The audit events written after ``offset``, one dict each; a torn last line is skipped."""
    with open(log_file, "rb") as f:
        f.seek(offset)
        for raw in f:
            try:
                yield json.loads(raw)
            except ValueError:
                continue


def client_of(event: dict) -> str:
    """A short name for the client: the user agent's program name (``kube-scheduler``,
    ``kwok``, ``python-requests``), else the user name."""
    agent = str(event.get("userAgent") or "")
    if agent:
        return agent.split("/", 1)[0].split(" ", 1)[0]
    return str((event.get("user") or {}).get("username") or "?")


def request_of(event: dict) -> str:
    """``VERB resource[/subresource]`` as kube-apiserver's metrics name it (``patch`` in the
    log is also server-side ``APPLY``; the log does not tell them apart at this level)."""
    ref = event.get("objectRef") or {}
    resource = str(ref.get("resource") or event.get("requestURI") or "-")
    if ref.get("subresource"):
        resource += "/" + str(ref["subresource"])
    return f"{str(event.get('verb') or '?').upper()} {resource}"


def tally(events: Iterable[dict], *, skip_verbs: frozenset[str] = frozenset()) -> Counter[tuple[str, str, int]]:
    """Requests counted per (client, request, response code), each request once."""
    out: Counter[tuple[str, str, int]] = Counter()
    for e in events:
        if e.get("stage") not in COUNTED_STAGES or e.get("verb") in skip_verbs:
            continue
        code = int((e.get("responseStatus") or {}).get("code") or 0)
        out[(client_of(e), request_of(e), code)] += 1
    return out


def samples(events: Iterable[dict], request: str, limit: int = 300) -> dict[str, str]:
    """One request body per client for ``request`` (``"PATCH pods/status"``), as compact JSON
    cut to ``limit`` characters: what a client changes, for the requests the policy logs whole."""
    out: dict[str, str] = {}
    for e in events:
        if e.get("stage") in COUNTED_STAGES and request_of(e) == request and "requestObject" in e:
            out.setdefault(client_of(e), json.dumps(e["requestObject"], separators=(",", ":"))[:limit])
    return out
