"""Attack battery for the default fork-server sandbox: every escape attempt is contained.

Each case runs hostile code and asserts (1) a clear status, (2) that nothing reached the host
(a listening port, a file, a process), and, through the autouse `healthy` fixture, (3) that the
pool and a bystander session are unaffected afterwards. Runs as root in CI (uid drop, Landlock,
namespaces); cases that need a kernel feature skip with the reason when it is missing.
"""

from __future__ import annotations

import ast
import asyncio
import os
import secrets
import socket
import sys
import time
from pathlib import Path

import pytest
import pytest_asyncio

from looprl.sandbox import ExecResult, ForkServerExecutor, SandboxLimits

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(sys.platform != "linux", reason="the fork-server sandbox is Linux-only"),
]

LIMITS = SandboxLimits(
    timeout=5,
    memory_mb=512,
    max_processes=16,
    max_file_mb=8,
    disk_mb=16,
    max_output_bytes=64 * 1024,
)
SECRET_ENV = "LOOPRL_TEST_SECRET_TOKEN"
SECRET = secrets.token_hex(16)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def box():
    os.environ[SECRET_ENV] = SECRET  # present in the trainer's environment when workers start
    ex = ForkServerExecutor(LIMITS, workers=4)
    await ex.start()
    assert (await ex.execute("bystander = 12345", session_id="bystander")).ok
    yield ex
    await ex.close()
    os.environ.pop(SECRET_ENV, None)


@pytest_asyncio.fixture(loop_scope="module", autouse=True)
async def healthy(box):
    """After every case: the pool still answers and the bystander session kept its state."""
    yield
    r = await box.execute("print(6 * 7)", timeout=10)
    assert r.status == "ok" and r.stdout == "42\n", r
    r = await box.execute("bystander", session_id="bystander")
    assert r.status == "ok" and r.value == "12345", r


def feature(box: ForkServerExecutor, name: str) -> str:
    return str(box.isolation_report().features.get(name, ""))


def need_strong(box: ForkServerExecutor) -> None:
    if box.isolation_report().level != "strong":
        pytest.skip(f"needs root, Landlock and namespaces: {box.isolation_report().summary()}")


