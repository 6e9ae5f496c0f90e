"""Process-wide settings read from the environment (and `.env`), with the defaults of the embedded mode."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_DATABASE_URL = "sqlite:///./kbrl.db"


def load_dotenv(path: Path | None = None) -> None:
    """Load KEY=VALUE lines from `.env` into os.environ without overriding variables already set."""
    path = path or Path.cwd() / ".env"
    if not path.is_file():
        return
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip().strip("'\"")
        os.environ.setdefault(key.strip(), value)


def database_url() -> str:
    """The event store: `KBRL_DATABASE_URL`, SQLite in the working directory by default."""
    return os.environ.get("KBRL_DATABASE_URL") or DEFAULT_DATABASE_URL


def broker_url() -> str | None:
    """The Celery broker, or None for the in-process queue."""
    return os.environ.get("KBRL_BROKER_URL") or None


def cache_dir() -> Path:
    """Build cache, baseline timings and reference outputs: `KBRL_CACHE_DIR`, else ~/.cache/kbrl."""
    root = os.environ.get("KBRL_CACHE_DIR")
    path = Path(root) if root else Path.home() / ".cache" / "kbrl"
    path.mkdir(parents=True, exist_ok=True)
    return path
