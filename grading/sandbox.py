"""Run one untrusted Python program in a sandbox: its own processes, limits, and Linux namespaces.

    box = Sandbox()                                   # picks the strongest isolation this machine has
    result = box.run("print(int(input()) * 2)", stdin="21\\n")
    result.exit_code, result.stdout, result.killed    # 0, b"42\\n", ""

Every run gets a fresh empty directory (removed afterwards), a scrubbed environment, `python -I -S`
(no user site, no PYTHON* variables, no site-packages unless asked), its stdin from the caller, its
stdout and stderr read in 64 KiB chunks up to a cap (past it the program is killed, so a program
printing a gigabyte is never held in memory), and rlimits set inside the sandbox before the
program's first line: CPU seconds, address space, file size, open files, processes, no core file.
At the wall-clock deadline the whole process tree is killed and reaped, so nothing outlives a run.

Isolation, strongest first (`isolation="auto"` takes the first that works; a weaker one warns once
with `SandboxWarning`, saying what is not isolated and how to get it):

    bwrap    bubblewrap (`apt install bubblewrap`): new PID, network, mount, IPC, UTS and cgroup
             namespaces. The program sees a fresh root holding /usr and the interpreter's install,
             read-only, and its own directory at /sandbox, writable; nothing else of the machine.
    unshare  util-linux `unshare`: new PID, network, mount (a private /proc), IPC and UTS
             namespaces, but the machine's filesystem.
    none     a plain child process in its own session: limits (and, as root, the uid) only.

The process limit (RLIMIT_NPROC) counts processes per user, and does not bind root at all. So when
we run as root, each concurrent run gets a uid of its own (`uid_base` + a slot, leased across
processes with a lock file) and the program is switched to it, with no capabilities, before it
starts; at the end every process of that uid is killed. When we are not root the program keeps our
uid; bwrap and unshare then put it in a new user namespace, where the kernel counts RLIMIT_NPROC
per namespace (we set it inside), so it bounds this run and not our other processes. Without
namespaces a non-root program is allowed `processes` more than the tasks we already run. If the
grading process dies, its runs die with it (bwrap --die-with-parent; setpriv --pdeathsig).

Threat model. The adversary is the program: arbitrary Python that knows this file, wanting to harm
the machine or the training process, outlive its deadline, read what it should not, or get a reward
it did not earn.
- Contained by namespaces (bwrap): the network (an empty network namespace: no loopback service,
  no internet); other processes (it sees and signals only its own; when its first process ends or
  is killed at the deadline, the kernel kills the rest, double-forked daemons included); the
  filesystem (no /home, /root, /etc, /tmp, training data or checkpoints; it writes only its own
  directory); SysV IPC. unshare contains the network, the processes and IPC, not the filesystem.
- Contained by limits, in every mode: CPU time, wall time, memory per process, file size, open
  files, number of processes, output size; and, when we are root, by its own uid: it cannot
  signal, trace or write anything of another user (the trainer included).
- Not contained in any mode: kernel bugs (namespaces are not a virtual machine: use gVisor or a VM
  against an adversary with kernel exploits); contention (a program slows its neighbours until its
  deadline); the memory of a process tree beyond `processes` x `memory` (no cgroup); the number of
  files it writes in its own directory (each at most `file_size`, all removed afterwards).
- Not contained without bwrap: reads of every file its uid may read (as root the world-readable
  ones; otherwise all of ours) and writes wherever that uid may write (as root we then remove its
  entries in /tmp, /var/tmp and /dev/shm).
- Not contained without namespaces: the network (local services and the internet); SysV IPC
  objects, which outlive the program (as root we remove those of its uid); and, when not root, our
  processes: it can signal them, and a daemon that double-forks and calls setsid escapes the kill.
- Rewards: expected outputs never enter the sandbox; graders compare outside (see grading/code.py).
"""
from __future__ import annotations

import contextlib
import fcntl
import math
import os
import pwd
import select
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

