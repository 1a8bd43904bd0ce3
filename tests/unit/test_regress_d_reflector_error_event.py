"""Regression review of "a watch has worked once something arrives on it": an ERROR event is
something arriving, and it is the failure itself. An API server answering each watch with one
(a watch cache behind the asked version: code 504 "Too large resource version"; an etcd error:
500) logged "works again" and then the failure's warning, two lines per try for as long as it
lasted, which is what the change meant to stop."""

from __future__ import annotations

import asyncio
import json
import logging

from aiohttp import web

from .test_reflector import _Quiet, _run_against


async def test_a_watch_answering_only_error_events_warns_once(monkeypatch, caplog):
    from hami.kube import reflector

    monkeypatch.setattr(reflector.random, "uniform", lambda a, b: 0.0)  # no backoff wait
    watches = []

    async def handler(request):
        if request.query.get("watch") != "true":
            return web.json_response({"metadata": {"resourceVersion": "10"}, "items": []})
        watches.append(1)
        resp = web.StreamResponse()
        await resp.prepare(request)
        if len(watches) <= 6:
            error = {"kind": "Status", "status": "Failure", "reason": "Timeout", "code": 504}
            await resp.write(json.dumps({"type": "ERROR", "object": error}).encode() + b"\n")
            return resp
        event = {"type": "ADDED", "object": {"metadata": {"name": "w", "resourceVersion": "11"}}}
        await resp.write(json.dumps(event).encode() + b"\n")
        await asyncio.sleep(30)
        return resp

    h = _Quiet()
    with caplog.at_level(logging.DEBUG, logger=reflector.log.name):
        await _run_against(handler, h, lambda r: ("ADDED", "w") in h.applied, seconds=10.0)
    assert ("ADDED", "w") in h.applied and len(watches) == 7
    lines = [(rec.levelname, rec.getMessage()) for rec in caplog.records if "/items" in rec.getMessage()]
    assert sum(1 for lv, m in lines if lv == "WARNING") == 1, lines
    assert [m for lv, m in lines if "works again" in m] == ["watch /items works again after 6 failures in a row"], lines
