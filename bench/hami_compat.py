"""Compatibility with HAMi v2.10, counted (issue 20): every case of
tests/unit/hami_compat_cases.py is run and tallied.

Per group it prints: cases checked (run, our output is the one written down), agreeing (HAMi
gives the same output), documented-different (HAMi differs and docs/compatibility.md has the
row), of those reproducible with a setting (HAMi's output with our setting for it), and
failures. Exit status 1 when any case fails.

    .venv/bin/python bench/hami_compat.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.unit import hami_compat_cases as K  # noqa: E402


def tally(group: str) -> tuple[int, int, int, int, list[str]]:
    doc = (ROOT / "docs" / "compatibility.md").read_text(encoding="utf-8")
    checked = agree = documented = knob = 0
    failures = []
    for c in K.ALL[group]:
        if not K.matches(K.outcome(c), c.ours):
            failures.append(c.name)
            continue
        checked += 1
        if c.agrees:
            agree += 1
        elif c.doc and f"`{c.doc}`" in doc:
            documented += 1
            if c.knobs and K.matches(K.outcome(c, **c.knobs), c.hami):
                knob += 1
        else:
            failures.append(f"{c.name} (differs, no row)")
    return checked, agree, documented, knob, failures


def main() -> int:
    print(f"{'group':30} {'checked':>8} {'agree':>6} {'doc-diff':>9} {'via-knob':>9} {'failed':>7}")
    totals: dict[str, list[int]] = {"codec": [0] * 5, "decisions": [0] * 5}
    bad = []
    for group in K.ALL:
        checked, agree, documented, knob, failures = tally(group)
        bad += failures
        print(f"{group:30} {checked:8} {agree:6} {documented:9} {knob:9} {len(failures):7}")
        t = totals["decisions" if group in K.DECISION_GROUPS else "codec"]
        for i, v in enumerate((checked, agree, documented, knob, len(failures))):
            t[i] += v
    for name, t in totals.items():
        print(f"{'TOTAL ' + name:30} {t[0]:8} {t[1]:6} {t[2]:9} {t[3]:9} {t[4]:7}")
    for name in bad:
        print(f"FAILED: {name}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