ISOLATIONS = ("bwrap", "unshare", "none")  # strongest first: what "auto" tries
SANDBOX_DIR = "/sandbox"  # where bwrap shows the program its directory
UID_BASE = 0x70000000  # root: run i of those running at once gets uid UID_BASE + i (see uid_base)
UID_SLOTS = 256  # runs at once per machine, across processes
CHUNK = 1 << 16  # bytes per read or write on the pipes
EXIT_GRACE = 0.2  # seconds to drain the pipes after the program exits, if something else still holds them
SWEEP_PATIENCE = 5.0  # seconds to keep killing a uid's processes (a fork bomb races the sweep)
REAP_PATIENCE = 0.5  # seconds to wait for its killed processes to be reaped
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm")  # world-writable: without bwrap, programs may leave files
HINT = ("install bubblewrap (apt install bubblewrap) and allow user namespaces "
        "(sysctl kernel.unprivileged_userns_clone=1; in Docker, a seccomp profile that permits unshare)")

# The first code to run in the sandbox, in the program's own process. It sets the rlimits (inside the
# namespaces, so that RLIMIT_NPROC counts this run only), brings back the exit()/quit() that -S leaves
# out (programs call them), and runs main.py in the real __main__ module, as `python main.py` would
# (runpy would do it too, at 30 ms of imports per run).
BOOTSTRAP = """\
import resource, site, sys
site.setquit()
for name, value in zip(("CPU", "AS", "FSIZE", "NOFILE", "NPROC", "CORE"), sys.argv[1:7]):
    resource.setrlimit(getattr(resource, "RLIMIT_" + name), (int(value), int(value)))
sys.argv = sys.argv[7:]
__file__ = sys.argv[0]
del resource, site, sys, name, value
exec(compile(open(__file__, "rb").read(), __file__, "exec"))
"""


class SandboxError(RuntimeError):
    """The sandbox cannot run programs as asked here; the message says what to change."""


class SandboxWarning(UserWarning):
    """Programs run with weaker isolation than bwrap; the message says what is not isolated."""


@dataclass(frozen=True)
class Limits:
    """What one run may use. rlimits bind each process of the program on its own."""
    timeout: float = 5.0  # wall-clock seconds; then the whole process tree is killed
    memory: int = 1 << 30  # bytes of address space per process (RLIMIT_AS): a 50 GB list fails at once
    file_size: int = 16 << 20  # bytes per file written (RLIMIT_FSIZE): a larger write is killed by SIGXFSZ
    open_files: int = 64  # file descriptors (RLIMIT_NOFILE)
    processes: int = 16  # processes and threads of the run (RLIMIT_NPROC): a fork bomb stops here
    stdout: int = 8 << 20  # bytes of stdout kept; a program writing more is killed ("output_limit")
    stderr: int = 1 << 20  # bytes of stderr, likewise


@dataclass
class Result:
    """What became of one run."""
    exit_code: int | None  # the program's exit status as its launcher reports it (a signal N: -N, or 128+N
    #                        under bwrap); None when it never started
    stdout: bytes  # at most Limits.stdout bytes
    stderr: bytes  # at most Limits.stderr bytes; the reason when it never started
    killed: str = ""  # why the sandbox ended it: "timeout", "output_limit", "error" (never started); "" if it ended
    wall: float = 0.0  # seconds from start until the program exited or was killed

    @property
    def ok(self) -> bool:
        """Ended by itself with exit status 0."""
        return self.exit_code == 0 and not self.killed


