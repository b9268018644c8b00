"""RAM directories name their owner and are swept once it dies; a vLLM server's log is temporary.

A process killed with SIGKILL leaves its directories behind: the next sweep removes them and
says how much it freed, while a live owner's directory, a recycled process id's stamp and names
of another form are told apart. The server half runs against a stand-in for vLLM (a stdlib
HTTP server answering `/health`, put on PYTHONPATH as `vllm.entrypoints.openai.api_server`):
its shim removes the trainer's RAM directories when the trainer is SIGKILLed, the temporary
log goes on a clean stop and stays when the server failed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from looprl.engines.ram_dirs import ram_dir, ram_root, start_ticks, sweep_and_report, sweep_ram_dirs

REPO = Path(__file__).resolve().parents[1]
FAKE_VLLM = """
import argparse, http.server, pathlib, sys
parser = argparse.ArgumentParser()
parser.add_argument("--model")
parser.add_argument("--port", type=int)
args, _ = parser.parse_known_args()
if (pathlib.Path(args.model) / "broken").exists():
    print("ValueError: model type 'no_such_architecture' is not supported", flush=True)
    sys.exit(1)

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass

print("fake vLLM serving", flush=True)
http.server.HTTPServer(("127.0.0.1", args.port), Health).serve_forever()
"""


def _child_env(extra: Path | None = None) -> dict[str, str]:
    paths = [str(p) for p in (extra, REPO) if p is not None]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": "1"}


def _spawn(
    code: str, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str]:
    """Start python running `code`; return it and the first line it prints."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE, text=True, env=env or _child_env(),
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line, f"the child printed nothing (exit {proc.wait()})"
    return proc, line


def _kill9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


OWNER = """
    import sys, time
    from pathlib import Path
    from looprl.engines.ram_dirs import ram_dir
    d = ram_dir("vllm-model", root=Path(sys.argv[1]))
    (d / "model.safetensors").write_bytes(bytes(300_000))
    print(d, flush=True)
    time.sleep(120)
"""


def test_a_sigkilled_owners_directory_is_swept_and_a_live_ones_kept(tmp_path) -> None:
    proc, made = _spawn(OWNER, str(tmp_path))
    dead = Path(made)
    assert dead.name.startswith(f"looprl-{proc.pid}-{start_ticks(proc.pid)}-vllm-model-")
    mine = ram_dir("weights", root=tmp_path)  # this process runs: never removed
    other_live, other_made = _spawn(OWNER, str(tmp_path))
    try:
        _kill9(proc)
        sweep = sweep_ram_dirs(tmp_path)
    finally:
        _kill9(other_live)
    assert not dead.exists() and mine.is_dir() and Path(other_made).is_dir()
    assert (sweep.removed, sweep.freed_bytes, sweep.pids) == (1, 300_000, (proc.pid,))
    assert sweep.line() == (
        f"freed 293.0 KB in {tmp_path}: removed 1 directory left by looprl processes that no "
        f"longer run (pid {proc.pid})"
    )


def test_an_unreaped_owner_counts_as_dead(tmp_path) -> None:
    """A trainer killed while its parent has not collected it yet is a zombie: it owns nothing."""
    proc, made = _spawn(OWNER, str(tmp_path))
    proc.send_signal(signal.SIGKILL)
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped: a zombie
    try:
        assert sweep_ram_dirs(tmp_path).removed == 1 and not Path(made).exists()
    finally:
        proc.wait()


def test_a_recycled_pid_is_not_the_owner_and_other_names_are_left(tmp_path) -> None:
    """Our own pid with another start time is a dead owner whose pid came back for someone else."""
    pid, start = os.getpid(), start_ticks(os.getpid())
    assert start is not None
    recycled = tmp_path / f"looprl-{pid}-{start + 1}-weights-abcd"
    live = tmp_path / f"looprl-{pid}-{start}-weights-efgh"
    unstamped = [tmp_path / "looprl-weights-old", tmp_path / "looprl-vllm-1.log", tmp_path / "x"]
    for path in (recycled, live, unstamped[0], unstamped[2]):
        path.mkdir()
    unstamped[1].write_text("a file, not a directory")
    sweep = sweep_ram_dirs(tmp_path)
    assert sweep.removed == 1 and not recycled.exists()
    assert live.is_dir() and all(p.exists() for p in unstamped)


def test_a_sweep_that_finds_nothing_prints_nothing(tmp_path, capsys) -> None:
    ram_dir("weights", root=tmp_path)
    assert sweep_and_report(tmp_path).line() is None
    assert capsys.readouterr().out == ""
    assert sweep_ram_dirs(tmp_path / "missing").removed == 0  # no such root: nothing to do


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch) -> Path:
    """vLLM's entry point replaced by a stdlib server; returns a model directory it accepts."""
    package = tmp_path / "fake" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (package, package.parent, package.parent.parent):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(FAKE_VLLM)
    monkeypatch.setenv("LOOPRL_VLLM_PYTHON", sys.executable)
    monkeypatch.setenv("PYTHONPATH", _child_env(tmp_path / "fake")["PYTHONPATH"])
    model = tmp_path / "model"
    model.mkdir()
    return model


