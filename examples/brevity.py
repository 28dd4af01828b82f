"""A second reward term that pulls against correctness: fewer characters score more.

    torchrun --nproc_per_node 2 train.py --reward-terms correct=1,examples/brevity.py:brevity=0.5

1 for an empty response, falling linearly to 0 at LONGEST characters and beyond. On the built-in running
sums a full answer ("12+7=19 19+35=54 <answer>54</answer>") is 30-80 characters, so the term tempts the
model to drop its running sums and write the answer alone, which it gets wrong more often.
"""

LONGEST = 100


def brevity(prompt: str, response: str, answer: str) -> float:
    return max(0.0, 1.0 - len(response) / LONGEST)
