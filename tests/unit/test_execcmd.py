"""`hami exec` option parsing and the environment it builds (no process is started)."""

from __future__ import annotations

import argparse

import pytest

from hami import execcmd

GiB = 1 << 30


def args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    execcmd.add_arguments(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize(
    "text,value",
    [
        ("4G", 4 * GiB),
        ("4g", 4 * GiB),
        ("4096m", 4 * GiB),
        ("4Gi", 4 * GiB),
        ("4GiB", 4 * GiB),
        ("4GB", 4 * 10**9),
        ("1.5g", 3 * GiB // 2),
        ("1073741824", GiB),
        ("512Ki", 512 * 1024),
    ],
)
def test_parse_size(text, value):
    assert execcmd.parse_size(text) == value


@pytest.mark.parametrize("text", ["", "4X", "-1g", "1.5", "g", "0", "4 G B"])
def test_parse_size_rejects(text):
    with pytest.raises(execcmd.ExecError, match="--gpumem"):
        execcmd.parse_size(text)


def test_plan_sets_the_hami_core_environment(tmp_path):
    lib = tmp_path / "libvgpu.so"
    lib.write_bytes(b"")
    plan = execcmd.build_plan(
        args(
            "--gpumem",
            "4G",
            "--gpucores",
            "30",
            "--devices",
            "0,1",
            "--lib",
            str(lib),
            "--cache",
            str(tmp_path / "x.cache"),
            "--",
            "python",
            "-V",
        ),
        {"LD_PRELOAD": "/other/libfoo.so", "PATH": "/usr/bin"},
    )
    env = plan.env
    assert plan.argv == ["python", "-V"]
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == str(4 * GiB)
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == env["CUDA_DEVICE_MEMORY_LIMIT_1"] == str(4 * GiB)
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == str(tmp_path / "x.cache")
    assert env["LD_PRELOAD"] == f"{lib.resolve()}:/other/libfoo.so"


def test_plan_creates_a_fresh_cache_file(tmp_path):
    lib = tmp_path / "libvgpu.so"
    lib.write_bytes(b"")
    plan = execcmd.build_plan(args("--gpumem", "1g", "--lib", str(lib), "--", "true"), {})
    cache = plan.env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    try:
        assert "hami-exec-" in cache
    finally:
        import os

        os.unlink(cache)


@pytest.mark.parametrize(
    "argv,message",
    [
        (("--gpumem", "4X", "--", "true"), "--gpumem: invalid size '4X'"),
        (("--gpumem", "4g", "--gpucores", "0", "--", "true"), "--gpucores: expected a percentage in 1..100, got 0"),
        (("--gpumem", "4g", "--devices", "0,x", "--", "true"), "--devices: invalid device 'x'"),
        (("--gpumem", "4g", "--devices", "0,0", "--", "true"), "--devices: duplicate device"),
        (("--gpumem", "4g"), "CMD: missing command"),
        (("--gpumem", "4g", "--lib", "/nonexistent/libvgpu.so", "--", "true"), "--lib: libvgpu.so not found"),
    ],
)
def test_bad_options_give_one_clear_error(argv, message, capsys):
    assert execcmd.run(args(*argv)) == 2
    assert message in capsys.readouterr().err
