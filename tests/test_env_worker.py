"""environments.worker.UserEnvironment: a multi-turn environment of your own (--env file.py:Class) runs bounded in
worker processes; its state lives there, survives across turns, and is rebuilt by replay when a worker is
killed; whatever a hostile environment does fails its own step, counted, and the next step works."""
import threading
import time

import pytest

from environments import worker as env_worker
from environments.worker import UserEnvironment
from rewards import DataError, Problem

ENV = '''
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

print("a print at import must not reach the protocol")


@dataclass
class Step:
    observation: str | None
    reward: float | None = None
    details: dict = field(default_factory=dict)


class Echo:
    """Its observation shows its worker, how many environments that worker has built, and every turn so
    far (its state); a turn's text asks for each way a hostile environment can fail."""
    built = 0

    def __init__(self, problem):
        if problem.prompt == "bad problem":
            raise RuntimeError("no such problem")
        Echo.built += 1
        self.problem, self.seen = problem, []

    def step(self, turn):
        print("a stray print must not reach the protocol")
        self.seen.append(turn)
        if turn == "raise":
            raise ValueError("environment bug")
        if turn == "hang":
            time.sleep(1000)
        if turn == "slow":
            time.sleep(0.4)
        if turn == "exit":
            os._exit(3)
        if turn == "huge":
            return Step("x" * 5_000_000)
        if turn == "messages":
            return Step(["x" * 5_000_000, "short", "y" * 3000])
        invalid = {"int": Step(7), "bytes": Step(b"obs"), "nan": Step("o", float("nan")),
                   "string reward": Step("o", "1"), "huge int": Step("o", 10 ** 400),
                   "bad details": Step("o", None, {"k": "v"}), "details keys": Step("o", None, {1: 2.0}),
                   "dict": {"observation": "o", "reward": None}, "no messages": Step([]),
                   "17 messages": Step(["o"] * 17), "bytes message": Step(["o", b"obs"])}
        if turn in invalid:
            return invalid[turn]
        if turn == "done":
            return Step(None, 1.0 if self.problem.answer in self.seen else 0.0, {"turns": len(self.seen)})
        return Step(f"{os.getpid()} built={Echo.built} {self.problem.id}:{'|'.join(self.seen)}",
                    None if turn != "bool" else True, {"chars": len(turn)})
'''


@pytest.fixture
def env_file(tmp_path):
    path = tmp_path / "echo_env.py"
    path.write_text(ENV)
    return path


def open_env(path, **kwargs) -> UserEnvironment:
    env = UserEnvironment(f"{path}:Echo", **kwargs)
    env.check()
    return env


def seen(reply) -> tuple[str, str, str]:
    """(worker pid, environments built, "id:turn|turn|...") of a reply's observation."""
    pid, built, rest = reply["observation"].split(" ", 2)
    return pid, built, rest


def worker_of(env: UserEnvironment, key: str):
    return env.workers[env_worker.zlib.crc32(key.encode()) % len(env.workers)]


def test_three_turns_keep_state_in_one_worker_and_end_graded(env_file):
    env = open_env(env_file, timeout=2.0, workers=2)
    p = Problem("Say t2", "t2", id="p1")
    try:
        first, failure = env.step("a", p, ["t1"])
        assert failure == "" and first["reward"] is None and first["details"] == {"chars": 2.0}
        second, _ = env.step("a", p, ["t1", "t2"])
        # the same environment answered: same worker, no second construction, both turns in its state
        assert seen(second) == (seen(first)[0], "built=1", "p1:t1|t2")
        done, failure = env.step("a", p, ["t1", "t2", "done"])
        assert (done, failure) == ({"observation": None, "reward": 1.0, "details": {"turns": 3.0}}, "")
        again, _ = env.step("a", p, ["t1", "t2", "done", "t4"])
        assert seen(again)[1:] == ("built=2", "p1:t1|t2|done|t4")  # the done trace was dropped: rebuilt by replay
        assert env.step("b", p, ["bool"])[0]["reward"] == 1.0  # a bool is a reward, as rewards.is_reward says
    finally:
        env.close()


