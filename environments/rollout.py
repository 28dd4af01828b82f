"""Multi-turn traces (docs/math.md §8): the rollout's shape with an environment (`--env`).

The model writes a turn; the trace's environment (environments/__init__.py) reads it and answers with
an observation, which is appended to the context of the next turn, until the environment says done
or a cap ends the trace. Every turn is a training row whose prompt holds everything before it,
observations included: they are context, never trained and never a share of a normaliser.
config.rollout_shapes builds a `MultiTurn` from --env and its caps; rollout.generate calls its `write`.
"""
from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import rollout
from environments import STOPS, Environments, Turns
from rewards import Problem
from rollout import Chunk, Episode, RolloutError, Sampling, Shape, ends, episodes, stop_ids, stop_strings


@dataclass
class MultiTurn(Shape):
    """Turns with an environment: `environments` makes each trace's Session, `turns` caps the trace;
    `give_up`: (fraction, steps): `steps` training steps in a row in which at least `fraction` of the
    traces failed in the environment stop the run (check); steps 0 = never."""
    environments: Environments
    turns: Turns
    give_up: tuple[float, int] = (1.0, 1)
    failing: int = 0  # training steps in a row so far that failed as give_up says

    @property
    def tools(self) -> list[dict] | None:
        """The tools' schemas, which the chat template lists in the prompt (a built-in tool's, or those a
        user's class declares; None for none)."""
        return self.environments.tools

    @property
    def warnings(self) -> tuple:
        """What to say once before a run: the python tool's sandbox when weaker than bubblewrap."""
        return self.environments.warnings

    def write(self, lm, tokenizer, queries: list[list[int]], problems: list[Problem], groups: list[int],
              sampling: Sampling) -> list[Episode]:
        sessions = [self.environments(p) for p in problems]
        # an Environments' rounds run under its budget and its stop strings end turns; any other
        # callable that makes Sessions, as they come
        rounds = getattr(self.environments, "round", contextlib.nullcontext)
        sampling = replace(sampling, stop_strings=getattr(self.environments, "stop_strings", ()))
        traces = interact(lm, tokenizer, queries, sessions, sampling, self.turns, rounds)
        batch = episodes(tokenizer, queries, traces, groups, problems, stop_strings(tokenizer, sampling))
        for e, session in zip(batch, sessions):
            settle_trace(e, session, tokenizer)
        return batch


    def check(self, episodes: list[Episode]) -> None:
        """Stop the run with the environment's first error once it has failed too often: `give_up`.
        A step whose 128 traces all raised "ValueError: the tool server is down" (give_up (1.0, 1)) ->
        RolloutError("... 128 of 128 traces failed ...: ValueError: the tool server is down")."""
        fraction, steps = self.give_up
        failed = [e for e in episodes if e.details.get("env/failures")]
        self.failing = self.failing + 1 if episodes and len(failed) >= fraction * len(episodes) else 0
        if steps and self.failing >= steps:
            first = next((e.env_error for e in failed if e.env_error), "no message")
            raise RolloutError(f"the environment failed {len(failed)} of {len(episodes)} traces"
                               f"{f' in each of {steps} steps in a row' if steps > 1 else ''} (--env-fail-fraction "
                               f"{fraction:g}, --env-fail-steps {steps}); the first: {first}")


