"""The shipped training corpus: license-clean English-like text, and the train/eval split.

The text in data/corpus.txt.gz is *generated* by `generate_corpus()` below from word lists and
sentence templates written for cpuperf (no third-party text, so no licence question). It has real
structure for a small LM to learn - grammar, agreement-free templates, recurring names, arithmetic
facts, counting, weather reports, recipes - so the loss falls quickly and keeps falling.

Rebuild the shipped file with `python -m cpuperf.train.corpus --build` (tests check it is current).
"""

from __future__ import annotations

import gzip
import hashlib
import random
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

CORPUS_FILE = "corpus.txt.gz"
DEFAULT_SEED = 20241122
DEFAULT_SIZE = 400_000  # characters; ~130k BPE tokens with 512 merges

_NAMES = ["Ada", "Bruno", "Clara", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas",
          "Kira", "Leon", "Mira", "Nils", "Olga", "Pavel", "Rosa", "Sami", "Tara", "Viktor"]
_ANIMALS = ["fox", "owl", "heron", "badger", "otter", "crow", "goat", "hare", "wolf", "lynx",
            "mole", "swan", "trout", "beetle", "sparrow"]
_ADJ = ["small", "quiet", "bright", "old", "clever", "tired", "brave", "curious", "gentle",
        "patient", "hungry", "careful", "cheerful", "stubborn", "young"]
_PLACES = ["the mill", "the harbour", "the market", "the orchard", "the old bridge", "the forest",
           "the library", "the school", "the river bank", "the hill", "the bakery", "the station",
           "the workshop", "the garden", "the lighthouse"]
_OBJECTS = ["a lantern", "a map", "a copper key", "a basket of apples", "a wooden box",
            "a blue scarf", "a letter", "a compass", "a loaf of bread", "a bell", "a kite",
            "a clay jar", "a ladder", "a notebook", "a pair of boots"]
_VERBS_PAST = ["walked to", "ran to", "looked around", "waited near", "climbed up to",
               "wandered through", "hurried past", "returned to", "rested at", "sang near"]
_FEELINGS = ["happy", "worried", "surprised", "calm", "proud", "sleepy", "excited", "puzzled"]
_TIMES = ["In the morning", "At noon", "Later that day", "In the evening", "At night",
          "Before sunrise", "After lunch", "On Sunday", "The next day", "Once upon a time"]
_WEATHER = ["sunny", "cloudy", "rainy", "windy", "foggy", "snowy", "stormy", "clear"]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_TOWNS = ["Amberfield", "Brookmere", "Coldwater", "Dunmore", "Eastwick", "Fernhollow",
          "Greystone", "Highmoor", "Ivybridge", "Juniper Bay"]
_FOODS = ["flour", "sugar", "butter", "eggs", "milk", "salt", "honey", "oats", "apples",
          "cheese", "onions", "carrots", "rice", "beans", "pepper"]
_DISHES = ["bread", "soup", "pie", "porridge", "stew", "cake", "pancakes", "salad"]
_NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                 "ten", "eleven", "twelve"]


def _story(rng: random.Random) -> str:
    name = rng.choice(_NAMES)
    friend = rng.choice([n for n in _NAMES if n != name])
    animal = rng.choice(_ANIMALS)
    adj = rng.choice(_ADJ)
    place, place2 = rng.sample(_PLACES, 2)
    obj = rng.choice(_OBJECTS)
    lines = [
        f"{rng.choice(_TIMES)}, {name} {rng.choice(_VERBS_PAST)} {place}.",
        f"There {name} met a {adj} {animal}.",
        f"The {animal} was carrying {obj}.",
        f'"Where are you going?" asked {name}.',
        f'"I am going to {place2}," said the {animal}, "because I lost my way."',
        f"{name} felt {rng.choice(_FEELINGS)} and decided to help.",
    ]
    if rng.random() < 0.5:
        lines.append(f"Together they found {friend}, who knew the road to {place2}.")
    lines.append(f"When they reached {place2}, the {animal} gave {name} {obj} as a thank you.")
    lines.append(f"{name} walked home and told {friend} the whole story.")
    return " ".join(lines)