@pytest.mark.slow
def test_a_killed_worker_loses_nothing_replay_rebuilds_each_trace(env_file):
    env = open_env(env_file, timeout=1.0, workers=1)
    p, q = Problem("one", "", id="p"), Problem("two", "", id="q")
    try:
        for n in (1, 2, 3):
            before, failure = env.step("a", p, ["slow"] * n)
            assert failure == ""
        assert env.step("b", q, ["hang"]) == (None, "timeout")  # kills the one worker, and with it a's state
        start = time.monotonic()
        after, failure = env.step("a", p, ["slow"] * 3 + ["t4"])
        # a fresh worker rebuilt a by replaying 3 slow turns (1.2 s): given a timeout per replayed turn, not one
        assert failure == "" and time.monotonic() - start > 1.2
        assert seen(after)[0] != seen(before)[0] and seen(after)[1:] == ("built=1", "p:slow|slow|slow|t4")
        # a key that comes back with other earlier turns (another trace) is rebuilt from those, not continued
        other, _ = env.step("a", q, ["x", "t5"])
        assert seen(other)[1:] == ("built=2", "q:x|t5")
        assert seen(env.step("b", q, ["t1"])[0])[1:] == ("built=3", "q:t1")  # the timed-out trace starts over
    finally:
        env.close()


@pytest.mark.slow
def test_a_hostile_environment_fails_its_own_step_and_the_next_step_works(env_file):
    env = open_env(env_file, timeout=1.0, workers=2, max_chars=1000)
    p = Problem("Say t2", "t2", id="p1")
    try:
        assert env.step("k", p, ["raise"]) == (None, "error")
        assert env.step("k", Problem("bad problem", ""), ["t1"]) == (None, "error")  # the constructor raised
        for turn in ("int", "bytes", "nan", "string reward", "huge int", "bad details", "details keys", "dict"):
            assert env.step("k", p, [turn]) == (None, "invalid"), turn
        # a failed step leaves its environment in an unknown state: the trace's next step rebuilds it
        built = int(seen(env.step("r", p, ["t1"])[0])[1].removeprefix("built="))
        assert env.step("r", p, ["t1", "int"]) == (None, "invalid")
        assert seen(env.step("r", p, ["t1", "int", "t3"])[0])[1:] == (f"built={built + 1}", "p1:t1|int|t3")
        assert env.step("r", p, ["t1", "raise"]) == (None, "error")
        assert env.step("r", p, ["t1", "raise", "t3"]) == (None, "error")  # its replay raises again
        huge, failure = env.step("k", p, ["huge"])
        assert failure == "" and huge["observation"] == "x" * 1000
        start = time.monotonic()
        assert env.step("k", p, ["hang"]) == (None, "timeout")
        assert time.monotonic() - start < 2.5
        assert env.step("k", p, ["exit"]) == (None, "error")  # the worker died under it
        fine, failure = env.step("k", p, ["t1"])  # every print went to stderr; the restarted worker answers
        assert failure == "" and seen(fine)[2] == "p1:t1"
    finally:
        env.close()


@pytest.mark.slow
def test_a_hanging_trace_holds_up_its_worker_only(env_file):
    env = open_env(env_file, timeout=1.5, workers=2)
    p = Problem("x", "")
    keys = [f"trace-{i}" for i in range(20)]
    slow = keys[0]
    fast = next(k for k in keys if worker_of(env, k) is not worker_of(env, slow))
    try:
        env.workers[1].start()
        hung = []
        thread = threading.Thread(target=lambda: hung.append(env.step(slow, p, ["hang"])))
        thread.start()
        time.sleep(0.2)
        start = time.monotonic()
        assert env.step(fast, p, ["t1"])[1] == ""
        assert time.monotonic() - start < 1.0  # answered while the other worker hangs
        thread.join()
        assert hung == [(None, "timeout")]
    finally:
        env.close()


