"""Large fuzz run over every input surface (``make fuzz``): the generators and oracles of
tests/unit/_fuzzkit.py (quantities, registrations, webhook, extender HTTP, simulate),
_fuzzkit_ui.py (the UI's read API) and _fuzzkit_dra.py (DRA gRPC prepare, CDI directory, DRA
translation, claim and slice watches, checkpoints) at a budget of about 130,000 inputs, counting
instead of stopping.

Per surface it prints: inputs tried / crashes (an exception escaped) / HTTP 500s / wrong
verdicts (a valid input refused or answered wrongly, an invalid one accepted). Exit status 1
when any crash, 500 or wrong verdict was seen; the first three of each are printed.

    .venv/bin/python bench/fuzz_inputs.py [--scale 1.0] [--only quantity,http,...]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.unit import _fuzzkit as F  # noqa: E402
from tests.unit import _fuzzkit_dra as D  # noqa: E402
from tests.unit import _fuzzkit_ui as U  # noqa: E402


class Tally:
    def __init__(self, name: str) -> None:
        self.name, self.tried, self.crashes, self.http500, self.wrong = name, 0, 0, 0, 0
        self.samples: list[str] = []

    def run(self, check, item) -> None:
        self.tried += 1
        try:
            verdict = check(item)
        except Exception:  # noqa: BLE001 - a crash is what we count
            self.crashes += 1
            self._keep(f"crash on {item!r:.300}\n{traceback.format_exc(limit=6)}")
            return
        if verdict == "500":
            self.http500 += 1
            self._keep(f"HTTP 500 on {item!r:.300}")
        elif verdict is not None:
            self.wrong += 1
            self._keep(f"wrong verdict: {verdict[:400]}")

    def _keep(self, text: str) -> None:
        if len(self.samples) < 3:
            self.samples.append(text)


def drive(tally: Tally, strategy, check, budget: int) -> Tally:
    @settings(
        max_examples=budget,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def one(item):
        tally.run(check, item)

    one()
    return tally


def surfaces(scale: float):
    n = lambda k: max(1, int(k * scale))  # noqa: E731
    http = F.HttpSurface()
    http_valid = F.HttpSurface()
    sim = F.SimSurface()
    yield "quantity (valid, exact value)", F.valid_quantities(), F.check_quantity, n(20_000)
    yield (
        "quantity (invalid / junk)",
        st.one_of(F.non_ascii_digit_quantities.map(lambda t: (t, None)), F.quantity_junk.map(lambda t: (t, "any"))),
        F.check_quantity,
        n(20_000),
    )
    yield "registration annotation decode", F.registrations(), F.check_registration, n(20_000)
    yield "registration -> scheduler ledger", F.registrations(), F.check_node_ingest, n(6_000)
    yield "webhook: valid pods", F.valid_pods(), F.check_webhook_valid, n(8_000)
    yield "webhook: reinvocation", F.valid_pods(), F.check_webhook_reinvocation, n(4_000)
    yield "webhook: broken pods", st.one_of(F.broken_pods(), F.json_trees), F.check_webhook_garbage, n(10_000)
    for path in ("/filter", "/bind", "/webhook"):
        yield f"HTTP {path}: bad bodies", F.http_bodies, (lambda b, p=path: F.check_http(http, p, b)), n(3_500)
    yield (
        "HTTP /filter: valid GPU pods",
        F.valid_pods().filter(lambda i: i[1]),
        (lambda i: F.check_http_valid_filter(http_valid, i)),
        n(2_000),
    )
    yield "hami simulate: files", F.sim_inputs(), (lambda i: F.check_simulate(sim, i)), n(2_500)
    # the surfaces added with the DRA front end and the web UI
    ui = U.UiSurface()
    yield "UI /api/v1 over a listener", U.ui_requests(), (lambda i: U.check_ui(ui, i)), n(6_000)
    plugin = D.PluginSurface()
    yield "DRA gRPC prepare/unprepare", D.plugin_batches(), (lambda i: D.check_plugin(plugin, i)), n(3_000)
    yield "DRA CDI file damaged", D.cdi_damage(), (lambda i: D.check_cdi_damage(plugin, i)), n(1_000)
    yield "DRA webhook translation", D.dra_pods(), D.check_translation, n(8_000)
    yield "claim/slice watch + readers", D.watch_events(), D.check_watch, n(5_000)
    ck = D.CheckpointSurface()
    yield "DRA/MIG checkpoint damaged", D.damaged_files(), (lambda i: D.check_checkpoint(ck, i)), n(5_000)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every budget (1.0: about 130,000 inputs)")
    parser.add_argument("--only", default="", help="comma-separated words; run the surfaces whose name has one")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # the scheduler logs every refused registration
    only = [w for w in args.only.split(",") if w]
    rows: list[Tally] = []
    began = time.perf_counter()
    print(f"{'surface':40} {'inputs':>8} {'crashes':>8} {'HTTP 500':>9} {'wrong':>6} {'seconds':>8}")
    for name, strategy, check, budget in surfaces(args.scale):
        if only and not any(w in name for w in only):
            continue
        t0 = time.perf_counter()
        tally = drive(Tally(name), strategy, check, budget)
        rows.append(tally)
        print(
            f"{name:40} {tally.tried:8d} {tally.crashes:8d} {tally.http500:9d} {tally.wrong:6d} "
            f"{time.perf_counter() - t0:8.1f}",
            flush=True,
        )
    total = Tally("total")
    for r in rows:
        total.tried += r.tried
        total.crashes += r.crashes
        total.http500 += r.http500
        total.wrong += r.wrong
    print(
        f"{'total':40} {total.tried:8d} {total.crashes:8d} {total.http500:9d} {total.wrong:6d} "
        f"{time.perf_counter() - began:8.1f}"
    )
    for r in rows:
        for s in r.samples:
            print(f"\n[{r.name}] {s}")
    return 1 if total.crashes or total.http500 or total.wrong else 0


if __name__ == "__main__":
    sys.exit(main())
