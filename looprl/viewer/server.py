"""The `looprl view` web server: JSON APIs over run directories plus the static front end.

Stdlib only (`ThreadingHTTPServer`). Binds 127.0.0.1 by default and answers only requests whose
`Host` header names this machine by a loopback name (or the address given to `--host`), so a web
page elsewhere cannot read the runs through DNS rebinding. Everything in a run directory is
treated as untrusted data: lines that are not valid records are skipped and counted, and the
page sets all text through `textContent` (no HTML is built from data; a Content-Security-Policy
forbids inline scripts as a second line of defence). Routes:

- `GET /` and `GET /static/<file>`: the page (hand-written HTML/JS/CSS, nothing from a CDN).
- `GET /api/runs`: every run with its episode files, metric row count and skipped-line notices.
- `GET /api/metrics?run=ID&since=N`: metric rows from row N on (the page polls for new rows).
- `GET /api/config?run=ID`: the saved `config.json` and `metadata.json`.
- `GET /api/rollouts?run=ID&source=train|eval&step=N|all&env=&min=&max=&errors=&task=&exploit=&offset=&limit=`:
  one page of episode summaries, the total, and whether indexing reached the end of the files.
- `GET /api/episode?run=ID&file=KEY&i=N&tokens=0|1`: one full episode (and token strings).
- `GET /api/tasks?run=ID&q=PREFIX`: task ids seen so far that start with PREFIX.
- `GET /api/grid?run=ID`: held-out tasks x eval steps, mean reward per cell (the compare view).
- `GET /api/probe?run=ID`: a probe directory's exploit table and each exploit's episodes.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import json
import math
import re
import signal
import sys
import threading
import traceback
import webbrowser
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from looprl.viewer.runs import Catalog, Query
from looprl.viewer.tokens import TokenizerCache

STATIC_DIR = Path(__file__).parent / "static"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
MAX_PAGE = 500
TOKENIZER_HELP = (
    "the token view's tokenizer: a model directory or name (default: the run's own, or one its "
    "config names inside the directories viewed)"
)
FLOAT_MAX_INT = 2**1023  # larger integers do not fit a JavaScript number (about 1.8e308)
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
WILDCARD_HOSTS = ("", "0.0.0.0", "::")
_HOST = re.compile(r"(\[[0-9a-f:.]+\]|[^:\[\]/@\s]+)(?::\d{1,5})?")  # name, optional port
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class Viewer:
    """What the request handlers share: the runs and the tokenizer cache (which follows a path
    a run names only inside `paths`; `tokenizer` is the user's `--tokenizer`)."""

    def __init__(self, paths: list[Path], tokenizer: str | None = None) -> None:
        self.catalog = Catalog(paths)
        self.tokenizers = TokenizerCache(paths, tokenizer)


Params = dict[str, str]


def _int(p: Params, key: str, default: int) -> int:
    v = p.get(key, "")
    try:
        return int(v) if v != "" else default
    except ValueError:
        raise ValueError(f"query parameter {key}={v!r} must be an integer") from None


def _float(p: Params, key: str) -> float | None:
    v = p.get(key, "")
    try:
        return float(v) if v != "" else None
    except ValueError:
        raise ValueError(f"query parameter {key}={v!r} must be a number") from None


def _step(p: Params) -> int | None:
    v = p.get("step", "all")
    return None if v in ("", "all", "-") else _int(p, "step", 0)


def api_runs(v: Viewer, p: Params) -> Any:
    """Every run and its files, monitor trips, and the eval directories anchored on its curves."""
    infos = [r.info() for r in v.catalog.discover()]
    v.catalog.anchors(infos)
    return {"runs": infos}


def api_metrics(v: Viewer, p: Params) -> Any:
    """Metric rows of one run from row `since` on."""
    run = v.catalog.get(p.get("run", ""))
    run.metrics.refresh(budget_s=0.5)
    since = _int(p, "since", 0)
    rows = run.metrics.since(since)
    return {
        "run": run.id,
        "since": since,
        "rows": rows,
        "next": since + len(rows),
        "notice": run.metrics.notice(),
    }


def api_config(v: Viewer, p: Params) -> Any:
    """Saved config and eval metadata of one run."""
    return v.catalog.get(p.get("run", "")).config()


def api_rollouts(v: Viewer, p: Params) -> Any:
    """One filtered page of episode summaries."""
    run = v.catalog.get(p.get("run", ""))
    q = Query(
        source=p.get("source") or ("train" if run.kind == "train" else "eval"),
        step=_step(p),
        env=p.get("env") or None,
        min_reward=_float(p, "min"),
        max_reward=_float(p, "max"),
        errors=p.get("errors") or "all",
        task=p.get("task") or None,
        exploit=p.get("exploit") or None,
        offset=max(0, _int(p, "offset", 0)),
        limit=min(MAX_PAGE, max(1, _int(p, "limit", 50))),
    )
    return {"run": run.id, "source": q.source, **run.query(q)}


def api_episode(v: Viewer, p: Params) -> Any:
    """One full episode; with tokens=1 also one display string per token of each segment."""
    run = v.catalog.get(p.get("run", ""))
    key = p.get("file", "")
    i = _int(p, "i", 0)
    step, ep = run.episode(key, i)
    out: dict[str, Any] = {"run": run.id, "file": key, "step": step, "i": i, "episode": ep}
    out["group"] = run.group(key, i)
    if p.get("tokens") == "1":
        segs = []
        note = ""
        for t in ep.get("trajectories") or []:
            pieces, note = v.tokenizers.pieces(run.path, list(t.get("token_ids") or []))
            segs.append(pieces)
        out["tokens"] = segs
        out["tokenizer"] = note
    return out


def api_tasks(v: Viewer, p: Params) -> Any:
    """Task ids already indexed that start with `q` (for the compare view's picker)."""
    run = v.catalog.get(p.get("run", ""))
    prefix = p.get("q", "")
    limit = min(MAX_PAGE, max(1, _int(p, "limit", 50)))
    names = [n for n in list(run.tasks.names) if n.startswith(prefix)]
    return {"run": run.id, "tasks": names[:limit], "more": len(names) > limit}


def api_grid(v: Viewer, p: Params) -> Any:
    """Held-out tasks x eval steps of one training run (or the one file of an eval directory)."""
    run = v.catalog.get(p.get("run", ""))
    return {"run": run.id, **run.grid()}


def api_probe(v: Viewer, p: Params) -> Any:
    """The exploit table of a `looprl probe` directory and the episodes of each exploit."""
    run = v.catalog.get(p.get("run", ""))
    if run.kind != "probe":
        raise KeyError(f"run {run.id!r} is a {run.kind} run, not a probe directory (probe.json)")
    return {"run": run.id, **run.probe()}


ROUTES: dict[str, Callable[[Viewer, Params], Any]] = {
    "/api/runs": api_runs,
    "/api/metrics": api_metrics,
    "/api/config": api_config,
    "/api/rollouts": api_rollouts,
    "/api/episode": api_episode,
    "/api/tasks": api_tasks,
    "/api/grid": api_grid,
    "/api/probe": api_probe,
}


def host_allowed(header: str | None, bound: str) -> bool:
    """Whether a request's `Host` header names this server, not some other site's domain.

    Allowed names: 127.0.0.1, localhost, [::1] and the address the server was bound to, with any
    port or none (an `ssh -L` tunnel may use another local port). When bound to every interface
    (`0.0.0.0`), any IP address is allowed too. DNS rebinding needs a domain name of the
    attacker's in the Host header, never one of these.
    """
    m = _HOST.fullmatch((header or "").strip().lower())
    if m is None:
        return False
    name, bound = m.group(1), bound.lower()
    if name in LOOPBACK_NAMES or name == (f"[{bound}]" if ":" in bound else bound):
        return True
    if bound not in WILDCARD_HOSTS:
        return False
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def clean_json(x: Any) -> Any:
    """`x` with NaN, infinities and integers beyond the float range replaced by None.

    Browsers reject NaN in JSON and read integers beyond `FLOAT_MAX_INT` as Infinity.
    """
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, int) and not isinstance(x, bool) and abs(x) > FLOAT_MAX_INT:
        return None
    if isinstance(x, dict):
        return {k: clean_json(val) for k, val in x.items()}
    if isinstance(x, list):
        return [clean_json(val) for val in x]
    return x


