"""The sandbox (grading/sandbox.py) and the code grader (grading/code.py).

Every isolation mode this machine has is tested (bwrap, unshare, none; a mode it lacks is skipped
with the reason). Right programs score 1 and wrong ones 0 on both test formats; each hostile program
scores 0 within its time limit and leaves nothing behind: no live process of the sandbox, no file
outside its directory, the machine's memory back (a mode's hostile programs are graded at once, as
a training batch is). A case that needs an isolation a mode does not
give (the network without namespaces, a world-readable file without bwrap) is skipped in that mode
with the reason, never passed vacuously. Run with -s to see what each case did.
"""
import ast
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from grading import sandbox
from grading.code import (CodeGrader, CodeVerdict, CodeTests, CodeTestsError, extract_program, outputs_match,
                          parse_tests, returns_match)
from grading.sandbox import ISOLATIONS, Limits, Sandbox, SandboxError
from helpers import fenced, fixture_problems

LIMITS = Limits(timeout=1.0)
SLACK = 2.0  # seconds a hostile case may take beyond its time limit: set-up, the kill, the sweep
MB = 1 << 20
SUM = parse_tests({"inputs": ["1 2\n"], "outputs": ["3\n"]})  # what every hostile program is graded on


def make_box(mode: str) -> Sandbox:
    """A sandbox in `mode`, with our interpreter, or else one other users can read (as root without
    bwrap, the programs' uid cannot reach an interpreter under /root); skips with the reason."""
    why = ""
    for python in (sys.executable, "/usr/bin/python3"):
        try:
            return Sandbox(mode, python=python, limits=LIMITS)
        except SandboxError as e:
            why = str(e)
    pytest.skip(f"isolation {mode!r} does not work here: {why}")


@pytest.fixture(scope="module", params=ISOLATIONS)
def box(request):
    return make_box(request.param)


def sandbox_processes() -> list[int]:
    """Live processes of any sandbox run: as root, those of the sandbox uids; otherwise ours whose
    HOME is a sandbox directory (every run's environment sets it)."""
    if os.geteuid() == 0:
        return [pid for uid in range(sandbox.UID_BASE, sandbox.UID_BASE + 8)
                for pid, (zombie, _) in sandbox._processes_of(uid).items() if not zombie]
    found = []
    for pid, _ in sandbox._processes_of(os.getuid()).items():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(e == b"HOME=/sandbox" or e.startswith(b"HOME=" + bytes(sandbox._sandbox_home()) + b"/run-")
               for e in env):
            found.append(pid)
    return found