class Sandbox:
    """Runs programs under one isolation mode, chosen and tested once, here.

    isolation: "auto" (the strongest that works), or "bwrap", "unshare", "none" (a SandboxError
    says why it cannot work here). python: the interpreter programs run with (default: ours). As root
    without bwrap it must be readable by other users (the programs' uid), e.g. /usr/bin/python3.
    site_packages: let programs import installed packages (slower start: .pth files run).
    """

    def __init__(self, isolation: str = "auto", *, python: str | None = None, limits: Limits = Limits(),
                 site_packages: bool = False, uid_base: int = UID_BASE):
        if isolation != "auto" and isolation not in ISOLATIONS:
            raise SandboxError(f"isolation {isolation!r}: expected auto, {', '.join(ISOLATIONS)}")
        self.python = os.path.abspath(python or sys.executable)  # not resolved: a venv's python must stay one
        self.limits, self.site_packages, self.uid_base = limits, site_packages, uid_base
        self.root = os.geteuid() == 0
        # absolute paths: the launcher is looked up on the programs' PATH, which is only /usr/bin:/bin
        self._tools = {tool: shutil.which(tool) for tool in ("bwrap", "unshare", "setpriv", "ipcrm")}
        self._install = _install_dirs(self.python)
        self._binds = _bwrap_binds(self._install)
        self._home = _sandbox_home()  # the runs' directories; as root, also the uid lock files
        _remove_stale_workdirs(self._home)
        self._locks = _uid_lock_dir(self._home, uid_base) if self.root else None
        self.passed_over: dict[str, str] = {}  # stronger modes that did not work here, and why
        self.isolation = self._choose(isolation)
        note = isolation_note(self.isolation, self.root, self.passed_over, uid_base)
        if note:
            _warn_once(note)

    def run(self, program: str, stdin: bytes | str = b"", files: dict[str, str] | None = None,
            timeout: float | None = None) -> Result:
        """Run `program` as main.py, beside `files` (name -> text), with `stdin`, for at most `timeout`
        seconds (at most Limits.timeout). Never raises for anything the program does."""
        limit = self.limits.timeout if timeout is None else min(timeout, self.limits.timeout)
        data = stdin.encode(errors="surrogatepass") if isinstance(stdin, str) else stdin  # never raises
        return self._run(self.isolation, {**(files or {}), "main.py": program}, data, limit)

    def _choose(self, wanted: str) -> str:
        for mode in ISOLATIONS if wanted == "auto" else (wanted,):
            why = self._unavailable(mode)
            if not why:
                return mode
            self.passed_over[mode] = why
        raise SandboxError("no sandbox works here: " + "; ".join(f"{m}: {w}" for m, w in self.passed_over.items())
                           + f". To fix: {HINT}, or pass an interpreter other users can read (python=/usr/bin/python3)")

    def _unavailable(self, mode: str) -> str:
        """Why `mode` cannot run programs here; "" when a test program ran correctly under it."""
        for tool in ([mode] if mode != "none" else []) + (["setpriv"] if self.root else []):
            if not self._tools[tool]:
                return f"{tool} is not installed"
        if self.root and mode != "bwrap":  # bwrap shows the install at its path with fresh parents
            for path in [self.python, *self._install]:
                blocked = _blocked_for_others(path)
                if blocked:
                    return (f"the programs' uid cannot reach {path} ({blocked} is not searchable by other "
                            f"users), and only bwrap can show it to them")
        result = self._run(mode, {"main.py": "print(6 * 7)"}, b"", 60.0)
        if result.stdout != b"42\n":
            return f"a test program failed ({result.stderr.decode(errors='replace').strip()[:300] or result.killed})"
        return ""

    def _run(self, mode: str, files: dict[str, str], stdin: bytes, timeout: float) -> Result:
        start = time.monotonic()
        try:
            with self._leased_uid() as uid, _workdir(self._home, uid) as workdir:
                for name, text in files.items():
                    (workdir / Path(name).name).write_text(text, encoding="utf-8", errors="surrogatepass")
                return self._execute(mode, uid, workdir, stdin, start + timeout)
        except (OSError, SandboxError) as e:  # no free uid, a full disk, too many processes of ours
            return Result(None, b"", f"sandbox: {e}".encode(), "error", time.monotonic() - start)

    def _execute(self, mode: str, uid: int | None, workdir: Path, stdin: bytes, deadline: float) -> Result:
        home = SANDBOX_DIR if mode == "bwrap" else str(workdir)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home}
        shared = _mtimes(SHARED_DIRS)  # a directory whose entries change changes its mtime
        start = time.monotonic()
        proc = subprocess.Popen(self._command(mode, uid, workdir), cwd=workdir, env=env, start_new_session=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err, killed = _pump(proc, stdin, deadline, self.limits)
            wall = time.monotonic() - start
        finally:
            _end(proc, whole_group=mode == "none")  # also on KeyboardInterrupt: nothing may outlive the run
            if uid is not None:
                _kill_uid(uid)
                if mode != "bwrap":  # it saw the machine's world-writable directories
                    _remove_entries_of(uid, [d for d, t in _mtimes(SHARED_DIRS).items() if t != shared[d]])
                if mode == "none":  # it had no IPC namespace to take its SysV objects away with it
                    _remove_ipc_of(uid, self._tools["ipcrm"])
        return Result(proc.returncode, out, err, killed, wall)

    def _command(self, mode: str, uid: int | None, workdir: Path) -> list[str]:
        """The launcher's argv: [bwrap|unshare ...] [setpriv ...] python -I -S -c BOOTSTRAP limits main.py."""
        lim = self.limits
        nproc = lim.processes
        if mode == "none" and uid is None:  # no namespace, no uid of its own: NPROC counts all our tasks
            nproc += sum(threads for _, threads in _processes_of(os.getuid()).values())
        # CPU seconds: a backstop behind the wall deadline, for a process that would escape the kill
        limits = [math.ceil(lim.timeout) + 1, lim.memory, lim.file_size, lim.open_files, nproc, 0]
        python = [self.python, "-I", "-B", *([] if self.site_packages else ["-S"]),
                  "-c", BOOTSTRAP, *map(str, limits), "main.py"]
        program = [*self._setpriv(uid), *python]
        if mode == "bwrap":
            return [self._tools["bwrap"], *self._bwrap_args(uid, workdir), "--", *program]
        if mode == "unshare":
            user = ["--map-current-user"] if uid is None else []  # root needs no user namespace
            # unshare has no --die-with-parent: setpriv gives it one, so that the run ends if we die
            return [*self._setpriv(None), self._tools["unshare"], *user, "--pid", "--net", "--ipc", "--uts",
                    "--kill-child", "--mount-proc", "--", *program]
        return program

    def _setpriv(self, uid: int | None) -> list[str]:
        """setpriv's argv up to the command: SIGKILL when the parent dies (a uid switch clears the one
        that unshare --kill-child set), and given a uid, the switch to it without capabilities."""
        if not self._tools["setpriv"]:  # (root cannot get here: it needs setpriv for the uid)
            return []
        switch = ["--reuid", str(uid), "--regid", str(uid), "--clear-groups", "--inh-caps=-all",
                  "--bounding-set=-all"] if uid is not None else []
        return [self._tools["setpriv"], "--pdeathsig", "KILL", *switch, "--"]

    def _bwrap_args(self, uid: int | None, workdir: Path) -> list[str]:
        # root: no user namespace, so that setpriv can switch to the leased uid inside (under a user
        # namespace of root's, that uid would be unmapped); not root: bwrap needs one for the others
        user = ["--unshare-user"] if uid is None else []
        return [*user, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--die-with-parent", "--new-session", "--proc", "/proc", "--dev", "/dev", *self._binds,
                "--bind", str(workdir), SANDBOX_DIR, "--chdir", SANDBOX_DIR]

    @contextlib.contextmanager
    def _leased_uid(self):
        """Root: a uid that no other run on this machine uses until we are done (a lock file per
        slot, held open; the kernel drops it if we die). Its leftovers are killed first. Not root: None."""
        if self._locks is None:
            yield None
            return
        for slot in range(UID_SLOTS):
            fd = os.open(self._locks / str(slot), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                # a process that died mid-run may have left live processes; an init that is slow to
                # reap (or never does: a trainer running as a container's PID 1) leaves zombies, which
                # would eat into the next run's process limit: then take another uid
                if not _kill_uid(self.uid_base + slot, reap_wait=0):
                    continue
                yield self.uid_base + slot
            finally:
                os.close(fd)
            return
        raise SandboxError(f"all {UID_SLOTS} sandbox uids are in use or hold unreaped processes "
                           f"(lock files in {self._locks})")


def isolation_note(mode: str, root: bool, passed_over: dict[str, str], uid_base: int = UID_BASE) -> str:
    """The warning for `mode`: what it leaves unisolated and how to get more. "" for bwrap."""
    if mode == "bwrap":
        return ""
    why = "; ".join(f"{m}: {w}" for m, w in passed_over.items()) or f"isolation={mode!r} was asked for"
    who = (f"as uids from {uid_base} (no capabilities): they can read every world-readable file and write "
           f"world-writable directories" if root else
           "as you: they can read and write everything you can")
    if mode == "unshare":
        return (f"sandbox: not using bwrap ({why}); programs get their own PID, network and IPC namespaces but "
                f"share this machine's filesystem, running {who}. To isolate the filesystem: {HINT}.")
    signals = ("they cannot signal your processes" if root else
               "they can signal your processes (this one included), and a daemon that double-forks and "
               "calls setsid outlives its deadline")
    return (f"sandbox: no Linux namespaces ({why}); programs share this machine's network (they can reach "
            f"local services and the internet), process table and filesystem, running {who}; {signals}. "
            f"Only limits apply. To isolate them: {HINT}.")


_warned: set[str] = set()  # a warning is given once per process, whatever the warnings filters say


def _warn_once(note: str) -> None:
    if note not in _warned:
        _warned.add(note)
        warnings.warn(note, SandboxWarning, stacklevel=3)


# ----------------------------------------------------------------------------- set-up

def _install_dirs(python: str) -> list[str]:
    """The directories an interpreter needs besides /usr: its prefix (and a venv's base), asked of it."""
    try:
        out = subprocess.run([python, "-I", "-S", "-c", "import sys; print(sys.prefix); print(sys.base_prefix)"],
                             capture_output=True, text=True, timeout=60, check=True).stdout.split("\n")
    except (OSError, subprocess.SubprocessError) as e:
        raise SandboxError(f"python={python}: cannot run it to find its install ({e})") from None
    # as reported (a path through a link must exist inside too) and resolved (where the files are)
    dirs = {*out[:2], *map(os.path.realpath, out[:2]), os.path.dirname(os.path.dirname(os.path.realpath(python)))}
    return sorted(d for d in dirs if d != "/usr" and not d.startswith("/usr/"))


def _bwrap_binds(install: list[str]) -> list[str]:
    """bwrap arguments that show /usr, the top-level links into it (/bin, /lib64, ...) and the
    interpreter's install, read-only: what a dynamically linked python needs, and nothing else."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for path in install:
        args += ["--ro-bind", path, path]
    return args


def _blocked_for_others(path: str) -> str:
    """The first directory on the way to `path` that other users cannot search; "" if none."""
    parts = Path(path).parts
    for i in range(1, len(parts)):
        parent = os.path.join(*parts[:i])
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return parent
    return ""


def _sandbox_home() -> Path:
    """Our directory of run directories, one per user, that no one else can write (so that nothing
    in it was planted) but the programs' uids can cross (mode 0711). Being our own, it also keeps
    the runs from touching /tmp itself, whose changes tell us when a program wrote there."""
    path = Path(tempfile.gettempdir()) / f"rlvr-sandbox-{os.getuid()}"
    path.mkdir(exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise SandboxError(f"{path}: expected a directory of yours (uid {os.getuid()}); remove it and retry")
    os.chmod(path, 0o711)
    return path


def _uid_lock_dir(home: Path, uid_base: int) -> Path:
    """Root's directory of uid lock files, after checking that no account uses the uids."""
    for uid in range(uid_base, uid_base + UID_SLOTS):
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            continue
        raise SandboxError(f"uid_base={uid_base}: uid {uid} belongs to user {name}; choose a range no account uses")
    path = home / "uids"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


@contextlib.contextmanager
def _workdir(home: Path, uid: int | None):
    """A fresh empty directory for one run, owned by the program's uid, removed afterwards; locked
    (flock) while the run lives, so that a directory no one holds is known to be left over."""
    path = Path(tempfile.mkdtemp(prefix="run-", dir=home))
    lock = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if uid is not None:
            os.chown(path, uid, uid)
        yield path
    finally:
        if uid is None:  # we are not root: undo a program's chmod 000 so that we can delete its files
            for parent, dirs, _ in os.walk(path):
                for d in dirs:
                    if not os.path.islink(os.path.join(parent, d)):
                        os.chmod(os.path.join(parent, d), 0o700)
        shutil.rmtree(path, ignore_errors=True)
        os.close(lock)


def _remove_stale_workdirs(home: Path) -> None:
    """Remove the run directories whose lock no one holds: left by a grader that was killed."""
    for name in os.listdir(home):
        if name.startswith("run-"):
            with contextlib.suppress(OSError):
                lock = os.open(home / name, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    shutil.rmtree(home / name, ignore_errors=True)
                finally:
                    os.close(lock)


# ----------------------------------------------------------------------------- a run

def _pump(proc: subprocess.Popen, stdin: bytes, deadline: float, limits: Limits) -> tuple[bytes, bytes, str]:
    """Feed stdin and read stdout/stderr in bounded chunks until the program exits and its pipes
    close, the deadline passes ("timeout") or an output passes its cap ("output_limit")."""
    bufs = {proc.stdout.fileno(): (bytearray(), limits.stdout), proc.stderr.fileno(): (bytearray(), limits.stderr)}
    stdin_fd, pending, exited_at, killed = proc.stdin.fileno(), memoryview(stdin), None, ""
    exit_fd = os.pidfd_open(proc.pid)  # readable once the launcher exits
    with selectors.DefaultSelector() as sel:
        for fd in [*bufs, exit_fd]:
            sel.register(fd, selectors.EVENT_READ)
        if pending:
            os.set_blocking(stdin_fd, False)
            sel.register(stdin_fd, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        while not killed:
            now = time.monotonic()
            reading = any(fd in sel.get_map() for fd in bufs)
            if exited_at is not None and (not reading or now > exited_at + EXIT_GRACE):
                break  # done; or a leftover holds the pipes open, which the kill that follows ends
            if now >= deadline:
                killed = "timeout"
                break
            wait = deadline if exited_at is None else min(deadline, exited_at + EXIT_GRACE)
            for key, _ in sel.select(wait - now):
                if key.fd == exit_fd:
                    exited_at = time.monotonic()
                    sel.unregister(exit_fd)
                elif key.fd == stdin_fd:
                    pending = _feed(proc, sel, pending)
                else:
                    killed = killed or _drain(key.fd, *bufs[key.fd], sel)
    os.close(exit_fd)
    return bytes(bufs[proc.stdout.fileno()][0]), bytes(bufs[proc.stderr.fileno()][0]), killed


def _feed(proc: subprocess.Popen, sel: selectors.BaseSelector, pending: memoryview) -> memoryview:
    """Write the next chunk of stdin; close it when all is written or the program stopped reading."""
    try:
        pending = pending[os.write(proc.stdin.fileno(), pending[:CHUNK]):]
    except BlockingIOError:
        return pending
    except OSError:  # EPIPE: the program closed its stdin or exited
        pending = pending[:0]
    if not pending:
        sel.unregister(proc.stdin.fileno())
        proc.stdin.close()
    return pending


def _drain(fd: int, buf: bytearray, cap: int, sel: selectors.BaseSelector) -> str:
    """Read one chunk of an output into its buffer, up to `cap` bytes; "output_limit" past it."""
    chunk = os.read(fd, CHUNK)
    if not chunk:
        sel.unregister(fd)
    over = len(buf) + len(chunk) > cap
    buf += chunk[:cap - len(buf)]
    return "output_limit" if over else ""


def _end(proc: subprocess.Popen, whole_group: bool) -> None:
    """Kill whatever is left of a run and reap it. The launcher is not reaped until its group is
    killed (a zombie at worst), so neither its pid nor its group's id can have been reused meanwhile.
    whole_group: wait until every process of its group is dead (without a PID namespace nothing else
    waits for them: a SIGKILLed process of a fork bomb still runs until it is next scheduled)."""
    firsts = _child_pidfds(proc.pid)  # bwrap, unshare: the namespace's first process, if still running
    for fd in firsts:  # killing it makes the kernel kill the rest of its namespace
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    if firsts:  # the launcher reaps it and exits: nothing is left for a slow init to reap
        launcher = os.pidfd_open(proc.pid)
        select.select([launcher], [], [], 1.0)
        os.close(launcher)
    for kill in (os.killpg, os.kill):  # its group; and itself, in case the program (mode none) left the group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + SWEEP_PATIENCE
    while whole_group and _live_members(proc.pid) and time.monotonic() < deadline:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # (the group's id stays taken while it has members)
        time.sleep(0.001)
    for fd in firsts:
        select.select([fd], [], [], SWEEP_PATIENCE)  # readable once it (and so its namespace) is gone
        os.close(fd)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        pipe.close()


def _child_pidfds(pid: int) -> list[int]:
    """pidfds of `pid`'s children, each checked to still be its child after it was opened."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    fds = []
    for child in map(int, children):
        try:
            fd = os.pidfd_open(child)
        except ProcessLookupError:
            continue
        if _field(_status(child), "PPid") == str(pid):
            fds.append(fd)
        else:
            os.close(fd)
    return fds


# ----------------------------------------------------------------------------- processes and files of a uid

def _live_members(pgid: int) -> list[int]:
    """Pids of the processes of process group `pgid` that are not zombies."""
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()  # after "(comm)"
                if fields[2] == str(pgid) and fields[0] != "Z":  # state, ppid, pgrp
                    members.append(int(name))
    return members


def _status(pid: int) -> str:
    """The text of /proc/PID/status ("" if it is gone): "Name:\tpython\nState:\tS (sleeping)\n..."."""
    try:
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY)
    except OSError:
        return ""
    try:
        return os.read(fd, 4096).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _field(status: str, name: str) -> str:
    """One field of a status text: _field(status, "PPid") -> "1234"; "" if absent."""
    start = status.find(f"\n{name}:\t")
    if start < 0:
        return ""
    start += len(name) + 3
    end = status.find("\n", start)
    return status[start:end if end >= 0 else len(status)]


def _has_uid(status: str, uid: int) -> bool:
    """Whether the real, effective or saved uid is `uid` (a setuid program may hold any of them)."""
    return str(uid) in _field(status, "Uid").split()[:3]


def _processes_of(uid: int) -> dict[int, tuple[bool, int]]:
    """{pid: (is a zombie, threads)} of the processes of `uid`. RLIMIT_NPROC counts each thread, and
    a zombie until it is reaped."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            status = _status(int(name))
            if _has_uid(status, uid):
                found[int(name)] = (_field(status, "State").startswith("Z"), int(_field(status, "Threads") or 1))
    return found


def _kill_uid(uid: int, reap_wait: float = REAP_PATIENCE) -> bool:
    """SIGKILL every process of `uid` until none is alive (root only), then wait up to `reap_wait`
    seconds for the killed to be reaped by their parent or init; True when nothing of `uid` is left,
    zombies included (they count against its process limit). Each process is opened as a pidfd and checked again before
    the signal, so that a reused pid is never hit."""
    start = time.monotonic()
    while procs := _processes_of(uid):
        alive = [pid for pid, (zombie, _) in procs.items() if not zombie]
        if time.monotonic() > start + (SWEEP_PATIENCE if alive else reap_wait):
            return False
        for pid in alive:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            with contextlib.suppress(ProcessLookupError):
                if _has_uid(_status(pid), uid):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)
        time.sleep(0.001)
    return True


def _mtimes(dirs: tuple[str, ...]) -> dict[str, int]:
    return {d: os.stat(d).st_mtime_ns if os.path.isdir(d) else 0 for d in dirs}


def _remove_entries_of(uid: int, dirs: list[str]) -> None:
    """Delete what `uid` left at the top of shared world-writable directories (its processes are dead)."""
    for parent in dirs:
        with contextlib.suppress(OSError), os.scandir(parent) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid != uid:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)


def _remove_ipc_of(uid: int, ipcrm: str | None) -> None:
    """Delete the SysV IPC objects `uid` created or owns: they outlive their processes (shared
    memory would keep its pages), unless an IPC namespace ends with them."""
    args = []
    for kind, flag in (("shm", "-m"), ("msg", "-q"), ("sem", "-s")):
        with contextlib.suppress(OSError, ValueError, IndexError):
            header, *rows = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
            columns = header.split()
            for row in map(str.split, rows):
                if str(uid) in (row[columns.index("uid")], row[columns.index("cuid")]):
                    args += [flag, row[1]]
    if args and ipcrm:
        subprocess.run([ipcrm, *args], capture_output=True, timeout=60)