@pytest.mark.parametrize("source,spec,message", [
    (None, "{dir}/missing.py:Echo", "no such file"),
    ("def Echo(problem):\n    pass\n", "{dir}/env.py:Echo", "has no top-level class Echo"),
    ("class Echo:\n    def step(self, turn)\n", "{dir}/env.py:Echo", "is not valid Python"),
    ("import not_a_module_anywhere\nclass Echo:\n    pass\n", "{dir}/env.py:Echo",
     "its worker did not start: importing .*env.py failed: ModuleNotFoundError: No module named 'not_a_module"),
    ("class Echo:\n    pass\n", "{dir}/env.py:Echo", "Echo is not a class with a step method"),
    ("class Echo:\n    def step(self, turn):\n        pass\n", "{dir}/env.py", "give path/to/file.py:Class"),
])
def test_a_bad_environment_file_is_a_data_error_naming_it(source, spec, message, tmp_path):
    if source is not None:
        (tmp_path / "env.py").write_text(source)
    env = UserEnvironment(spec.format(dir=tmp_path), timeout=1.0)
    try:
        with pytest.raises(DataError, match=f"--env .*{tmp_path}.*{message}"):
            env.check()
        assert env.step("k", Problem("x", ""), ["t1"]) == (None, "error")  # unchecked, a step still never raises
    finally:
        env.close()


def test_steps_need_a_turn_and_envs_are_bounded():
    env = UserEnvironment("nowhere.py:Echo")
    with pytest.raises(ValueError, match="no turn to answer"):
        env.step("k", Problem("x", ""), [])
    held = env_worker._Held()
    for i in range(env_worker.MAX_ENVS):
        held.put(str(i), i)
    held.put("0", 0)  # used again: now the newest
    held.put("new", -1)
    assert len(held) == env_worker.MAX_ENVS and "1" not in held and "0" in held and "new" in held


# ============================================================================ a broken environment, found fast

@pytest.mark.slow  # waits out timeouts
def test_a_round_of_hanging_steps_costs_about_one_timeout(env_file):
    """8 traces whose step hangs, on 2 workers, from 4 threads as environments/rollout.answers steps them:
    in a round (UserEnvironment.round) they cost one timeout, at most one step a worker timing out and
    the steps still waiting then failing at once ("budget"); one after another, as before rounds,
    each cost its own timeout (8 × 1.5 s on 2 workers: 6 s). Each failure is said in words. A sound round after it is cut nowhere, though its steps are slow:
    each answer moves the round's end on."""
    from concurrent.futures import ThreadPoolExecutor
    env = open_env(env_file, timeout=1.5, workers=2)
    try:
        start = time.monotonic()
        with env.round(), ThreadPoolExecutor(4) as threads:
            got = list(threads.map(lambda k: env.step(f"k{k}", Problem("p", "", id=str(k)), ["hang"]), range(8)))
        took = time.monotonic() - start
        failures = sorted(f for _, f in got)  # one timeout a worker at most; the rest cut by the round's end
        assert all(reply is None for reply, _ in got) and set(failures) <= {"timeout", "budget"}
        assert failures.count("timeout") <= 2 and took < 4.0, (failures, took)
        assert env.messages["k0"] in ("a step took longer than --env-timeout 1.5 s",
                                      "no step of its round of turns was answered for 1.5 s (--env-budget)")
        with env.round(), ThreadPoolExecutor(4) as threads:  # 0.4 s a step, 5 a worker: 2 s > the budget
            slow = list(threads.map(lambda k: env.step(f"s{k}", Problem("p", "", id=str(k)), ["slow"]), range(10)))
        assert all(failure == "" for _, failure in slow)
    finally:
        env.close()


