"""The content-hash build cache (kbrl.kernels.build_cache) with real torch builds on CPU.

C++-only `load_inline` extensions build and load here with g++ (no GPU needed). Each load runs in a
fresh child process, as in the evaluator (one runner per candidate), through the runner's own hook
(`_install_build_hooks` with has_gpu=True), so the stats the evaluator reads are checked too. A build
takes 20-45 s on a 2-core host: those tests are `slow` and share builds through module fixtures.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kbrl.kernels.build_cache import MANIFEST, BuildCache, CompileError, build_key, exclusive_lock

NAME, FUNCTIONS = "addk", ["add_k"]


def source(k: int) -> str:
    return f"torch::Tensor add_k(torch::Tensor x) {{ return x + {k}; }}"


# One load, as a candidate does it: `load_inline` after the runner installed its hooks. Counts calls
# into torch's real load_inline; with --no-torch-build torch's build machinery raises if it is reached.
CHILD = r"""
import json, sys, time
from pathlib import Path
import torch
from torch.utils import cpp_extension
from kbrl.kernels import runner

calls = []
real = cpp_extension.load_inline
def counting(*args, **kwargs):
    calls.append(args[0])
    return real(*args, **kwargs)
cpp_extension.load_inline = counting
if "--no-torch-build" in sys.argv:
    def refuse(*args, **kwargs):
        raise AssertionError("torch's build machinery ran")
    cpp_extension._jit_compile = refuse
    cpp_extension._write_ninja_file_and_build_library = refuse
