"""`kbrl dashboard`: serve the Streamlit app (`dashboard/app.py` of the checkout) on localhost.

kbrl never imports the dashboard; it starts `streamlit run` on the app's file in a child process, with the
store URL in the child's environment. The default address is 127.0.0.1: the dashboard has no login, and
its form can queue jobs, so expose it only behind an authenticating proxy (see dashboard/README.md).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8501


def app_path() -> Path:
    """The app: `KBRL_DASHBOARD_APP`, else `dashboard/app.py` next to the `kbrl` package (a checkout)."""
    override = os.environ.get("KBRL_DASHBOARD_APP")
    path = Path(override) if override else Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
    if not path.is_file():
        raise FileNotFoundError(f"no dashboard app at {path}: run from a kbrl checkout, or set KBRL_DASHBOARD_APP")
    return path


def streamlit_command(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> list[str]:
    """The `streamlit run` command line: headless, no usage statistics, bound to `host`."""
    return [sys.executable, "-m", "streamlit", "run", str(app_path()),
            "--server.address", host, "--server.port", str(port), "--server.headless", "true",
            "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal"]  # fmt: skip


def launch(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, store_url: str | None = None) -> int:
    """Replace this process with `streamlit run` (so Ctrl-C and SIGTERM reach the server itself, and no
    orphan is left); returns only on an error, with an exit code."""
    try:
        import streamlit  # noqa: F401
    except ImportError:
        print("error: the dashboard needs streamlit: pip install -e '.[dashboard]'", file=sys.stderr)
        return 2
    try:
        command = streamlit_command(host, port)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if store_url:
        env["KBRL_DATABASE_URL"] = store_url
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: serving on {host} without authentication; put an authenticating proxy in front "
              "(dashboard/README.md)", file=sys.stderr)  # fmt: skip
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, env)
    return 0  # not reached: execve does not return


__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "app_path", "launch", "streamlit_command"]