def test_an_observation_of_several_messages_crosses_the_pipe_cut_together(env_file):
    """A list of messages (one tool message each) comes back a list, max_chars bounding all of them
    together (environments.fair_cut: the short ones whole, the long ones sharing the rest); a list of
    none, of more than MAX_MESSAGES or of something else than str breaks the contract."""
    env = open_env(env_file, workers=1, max_chars=1000)
    p = Problem("p", "")
    try:
        reply, failure = env.step("k", p, ["messages"])
        assert failure == "" and reply["observation"] == ["x" * 498, "short", "y" * 497]
        for turn in ("no messages", "17 messages", "bytes message"):
            assert env.step("k", p, [turn]) == (None, "invalid"), turn
        assert env.messages["k"] == "invalid step: observation is list, not str, a list of 1 to 16 str, or None"
    finally:
        env.close()


def test_an_error_is_sent_back_in_words(env_file):
    env = open_env(env_file, workers=1)
    try:
        assert env.step("k", Problem("p", ""), ["raise"]) == (None, "error")
        assert env.messages["k"] == "ValueError: environment bug"
    finally:
        env.close()


def test_what_a_step_starts_ends_with_its_worker(tmp_path):
    """A step that starts a child process (and returns): the child lives while the worker does, and
    ends when the worker is closed (its process group is killed), not orphaned to outlive the run."""
    path = tmp_path / "spawn.py"
    path.write_text("import subprocess\nfrom types import SimpleNamespace\n"
                    "class Env:\n    def __init__(self, problem): pass\n"
                    "    def step(self, turn):\n"
                    "        child = subprocess.Popen(['sleep', '1000'])\n"
                    "        return SimpleNamespace(observation=str(child.pid), reward=None, details={})\n")
    env = UserEnvironment(f"{path}:Env", workers=1)
    env.check()
    reply, failure = env.step("k", Problem("p", ""), ["go"])
    child = int(reply["observation"])

    def running(pid: int) -> bool:  # a killed child the container's init has not reaped yet is a zombie
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(") ")[1][0] != "Z"
        except FileNotFoundError:
            return False
    assert failure == "" and running(child)
    env.close()
    deadline = time.monotonic() + 5
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(child)


@pytest.mark.slow  # waits out the start-up limit
def test_a_file_whose_import_hangs_fails_the_start_up_check_in_one_line(tmp_path, monkeypatch):
    path = tmp_path / "stuck.py"
    path.write_text("import time\ntime.sleep(1000)\nclass Env:\n    def step(self, turn): pass\n")
    monkeypatch.setattr(env_worker.EnvWorker, "STARTUP_S", 2.0)
    start = time.monotonic()
    with pytest.raises(DataError) as e:
        UserEnvironment(f"{path}:Env").check()
    assert time.monotonic() - start < 10
    assert str(e.value) == (f"--env {path}:Env: its worker did not start: it did not say ready within 2 s "
                            "(an import that hangs?)")


def test_a_class_names_its_stop_strings_and_a_bad_one_is_refused(tmp_path):
    """A user's class may name stop_strings (text that ends a turn); check() reads them from the
    worker, which imported the class, before any model loads. Not a tuple of non-empty strings: one line."""
    path = tmp_path / "calls.py"
    path.write_text("class Env:\n    stop_strings = ('</call>', '```output')\n"
                    "    def __init__(self, problem): pass\n    def step(self, turn): return None\n"
                    "class Bad(Env):\n    stop_strings = ('',)\n")
    env = UserEnvironment(f"{path}:Env", workers=1)
    env.check()
    assert env.stop_strings == ("</call>", "```output")
    env.close()
    with pytest.raises(DataError, match=r"^--env .*:Bad: stop_strings is \(''\,\): give a tuple of non-empty strings$"):
        UserEnvironment(f"{path}:Bad", workers=1).check()
