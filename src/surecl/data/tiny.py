"""The ``tiny`` fixture stream: four small keyword tasks with disjoint label sets.

Each task maps a handful of cue words to its own labels; the rest of a sentence is filler
shared by all tasks. A tiny model learns a task in a few dozen steps, and because every task
has its own labels (class-incremental), sequential training without replay forgets earlier
tasks: the model's answers drift to the newest task's labels. That makes replay measurable in
seconds, which is what tests and smoke checks need.
"""

from __future__ import annotations

import random

from surecl.data.task import Example, Task

FILLER = "the a of to and in is it on for with as was at by this that from or one all there".split()
# task name -> {cue word: label}
TINY_TASKS: dict[str, dict[str, str]] = {
    "colors": {"red": "warm", "orange": "warm", "yellow": "warm", "blue": "cool", "green": "cool", "purple": "cool"},
    "animals": {"dog": "pet", "cat": "pet", "hamster": "pet", "wolf": "wild", "tiger": "wild", "shark": "wild"},
    "numbers": {"two": "even", "four": "even", "six": "even", "three": "odd", "five": "odd", "seven": "odd"},
    "weather": {"sun": "dry", "drought": "dry", "desert": "dry", "rain": "wet", "flood": "wet", "storm": "wet"},
}
TINY_INSTRUCTION = "Which class fits the cue word in the text? Choose one from the option.\n"


def _sentences(cues: dict[str, str], n: int, rng: random.Random) -> list[Example]:
    words = sorted(cues)
    out = []
    for _ in range(n):
        cue = rng.choice(words)
        # The cue ends the sentence: a fixed offset from the answer keeps it learnable in seconds.
        filler = [rng.choice(FILLER) for _ in range(rng.randint(2, 6))]
        out.append(Example(sentence=" ".join(filler + [cue]), label=cues[cue]))
    return out


def tiny_stream(n_train: int = 96, n_test: int = 24, seed: int = 1234) -> list[Task]:
    """Build the fixture stream deterministically (independent of the run seed)."""
    tasks = []
    for name, cues in TINY_TASKS.items():
        rng = random.Random(f"{seed}:{name}")
        tasks.append(
            Task(
                name=name,
                instruction=TINY_INSTRUCTION,
                labels=sorted(set(cues.values())),
                train=_sentences(cues, n_train, rng),
                test=_sentences(cues, n_test, rng),
                group="tiny",
            )
        )
    return tasks


TINY_GENERATE_INSTRUCTION = "Which class fits the cue word in the text?\n"


def tiny_generation_stream(n_train: int = 96, n_test: int = 24, seed: int = 1234, cues: int = 1) -> list[Task]:
    """The generation twin of :func:`tiny_stream` (``data.benchmark=tiny data.kind=generate``):
    a sentence ends with ``cues`` cue words of the task and the target is their classes in
    order (``"warm"``; ``"warm cool"`` with two cues), generated freely (no label options in
    the prompt) and ended by EOS; scored by ROUGE-L. The tiny model learns one cue in a few
    dozen steps; two cues it does not learn in a test's budget (it answers the same pair
    whatever the input)."""
    tasks = []
    for name, table in TINY_TASKS.items():
        rng = random.Random(f"{seed}:generate:{name}")
        train, test = (_cue_rows(table, n, cues, rng) for n in (n_train, n_test))
        tasks.append(Task(name=name, instruction=TINY_GENERATE_INSTRUCTION, labels=[], train=train, test=test, group="tiny", kind="generate"))
    return tasks


def _cue_rows(table: dict[str, str], n: int, cues: int, rng: random.Random) -> list[Example]:
    words = sorted(table)
    out = []
    for _ in range(n):
        picked = [rng.choice(words) for _ in range(cues)]
        filler = [rng.choice(FILLER) for _ in range(rng.randint(2, 5))]
        out.append(Example(sentence=" ".join(filler + picked), label=" ".join(table[w] for w in picked)))
    return out


def tiny_vocabulary() -> list[str]:
    """Every word the tiny stream and its prompts can contain (for the word-level tokenizer)."""
    words = set(FILLER) | {"Option", "Answer", ":", ",", "?", "."}
    for cues in TINY_TASKS.values():
        words |= set(cues) | set(cues.values())
    for token in TINY_INSTRUCTION.replace("?", " ? ").replace(".", " . ").split():
        words.add(token)
    return sorted(words)
