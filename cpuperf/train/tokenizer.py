"""A byte-level BPE tokenizer (GPT-2 style, pure Python), trained on the corpus in about a second.

Ids 0-255 are the raw bytes, so every byte string round-trips; id 256 + i is merge i. Text is
first split into pre-tokens (a word with its leading space, one digit, a run of punctuation, or
whitespace) and merges never cross pre-token boundaries, as in GPT-2
(https://github.com/openai/gpt-2/blob/master/src/encoder.py). Digits are split one by one so
arithmetic stays learnable, as in LLaMA's tokenizer.

Training keeps pair counts and a pair -> words index up to date incrementally, so each merge only
touches the words that contain the merged pair (the standard trick from the HF tokenizers
trainer); that keeps 512 merges on ~400 KB well under the 5 s budget.
"""

from __future__ import annotations

import json
import re
from array import array
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict

TOKENIZER_SCHEMA = "cpuperf.tokenizer/1"
# Every byte falls in exactly one branch, so the pre-tokens always concatenate back to the input.
_PRETOKEN = re.compile(rb" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


def pretokenize(data: bytes) -> list[bytes]:
    """Split bytes into pre-tokens; b''.join(result) == data."""
    return _PRETOKEN.findall(data)


def _merge_word(sym: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    out: list[int] = []
    i, n = 0, len(sym)
    a, b = pair
    while i < n:
        if i < n - 1 and sym[i] == a and sym[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(sym[i])
            i += 1
    return out


@dataclass
class BPETokenizer:
    """Byte-level BPE: `merges[i]` is the pair of ids that becomes id 256 + i."""

    merges: list[tuple[int, int]]
    corpus_sha256: str = ""
    _ranks: dict[tuple[int, int], int] = field(init=False, repr=False)
    _vocab: list[bytes] = field(init=False, repr=False)
    _cache: dict[bytes, list[int]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.merges = [(int(a), int(b)) for a, b in self.merges]
        self._ranks = {pair: i for i, pair in enumerate(self.merges)}
        self._vocab = [bytes([i]) for i in range(256)]
        for a, b in self.merges:
            self._vocab.append(self._vocab[a] + self._vocab[b])
        self._cache = {}

    @property
    def vocab_size(self) -> int:
        """Number of distinct ids (256 bytes + one per merge)."""
        return 256 + len(self.merges)

    @classmethod
    def train(cls, text: str, n_merges: int = 512, corpus_sha256: str = "") -> BPETokenizer:
        """Learn up to `n_merges` merges from `text` (deterministic: ties go to the smaller pair)."""
        word_counts = Counter(pretokenize(text.encode("utf-8")))
        words = [list(w) for w in word_counts]
        freqs = list(word_counts.values())
        pair_counts: dict[tuple[int, int], int] = defaultdict(int)
        where: dict[tuple[int, int], set[int]] = defaultdict(set)
        for wi, sym in enumerate(words):
            f = freqs[wi]
            for pair in zip(sym, sym[1:]):
                pair_counts[pair] += f
                where[pair].add(wi)
        merges: list[tuple[int, int]] = []
        for m in range(n_merges):
            if not pair_counts:
                break
            best = max(pair_counts.items(), key=lambda kv: (kv[1], -kv[0][0], -kv[0][1]))[0]
            if pair_counts[best] < 2:
                break
            new_id = 256 + m
            merges.append(best)
            for wi in where.pop(best, ()):
                sym = words[wi]
                f = freqs[wi]
                new = _merge_word(sym, best, new_id)
                if len(new) == len(sym):
                    continue  # stale index entry: the pair left this word in an earlier merge
                for pair in zip(sym, sym[1:]):
                    c = pair_counts[pair] - f
                    if c > 0:
                        pair_counts[pair] = c
                    else:
                        pair_counts.pop(pair, None)
                for pair in zip(new, new[1:]):
                    pair_counts[pair] += f
                    where[pair].add(wi)
                words[wi] = new
            pair_counts.pop(best, None)
        return cls(merges=merges, corpus_sha256=corpus_sha256)

    def _encode_word(self, word: bytes) -> list[int]:
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        sym = list(word)
        ranks = self._ranks
        while len(sym) > 1:
            best_rank, best = None, None
            for pair in zip(sym, sym[1:]):
                r = ranks.get(pair)
                if r is not None and (best_rank is None or r < best_rank):
                    best_rank, best = r, pair
            if best is None or best_rank is None:
                break
            sym = _merge_word(sym, best, 256 + best_rank)
        self._cache[word] = sym
        return sym

    def encode(self, text: str | bytes) -> list[int]:
        """Token ids for `text` (str is UTF-8 encoded first)."""
        data = text.encode("utf-8") if isinstance(text, str) else text
        out: list[int] = []
        for w in pretokenize(data):
            out.extend(self._encode_word(w))
        return out

    def decode_bytes(self, ids: list[int]) -> bytes:
        """The exact bytes that `ids` stand for."""
        return b"".join(self._vocab[i] for i in ids)

    def decode(self, ids: list[int]) -> str:
        """Text for `ids` (invalid UTF-8, e.g. a cut multi-byte character, becomes U+FFFD)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def to_json(self) -> Dict[str, object]:
        """JSON-ready form (schema, merges, the corpus it was trained on)."""
        return {"schema": TOKENIZER_SCHEMA, "corpus_sha256": self.corpus_sha256,
                "vocab_size": self.vocab_size, "merges": [list(p) for p in self.merges]}

    @classmethod
    def from_json(cls, obj: Dict[str, Any]) -> BPETokenizer:
        """Inverse of to_json(); ValueError on another schema."""
        if obj.get("schema") != TOKENIZER_SCHEMA:
            raise ValueError(f"not a {TOKENIZER_SCHEMA} tokenizer file")
        return cls(merges=[tuple(p) for p in obj["merges"]],
                   corpus_sha256=str(obj.get("corpus_sha256", "")))


def load_or_train(cache_dir: Path, text: str, corpus_sha: str,
                  n_merges: int) -> tuple[BPETokenizer, list[int], bool]:
    """Tokenizer and token ids for `text`, from `cache_dir` when they match, else trained and cached.

    Returns (tokenizer, ids, from_cache). Concurrent ranks may both train; the files they write are
    identical and each lands atomically, so no barrier is needed.
    """
    key = f"{corpus_sha[:16]}-m{n_merges}"
    tok_path = cache_dir / f"tokenizer-{key}.json"
    ids_path = cache_dir / f"tokens-{key}.u16"
    try:
        tok = BPETokenizer.from_json(json.loads(tok_path.read_text()))
        arr = array("H")
        arr.frombytes(ids_path.read_bytes())
        if tok.corpus_sha256 == corpus_sha and len(tok.merges) <= n_merges and len(arr) > 0:
            return tok, arr.tolist(), True
    except (OSError, ValueError, KeyError, TypeError):
        pass
    tok = BPETokenizer.train(text, n_merges=n_merges, corpus_sha256=corpus_sha)
    ids = tok.encode(text)
    from cpuperf.fsutil import atomic_write_bytes

    atomic_write_bytes(tok_path, json.dumps(tok.to_json()).encode())
    atomic_write_bytes(ids_path, array("H", ids).tobytes())
    return tok, ids, False
