"""The content-hash build cache (kbrl.kernels.build_cache) with real torch builds on CPU.

C++-only `load_inline` extensions build and load here with g++ and ninja (no GPU needed). Each load runs
in a fresh child process, as in the evaluator (one runner per candidate), through the runner's own hook
(`_install_build_hooks` with has_gpu=True), so the stats the evaluator reads are checked too.

Two flavours of the same extension, each through torch's real builder: `light` is a bare Python.h
module (`no_implicit_headers=True`, ~1 s to build), so every behaviour is tested in the default run;
`torch` is what candidates write (torch/extension.h, `functions=[...]`, tensors in and out), 30-100 s a
build on a 2-core host, so its tests are `slow` and share builds through module fixtures.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kbrl.kernels.build_cache import MANIFEST, BuildCache, CompileError, build_key, exclusive_lock

NAME, FNS = "addk", ["add_k"]
LIGHT = r"""
#include <Python.h>
#define KBRL_STR2(x) #x
#define KBRL_STR(x) KBRL_STR2(x)
#define KBRL_CAT2(a, b) a##b
#define KBRL_CAT(a, b) KBRL_CAT2(a, b)
static PyObject* add_k(PyObject*, PyObject* x) { return PyFloat_FromDouble(PyFloat_AsDouble(x) + K); }
static PyMethodDef methods[] = {{"add_k", add_k, METH_O, "x + K"}, {nullptr, nullptr, 0, nullptr}};
static PyModuleDef def = {PyModuleDef_HEAD_INIT, KBRL_STR(TORCH_EXTENSION_NAME), nullptr, -1, methods};
PyMODINIT_FUNC KBRL_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&def); }
"""
FLAVOURS: dict[str, dict[str, Any]] = {
    "light": {"no_implicit_headers": True},
    "torch": {"functions": FNS},
}
LAUNCHES = {"light": 3, "torch": 1}  # calls into the extension the runner counts (one per element for light)
needs_toolchain = pytest.mark.skipif(
    shutil.which("c++") is None or shutil.which("ninja") is None, reason="needs a C++ compiler and ninja"
)


def source(k: int, flavour: str = "torch") -> str:
    """add_k(x) = x + k; sources for different k differ in one character (k < 10)."""
    if flavour == "light":
        return LIGHT.replace("+ K)", f"+ {k})")
    return f"torch::Tensor add_k(torch::Tensor x) {{ return x + {k}; }}"


def key_of(k: int, flavour: str) -> str:
    return build_key(NAME, source(k, flavour), **FLAVOURS[flavour])


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
ext = cpp_extension.load_inline(name="addk", cpp_sources=sys.argv[2], **json.loads(sys.argv[3]))
if "functions" in sys.argv[3]:
    value = ext.add_k(torch.arange(3.0)).tolist()
else:
    value = [ext.add_k(float(i)) for i in range(3)]
print(json.dumps({"built": len(calls), "stats": stats, "value": value, "launches": runner._Launches.count}))
"""


def start(
    root: Path, k: int, flavour: str, *flags: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """A child loading add_k for this k and flavour (stdout's last line: its JSON report)."""
    argv = [sys.executable, "-c", CHILD, str(root), source(k, flavour), json.dumps(FLAVOURS[flavour]), *flags]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip


def finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.splitlines()[-1])