def meminfo(field: str) -> int:
    """Bytes of a /proc/meminfo field: Committed_AS (the commit charge: every process's private
    writable memory, SysV shared memory and tmpfs pages); Shmem (SysV shared memory and tmpfs files)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def workdirs() -> set[str]:
    """The run directories that exist (grading/sandbox.py keeps them in one directory per user)."""
    return {p.name for p in sandbox._sandbox_home().glob("run-*")}


# What an attack needs isolated, and who isolates it: the modes whose namespaces do, and whether,
# as root, the run's own uid does in the other modes (see grading/sandbox.py's threat model).
CONTAINMENT = {
    "other processes": ({"bwrap", "unshare"}, True),  # signals to them; daemons outliving the run
    "the process count": ({"bwrap", "unshare"}, True),  # counted per run, not over all our processes
    "SysV IPC": ({"bwrap", "unshare"}, True),  # objects outliving the run (root: removed by uid)
    "the network": ({"bwrap", "unshare"}, False),
    "private files": ({"bwrap"}, True),  # files of ours that other users may not read
    "world-readable files": ({"bwrap"}, False),
    "writes outside its directory": ({"bwrap"}, True),  # (root: its entries in /tmp... are removed)
}


def not_isolated(box, what: str) -> str:
    """Why `box` does not isolate `what` on this machine; "" where it does (or `what` is "")."""
    modes, by_uid = CONTAINMENT.get(what, (set(ISOLATIONS), False))
    if box.isolation in modes or (by_uid and os.geteuid() == 0):
        return ""
    return f"isolation {box.isolation!r} does not isolate {what}" + (" when not root" if by_uid else "")


def require(box, what: str) -> None:
    """Skip, with the reason, where `box` does not isolate `what` on this machine."""
    why = not_isolated(box, what)
    if why:
        pytest.skip(why)


# ----------------------------------------------------------------------------- extraction and comparison

@pytest.mark.parametrize("response, program", [
    ("```python\nprint(1)\n```", "print(1)\n"),
    ("```py\nprint(1)\n```\n```python\nprint(2)\n```\ntext", "print(2)\n"),  # the last block
    ("```python\nprint(1)\n```\n```text\nnot code\n```", "print(1)\n"),  # the last *python* block
    ("```python\nprint(1)\n```\n```python\nprint(2)", "print(1)\n"),  # an unclosed block is no program
    ("1. step\n   ```python\n   x = 1\n   print(x)\n   ```", "x = 1\nprint(x)\n"),  # indented in a list
    ("```python\ns = '```python inside a string'\n```", "s = '```python inside a string'\n"),  # not at a line start
    ("no code at all", None),
    ("```python\n" + "x = 1\n" * 30000 + "```", ""),  # past MAX_PROGRAM_CHARS: too long
])
def test_extract_program(response, program):
    assert extract_program(response) == program


@pytest.mark.parametrize("response", [
    "```python\n" * (MB // 10),  # a megabyte of opening fences
    "```\n" * (MB // 4),  # a megabyte of fences alternating open/close
    "`" * (4 * MB),  # one 4 MB run of backticks
    "(" * (4 * MB) + "```python\nprint(1)\n```",  # deep nesting, then a block
    " " * (4 * MB) + "```python",  # a 4 MB indent before an unclosed fence
])
def test_extract_program_is_bounded_on_hostile_responses(response):
    start = time.perf_counter()
    extract_program(response)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("got, expected, same", [
    ("3\n", "3", True),
    ("  3  \r\n\n\n", "3\n", True),  # each line stripped, the whole output stripped
    ("2.5\n", "2.50", True),  # equal as Decimal tokens
    ("1 2  3\n", "1 2 3", True),  # tokens compare as Decimals when the lines differ in spacing
    ("3\n4\n", "3 4\n", False),  # line structure counts
    ("3\n\n4", "3\n4", False),  # an empty line inside the output counts
    ("abc", "abd", False),
    ("sNaN", "sNaN", True),  # equal strings never reach Decimal
    ("sNaN 1", "sNaN 2", False),  # comparing a signalling NaN raises in Decimal: no match, no crash
])
def test_outputs_match_follows_livecodebench(got, expected, same):
    assert outputs_match(got, expected) is same


@pytest.mark.parametrize("value, expected, same", [
    ([1, 2], [1, 2], True), (3, [3], True), ([1, 2], [[1, 2]], True), ({"1": 2}, {"1": 2}, True),
    (1, [1, 2], False),  # APPS would take the first element of any list; only one-element lists unwrap
    (1.0, 1, True), ("1", 1, False), (None, [None], True),
])
def test_returns_match_follows_apps(value, expected, same):
    assert returns_match(value, expected) is same


@pytest.mark.parametrize("spec, message", [
    ("{not json", "p.jsonl:4: tests: not valid JSON"),
    ([1, 2], "expected an object"),
    ({"inputs": [], "outputs": []}, "must be non-empty lists"),
    ({"inputs": ["1"], "outputs": ["1", "2"]}, "1 inputs but 2 outputs"),
    ({"inputs": [1], "outputs": ["1"]}, "inputs[0]: expected a string"),
    ({"fn_name": "f", "inputs": [1], "outputs": [1]}, "inputs[0] must be the list of arguments to f"),
    ({"fn_name": 3, "inputs": [[1]], "outputs": [1]}, "'fn_name' must be a string"),
])
def test_parse_tests_errors_name_the_field(spec, message):
    with pytest.raises(CodeTestsError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_tests(spec, "p.jsonl:4: tests")


def test_parse_tests_reads_apps_text_and_line_lists():
    tests = parse_tests(json.dumps({"inputs": [["1 2", "3"]], "outputs": [["3", "3"]]}))
    assert tests == CodeTests(["1 2\n3"], ["3\n3"])


# ----------------------------------------------------------------------------- the sandbox

def test_run_feeds_stdin_and_reads_both_outputs_concurrently(box):
    """1 MB in and out at once: a pipe buffer is 64 KiB, so feeding and reading must interleave."""
    result = box.run("import sys\ndata = sys.stdin.buffer.read()\nsys.stdout.buffer.write(data)\n"
                     "sys.stderr.write('done')", stdin=b"x" * MB)
    assert result.ok and result.stdout == b"x" * MB and result.stderr == b"done"


def test_output_cap_is_exact():
    box = make_box("auto")
    capped = Sandbox(box.isolation, python=box.python, limits=Limits(timeout=5, stdout=1000))
    exact = capped.run("import sys; sys.stdout.write('x' * 1000)")
    over = capped.run("import sys; sys.stdout.write('x' * 1001)")
    assert exact.ok and exact.stdout == b"x" * 1000
    assert over.killed == "output_limit" and over.stdout == b"x" * 1000


def test_environment_is_scrubbed_and_python_isolated(box, monkeypatch):
    monkeypatch.setenv("RLVR_SECRET_TOKEN", "hunter2")
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    result = box.run("import os, sys\nprint(sorted(os.environ))\nprint(sys.flags.isolated, sys.flags.no_site)\n"
                     "print(os.listdir('.'))\nexit(3)")
    lines = result.stdout.decode().splitlines()
    assert result.exit_code == 3  # exit() works although -S leaves out site
    assert set(ast.literal_eval(lines[0])) <= {"HOME", "LANG", "PATH", "TMPDIR", "PWD"}  # bwrap sets PWD
    assert lines[1:] == ["1 1", "['main.py']"]  # a fresh directory with the program alone


@pytest.mark.skipif(os.geteuid() != 0, reason="runs as its own uid only when we are root")
def test_root_runs_programs_as_a_leased_uid_without_capabilities(box):
    result = box.run("import os\nprint(os.getuid(), os.getgid(), os.getgroups())\n"
                     "print([l for l in open('/proc/self/status') if l.startswith('CapEff')])")
    uid, gid, groups = result.stdout.decode().splitlines()[0].split(" ", 2)
    assert box.uid_base <= int(uid) < box.uid_base + sandbox.UID_SLOTS and gid == uid and groups == "[]"
    assert "CapEff:\\t0000000000000000\\n" in result.stdout.decode()


def test_process_limit_is_per_run(box):
    """Two runs at once each fork 8 children under a limit of 16: with a shared count (one uid for
    all runs, or our own uid without a user namespace) the second would be refused."""
    require(box, "the process count")
    program = ("import os, time\nkids = 0\nfor _ in range(8):\n    if os.fork() == 0:\n        time.sleep(0.3)\n"
               "        os._exit(0)\n    kids += 1\nprint(kids)\nfor _ in range(kids): os.wait()")
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: box.run(program), range(2)))
    assert [r.stdout for r in results] == [b"8\n", b"8\n"], [r.stderr[-200:] for r in results]


def test_auto_falls_back_and_warns_when_bwrap_is_missing(monkeypatch):
    real_which = shutil.which
    monkeypatch.setattr(sandbox.shutil, "which", lambda tool: None if tool == "bwrap" else real_which(tool))
    monkeypatch.setattr(sandbox, "_warned", set())
    box = make_box("auto")
    assert box.isolation != "bwrap" and box.passed_over["bwrap"] == "bwrap is not installed"
    assert any("not using bwrap" in note or "no Linux namespaces" in note for note in sandbox._warned)
    assert all("apt install bubblewrap" in note for note in sandbox._warned)


@pytest.mark.parametrize("mode, root, says", [
    ("bwrap", True, ""),
    ("unshare", True, "share this machine's filesystem"),
    ("unshare", False, "as you: they can read and write everything you can"),
    ("none", True, "they cannot signal your processes"),
    ("none", False, "they can signal your processes"),
])
def test_isolation_note_says_what_is_not_isolated(mode, root, says):
    note = sandbox.isolation_note(mode, root, {"bwrap": "bwrap is not installed"})
    assert says in note
    if mode != "bwrap":
        assert "bwrap is not installed" in note and "apt install bubblewrap" in note


def test_unknown_isolation_is_an_error():
    with pytest.raises(SandboxError, match="isolation 'docker': expected auto, bwrap, unshare, none"):
        Sandbox("docker")


# ----------------------------------------------------------------------------- grading

def test_fixture_right_programs_score_1_and_wrong_ones_0(box):
    problems = fixture_problems()
    assert {bool(parse_tests(p["tests"]).fn_name) for p in problems} == {True, False}  # both formats
    items = [(fenced(p[kind]), parse_tests(p["tests"], p["name"])) for p in problems for kind in ("right", "wrong")]
    verdicts = CodeGrader(box, workers=2).grade_all(items)
    for p, right, wrong in zip(problems, verdicts[::2], verdicts[1::2]):
        n = len(p["tests"]["inputs"])
        assert right == CodeVerdict(1.0, 1.0, ""), p["name"]
        assert wrong == CodeVerdict(0.0, p["wrong_passes"] / n, ""), p["name"]


def test_forged_harness_lines_do_not_pass(box):
    """A function program that prints result lines for every possible answer fails: each test must
    be answered by exactly one line."""
    tests = parse_tests({"fn_name": "is_even", "inputs": [[2], [3]], "outputs": [True, False]})
    forger = ("import os\nfor i in range(2):\n    for guess in ('true', 'false'):\n"
              "        os.write(1, f'@@rlvr-result [{i}, true, {guess}]\\n'.encode())\n"
              "def is_even(n):\n    return None")
    assert CodeGrader(box).grade(fenced(forger), tests) == CodeVerdict(0.0, 0.0, "")


def test_no_code_and_crashes_are_counted_failures(box):
    grader = CodeGrader(box)
    assert grader.grade("the answer is 3", SUM) == CodeVerdict(0.0, 0.0, "no_code")
    assert grader.grade(fenced("raise SystemExit(1)"), SUM) == CodeVerdict(0.0, 0.0, "crash")
    assert grader.grade(fenced("print(3)\nraise ValueError"), SUM) == CodeVerdict(0.0, 0.0, "crash")
    assert grader.grade(fenced("def f(:"), parse_tests({"fn_name": "f", "inputs": [[1]], "outputs": [1]})) \
        == CodeVerdict(0.0, 0.0, "crash")


@pytest.mark.slow
def test_budget_bounds_a_batch_and_the_rest_goes_on():
    box = make_box("auto")
    right = fenced("a, b = map(int, input().split())\nprint(a + b)")
    items = [(fenced("while True: pass"), SUM)] * 4 + [(right, SUM)]
    start = time.monotonic()
    verdicts = CodeGrader(box, workers=2).grade_all(items, budget=1.5)
    elapsed = time.monotonic() - start
    assert [v.failure for v in verdicts[:2]] == ["timeout", "timeout"]  # 1 s each, within the budget
    assert [v.failure for v in verdicts[2:]] == ["budget"] * 3  # cut by it, or never started
    assert elapsed < 1.5 + SLACK
    assert CodeGrader(box).grade_all([(right, SUM)] * 2) == [CodeVerdict(1.0, 1.0, "")] * 2


# ----------------------------------------------------------------------------- hostile programs

DAEMON = """import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
    os._exit(0)