def _arithmetic(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randint(4, 8)):
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        op = rng.random()
        if op < 0.45:
            out.append(f"{a} plus {b} is {a + b}.")
        elif op < 0.8:
            hi, lo = max(a, b), min(a, b)
            out.append(f"{hi} minus {lo} is {hi - lo}.")
        else:
            a, b = a % 13, b % 13
            out.append(f"{a} times {b} is {a * b}.")
    return " ".join(out)


def _counting(rng: random.Random) -> str:
    start = rng.randint(1, 80)
    step = rng.choice([1, 2, 3, 5, 10])
    nums = [str(start + i * step) for i in range(rng.randint(5, 10))]
    what = rng.choice(_ANIMALS)
    return f"Counting the {what}s by {step}: " + ", ".join(nums) + "."


def _weather(rng: random.Random) -> str:
    town = rng.choice(_TOWNS)
    day = rng.choice(_DAYS)
    w = rng.choice(_WEATHER)
    lo = rng.randint(-5, 18)
    hi = lo + rng.randint(2, 12)
    wind = rng.randint(0, 60)
    return (f"Weather for {town} on {day}: {w}, with a low of {lo} degrees and a high of {hi} "
            f"degrees. Wind {wind} kilometres per hour.")


def _recipe(rng: random.Random) -> str:
    dish = rng.choice(_DISHES)
    items = rng.sample(_FOODS, rng.randint(3, 6))
    parts = [f"To make {dish} you need " + ", ".join(items[:-1]) + f" and {items[-1]}."]
    for i, item in enumerate(items, 1):
        qty = rng.randint(1, 9)
        n = _NUMBER_WORDS[qty]
        parts.append(f"Step {i}: add {n} spoons of {item} and stir.")
    parts.append(f"Bake or cook for {rng.choice([10, 15, 20, 30, 45, 60])} minutes. "
                 f"The {dish} is ready.")
    return " ".join(parts)


def _dialogue(rng: random.Random) -> str:
    a, b = rng.sample(_NAMES, 2)
    town = rng.choice(_TOWNS)
    n = rng.randint(2, 12)
    return (f'{a}: "Have you been to {town}?"\n{b}: "Yes, I went there {_NUMBER_WORDS[n]} times."\n'
            f'{a}: "What did you like most?"\n{b}: "I liked {rng.choice(_PLACES)} and '
            f'{rng.choice(_PLACES)}."')


_KINDS = [(_story, 5), (_arithmetic, 2), (_counting, 1), (_weather, 2), (_recipe, 2),
          (_dialogue, 2)]


def generate_corpus(seed: int = DEFAULT_SEED, size: int = DEFAULT_SIZE) -> str:
    """Deterministically generate about `size` characters of paragraphs separated by blank lines."""
    rng = random.Random(seed)
    funcs = [f for f, _ in _KINDS]
    weights = [w for _, w in _KINDS]
    paras: list[str] = []
    total = 0
    while total < size:
        p = rng.choices(funcs, weights)[0](rng)
        paras.append(p)
        total += len(p) + 2
    return "\n\n".join(paras) + "\n"


def load_corpus() -> str:
    """The shipped corpus text (data/corpus.txt.gz inside the package)."""
    ref = resources.files("cpuperf.train").joinpath("data").joinpath(CORPUS_FILE)
    return gzip.decompress(ref.read_bytes()).decode("utf-8")


def corpus_sha256(text: str) -> str:
    """Hex digest identifying a corpus text (keys the tokenizer cache)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Split:
    """Token ids split into a training part and a held-out evaluation part."""

    train: list[int]
    eval: list[int]


def split_tokens(ids: list[int], eval_fraction: float = 0.05) -> Split:
    """Hold out the last `eval_fraction` of the token stream for evaluation (no overlap)."""
    n_eval = max(1, int(len(ids) * eval_fraction))
    return Split(train=ids[:-n_eval], eval=ids[-n_eval:])


def build_shipped_file(path: Path | None = None) -> Path:
    """Write data/corpus.txt.gz from the generator (mtime 0, so the bytes are reproducible)."""
    path = path or Path(__file__).with_name("data") / CORPUS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    data = gzip.compress(generate_corpus().encode("utf-8"), compresslevel=9, mtime=0)
    path.write_bytes(data)
    return path


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    if sys.argv[1:] == ["--build"]:
        print(build_shipped_file())
    else:
        sys.stderr.write("usage: python -m cpuperf.train.corpus --build\n")
        raise SystemExit(2)
