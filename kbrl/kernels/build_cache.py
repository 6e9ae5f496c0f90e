"""Content-hash cache of `load_inline` builds: an identical extension never builds twice on a host.

Workers of one host share one cache directory, kept across worker restarts. Layout under `root`:

    <root>/<key>.lock           flock'd around check-then-build and the load (never deleted: deleting a
                                lock file others may hold open would let two holders coexist)
    <root>/<key>/               torch's build directory: sources, build.ninja, objects, <module>.so
    <root>/<key>/manifest.json  written last, atomically (temp file + os.replace): module name, library
                                file name, its size and sha256, and the key material
    <root>/checked/<key>.ok     no-GPU hosts: these sources already passed the compile-only check

An entry is valid only when its manifest parses and the library's size and sha256 match it; this is
re-verified on every hit. Anything else — no manifest (a build killed half-way, or one that failed), a
truncated or overwritten library, an unreadable manifest — is wiped and rebuilt under the lock. Because
every hit re-hashes the library, no fsync is needed: a torn write after a host crash fails the check.

A hit imports the library directly (as torch itself does after a build), without torch's builder or
ninja, whose timestamp checks would call a truncated library "up to date".

Failed builds are not cached: they leave no manifest, so the next load of the key builds again (a
transient failure — out of memory, a killed compiler — must not stick, and a model rarely resubmits a
failing kernel byte for byte).

Locking is `fcntl.flock`, which the kernel drops when the holder dies (SIGKILL included), so a killed
build never wedges its key, and which excludes threads as well as processes (each load opens the lock
file anew). flock needs a local filesystem: on NFS it is emulated or missing, and two hosts sharing one
cache directory would not exclude each other — give each host its own cache.

Not keyed (documented limits): the contents of headers under `extra_include_paths`, and the compiler
and nvcc versions (an upgraded compiler keeps serving binaries the old one built, which stay ABI-valid
for the same torch).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Bump when the layout, the manifest or the build recipe changes: old entries then simply miss.
CACHE_FORMAT = 1
MANIFEST = "manifest.json"
# Keyword arguments that do not change the binary (and that the cache sets itself).
UNKEYED_KWARGS = frozenset({"build_directory", "verbose"})


class CompileError(Exception):
    """A CUDA/C++ build of the candidate failed (message is the compiler output)."""


def as_list(value: Any) -> list[str]:
    """`load_inline` takes a string or a list of strings for its sources; always a fresh list here."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def gpu_capabilities() -> list[str]:
    """Compute capabilities of the visible GPUs: torch builds for these when TORCH_CUDA_ARCH_LIST is unset."""
    import torch

    if not torch.cuda.is_available():
        return []
    return sorted(
        {"{}.{}".format(*torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())}
    )