stats = {}
runner._install_build_hooks(Path(sys.argv[1]), True, stats)
print("loading", flush=True)
ext = cpp_extension.load_inline(name="addk", cpp_sources=sys.argv[2], functions=["add_k"])
value = ext.add_k(torch.arange(3.0)).tolist()
print(json.dumps({"built": len(calls), "stats": stats, "value": value, "launches": runner._Launches.count}))
"""


def start(root: Path, src: str, *flags: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", CHILD, str(root), src, *flags]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip


def finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.splitlines()[-1])


def load(root: Path, src: str, *flags: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    return finish(start(root, src, *flags, env=env))


# ------------------------------------------------------------------------------------------ fast


def test_key_covers_what_changes_the_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    base = build_key(NAME, source(1), functions=FUNCTIONS, extra_cflags=["-O2"])
    assert base == build_key(NAME, [source(1)], None, functions=FUNCTIONS, extra_cflags=["-O2"])
    assert len(base) == 64
    # build_directory and verbose are chosen by the cache, never part of the key.
    assert base == build_key(NAME, source(1), functions=FUNCTIONS, extra_cflags=["-O2"], verbose=True,
                             build_directory="/elsewhere")  # fmt: skip
    variants = [
        build_key(NAME, source(1), functions=FUNCTIONS, extra_cflags=["-O3"]),
        build_key(NAME, source(1), functions=FUNCTIONS),
        build_key(NAME, source(2), functions=FUNCTIONS, extra_cflags=["-O2"]),
        build_key("other", source(1), functions=FUNCTIONS, extra_cflags=["-O2"]),
        build_key(NAME, source(1), "", functions=["add_k", "g"], extra_cflags=["-O2"]),
        build_key(NAME, source(1), "// cuda", functions=FUNCTIONS, extra_cflags=["-O2"]),
        build_key(NAME, source(1), functions=FUNCTIONS, extra_cflags=["-O2"], with_cuda=True),
        build_key(NAME, source(1), functions=FUNCTIONS, extra_cflags=["-O2"], extra_include_paths=["/x"]),
    ]
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    variants.append(build_key(NAME, source(1), functions=FUNCTIONS, extra_cflags=["-O2"]))
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    monkeypatch.setattr("kbrl.kernels.build_cache.gpu_capabilities", lambda: ["9.0"])
    variants.append(build_key(NAME, source(1), functions=FUNCTIONS, extra_cflags=["-O2"]))
    monkeypatch.setattr("torch.__version__", "0.0.0")
    variants.append(build_key(NAME, source(1), functions=FUNCTIONS, extra_cflags=["-O2"]))
    assert len({base, *variants}) == len(variants) + 1


def _fake_entry(cache: BuildCache, key: str, payload: bytes) -> Path:
    """An entry as a build would commit it, around any bytes (verification does not care what they are)."""
    import hashlib

    entry = cache.root / key
    entry.mkdir(parents=True)
    (entry / "m.so").write_bytes(payload)
    manifest = {"format": 1, "key": key, "module": "m", "library": "m.so", "size": len(payload),
                "sha256": hashlib.sha256(payload).hexdigest()}  # fmt: skip
    (entry / MANIFEST).write_text(json.dumps(manifest))
    return entry


def test_verify_accepts_only_a_library_matching_its_manifest(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path, builder=lambda *a, **k: pytest.fail("no build expected"))
    key = "a" * 64
    assert cache.verify(key) == (None, "absent")
    entry = _fake_entry(cache, key, b"\x7fELF" + bytes(range(256)) * 8)
    assert cache.verify(key)[1] == "ok"
    data = (entry / "m.so").read_bytes()
    (entry / "m.so").write_bytes(data[: len(data) // 2])
    assert cache.verify(key) == (None, "size mismatch")
    (entry / "m.so").write_bytes(data[:-1] + b"\0")  # same size, one byte changed
    assert cache.verify(key) == (None, "sha256 mismatch")
    (entry / "m.so").unlink()
    assert cache.verify(key) == (None, "missing library")
    (entry / MANIFEST).write_text('{"format": 1, "key": "')  # torn write
    assert cache.verify(key) == (None, "unreadable manifest")
    (entry / MANIFEST).unlink()
    assert cache.verify(key) == (None, "no manifest")
    _fake_entry(cache, "b" * 64, b"x")
    os.replace(cache.root / ("b" * 64) / MANIFEST, entry / MANIFEST)  # another key's manifest
    assert cache.verify(key) == (None, "foreign manifest")


def test_lock_is_released_when_its_holder_is_killed(tmp_path: Path) -> None:
    lock = tmp_path / "k.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from kbrl.kernels.build_cache import exclusive_lock\n"
         "with exclusive_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(600)", str(lock)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        import fcntl

        fd = os.open(lock, os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)
    finally:
        holder.kill()
        holder.wait()
    started = time.perf_counter()
    with exclusive_lock(lock):
        assert time.perf_counter() - started < 1


# ------------------------------------------------------------------------------ slow: real builds


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("build-cache")


@pytest.fixture(scope="module")
def first_build(root: Path) -> dict[str, Any]:
    """One cold build of source(1), shared by the hit and corruption tests."""
    return load(root, source(1))


@pytest.mark.slow
def test_hit_skips_the_build(root: Path, first_build: dict[str, Any], tmp_path: Path) -> None:
    assert first_build["built"] == 1 and first_build["stats"]["build_cache_hit"] is False
    assert first_build["value"] == [1.0, 2.0, 3.0] and first_build["launches"] == 1
    key = build_key(NAME, source(1), functions=FUNCTIONS)
    assert BuildCache(root).verify(key)[1] == "ok"
    # No compiler, no ninja on PATH, and torch's build machinery rigged to raise: a hit needs none of them.
    empty = tmp_path / "no-tools"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty)}
    hit = load(root, source(1), "--no-torch-build", env=env)
    assert hit["built"] == 0 and hit["stats"]["build_cache_hit"] is True, hit
    assert hit["value"] == [1.0, 2.0, 3.0] and hit["launches"] == 1
    assert hit["stats"]["build_s"] < 1.0, hit["stats"]
    assert "build_cache_repaired" not in hit["stats"]
    print(f"cold build {first_build['stats']['build_s']:.1f} s, hit {hit['stats']['build_s'] * 1000:.1f} ms")


@pytest.fixture(scope="module")
def concurrent_build(root: Path) -> list[dict[str, Any]]:
    """Three processes load source(2), never built before, at the same moment."""
    procs = [start(root, source(2)) for _ in range(3)]
    return [finish(p) for p in procs]


@pytest.mark.slow
def test_changed_source_misses(root: Path, first_build: dict[str, Any], concurrent_build: list[dict[str, Any]]) -> None:
    assert source(1) != source(2) and len(source(1)) == len(source(2))  # one character apart
    key1, key2 = build_key(NAME, source(1), functions=FUNCTIONS), build_key(NAME, source(2), functions=FUNCTIONS)
    assert key1 != key2
    assert sum(r["built"] for r in concurrent_build) == 1  # not served from source(1)'s entry
    assert all(r["value"] == [2.0, 3.0, 4.0] for r in concurrent_build)
    assert BuildCache(root).verify(key1)[1] == BuildCache(root).verify(key2)[1] == "ok"


@pytest.mark.slow
def test_concurrent_writers_build_once(root: Path, concurrent_build: list[dict[str, Any]]) -> None:
    builders = [r for r in concurrent_build if r["built"]]
    waiters = [r for r in concurrent_build if not r["built"]]
    assert len(builders) == 1 and len(waiters) == 2, concurrent_build
    assert builders[0]["stats"]["build_cache_hit"] is False
    assert all(r["stats"]["build_cache_hit"] is True for r in waiters)
    assert all(r["value"] == [2.0, 3.0, 4.0] and r["launches"] == 1 for r in concurrent_build)
    key = build_key(NAME, source(2), functions=FUNCTIONS)
    (library,) = (root / key).glob("*.so")
    manifest = json.loads((root / key / MANIFEST).read_text())
    assert manifest["library"] == library.name and manifest["size"] == library.stat().st_size
    assert not list((root / key).glob(f".{MANIFEST}.*"))  # no leftover temp manifests


@pytest.mark.slow
def test_corrupted_library_is_rebuilt(root: Path, first_build: dict[str, Any]) -> None:
    key = build_key(NAME, source(1), functions=FUNCTIONS)
    (library,) = (root / key).glob("*.so")
    data = library.read_bytes()
    library.write_bytes(data[: len(data) // 3])  # truncated: ninja would call this "up to date"
    again = load(root, source(1))
    assert again["built"] == 1 and again["stats"]["build_cache_hit"] is False, again
    assert again["stats"]["build_cache_repaired"] == "size mismatch"
    assert again["value"] == [1.0, 2.0, 3.0]
    assert BuildCache(root).verify(key)[1] == "ok"


@pytest.mark.slow
def test_build_killed_half_way_is_rebuilt(root: Path) -> None:
    """SIGKILL a build mid-compile: its lock dies with it, and the manifest-less dir is rebuilt."""
    key = build_key(NAME, source(3), functions=FUNCTIONS)
    victim = start(root, source(3))
    deadline = time.monotonic() + 120
    while not (root / key / "main.cpp").exists():  # torch writes the sources, then runs ninja
        assert time.monotonic() < deadline and victim.poll() is None
        time.sleep(0.2)
    time.sleep(2)  # well inside the compile
    os.killpg(victim.pid, signal.SIGKILL)  # the child, ninja and the compiler
    victim.wait()
    assert BuildCache(root).verify(key) == (None, "no manifest")
    again = load(root, source(3))
    assert again["built"] == 1 and again["stats"]["build_cache_repaired"] == "no manifest", again
    assert again["value"] == [3.0, 4.0, 5.0]
    assert BuildCache(root).verify(key)[1] == "ok"


@pytest.mark.slow
def test_failed_build_raises_compile_error_and_is_not_cached(root: Path) -> None:
    bad = "torch::Tensor add_k(torch::Tensor x) { return x + ; }"
    cache = BuildCache(root)
    with pytest.raises(CompileError) as err:
        cache.load(NAME, bad, functions=FUNCTIONS)
    assert "Error building extension" in str(err.value) and "expected primary-expression" in str(err.value)
    key = build_key(NAME, bad, functions=FUNCTIONS)
    assert not (root / key / MANIFEST).exists()
    assert cache.verify(key) == (None, "no manifest")  # the next load builds again