def host_pids(predicate) -> list[int]:
    """Live (non-zombie) host processes whose /proc status text satisfies `predicate`."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                found.append((int(name), Path(f"/proc/{name}/status").read_text()))
            except OSError:
                continue
    return [pid for pid, status in found if predicate(status) and "\nState:\tZ" not in status]


async def gone(predicate, within: float = 3.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not host_pids(predicate):
            return True
        await asyncio.sleep(0.05)
    return False


def with_uid(uid: int):
    return lambda status: f"\nUid:\t{uid}\t" in status


def named(comm: str):
    return lambda status: status.startswith(f"Name:\t{comm}\n")


# ---------------------------------------------------------------- network


async def test_tcp_to_listening_localhost_port_is_blocked(box):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        srv.settimeout(0.3)
        port = srv.getsockname()[1]
        code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\ns.sendall(b'escaped')"
        r = await box.execute(code)
        assert r.status == "error" and "PermissionError" in r.message, r
        with pytest.raises(TimeoutError):
            srv.accept()


async def test_udp_to_listening_localhost_port_is_blocked(box):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as srv:
        srv.bind(("127.0.0.1", 0))
        srv.settimeout(0.3)
        port = srv.getsockname()[1]
        code = f"import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'escaped', ('127.0.0.1', {port}))"
        r = await box.execute(code)
        assert r.status == "error" and "PermissionError" in r.message, r
        with pytest.raises(TimeoutError):
            srv.recvfrom(100)


async def test_ipv6_netlink_and_raw_libc_sockets_are_refused(box):
    code = (
        "import ctypes, socket\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print([libc.socket(f, 1, 0) for f in (2, 10, 16, 17)], ctypes.get_errno())\n"
        "socket.socket(socket.AF_INET6)\n"
    )
    r = await box.execute(code)
    assert r.stdout.startswith("[-1, -1, -1, -1] 1"), r  # every family: EPERM
    assert r.status == "error" and "PermissionError" in r.message


async def test_unix_sockets_of_the_host_are_unreachable(box, tmp_path):
    abstract = f"\0looprl-test-{secrets.token_hex(4)}"
    path = tmp_path / "host.sock"
    with socket.socket(socket.AF_UNIX) as a, socket.socket(socket.AF_UNIX) as b:
        a.bind(abstract)
        b.bind(str(path))
        for s in (a, b):
            s.listen()
            s.settimeout(0.2)
        os.chmod(path, 0o777)
        os.chmod(tmp_path, 0o755)
        code = (
            "import socket\nout = []\n"
            f"for addr in ({abstract!r}, {str(path)!r}):\n"
            "    try:\n        socket.socket(socket.AF_UNIX).connect(addr); out.append('connected')\n"
            "    except OSError as e:\n        out.append(type(e).__name__)\n"
            "print(out)"
        )
        r = await box.execute(code)
        assert r.status == "ok" and "connected" not in r.stdout, r
        for s in (a, b):
            with pytest.raises(TimeoutError):
                s.accept()


# ---------------------------------------------------------------- files and environment


async def test_reading_a_secret_file_outside_scratch_fails(box, tmp_path):
    need_strong(box)
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    os.chmod(secret, 0o644)
    os.chmod(tmp_path, 0o755)
    for path in (secret, Path(__file__)):
        r = await box.execute(f"print(open({str(path)!r}).read())")
        assert r.status == "error" and r.message.startswith(
            ("FileNotFoundError", "PermissionError")
        ), r
        assert SECRET not in r.stdout + r.stderr


async def test_host_directories_cannot_be_listed(box):
    need_strong(box)
    code = "import os\nfor d in ('/', '/etc', '/root', '/home', '/work', '/proc', '/tmp'):\n    try:\n        print(d, os.listdir(d))\n    except OSError as e:\n        print(d, type(e).__name__)"
    r = await box.execute(code)
    assert r.status == "ok", r
    assert all(
        line.split()[1] in ("PermissionError", "FileNotFoundError")
        for line in r.stdout.splitlines()
    ), r.stdout


async def test_writing_outside_scratch_fails(box, tmp_path):
    need_strong(box)
    os.chmod(tmp_path, 0o777)
    targets = [
        f"/tmp/looprl-escape-{secrets.token_hex(4)}",
        str(tmp_path / "escape"),
        "/dev/shm/escape",
        "/escape",
    ]
    code = (
        "out = []\n"
        f"for p in {targets!r}:\n"
        "    try:\n        open(p, 'w').write('x'); out.append('written')\n"
        "    except OSError as e:\n        out.append(type(e).__name__)\n"
        "print(out)"
    )
    r = await box.execute(code)
    assert r.status == "ok" and "written" not in r.stdout, r
    assert not any(os.path.exists(t) for t in targets)


async def test_symlink_out_of_scratch_does_not_grant_access(box):
    need_strong(box)
    r = await box.execute(f"import os\nos.symlink({__file__!r}, 'link')\nopen('link').read()")
    assert r.status == "error" and r.message.startswith(("FileNotFoundError", "PermissionError")), r


async def test_parent_environment_is_invisible(box):
    code = (
        "import os\nprint(dict(os.environ))\n"
        f"for p in ('/proc/{os.getpid()}/environ', '/proc/1/environ', '/proc/self/environ'):\n"
        "    try:\n        print(open(p, 'rb').read())\n    except OSError as e:\n        print(p, type(e).__name__)"
    )
    r = await box.execute(code)
    assert r.status == "ok", r
    assert SECRET not in r.stdout and SECRET_ENV not in r.stdout
    assert "'HOME'" in r.stdout and "PATH" in r.stdout  # the minimal environment is there


async def test_scratch_directory_is_fresh_for_every_call(box):
    await box.execute("open('left_behind.txt', 'w').write('x')")
    for _ in range(4):  # land on every worker
        r = await box.execute("import os\nos.listdir('.')")
        assert r.status == "ok" and r.value == "[]", r


# ---------------------------------------------------------------- processes


async def test_fork_bomb_is_contained_and_swept(box):
    comm = f"lrb{secrets.token_hex(4)}"  # every process of the bomb carries this name
    code = (
        f"import ctypes, os\nctypes.CDLL(None).prctl(15, b'{comm}', 0, 0, 0)\n"
        "print(os.getuid(), flush=True)\n"
        "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    )
    r = await box.execute(code, timeout=2)
    assert r.status == "timeout", r
    assert await gone(named(comm)), f"fork bomb {comm} survived the call"
    uid = int(r.stdout.split()[0])
    if uid != os.getuid():  # as root, a uid of its own: at most the next spare child has it
        assert await until(lambda: len(host_pids(with_uid(uid))) <= 1)


async def test_thread_bomb_hits_the_process_limit(box):
    code = "import threading, time\nts = [threading.Thread(target=time.sleep, args=(30,), daemon=True) for _ in range(200)]\nfor t in ts:\n    t.start()"
    r = await box.execute(code)
    assert r.status == "error" and "can't start new thread" in r.message, r


async def test_double_forked_setsid_daemon_does_not_survive_the_call(box):
    comm = f"lrd{secrets.token_hex(4)}"
    code = (
        "import ctypes, os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        ctypes.CDLL(None).prctl(15, b'{comm}', 0, 0, 0)\n"
        "        open('alive', 'w').close()\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "for _ in range(200):\n"
        "    if os.path.exists('alive'):\n        break\n"
        "    time.sleep(0.01)\n"
        "print('daemon started' if os.path.exists('alive') else 'no daemon')"
    )
    r = await box.execute(code)
    assert r.status == "ok" and r.stdout == "daemon started\n", r
    assert await gone(named(comm)), f"daemon {comm} survived the call"


async def test_signalling_or_ptracing_the_worker_fails(box):
    code = (
        "import ctypes, os, signal\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.ptrace(16, os.getppid(), 0, 0), ctypes.get_errno())\n"
        "for pid in (os.getppid(), 1, -1):\n"
        "    try:\n        os.kill(pid, signal.SIGKILL); print(pid, 'sent')\n"
        "    except OSError as e:\n        print(pid, type(e).__name__)\n"
    )
    r = await box.execute(code)
    assert r.status == "ok", r
    lines = r.stdout.splitlines()
    assert lines[0] == "-1 1"  # ptrace: EPERM
    assert lines[1].endswith("PermissionError") and lines[2].endswith("PermissionError"), r.stdout
    # kill(-1) may "succeed" but can only reach the call's own processes: see the healthy fixture


async def test_spawning_a_shell_fails(box):
    code = (
        "import os, subprocess\n"
        "print('system', os.system('echo pwned'))\n"
        "subprocess.run(['/bin/sh', '-c', 'echo pwned'])\n"
    )
    r = await box.execute(code)
    assert r.status == "error" and r.message.startswith("PermissionError"), r
    assert "pwned" not in r.stdout and "system 0" not in r.stdout


async def test_ctypes_privileged_libc_calls_fail(box):
    code = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.getpid() > 0)\n"  # ordinary calls work
        "print([libc.setuid(0), libc.unshare(0x10000000), libc.chroot(b'/'), "
        "libc.mount(b'none', b'.', b'tmpfs', 0, None), libc.unshare(0x40000000)])"
    )
    r = await box.execute(code)
    assert r.status == "ok" and r.stdout == "True\n[-1, -1, -1, -1, -1]\n", r


async def test_raising_own_limits_is_refused(box):
    code = (
        "import resource\n"
        "for name in ('RLIMIT_CPU', 'RLIMIT_AS', 'RLIMIT_NPROC', 'RLIMIT_NOFILE', 'RLIMIT_FSIZE'):\n"
        "    r = getattr(resource, name)\n"
        "    soft, hard = resource.getrlimit(r)\n"
        "    try:\n"
        "        resource.setrlimit(r, (hard + 1000, hard + 1000))\n"
        "        print(name, 'RAISED')\n"
        "    except (ValueError, OSError):\n"
        "        print(name, 'refused', soft == hard)\n"
    )
    r = await box.execute(code)
    assert r.status == "ok", r
    assert r.stdout.count("refused True") == 5 and "RAISED" not in r.stdout, r.stdout


async def test_exiting_the_interpreter(box):
    assert (await box.execute("import sys\nsys.exit(0)")).status == "ok"
    r = await box.execute("import sys\nsys.exit(3)")
    assert r.status == "error" and "SystemExit: 3" in r.message
    r = await box.execute("import os\nprint('bye', flush=True)\nos._exit(4)")
    assert r.status == "error" and "code 4" in r.message and r.stdout == "bye\n", r
    r = await box.execute("import os\nos._exit(70)")  # no exit code can pass for an infra failure
    assert r.status == "error" and r.model_fault, r


async def test_closing_stdout_is_the_codes_error_not_silent_loss(box):
    r = await box.execute("import os\nprint('lost')\nos.close(1)")
    assert r.status == "error" and r.model_fault, r
    assert "stdout could not be written" in r.message and "output was lost" in r.message, r


BYTES_CODE = (
    "import sys\nprint('a')\nsys.stdout.buffer.write(b'b\\n')\nsys.stdout.write('c\\n')\n"
    "sys.stderr.buffer.write(bytearray(b'e\\n'))\nsys.stdout.buffer.flush()\n"
    "sys.stdout.buffer.write(memoryview(b'\\xc3\\xa9\\n'))"
)


async def test_bytes_written_through_sys_stdout_buffer_arrive_in_order(box):
    for sid in (None, "bytes"):
        r = await box.execute(BYTES_CODE, session_id=sid)
        # the trailing expression is write()'s return value: bytes written, as on a real stdout
        assert (r.status, r.stdout, r.stderr, r.value) == ("ok", "a\nb\nc\né\n", "e\n", "3"), r
    r = await box.execute("import sys\nsys.stdout.buffer.write(b'x' * 10**6)", session_id="bytes")
    assert r.status == "output_limit" and len(r.stdout) <= LIMITS.max_output_bytes, r
    r = await box.execute("import sys\nsys.stdout.buffer.write('text')")
    assert r.status == "error" and "bytes-like object is required" in r.message, r
    await box.close_session("bytes")


# ---------------------------------------------------------------- time, memory, output, disk


async def test_infinite_loop_times_out(box):
    start = time.monotonic()
    r = await box.execute("while True: pass", timeout=1)
    assert r.status == "timeout" and "1 s" in r.message, r
    assert time.monotonic() - start < 3


async def test_ten_gib_allocation_is_a_memory_error(box):
    r = await box.execute("x = bytearray(10 * 1024**3)")
    assert r.status == "memory" and "512 MB" in r.message, r
    r = await box.execute("import numpy as np\nnp.ones(10 * 1024**3 // 8)")
    assert r.status == "memory", r


async def test_gradual_memory_growth_is_a_memory_error(box):
    r = await box.execute("chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))")
    assert r.status == "memory", r


async def test_hundred_megabytes_of_output_are_cut(box):
    start = time.monotonic()
    r = await box.execute("print('x' * 100_000_000)")
    assert r.status == "output_limit" and r.truncated, r
    assert len(r.stdout) <= LIMITS.max_output_bytes
    r = await box.execute(
        "import os\nwhile True:\n    os.write(1, b'y' * 65536)"
    )  # bypasses sys.stdout
    assert r.status == "output_limit" and len(r.stdout) <= LIMITS.max_output_bytes, r
    assert time.monotonic() - start < 5


async def test_infinite_generator_printed(box):
    r = await box.execute("import itertools\nfor i in itertools.count():\n    print(i)")
    assert r.status == "output_limit" and r.stdout.startswith("0\n1\n2\n"), r
    r = await box.execute("import itertools\nprint(list(itertools.count()))")
    assert r.status == "memory", r


async def test_filling_the_disk_stops_at_the_scratch_quota(box):
    if box.isolation_report().features.get("scratch_tmpfs") is not True:
        pytest.skip("no size-limited tmpfs scratch on this machine")
    code = (
        "i = 0\ntry:\n    while True:\n        with open(f'f{i}', 'wb') as f:\n            f.write(bytes(1 << 20))\n        i += 1\n"
        "except OSError as e:\n    print(i, e.strerror)"
    )
    r = await box.execute(code)
    assert r.status == "ok" and "No space left on device" in r.stdout, r
    assert int(r.stdout.split()[0]) <= LIMITS.disk_mb


async def test_a_file_larger_than_the_limit_fails(box):
    r = await box.execute("open('big', 'wb').write(bytes(9 * 1024 * 1024))")
    assert r.status == "error" and "File too large" in r.message, r


async def test_deep_recursion(box):
    r = await box.execute("def f(n):\n    return f(n + 1)\nf(0)")
    assert r.status == "error" and r.message.startswith("RecursionError"), r
    code = "import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1)\nf(0)"
    r = await box.execute(code, timeout=2)
    assert r.status in ("killed", "error", "memory", "timeout"), (
        r
    )  # contained whichever limit hits first


# ---------------------------------------------------------------- other sandboxes


async def test_sessions_cannot_touch_each_other(box):
    need_strong(box)
    a = await box.execute(
        "import os\nopen('mine.txt', 'w').write('private')\nprint(os.getcwd(), os.getpid())",
        session_id="victim",
    )
    cwd, pid = a.stdout.split()
    code = (
        "import os, signal\nout = []\n"
        f"try:\n    out.append(open({cwd + '/mine.txt'!r}).read())\nexcept OSError as e:\n    out.append(type(e).__name__)\n"
        f"try:\n    os.kill({pid}, signal.SIGKILL); out.append('killed')\nexcept OSError as e:\n    out.append(type(e).__name__)\n"
        "print(out)"
    )
    for session in (None, "attacker"):
        r = await box.execute(code, session_id=session)
        assert r.status == "ok" and "private" not in r.stdout and "killed" not in r.stdout, r
    r = await box.execute("open('mine.txt').read()", session_id="victim")
    assert r.status == "ok" and r.value == "'private'", r
    await box.close_session("victim")
    await box.close_session("attacker")


async def test_one_misbehaving_call_does_not_slow_the_others(box):
    bad = [
        asyncio.create_task(box.execute("while True: pass", timeout=4)),
        asyncio.create_task(
            box.execute(
                "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", timeout=4
            )
        ),
    ]
    await asyncio.sleep(0.2)
    good = await asyncio.gather(*(box.execute(f"print({i} * 2)") for i in range(40)))
    assert [r.stdout for r in good] == [f"{i * 2}\n" for i in range(40)]
    # not a speed threshold: the 40 quick calls all finished while the runaways still ran
    assert all(not t.done() for t in bad)
    assert [r.status for r in await asyncio.gather(*bad)] == ["timeout", "timeout"]


async def test_many_concurrent_calls_all_succeed(box):
    results = await asyncio.gather(*(box.execute(f"{i} ** 2") for i in range(100)))
    assert [r.value for r in results] == [str(i**2) for i in range(100)]


# ---------------------------------------------------------------- sessions


async def test_session_state_persists_and_resets_after_a_timeout(box):
    sid = "persist"
    assert (
        await box.execute("import numpy as np\nx = 41\ndef f(v):\n    return v + 1", session_id=sid)
    ).ok
    r = await box.execute("f(x)", session_id=sid)
    assert r.status == "ok" and r.value == "42", r
    r = await box.execute("bytearray(10 * 1024**3)", session_id=sid)
    assert r.status == "memory" and not r.session_reset  # recoverable: state kept
    r = await box.execute("print('z' * 10**6)", session_id=sid)
    assert r.status == "output_limit" and not r.session_reset
    assert (await box.execute("np.int64(x)", session_id=sid)).value == "np.int64(41)"
    r = await box.execute("while True: pass", session_id=sid, timeout=1)
    assert r.status == "timeout" and r.session_reset and "reset" in r.message, r
    r = await box.execute("x", session_id=sid)
    assert r.status == "error" and r.message == "NameError: name 'x' is not defined", r
    await box.close_session(sid)


async def test_session_daemon_is_swept_but_the_session_survives(box):
    comm = f"lrs{secrets.token_hex(4)}"
    code = (
        "import ctypes, os, time\nkeep = 'still here'\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        ctypes.CDLL(None).prctl(15, b'{comm}', 0, 0, 0)\n        open('alive', 'w').close()\n        time.sleep(60)\n"
        "    os._exit(0)\n"
        "while not os.path.exists('alive'):\n    time.sleep(0.01)"
    )
    assert (await box.execute(code, session_id="daemon")).ok
    assert await gone(named(comm)), f"daemon {comm} survived the session call"
    r = await box.execute("keep", session_id="daemon")
    assert r.value == "'still here'", r
    await box.close_session("daemon")


SPINNER = (
    "import os, threading\ncount = 0\ndef spin():\n    global count\n    while True:\n"
    "        count += 1\nthreading.Thread(target=spin, daemon=True).start()\n"
    "os.getpid(), os.getuid()"
)


def thread_states(pid: int) -> list[str]:
    """The scheduler state letter of each thread of `pid` (R running, S sleeping, T stopped)."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        states.append(stat[stat.rindex(")") + 2])
    return states


