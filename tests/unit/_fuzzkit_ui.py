"""Generator and oracle for the web UI's ``/api/v1`` read API over a real loopback listener
(shared by tests/unit/test_fuzz_dra.py and bench/fuzz_inputs.py, ``make fuzz``), in the shape of
:mod:`tests.unit._fuzzkit`.

Each input is one raw HTTP request (method, path, query pairs, extra headers) written on a TCP
connection to the listener :func:`hami.ui.server.serve_ui` opens, with every limit of
:mod:`hami.serve`. The oracle: no 5xx, no traceback logged, a method other than GET/HEAD is 405,
an endpoint answers 200 with its document when every parameter is one it takes with a printable
value of at most 253 characters, else 400 whose message names the first bad parameter.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st

from hami.core.codec import encode_node_devices_json
from hami.core.types import DeviceInfo

TAKES = {
    "/api/v1/nodes": ("node", "model", "vendor"),
    "/api/v1/pods": ("namespace", "node"),
    "/api/v1/pending": ("namespace",),
    "/api/v1/quotas": ("namespace",),
}
OTHER_PATHS = ["/", "/static/app.js", "/static/style.css", "/healthz", "/api/v1/openapi.yaml"]
ODD_PATHS = [
    "/api/v1/nodes/",
    "/api/v1//nodes",
    "/api/v2/nodes",
    "/static/..%2fopenapi.yaml",
    "/static/%00",
    "/%ff%fe",
    "/api/v1/nodes;x",
    "//",
    "/nowhere",
]

_words = st.sampled_from(["gpu-1", "team-a", "NVIDIA", "NVIDIA-Tesla T4", "kube-system", "x"])
values = st.one_of(
    _words,
    st.just(""),
    st.text(max_size=20),
    st.sampled_from(["a" * 253, "a" * 254, "b" * 5000, "\x00", "\u200b", "é", "\ud7ff", "../..", "%", "+ +"]),
)
keys = st.one_of(
    st.sampled_from(["node", "model", "vendor", "namespace"] * 3), st.sampled_from(["colour", "", "NODE", "node[]"])
)


@st.composite
def ui_requests(draw) -> tuple[str, str, list[tuple[str, str]], list[tuple[str, str]]]:
    """``(method, path, query pairs, extra headers)``."""
    method = draw(st.sampled_from(["GET"] * 6 + ["HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "FOO"]))
    path = draw(st.sampled_from(sorted(TAKES) * 4 + OTHER_PATHS + ODD_PATHS))
    query = draw(st.lists(st.tuples(keys, values), max_size=4))
    headers = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["X-Fuzz", "Accept", "Cookie", "If-None-Match", "Range", "Content-Length"]),
                st.sampled_from(["*/*", "0", "bytes=0-1", "a" * 9000, "é", "\t"]) | st.text("abc ;=,", max_size=20),
            ),
            max_size=3,
        )
    )
    if draw(st.integers(0, 40)) == 0:
        headers += [(f"X-H{i}", "1") for i in range(70)]  # above the header count limit
    return method, path, query, headers


def _encode(query: list[tuple[str, str]]) -> str:
    return "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in query)


# a Kubernetes namespace name (RFC 1123 label), written here, not taken from the server
NAMESPACE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def expected(path: str, query: list[tuple[str, str]]) -> tuple[int, set[str]]:
    """``(status, the parameters a 400 may name: each one it takes not, or with a bad value, or twice)``."""
    takes = TAKES[path]
    counts = {k: sum(1 for q, _ in query if q == k) for k, _ in query}
    bad = {k for k, v in query if k not in takes or len(v) > 253 or not v.isprintable() or counts[k] > 1}
    # a namespace must be one (the server says "not a Kubernetes namespace name"): "NVIDIA" is not
    bad |= {k for k, v in query if k == "namespace" and not NAMESPACE.fullmatch(v)}
    return (400 if bad else 200), bad


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class UiSurface:
    """A scheduler's UI listener over a small cluster, on a private event loop."""

    def __init__(self) -> None:
        from hami.core import SchedulerConfig
        from hami.scheduler.state import ClusterState
        from hami.ui.server import UiApi, serve_ui
        from hami.vendors import build_vendors

        state = ClusterState(SchedulerConfig(build_vendors()))
        devs = [
            DeviceInfo(id=f"GPU-{i}", index=i, count=10, devmem=16384, devcore=100, type="NVIDIA-Tesla T4", health=True)
            for i in range(2)
        ]
        state.node_handler.replace(
            [
                {
                    "metadata": {
                        "name": "gpu-1",
                        "annotations": {"hami.io/node-nvidia-register": encode_node_devices_json(devs)},
                    },
                    "status": {"allocatable": {"nvidia.com/gpu": "20"}},
                }
            ]
        )
        state.pod_handler.apply(
            "ADDED",
            {
                "metadata": {"name": "p", "namespace": "team-a", "uid": "u-p", "resourceVersion": "1"},
                "spec": {
                    "schedulerName": "hami-scheduler",
                    "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
                },
                "status": {"phase": "Pending"},
            },
        )
        self.loop = asyncio.new_event_loop()
        self.runner = self.loop.run_until_complete(serve_ui(UiApi(state, "hami-scheduler"), "127.0.0.1", 0))
        self.port = self.runner.addresses[0][1]
        self.errors = _Errors()
        logging.getLogger("hami").addHandler(self.errors)
        logging.getLogger("aiohttp").addHandler(self.errors)

    def send(self, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        async def go() -> tuple[int, dict[str, str], bytes]:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            writer.write(raw)
            await writer.drain()
            data = await reader.read()  # Connection: close
            writer.close()
            return data

        muted = logging.root.manager.disable  # make fuzz mutes logging: errors must still reach us
        logging.disable(min(muted, logging.WARNING))
        try:
            data = self.loop.run_until_complete(go())
        finally:
            logging.disable(muted)
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        return status, headers, body

    def close(self) -> None:
        logging.getLogger("hami").removeHandler(self.errors)
        logging.getLogger("aiohttp").removeHandler(self.errors)
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()


def check_ui(surface: UiSurface, item: tuple[str, str, list[tuple[str, str]], list[tuple[str, str]]]) -> str | None:
    method, path, query, headers = item
    target = path + (f"?{_encode(query)}" if query else "")
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers]
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")
    before = len(surface.errors.records)
    status, got_headers, body = surface.send(raw)
    logged = surface.errors.records[before:]
    if logged:
        return f"an error was logged for {target[:120]!r}: {logged[0].getMessage()[:200]}"
    if status >= 500:
        return "500"
    if status == 0:
        return f"no answer to {raw[:120]!r}"
    oversized = len(target) > 8000 or any(len(v) > 8000 for _, v in headers) or len(headers) > 64
    if oversized or any(k == "Content-Length" for k, _ in headers) or status in (400, 431) and path not in TAKES:
        return None if 400 <= status < 500 or status == 200 else f"{status} for a request the parser refuses"
    if method not in ("GET", "HEAD"):
        if status == 405 and got_headers.get("allow") == "GET, HEAD":
            return None
        return None if status == 400 and body.strip() else f"{method} answered {status}"  # the parser's 400
    if path not in TAKES:
        return None if status in (200, 404) else f"GET {path} answered {status}"
    want, names = expected(path, query)
    if status != want:
        return f"GET {target[:200]!r} answered {status}, want {want} ({body[:200]!r})"
    if method == "HEAD":
        return None
    doc = json.loads(body)
    if want == 400:
        err = doc["error"]
        named = any(repr(n) in err or f"parameter {n}:" in err for n in names)
        return None if named else f"400 not naming one of {sorted(names)}: {doc}"
    return None if isinstance(doc.get("items"), list) else f"no items in {doc}"


__all__: list[Any] = ["UiSurface", "check_ui", "ui_requests"]