def encode_json(body: Any) -> bytes:
    """UTF-8 JSON of `body` (see `clean_json`); strings with lone surrogates come out escaped."""
    text = json.dumps(clean_json(body), ensure_ascii=False, allow_nan=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (valid in JSON text, not in UTF-8)
        return json.dumps(clean_json(body), ensure_ascii=True, allow_nan=False).encode("ascii")


def error_json(message: str) -> bytes:
    """The body of an error answer: `{"error": message}`."""
    return encode_json({"error": message or "not found"})


class Handler(BaseHTTPRequestHandler):
    """Serves the APIs and the static page; never writes anything to disk."""

    server: ViewerServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        """Route one GET request (refused unless its Host header names this server)."""
        host = self.headers.get("Host")
        if not host_allowed(host, str(self.server.server_address[0])):
            names = ", ".join(LOOPBACK_NAMES)
            msg = (
                f"refused: Host {(host or '')[:100]!r} is not this viewer's address; looprl view answers only "
                f"{names} (and the address given to --host), which blocks DNS rebinding"
            )
            self._send_json({"error": msg}, HTTPStatus.FORBIDDEN)
            return
        url = urlsplit(self.path)
        if url.path in ROUTES:
            params = {k: vals[-1] for k, vals in parse_qs(url.query).items()}
            self._api(ROUTES[url.path], params)
        elif url.path in ("/", "/index.html"):
            self._static("index.html")
        elif url.path.startswith("/static/"):
            self._static(url.path[len("/static/") :])
        elif url.path == "/favicon.ico":
            self._send(b"", "image/x-icon", HTTPStatus.NO_CONTENT)
        else:
            self._send_json({"error": f"no such page {url.path!r}"}, HTTPStatus.NOT_FOUND)

    def _api(self, fn: Callable[[Viewer, Params], Any], params: Params) -> None:
        try:
            status, data = HTTPStatus.OK, encode_json(fn(self.server.viewer, params))
        except KeyError as e:
            status, data = HTTPStatus.NOT_FOUND, error_json(str(e.args[0]) if e.args else "")
        except (ValueError, IndexError) as e:  # a bad parameter, or a malformed line asked for
            status, data = HTTPStatus.BAD_REQUEST, error_json(str(e))
        except OSError as e:
            status, data = HTTPStatus.INTERNAL_SERVER_ERROR, error_json(f"could not read: {e}")
        except Exception as e:  # a viewer bug must show in the page, not kill the server
            traceback.print_exc(file=sys.stderr)
            msg = f"internal error: {type(e).__name__}: {e}"
            status, data = HTTPStatus.INTERNAL_SERVER_ERROR, error_json(msg)
        self._send(data, "application/json; charset=utf-8", status)

    def _static(self, name: str) -> None:
        allowed = {p.name: p for p in STATIC_DIR.iterdir() if p.is_file()}
        path = allowed.get(name)
        if path is None:
            self._send_json({"error": f"no static file {name!r}"}, HTTPStatus.NOT_FOUND)
            return
        ctype = CONTENT_TYPES.get(path.suffix, "application/octet-stream")
        self._send(path.read_bytes(), ctype, HTTPStatus.OK)

    def _send_json(self, body: Any, status: int) -> None:
        self._send(encode_json(body), "application/json; charset=utf-8", status)

    def _send(self, data: bytes, ctype: str, status: int) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            for name, value in SECURITY_HEADERS.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the page went away mid-answer; nothing to do

    def log_message(self, format: str, *args: Any) -> None:
        """Log requests only when the server was started verbose."""
        if self.server.verbose:
            super().log_message(format, *args)


class ViewerServer(ThreadingHTTPServer):
    """The HTTP server with the shared `Viewer` attached."""

    daemon_threads = True

    def __init__(self, addr: tuple[str, int], viewer: Viewer, verbose: bool = False) -> None:
        super().__init__(addr, Handler)
        self.viewer = viewer
        self.verbose = verbose
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The address to open in a browser."""
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/"

    def close(self) -> None:
        """Stop serving (if started in a thread) and release the port."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.server_close()


def start_server(
    paths: list[Path], port: int = 0, host: str = "127.0.0.1", tokenizer: str | None = None
) -> tuple[ViewerServer, str]:
    """Start the viewer in a background thread; returns (server, url). Call `server.close()`."""
    server = ViewerServer((host, port), Viewer([Path(p) for p in paths], tokenizer))
    server._thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="looprl-view", daemon=True
    )
    server._thread.start()
    return server, server.url