def cpu_ticks(pid: int) -> int:
    """User + system CPU clock ticks used by every thread of `pid` so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def session_host_pid(pid: int, uid: int) -> int:
    """The host pid of a session interpreter that reported (os.getpid(), os.getuid())."""
    if uid == os.getuid():  # a non-root worker: no PID namespace, the sandbox shares our uid
        return pid
    (host,) = host_pids(with_uid(uid))  # as root: a uid of its own
    return host


async def until(condition, within: float = 5.0) -> bool:
    end = time.monotonic() + within
    while not condition():
        if time.monotonic() > end:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_threads_a_session_cell_leaves_running_are_frozen_between_calls(box):
    r = await box.execute(SPINNER, session_id="spinner")
    assert r.ok, r
    host = session_host_pid(*ast.literal_eval(r.value))
    assert len(thread_states(host)) == 2
    # the interpreter is stopped before the reply: every thread at once
    assert await until(lambda: set(thread_states(host)) == {"T"}), thread_states(host)
    before = cpu_ticks(host)
    await asyncio.sleep(1.0)
    assert cpu_ticks(host) == before, "a thread used CPU while no cell ran"
    # the next cell runs, with the session's state and its thread (which runs again meanwhile)
    code = (
        "import time\nc0, end = count, time.monotonic() + 5\n"
        "while count == c0 and time.monotonic() < end:\n    time.sleep(0.01)\ncount > c0"
    )
    r = await box.execute(code, session_id="spinner")
    assert (r.status, r.value, r.session_reset) == ("ok", "True", False), r
    assert await until(lambda: set(thread_states(host)) == {"T"}), thread_states(host)
    await box.close_session("spinner")
    assert await gone(lambda status: f"\nPid:\t{host}\n" in status)


async def test_sessions_are_separate_and_close_session_forgets(box):
    await box.execute("v = 'a'", session_id="s-a")
    await box.execute("v = 'b'", session_id="s-b")
    assert (await box.execute("v", session_id="s-a")).value == "'a'"
    assert (await box.execute("v", session_id="s-b")).value == "'b'"
    await box.close_session("s-a")
    r = await box.execute("v", session_id="s-a")
    assert r.status == "error" and "NameError" in r.message
    await box.close_session("s-a")
    await box.close_session("s-b")


# ---------------------------------------------------------------- report and results


async def test_isolation_report_records_what_was_verified(box):
    report = box.isolation_report()
    d = report.to_dict()
    assert d["backend"] == "forkserver" and d["level"] in ("strong", "partial", "weak")
    assert str(d["verified"].get("inet_socket", "")).startswith("blocked")
    assert "seccomp" in d["features"] and "landlock" in d["features"]
    assert "isolation=" in report.summary()


async def test_values_errors_and_syntax_errors(box):
    r = await box.execute("x = [1, 2]\nx")
    assert r.status == "ok" and r.value == "[1, 2]" and r.stdout == ""
    r = await box.execute("import sympy as sp\nsp.factor(sp.Symbol('x')**2 - 1)")
    assert r.value == "(x - 1)*(x + 1)", r
    r = await box.execute("def f(:\n  pass")
    assert r.status == "error" and r.message.startswith("SyntaxError"), r
    r = await box.execute("raise ValueError('bad input')")
    assert (
        r.status == "error"
        and r.message == "ValueError: bad input"
        and '<cell 1>", line 1' in r.stderr
    )
    assert r.model_fault and not ExecResult("sandbox_error").model_fault
