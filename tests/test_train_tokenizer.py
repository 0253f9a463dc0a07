"""Corpus and byte-level BPE tokenizer: round-trips, determinism, cache, shipped data."""

from __future__ import annotations

import random

import pytest

from cpuperf.train.corpus import corpus_sha256, generate_corpus, load_corpus, split_tokens
from cpuperf.train.tokenizer import BPETokenizer, load_or_train, pretokenize


@pytest.fixture(scope="module")
def corpus() -> str:
    return load_corpus()


@pytest.fixture(scope="module")
def tok(corpus: str) -> BPETokenizer:
    return BPETokenizer.train(corpus, n_merges=512, corpus_sha256=corpus_sha256(corpus))


def test_shipped_corpus_is_the_generator_output(corpus: str) -> None:
    # The data file is reproducible from code in this repo: nothing third-party is shipped.
    assert corpus == generate_corpus()
    assert 200_000 < len(corpus) < 1_000_000


def test_pretokens_cover_every_byte() -> None:
    data = bytes(range(256)) * 3 + b"  Hello,  world 123\n\n\t x"
    assert b"".join(pretokenize(data)) == data


def test_round_trip_corpus(tok: BPETokenizer, corpus: str) -> None:
    sample = corpus[:20_000]
    ids = tok.encode(sample)
    assert tok.decode(ids) == sample
    assert len(ids) < len(sample.encode()) / 2.5  # merges actually compress
    assert max(ids) < tok.vocab_size == 256 + 512


def test_round_trip_arbitrary_bytes_and_unicode(tok: BPETokenizer) -> None:
    rng = random.Random(0)
    for _ in range(20):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
        assert tok.decode_bytes(tok.encode(data)) == data
    text = "Grüße, 東京! naïve café — 42 plus 7 is 49.\n"
    assert tok.decode(tok.encode(text)) == text


def test_training_is_deterministic_and_json_round_trips(tok: BPETokenizer, corpus: str) -> None:
    again = BPETokenizer.train(corpus, n_merges=512, corpus_sha256=tok.corpus_sha256)
    assert again.merges == tok.merges
    loaded = BPETokenizer.from_json(tok.to_json())
    assert loaded.merges == tok.merges and loaded.vocab_size == tok.vocab_size
    with pytest.raises(ValueError):
        BPETokenizer.from_json({"schema": "other"})


def test_cache_is_reused(tmp_path, corpus: str) -> None:
    sha = corpus_sha256(corpus)
    tok1, ids1, cached1 = load_or_train(tmp_path, corpus, sha, 256)
    tok2, ids2, cached2 = load_or_train(tmp_path, corpus, sha, 256)
    assert (cached1, cached2) == (False, True)
    assert ids1 == ids2 and tok1.merges == tok2.merges
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temp files


def test_split_has_no_overlap() -> None:
    ids = list(range(1000))
    sp = split_tokens(ids, eval_fraction=0.1)
    assert sp.train == list(range(900)) and sp.eval == list(range(900, 1000))