"""
SHM = """import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
size = 300 << 20
segment = libc.shmget(0, ctypes.c_size_t(size), 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
address = libc.shmat(segment, None, 0)
ctypes.memset(address, 1, size)  # touch every page
"""
# name -> (program, the failures it may score with, what it needs contained beyond the limits).
HOSTILE = {
    "infinite_loop": ("while True: pass", {"timeout"}, ""),
    "fork_bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
                  {"timeout"}, ""),
    "allocate_50GB": ("x = bytearray(50 << 30)", {"crash"}, ""),
    "write_10GB": ("with open('big', 'wb') as f:\n    for _ in range(10 << 10):\n        f.write(bytes(1 << 20))",
                   {"crash"}, ""),
    "kill_parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", {"", "crash"}, "other processes"),
    "double_forked_daemon": (DAEMON, {""}, "other processes"),
    "one_MB_lines": ("while True: print('x' * (1 << 20))", {"output_limit"}, ""),
    "deep_recursion": ("import sys\nsys.setrecursionlimit(10 ** 9)\ndef f(n): return f(n + 1) + 1\nf(0)",
                       {"crash", "timeout"}, ""),
    "stdin_forever": ("import sys\nwhile True: sys.stdin.read()", {"timeout"}, ""),
    "hold_600MB": ("x = b'x' * (600 << 20)\nwhile True: pass", {"timeout"}, ""),  # memory comes back
    "sysv_shared_memory_300MB": (SHM, {"", "timeout"}, "SysV IPC"),  # memory that would outlive the program
}


def graded_hostile(box, cases: dict[str, tuple[str, set[str], float]]) -> None:
    """Grade the program of each case {name: (program, failures it may score with, its reward)} at
    once, one run each, as a batch is graded; check each reward and failure, the batch's time, and
    that nothing was left behind: no process, no directory, no memory (its processes' memory goes
    with them; what could outlive them, shared memory and tmpfs files, shows in Shmem). Memory is
    counted by the commit charge, not MemAvailable: on a VM whose balloon has free page reporting
    (Firecracker's, this test's machine), freed pages leave the free lists while the host takes them
    back, so 1.2 GB freed by a plain process left MemFree 284 MB short that came back at ~35 MB/s,
    while Committed_AS was back at once. Other jobs on the machine move both; 256 MB is under the
    smallest hold a hostile case makes (300 MB)."""
    before_commit, before_shm, before_dirs = meminfo("Committed_AS"), meminfo("Shmem"), workdirs()
    start = time.monotonic()
    verdicts = CodeGrader(box, workers=len(cases)).grade_all([(fenced(program), SUM)
                                                              for program, _, _ in cases.values()])
    elapsed = time.monotonic() - start
    print(f"\n  {box.isolation}: {len(cases)} program(s) in {elapsed:.2f} s")
    for (name, (_, allowed, reward)), verdict in zip(cases.items(), verdicts):
        print(f"  {box.isolation} {name}: {verdict}")
        assert verdict.reward == reward and verdict.failure in allowed, (name, verdict)
    assert elapsed < LIMITS.timeout + SLACK
    assert sandbox_processes() == []
    assert workdirs() <= before_dirs
    # an IPC namespace's segments go with its last process, a moment after the process is reaped
    deadline = time.monotonic() + 5
    while (meminfo("Shmem") > before_shm + 64 * MB or meminfo("Committed_AS") > before_commit + 256 * MB) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert meminfo("Shmem") < before_shm + 64 * MB
    assert meminfo("Committed_AS") < before_commit + 256 * MB


@pytest.mark.slow
def test_hostile_programs_score_0_and_leave_nothing(box):
    """Every hostile program this mode contains, graded at once. The daemons sleep 60 s, one after
    its parent printed the right answer (scored 1): nothing of them exists after the batch, nor a
    few tenths of a second later."""
    cases = {name: (program, failures, 0.0) for name, (program, failures, needs) in HOSTILE.items()
             if not not_isolated(box, needs)}
    if not not_isolated(box, "other processes"):
        cases["daemon_after_the_right_answer"] = (DAEMON + "print(3)", {""}, 1.0)
    for name in HOSTILE.keys() - cases.keys():
        print(f"\n  {box.isolation} {name}: not run, {not_isolated(box, HOSTILE[name][2])}")
    graded_hostile(box, cases)
    for _ in range(3):
        time.sleep(0.1)
        assert sandbox_processes() == []


def test_kill_of_an_outside_process_fails(box):
    require(box, "other processes")
    victim = subprocess.Popen(["sleep", "30"])
    try:
        graded_hostile(box, {"kill_outside": (f"import os, signal\nos.kill({victim.pid}, signal.SIGKILL)\n"
                                              f"os.kill(-1, signal.SIGKILL)", {"", "crash"}, 0.0)})
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.parametrize("visibility", ["private", "world_readable"])
def test_read_of_a_file_outside_its_directory_fails(box, visibility, tmp_path):
    require(box, f"{visibility.replace('_', '-')} files")
    folder = Path(tempfile.mkdtemp()) if visibility == "world_readable" else tmp_path
    try:
        folder.chmod(0o755 if visibility == "world_readable" else 0o700)
        secret = folder / "secret.txt"
        secret.write_text("the-gold-answers")
        secret.chmod(0o644 if visibility == "world_readable" else 0o600)
        program = f"try:\n    print(open({str(secret)!r}).read())\nexcept OSError as e:\n    print(type(e).__name__)"
        result = box.run(program)
        assert b"the-gold-answers" not in result.stdout and result.stdout.strip() in (
            b"FileNotFoundError", b"PermissionError"), result
        graded_hostile(box, {f"read_{visibility}": (program, {""}, 0.0)})
    finally:
        if visibility == "world_readable":
            shutil.rmtree(folder)


def test_write_outside_its_directory_leaves_nothing(box):
    require(box, "writes outside its directory")
    target = Path(tempfile.gettempdir()) / f"rlvr-escaped-{os.getpid()}"
    graded_hostile(box, {"write_outside": (f"import os\nos.makedirs({str(target)!r})\n"
                                           f"open({str(target / 'f')!r}, 'w').write('x')", {"", "crash"}, 0.0)})
    assert not target.exists()


def test_connection_to_a_local_port_does_not_arrive(box):
    require(box, "the network")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.3)
        port = listener.getsockname()[1]
        graded_hostile(box, {"connect_to_loopback": (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), "
                                                     f"timeout=0.5)\ns.sendall(b'stolen')", {"crash"}, 0.0)})
        with pytest.raises(socket.timeout):
            listener.accept()


def test_nothing_outlives_a_grader_that_dies(box):
    """SIGKILL the grading process while its program sleeps: the program dies with it (bwrap
    --die-with-parent; under unshare and none a parent-death signal set by setpriv)."""
    if not box._tools["setpriv"] and box.isolation != "bwrap":
        pytest.skip(f"isolation {box.isolation!r} needs setpriv to die with its parent")
    code = (f"import sys; sys.path.insert(0, {str(Path(sandbox.__file__).parent)!r}); import sandbox\n"
            f"box = sandbox.Sandbox({box.isolation!r}, python={box.python!r}, limits=sandbox.Limits(timeout=60))\n"
            f"print('probed', flush=True)\n"  # the run that follows is the only one
            f"box.run('import time; time.sleep(60)', timeout=60)")
    grader = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert grader.stdout.readline() == b"probed\n"
        deadline = time.monotonic() + 30
        while not sandbox_processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sandbox_processes(), "the program never started"
    finally:
        grader.kill()
        grader.wait()
    deadline = time.monotonic() + 3
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_processes() == []
    assert workdirs(), "its directory is left: nothing of the grader ran after the kill"
    sandbox._remove_stale_workdirs(sandbox._sandbox_home())  # what the next Sandbox() does
    assert workdirs() == set()