def serve(
    paths: list[Path],
    host: str = "127.0.0.1",
    port: int = 0,
    open_browser: bool = False,
    tokenizer: str | None = None,
) -> None:
    """Serve the viewer until Ctrl-C, printing its URL first."""
    server = ViewerServer((host, port), Viewer([Path(p) for p in paths], tokenizer))
    runs = server.viewer.catalog.discover()
    names = ", ".join(r.name for r in runs) or "none yet (they are picked up as they appear)"
    print(f"looprl view: {len(runs)} run(s): {names}", flush=True)
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: listening on {host}; anyone who can reach it can read these runs")
    print(f"looprl view: open {server.url}  (Ctrl-C to stop)", flush=True)
    if open_browser:
        webbrowser.open(server.url)
    # a shell's background job (`cmd &`) starts with SIGINT ignored; Ctrl-C / SIGINT must stop us
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("looprl view: stopped")
    finally:
        server.server_close()


def build_parser() -> argparse.ArgumentParser:
    """Arguments of `looprl view`."""
    ap = argparse.ArgumentParser(
        prog="looprl view",
        description="Local web page with a run's curves and rollouts (read-only).",
    )
    ap.add_argument("paths", nargs="+", type=Path, help="run dirs, folders of runs, eval dirs")
    ap.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default: loopback); requests must name it or a loopback name "
        "in their Host header",
    )
    ap.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    ap.add_argument("--open", action="store_true", help="open the page in a browser")
    ap.add_argument("--tokenizer", default=None, help=TOKENIZER_HELP)
    return ap


def main_args(argv: list[str] | None = None) -> int:
    """`looprl view ...` entry point: parse `argv`, serve, return an exit code."""
    args = build_parser().parse_args(argv)
    try:
        serve(
            args.paths, host=args.host, port=args.port, open_browser=args.open,
            tokenizer=args.tokenizer,
        )  # fmt: skip
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            print(
                f"error: port {args.port} on {args.host} is busy — pass --port 0 for a free one, "
                "or choose another port",
                file=sys.stderr,
            )
        else:
            print(f"error: {e} — check the paths and --host", file=sys.stderr)
        return 2
    return 0
