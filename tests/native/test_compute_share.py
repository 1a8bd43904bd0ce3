"""Compute shares (CUDA_DEVICE_SM_LIMIT) against the fake GPU: accuracy after settling,
competing containers, the three policies, every launch path, per-device limits.

Each scenario runs on its own fake machine (FAKEGPU_STATE_DIR), so independent scenarios run
side by side; the loads mostly sleep (fake kernels), so this stays cheap on 2 cores.
Run with `-s` to see the measured figures.

What is asserted is what the limiter guarantees on any machine: a task never gets more than its
share (limit + TOL), and it is held at its share rather than throttled to nothing (at least
LOW x limit). On an idle machine shares land within a point or two of the limit; on a saturated
one the load processes themselves get too little CPU to use their share: with two CPU hogs on two
cores and other builds running (load average 9-11) we measured down to 0.8 x limit, and once
0.5 x (a 60 % device limit at 29.9 %), which is not a limiter error. Accuracy and settling times
are figures for bench/bench_compute_share.py, not assertions."""

from __future__ import annotations

import pytest

from .cshare import Trace, base_env, start

pytestmark = pytest.mark.native

TOL = 5.0  # percentage points above the limit (the isolation guarantee)
# With a real driver's attribution (one process per sample) a competing task's share is held on
# average over a lottery of samples. In 5 s runs we measured up to 7 points over the limit on an
# idle machine and 11.4 under a full CI run; 10 s runs (RESIDENT_S) halve the spread (at most
# 5.3 over in repeated idle runs), which leaves the tolerance room for a loaded machine.
TOL_RESIDENT = 10.0
RESIDENT_S = 10
LOW = 0.25  # held, not starved: at least this fraction of the limit, even on a saturated CPU
SETTLE_MS = 500  # measurement starts this long after the first launch
UNTHROTTLED = 3 * TOL  # "clearly not held at the limit": more than limit + 15 points


def held(achieved: float, limit: float, what: object = None, tol: float = TOL) -> None:
    assert LOW * limit <= achieved <= limit + tol, (what, limit, achieved)


def fair_split(shares: list[float]) -> None:
    """Processes of one container split its share roughly evenly (each gets a quarter or more)."""
    total = sum(shares)
    assert all(s >= total / len(shares) / 2 for s in shares), shares


@pytest.fixture
def env(native_build):
    return base_env(native_build / "fakegpu")


def steady(trace, start_ms=None, end_ms=None):
    a = (start_ms if start_ms is not None else trace.start) + SETTLE_MS
    b = end_ms if end_ms is not None else trace.end - 50
    return trace.share(a, b)


def test_force_single_process_accuracy(env, tmp_path):
    limits = (10, 30, 50, 70, 90)
    tasks = [start(env, tmp_path / f"m{lim}", tmp_path / f"c{lim}.cache", limit=lim, policy="force") for lim in limits]
    for lim, task in zip(limits, tasks):
        tr = task.trace()
        achieved, settle = steady(tr), tr.settling_s(lim)
        print(f"force limit {lim}: achieved {achieved:.1f}%, settled in {settle:.2f} s")
        held(achieved, lim)


def test_disable_policy_never_throttles(env, tmp_path):
    tr = start(env, tmp_path / "m", tmp_path / "c.cache", limit=20, policy="disable", seconds=1.5).trace()
    assert steady(tr) > 20 + UNTHROTTLED  # not held at 20 (the load alone reaches ~98 on an idle machine)


# split: every process sampled with its own busy time each period; resident: each sample names
# only the process on the device at its instant, with the device's utilization (a real driver)
ATTRIBUTIONS = pytest.mark.parametrize("attribution", ["split", "resident"])


def competing(env, tmp_path, attribution: str, limits: tuple[int, ...], tries: int = 2) -> None:
    """Containers of ``limits`` compete on one fake GPU; each is held at its share. A run whose
    shares fall outside the bounds is measured once more on a fresh fake machine, and the test
    fails only if that one does too: the shares are a statistical figure on a shared 2-core
    machine (with the resident attribution a lottery of samples), and a single run outside the
    bound under load failed the CI in sessions of 21, 26 and 29 Nov with nothing wrong in the
    limiter. A limiter that does not hold a share fails every run."""
    env = dict(env, FAKEGPU_UTIL_ATTRIBUTION=attribution)
    secs, tol = (3, TOL) if attribution == "split" else (RESIDENT_S, TOL_RESIDENT)
    for attempt in range(tries):
        m = tmp_path / f"m{attempt}"
        tasks = [start(env, m, tmp_path / f"c{lim}-{attempt}.cache", limit=lim, seconds=secs) for lim in limits]
        traces = [t.trace() for t in tasks]
        a, b = max(t.start for t in traces), min(t.end for t in traces)
        shares = [tr.share(a + SETTLE_MS, b - 50) for tr in traces]
        label = "/".join(map(str, limits))
        for lim, achieved in zip(limits, shares):
            print(f"{label} competing ({attribution}, run {attempt + 1}): limit {lim} achieved {achieved:.1f}%")
        if all(LOW * lim <= got <= lim + tol for lim, got in zip(limits, shares)) or attempt == tries - 1:
            break
    for lim, achieved in zip(limits, shares):
        held(achieved, lim, attribution, tol)


@ATTRIBUTIONS
def test_two_containers_30_70(env, tmp_path, attribution):
    competing(env, tmp_path, attribution, (30, 70))


@ATTRIBUTIONS
def test_three_containers_20_30_50(env, tmp_path, attribution):
    competing(env, tmp_path, attribution, (20, 30, 50))