def interact(lm, tokenizer, queries: list[list[int]], sessions: list, sampling: Sampling, turns,
             rounds=contextlib.nullcontext) -> list[list[Chunk]]:
    """Each query's multi-turn trace, in one `rollout.sample` call per turn over the
    traces still going. A turn that ends with a stop id (or a stop string of the environment's,
    kept in the turn) goes to its trace's session; an observation comes back (token ids), and the
    trace's next turn is prompted with its last prompt ⧺ the turn ⧺ the observation, so every
    turn's row holds exactly the context it was written in. A trace ends
    when its session says done (or fails), when a turn ends without a stop id (cut by
    max_new_tokens), at turns.max_turns, or when its next context plus a turn would pass
    turns.max_tokens or the model's context (max_position_embeddings); session.stop says which
    (environments.STOPS). The sessions' answers to one round of turns run inside `rounds()` (a
    user's class: under one budget, Environments.round).
    q = [1, 2], turn 1 writes [7, eos], the observation is [5]: turn 2's prompt is [1, 2, 7, eos, 5].

    Each turn re-prefills its whole context (the engine and HF generate alike): the prefix cache of
    a Markovian trace needs the same columns in every round, and a turn's context grows by a
    different length in every trace (docs/measured.md: the cost against the turn's decode).
    """
    stops, most = stop_ids(tokenizer), min((n for n in (turns.max_tokens, context_limit(lm)) if n), default=0)
    strings = stop_strings(tokenizer, sampling)
    traces: list[list[Chunk]] = [[] for _ in queries]
    contexts, going = list(queries), list(range(len(queries)))
    for turn in range(turns.max_turns):
        if not going:
            break
        for i, (new, logp) in zip(going, rollout.sample(lm, tokenizer, [contexts[i] for i in going], sampling)):
            traces[i].append(Chunk(contexts[i], new, logp))
        asked = [i for i in going if ends(traces[i][-1].response_ids, stops, strings)]
        for i in set(going) - set(asked):
            sessions[i].stop = "length"
        still = []
        with rounds():
            replies = answers(tokenizer, [sessions[i] for i in asked], [traces[i][-1].response_ids for i in asked])
        for i, observation in zip(asked, replies):
            if observation is None:
                continue
            context = contexts[i] + traces[i][-1].response_ids + observation
            full = bool(most) and len(context) + sampling.max_new_tokens > most
            sessions[i].cut = turn + 1 == turns.max_turns or full
            sessions[i].stop = "max_turns" if turn + 1 == turns.max_turns else "context" if full else ""
            if not sessions[i].cut:
                sessions[i].seen()
                contexts[i] = context
                still.append(i)
        going = still
    return traces


def context_limit(lm) -> int:
    """The model's context, max_position_embeddings of its (text) config; 0 when it does not say."""
    config = getattr(lm, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(config, "max_position_embeddings", 0) or 0


ANSWER_THREADS = 4


def answers(tokenizer, sessions: list, turns: list[list[int]]) -> list[list[int] | None]:
    """Each session's answer to its trace's latest turn (observation ids, or None: done), from
    ANSWER_THREADS threads: a tool's program runs in a sandboxed process, a user's environment in a
    worker process, so several traces' answers overlap; the replies come in the sessions' order."""
    texts = [tokenizer.decode(t, skip_special_tokens=True) for t in turns]
    with ThreadPoolExecutor(max(1, min(ANSWER_THREADS, len(sessions)))) as pool:
        return list(pool.map(lambda session, text: session.answer(text), sessions, texts))


def settle_trace(e: Episode, session, tokenizer) -> None:
    """What a multi-turn Episode keeps of its session: the environment's rewards, its numbers, and
    the grader's text, the last turn alone (never an observation, which a tool could fill with a
    forged answer). A trace the caps stopped while its environment still answered is truncated."""
    last = e.chunks[-1]
    e.text = tokenizer.decode(last.response_ids, skip_special_tokens=True)
    e.transcript = tokenizer.decode(last.prompt_ids[len(e.prompt_ids):] + last.response_ids)
    e.truncated = e.truncated or session.cut
    stopped = {f"stop/{reason}": float(reason == session.stop) for reason in STOPS}
    e.turn_rewards = (session.turn_rewards + [0.0] * len(e.chunks))[:len(e.chunks)]  # a turn cut unanswered earns 0
    e.env_reward, e.details = session.reward, {**session.details, **stopped, "turns/mean": len(e.chunks),
                                               "turns/reward": sum(e.turn_rewards)}
    e.env_error = session.error
