"""A multi-turn environment in one file: a wrong answer is told so, and the model tries again.

    torchrun --nproc_per_node 2 train.py --env examples/env_retry.py:Retry --max-turns 3

Each turn is graded as the running-sum task grades a response (the last <answer>N</answer>); a right
answer at attempt k ends the trace with reward 1/k, a wrong one gets "Wrong, try again." back as
the next observation (a tool message of the chat template), and after `max_turns` wrong attempts
the trace ends truncated and the task grades its last turn (0). The class runs in a worker process
(environments/worker.py), so it must be a deterministic function of its problem and the turns so far: a
worker killed after a timeout is rebuilt by replaying them.

What an environment is (environments/): built once per trace with its problem; `step(turn)` gets
the model's latest turn as text and returns Step(observation) to go on, or Step(reward=...) /
Step() to end the trace (with your reward, or the task's grade of the last turn).
"""
from environments import Environment, Step
from rewards import grade_running_sum


class Retry(Environment):
    def __init__(self, problem):
        super().__init__(problem)
        self.attempts = 0

    def step(self, turn: str) -> Step:
        self.attempts += 1
        if grade_running_sum(self.problem, turn).reward == 1.0:
            return Step(reward=1.0 / self.attempts, details={"retry/attempts": self.attempts})
        return Step("Wrong, try again.")