def test_a_second_run_does_not_hide_a_limiter_that_never_holds(env, tmp_path):
    """The retry above must not turn a broken limiter into a pass: with the policy off (nothing
    held) both runs are far over the 30 % share and the check fails."""
    with pytest.raises(AssertionError):
        competing(dict(env, GPU_CORE_UTILIZATION_POLICY="disable"), tmp_path, "split", (30,))


def test_default_policy_is_work_conserving(env, tmp_path):
    """A lone task runs unthrottled; once a second task uses the GPU, both are held."""
    import time

    m = tmp_path / "m"
    first = start(env, m, tmp_path / "a.cache", limit=30, seconds=3.5)
    time.sleep(1.5)
    second = start(env, m, tmp_path / "b.cache", limit=50, seconds=2.0)
    ta, tb = first.trace(), second.trace()
    alone = ta.share(ta.start + 300, tb.start - 100)
    both_a = ta.share(tb.start + 600, tb.end - 50)
    both_b = tb.share(tb.start + 600, tb.end - 50)
    print(f"default policy: alone {alone:.1f}%, shared {both_a:.1f}% (limit 30) / {both_b:.1f}% (limit 50)")
    assert alone > 30 + UNTHROTTLED  # not held at 30 (~98 on an idle machine)
    held(both_a, 30)
    held(both_b, 50)


@pytest.mark.parametrize("kinds", [("ptsz", "ex", "ex_ptsz", "coop", "coop_ptsz", "graph", "graph_ptsz")])
def test_every_launch_path_is_limited(env, tmp_path, kinds):
    tasks = [
        start(env, tmp_path / f"m{k}", tmp_path / f"{k}.cache", limit=40, policy="force", kind=k, seconds=1.8)
        for k in kinds
    ]
    for k, task in zip(kinds, tasks):
        achieved = steady(task.trace())
        print(f"launch path {k}: achieved {achieved:.1f}% (limit 40)")
        held(achieved, 40, k)


def test_multi_gpu_container_limited_per_device(env, tmp_path):
    """One container (one region), two devices with their own limits and their own loops."""
    m, region = tmp_path / "m", tmp_path / "c.cache"
    per_dev = {"CUDA_DEVICE_SM_LIMIT_0": "30", "CUDA_DEVICE_SM_LIMIT_1": "60"}
    tasks = [start(env, m, region, policy="force", device=d, seconds=2.5, extra=per_dev) for d in (0, 1)]
    for want, task in zip((30, 60), tasks):
        achieved = steady(task.trace())
        print(f"multi-GPU container: device limit {want}: achieved {achieved:.1f}%")
        held(achieved, want)


def test_host_pid_by_memory_probe_when_nvml_pids_differ(env, tmp_path):
    """The fake NVML reports pid + 100000 (a driver in another PID namespace): the host PID
    comes from the memory-signature probe, and the share is still enforced."""
    region = tmp_path / "c.cache"
    task = start(
        env,
        tmp_path / "m",
        region,
        limit=30,
        policy="force",
        seconds=1.5,
        extra={"FAKEGPU_HOSTPID_OFFSET": "100000", "LIBCUDA_LOG_LEVEL": "3"},
    )
    out, err = task.proc.communicate(timeout=60)
    assert task.proc.returncode == 0, err
    tr = Trace.parse(out)
    held(steady(tr), 30)
    assert f"host pid {task.proc.pid + 100000}" in err


def test_processes_of_one_container_share_its_limit(env, tmp_path):
    """Two processes with one region (one container) and limit 40: together 40, about half each."""
    m, region = tmp_path / "m", tmp_path / "c.cache"
    tasks = [start(env, m, region, limit=40, policy="force", seconds=3) for _ in range(2)]
    traces = [t.trace() for t in tasks]
    a, b = max(t.start for t in traces) + 1000, min(t.end for t in traces) - 50
    shares = [tr.share(a, b) for tr in traces]
    print(f"one container, two processes, limit 40: {shares[0]:.1f}% + {shares[1]:.1f}% = {sum(shares):.1f}%")
    held(sum(shares), 40)
    fair_split(shares)


def test_long_kernels(env, tmp_path):
    """Kernels of half an NVML sample period (about one launch per period): periods are pooled
    until the cost per launch can be fitted."""
    tr = start(
        env, tmp_path / "m", tmp_path / "c.cache", limit=30, policy="force", seconds=3.5, kernel_us=25000, depth=2
    ).trace()
    achieved = tr.share(tr.start + 1000, tr.end - 50)
    print(f"25 ms kernels, limit 30: achieved {achieved:.1f}%")
    held(achieved, 30)


def test_process_joining_a_held_container_does_not_overshoot(env, tmp_path):
    """The newcomer starts from the container's published cost per launch at an equal split."""
    import time

    m, region = tmp_path / "m", tmp_path / "c.cache"
    first = start(env, m, region, limit=40, policy="force", seconds=3.0)
    time.sleep(1.2)
    second = start(env, m, region, limit=40, policy="force", seconds=1.8)
    t1, t2 = first.trace(), second.trace()
    join = t2.start
    burst = t1.share(join, join + 300) + t2.share(join, join + 300)
    later = (t1.share(join + 800, t2.end - 50), t2.share(join + 800, t2.end - 50))
    print(f"process joins a container held at 40: first 300 ms {burst:.1f}%, then {later[0]:.1f}% + {later[1]:.1f}%")
    assert burst <= 40 + 2 * TOL
    held(sum(later), 40)
    fair_split(list(later))