TRAINER = """
    import json, sys, time
    from pathlib import Path
    from looprl.engines.ram_dirs import ram_dir
    from looprl.engines.vllm_server import VLLMServer
    dirs = [ram_dir(p, root=Path(sys.argv[2])) for p in ("vllm-model", "weights")]
    server = VLLMServer(sys.argv[1], startup_timeout=60, remove_if_orphaned=tuple(dirs))
    server.start()
    print(json.dumps({"dirs": [str(d) for d in dirs], "log": str(server.log_path),
                      "shim": server.process.pid}), flush=True)
    time.sleep(120)
"""


def test_the_shim_removes_a_sigkilled_trainers_ram(fake_vllm, tmp_path) -> None:
    ram = tmp_path / "ram"
    ram.mkdir()
    trainer, line = _spawn(TRAINER, str(fake_vllm), str(ram), env=dict(os.environ))
    made = json.loads(line)
    paths = [Path(p) for p in [*made["dirs"], made["log"]]]
    assert all(p.exists() for p in paths)
    _kill9(trainer)
    deadline = time.monotonic() + 20
    while any(p.exists() for p in paths) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in paths if p.exists()]  # model export, weights, the clean server's log
    while Path(f"/proc/{made['shim']}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert start_ticks(made["shim"]) is None  # the server went with its trainer


THREAD_TRAINER = """
    import json, sys, threading, time
    from pathlib import Path
    from looprl.engines.ram_dirs import ram_dir
    from looprl.engines.vllm_server import VLLMServer
    dirs = [ram_dir("weights", root=Path(sys.argv[2]))]
    server = VLLMServer(sys.argv[1], startup_timeout=60, remove_if_orphaned=tuple(dirs))
    starter = threading.Thread(target=server.start)  # any thread may start a server
    starter.start()
    starter.join()
    time.sleep(1.0)  # the shim has had its parent-death signal for the ended thread
    print(json.dumps({"dirs": [str(d) for d in dirs], "shim": server.process.pid,
                      "healthy": server.healthy()}), flush=True)
    time.sleep(120)
"""


def test_a_server_started_from_a_thread_that_ends_lives_on_until_its_trainer_dies(
    fake_vllm, tmp_path
) -> None:
    """The kernel's parent-death signal comes when the starting thread ends, not the process:
    the shim tells the two apart by its parent's process id and keeps serving."""
    ram = tmp_path / "ram"
    ram.mkdir()
    trainer, line = _spawn(THREAD_TRAINER, str(fake_vllm), str(ram), env=dict(os.environ))
    made = json.loads(line)
    assert made["healthy"] and start_ticks(made["shim"]) is not None
    _kill9(trainer)
    deadline = time.monotonic() + 20
    while Path(made["dirs"][0]).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(made["dirs"][0]).exists()


def test_a_clean_stop_removes_the_log_and_keeps_the_live_owners_ram(fake_vllm, tmp_path) -> None:
    from looprl.engines.vllm_server import VLLMServer

    ram = ram_dir("weights", root=tmp_path)
    given = tmp_path / "server.log"
    with VLLMServer(fake_vllm, startup_timeout=60, remove_if_orphaned=(ram,)) as server:
        assert server.log_path.exists()
    with VLLMServer(fake_vllm, startup_timeout=60, log_path=given):
        pass
    assert not server.log_path.exists()  # a temporary log, and the server never failed
    assert ram.is_dir()  # its owner (this process) stopped the server: the shim kept it
    assert "fake vLLM serving" in given.read_text()  # a log the caller named is theirs


def test_a_server_that_failed_keeps_its_log(fake_vllm, tmp_path) -> None:
    from looprl.engines.vllm_server import VLLMServer, VLLMServerError

    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "broken").write_text("")
    server = VLLMServer(broken, startup_timeout=60)
    with pytest.raises(VLLMServerError, match=r"exited with code 1 .*end of its log") as err:
        server.start()
    assert str(server.log_path) in str(err.value) and "no_such_architecture" in str(err.value)
    assert "no_such_architecture" in server.log_path.read_text()  # kept for the user to read
    server.log_path.unlink()

    died = VLLMServer(fake_vllm, startup_timeout=60)
    died.start()
    os.killpg(died.process.pid, signal.SIGKILL)  # type: ignore[union-attr]
    died.process.wait()  # type: ignore[union-attr]
    died.stop()
    assert died.log_path.exists()  # it died on its own: the log says why
    died.log_path.unlink()


def test_a_vllm_engine_sweeps_at_start_and_names_its_weights_after_its_process(
    fake_vllm, capsys
) -> None:
    from looprl.engines.config import EngineSection
    from looprl.engines.factory import vllm_engine

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    leftover = ram_root() / f"looprl-{gone.stdout.strip()}-1-weights-testleftover"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(bytes(2048))
    engine = vllm_engine(None, EngineSection(kind="vllm", startup_timeout=60), max_model_len=64,
                         seed=0, model_dir=fake_vllm)  # fmt: skip
    try:
        assert not leftover.exists()
        out = capsys.readouterr().out  # other dead runs' directories may be swept with it
        assert "note: freed " in out and f" in {ram_root()}: removed " in out
        assert gone.stdout.strip() in out.split("(pid ")[1]
        weights = engine._weights_root
        assert weights.name.startswith(f"looprl-{os.getpid()}-{start_ticks(os.getpid())}-weights-")
        assert str(weights) in engine.servers[0].command(Path(sys.executable))
        log = engine.servers[0].log_path
    finally:
        asyncio.run(engine.close())
        shutil.rmtree(leftover, ignore_errors=True)
    assert not weights.exists() and not log.exists()