def load(root: Path, k: int, flavour: str, *flags: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    return finish(start(root, k, flavour, *flags, env=env))


# ------------------------------------------------------------------------------------------ fast


def test_key_covers_what_changes_the_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    base = build_key(NAME, source(1), functions=FNS, extra_cflags=["-O2"])
    assert base == build_key(NAME, [source(1)], None, functions=FNS, extra_cflags=["-O2"])
    assert len(base) == 64
    # build_directory and verbose are chosen by the cache, never part of the key.
    assert base == build_key(NAME, source(1), functions=FNS, extra_cflags=["-O2"], verbose=True,
                             build_directory="/elsewhere")  # fmt: skip
    variants = [
        build_key(NAME, source(1), functions=FNS, extra_cflags=["-O3"]),
        build_key(NAME, source(1), functions=FNS),
        build_key(NAME, source(2), functions=FNS, extra_cflags=["-O2"]),
        build_key("other", source(1), functions=FNS, extra_cflags=["-O2"]),
        build_key(NAME, source(1), "", functions=["add_k", "g"], extra_cflags=["-O2"]),
        build_key(NAME, source(1), "// cuda", functions=FNS, extra_cflags=["-O2"]),
        build_key(NAME, source(1), functions=FNS, extra_cflags=["-O2"], with_cuda=True),
        build_key(NAME, source(1), functions=FNS, extra_cflags=["-O2"], extra_include_paths=["/x"]),
    ]
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    variants.append(build_key(NAME, source(1), functions=FNS, extra_cflags=["-O2"]))
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    monkeypatch.setattr("kbrl.kernels.build_cache.gpu_capabilities", lambda: ["9.0"])
    variants.append(build_key(NAME, source(1), functions=FNS, extra_cflags=["-O2"]))
    monkeypatch.setattr("torch.__version__", "0.0.0")
    variants.append(build_key(NAME, source(1), functions=FNS, extra_cflags=["-O2"]))
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


# ----------------------------------------------------------------------------------- real builds


@pytest.fixture(scope="module", params=["light", pytest.param("torch", marks=pytest.mark.slow)])
def flavour(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, flavour: str) -> Path:
    return tmp_path_factory.mktemp(f"build-cache-{flavour}")


@pytest.fixture(scope="module")
def first_build(root: Path, flavour: str) -> dict[str, Any]:
    """One cold build of add_k(k=1), shared by the hit and corruption tests."""
    return load(root, 1, flavour)


@needs_toolchain
def test_hit_skips_the_build(root: Path, flavour: str, first_build: dict[str, Any], tmp_path: Path) -> None:
    assert first_build["built"] == 1 and first_build["stats"]["build_cache_hit"] is False
    assert first_build["value"] == [1.0, 2.0, 3.0] and first_build["launches"] == LAUNCHES[flavour]
    assert BuildCache(root).verify(key_of(1, flavour))[1] == "ok"
    # No compiler, no ninja on PATH, and torch's build machinery rigged to raise: a hit needs none of them.
    empty = tmp_path / "no-tools"
    empty.mkdir()
    hit = load(root, 1, flavour, "--no-torch-build", env={**os.environ, "PATH": str(empty)})
    assert hit["built"] == 0 and hit["stats"]["build_cache_hit"] is True, hit
    assert hit["value"] == [1.0, 2.0, 3.0] and hit["launches"] == LAUNCHES[flavour]
    assert hit["stats"]["build_s"] < 1.0, hit["stats"]
    assert "build_cache_repaired" not in hit["stats"]
    print(
        f"{flavour}: cold build {first_build['stats']['build_s']:.1f} s, hit {hit['stats']['build_s'] * 1000:.1f} ms"
    )


@pytest.fixture(scope="module")
def concurrent_build(root: Path, flavour: str) -> list[dict[str, Any]]:
    """Three processes load add_k(k=2), never built before, at the same moment."""
    procs = [start(root, 2, flavour) for _ in range(3)]
    return [finish(p) for p in procs]


@needs_toolchain
def test_changed_source_misses(
    root: Path, flavour: str, first_build: dict[str, Any], concurrent_build: list[dict[str, Any]]
) -> None:
    one, two = source(1, flavour), source(2, flavour)
    assert len(one) == len(two) and sum(a != b for a, b in zip(one, two)) == 1  # one character apart
    assert key_of(1, flavour) != key_of(2, flavour)
    assert sum(r["built"] for r in concurrent_build) == 1  # not served from k=1's entry
    assert all(r["value"] == [2.0, 3.0, 4.0] for r in concurrent_build)
    cache = BuildCache(root)
    assert cache.verify(key_of(1, flavour))[1] == cache.verify(key_of(2, flavour))[1] == "ok"


@needs_toolchain
def test_concurrent_writers_build_once(
    root: Path, flavour: str, concurrent_build: list[dict[str, Any]]
) -> None:
    builders = [r for r in concurrent_build if r["built"]]
    waiters = [r for r in concurrent_build if not r["built"]]
    assert len(builders) == 1 and len(waiters) == 2, concurrent_build
    assert builders[0]["stats"]["build_cache_hit"] is False
    assert all(r["stats"]["build_cache_hit"] is True for r in waiters)
    assert all(r["value"] == [2.0, 3.0, 4.0] and r["launches"] == LAUNCHES[flavour] for r in concurrent_build)
    key = key_of(2, flavour)
    (library,) = (root / key).glob("*.so")
    manifest = json.loads((root / key / MANIFEST).read_text())
    assert manifest["library"] == library.name and manifest["size"] == library.stat().st_size
    assert not list((root / key).glob(f".{MANIFEST}.*"))  # no leftover temp manifests


@needs_toolchain
def test_corrupted_library_is_rebuilt(root: Path, flavour: str, first_build: dict[str, Any]) -> None:
    key = key_of(1, flavour)
    (library,) = (root / key).glob("*.so")
    data = library.read_bytes()
    library.write_bytes(data[: len(data) // 3])  # truncated: ninja would call this "up to date"
    again = load(root, 1, flavour)
    assert again["built"] == 1 and again["stats"]["build_cache_hit"] is False, again
    assert again["stats"]["build_cache_repaired"] == "size mismatch"
    assert again["value"] == [1.0, 2.0, 3.0]
    assert BuildCache(root).verify(key)[1] == "ok"


@needs_toolchain
def test_half_built_dir_is_rebuilt(tmp_path: Path) -> None:
    """What a killed build leaves (sources, a stale torch baton, partial objects, no manifest) is rebuilt."""
    key = key_of(4, "light")
    entry = tmp_path / key
    entry.mkdir()
    (entry / "main.cpp").write_text(source(4, "light"))
    (entry / "lock").touch()  # torch's FileBaton: left behind, it would make torch wait forever
    (entry / "main.o").write_bytes(b"\x7fELF partial")
    again = load(tmp_path, 4, "light")
    assert again["built"] == 1 and again["stats"]["build_cache_repaired"] == "no manifest", again
    assert again["value"] == [4.0, 5.0, 6.0]
    assert BuildCache(tmp_path).verify(key)[1] == "ok"


@pytest.mark.slow
@needs_toolchain
def test_build_killed_half_way_is_rebuilt(tmp_path: Path) -> None:
    """SIGKILL a real build mid-compile: its lock dies with it, and the manifest-less dir is rebuilt."""
    key = key_of(3, "torch")
    victim = start(tmp_path, 3, "torch")
    deadline = time.monotonic() + 120
    while not (tmp_path / key / "main.cpp").exists():  # torch writes the sources, then runs ninja
        assert time.monotonic() < deadline and victim.poll() is None
        time.sleep(0.2)
    time.sleep(2)  # well inside the compile (torch/extension.h alone takes longer)
    os.killpg(victim.pid, signal.SIGKILL)  # the child, ninja and the compiler
    victim.wait()
    assert BuildCache(tmp_path).verify(key) == (None, "no manifest")
    again = load(tmp_path, 3, "torch")
    assert again["built"] == 1 and again["stats"]["build_cache_repaired"] == "no manifest", again
    assert again["value"] == [3.0, 4.0, 5.0]
    assert BuildCache(tmp_path).verify(key)[1] == "ok"


@needs_toolchain
def test_failed_build_raises_compile_error_and_is_not_cached(tmp_path: Path) -> None:
    bad = source(1, "light").replace("+ 1)", "+ )")
    cache = BuildCache(tmp_path)
    with pytest.raises(CompileError) as err:
        cache.load(NAME, bad, no_implicit_headers=True)
    assert "Error building extension" in str(err.value) and "expected primary-expression" in str(err.value)
    key = build_key(NAME, bad, no_implicit_headers=True)
    assert not (tmp_path / key / MANIFEST).exists()
    assert cache.verify(key) == (None, "no manifest")  # the next load builds again
    with pytest.raises(CompileError):
        cache.load(NAME, bad, no_implicit_headers=True)  # and fails again: failures are not cached