def key_material(name: str, cpp_sources: Any, cuda_sources: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Everything that changes the built binary (the key is the sha256 of this, as canonical JSON).

    Sources and name (the name is compiled in as TORCH_EXTENSION_NAME); every build keyword argument
    (flags, `functions`, `with_cuda`, include paths, ...) by repr, except `build_directory`/`verbose`;
    torch's version and CUDA/HIP version; the Python version and extension ABI tag; the C++11 string
    ABI; TORCH_CUDA_ARCH_LIST; and the capabilities of the visible GPUs (empty without one).
    """
    import torch

    return {
        "format": CACHE_FORMAT,
        "name": name,
        "cpp_sources": as_list(cpp_sources),
        "cuda_sources": as_list(cuda_sources),
        "kwargs": {k: repr(v) for k, v in sorted(kwargs.items()) if k not in UNKEYED_KWARGS},
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_hip": getattr(torch.version, "hip", None),
        "python": list(sys.version_info[:2]),
        "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX") or sys.implementation.cache_tag,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "cuda_arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST", ""),
        "gpu_capabilities": gpu_capabilities(),
    }


def build_key(name: str, cpp_sources: Any, cuda_sources: Any = None, **kwargs: Any) -> str:
    """The cache key (64 hex digits) of a `load_inline` call; see `key_material` for what it covers."""
    return _digest(key_material(name, cpp_sources, cuda_sources, kwargs))


def _digest(material: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if needed); released on exit or when the process dies."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the only descriptor drops the lock


@dataclass
class BuildOutcome:
    """What one cached load did, for the evaluator's stats."""

    key: str
    module_name: str
    hit: bool = False
    repaired: str | None = None  # why an existing entry was discarded and rebuilt ("sha256 mismatch", ...)
    build_s: float = 0.0  # inside torch's builder; 0 on a hit
    lock_wait_s: float = 0.0
    total_s: float = 0.0


class BuildCache:
    """Content-hash cache of `load_inline` extensions under `root` (see the module docstring)."""

    def __init__(self, root: Path, builder: Callable[..., Any] | None = None) -> None:
        """`builder` is torch's real `load_inline` unless given: capture it before hooks replace it."""
        if builder is None:
            from torch.utils import cpp_extension

            builder = cpp_extension.load_inline
        self.root = Path(root)
        self._builder = builder
        self.outcomes: list[BuildOutcome] = []

    def load_inline(self, name: str, cpp_sources: Any, cuda_sources: Any = None, **kwargs: Any) -> Any:
        """Drop-in for torch's `load_inline`; the outcome of each call is appended to `self.outcomes`."""
        module, outcome = self.load(name, cpp_sources, cuda_sources, **kwargs)
        self.outcomes.append(outcome)
        return module

    def load(
        self, name: str, cpp_sources: Any, cuda_sources: Any = None, **kwargs: Any
    ) -> tuple[Any, BuildOutcome]:
        """Load the extension from the cache, building it first (once per host) when absent or invalid.

        The module is named `<name>_<key[:10]>`, so two kernels that share a `name` coexist in one
        process. Raises CompileError with the compiler output when the build fails.
        """
        started = time.perf_counter()
        material = key_material(name, cpp_sources, cuda_sources, kwargs)
        key = _digest(material)
        outcome = BuildOutcome(key=key, module_name=f"{name}_{key[:10]}")
        kwargs = {k: v for k, v in kwargs.items() if k not in UNKEYED_KWARGS}
        python_module = kwargs.get("is_python_module", True)
        entry = self.root / key
        self.root.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(self.root / f"{key}.lock"):
            outcome.lock_wait_s = time.perf_counter() - started
            manifest, problem = self.verify(key)
            if manifest is not None:
                outcome.hit = True
                try:
                    module = _import_extension(
                        outcome.module_name, entry / manifest["library"], python_module
                    )
                except Exception as exc:  # verified bytes that will not load: the environment changed
                    raise CompileError(
                        f"cached build {key} failed to load: {type(exc).__name__}: {exc}"
                    ) from exc
            else:
                if problem != "absent":
                    outcome.repaired = problem
                shutil.rmtree(entry, ignore_errors=True)
                module = self._build(outcome, material, cpp_sources, cuda_sources, kwargs)
        outcome.total_s = time.perf_counter() - started
        return module, outcome

    def verify(self, key: str) -> tuple[dict[str, Any] | None, str]:
        """(manifest, "ok") for a valid entry, else (None, why): "absent", "no manifest", "sha256 mismatch"..."""
        entry = self.root / key
        if not entry.exists():
            return None, "absent"
        try:
            manifest = json.loads((entry / MANIFEST).read_text())
        except FileNotFoundError:
            return None, "no manifest"
        except (OSError, ValueError):
            return None, "unreadable manifest"
        if (
            not isinstance(manifest, dict)
            or manifest.get("format") != CACHE_FORMAT
            or manifest.get("key") != key
        ):
            return None, "foreign manifest"
        library = entry / str(manifest.get("library", ""))
        try:
            size = library.stat().st_size
        except OSError:
            return None, "missing library"
        if size != manifest.get("size"):
            return None, "size mismatch"
        if file_sha256(library) != manifest.get("sha256"):
            return None, "sha256 mismatch"
        return manifest, "ok"

    def _build(
        self, outcome: BuildOutcome, material: dict[str, Any], cpp_sources: Any, cuda_sources: Any,
        kwargs: dict[str, Any],
    ) -> Any:  # fmt: skip
        """Build with torch's real `load_inline` into the key's directory; commit with the manifest."""
        entry = self.root / outcome.key
        entry.mkdir(parents=True)
        _forget_torch_version(outcome.module_name)
        started = time.perf_counter()
        try:
            # Fresh lists: torch inserts headers into the lists it is given.
            module = self._builder(outcome.module_name, as_list(cpp_sources), as_list(cuda_sources) or None,
                                   build_directory=str(entry), verbose=False, **kwargs)  # fmt: skip
        except Exception as exc:  # torch raises RuntimeError("Error building extension ...") with the log
            raise CompileError(str(exc)) from exc
        finally:
            outcome.build_s = time.perf_counter() - started
        library = entry / f"{outcome.module_name}{_lib_suffix()}"
        if not library.is_file():
            raise CompileError(f"torch built {outcome.module_name} but {library.name} is not in {entry}")
        manifest = {
            "format": CACHE_FORMAT,
            "key": outcome.key,
            "module": outcome.module_name,
            "library": library.name,
            "size": library.stat().st_size,
            "sha256": file_sha256(library),
            "build_s": round(outcome.build_s, 3),
            "created": time.time(),
            "material": material,
        }
        tmp = entry / f".{MANIFEST}.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_text(json.dumps(manifest, indent=1))
        os.replace(tmp, entry / MANIFEST)
        return module

    # No-GPU hosts only compile-check CUDA sources (nothing to cache but the verdict).

    def checked(self, key: str) -> bool:
        """Whether sources with this key already passed the compile-only check on this host."""
        return (self.root / "checked" / f"{key}.ok").exists()

    def mark_checked(self, key: str) -> None:
        (self.root / "checked").mkdir(parents=True, exist_ok=True)
        (self.root / "checked" / f"{key}.ok").touch()


def _lib_suffix() -> str:
    return ".pyd" if sys.platform == "win32" else ".so"


def _forget_torch_version(module_name: str) -> None:
    """Make torch build even if this process built the same name before (its versioner would skip it)."""
    from torch.utils import cpp_extension

    versioner = getattr(cpp_extension, "JIT_EXTENSION_VERSIONER", None)
    entries = getattr(versioner, "entries", None)
    if isinstance(entries, dict):
        entries.pop(module_name, None)


def _import_extension(module_name: str, path: Path, python_module: bool) -> Any:
    """Load a built library exactly as torch does after a build (`PyInit_<module_name>` must match)."""
    if not python_module:
        import torch

        torch.ops.load_library(str(path))
        return str(path)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
