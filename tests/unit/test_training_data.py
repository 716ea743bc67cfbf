"""The token stream: deterministic, sharded by data-parallel rank, resumable from a sample index."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workers.training.data import ShardedTokenLoader, TokenCorpus, stdlib_files


@pytest.fixture(scope="module")
def corpus() -> TokenCorpus:
    return TokenCorpus.from_source(None)


def batches(loader: ShardedTokenLoader, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [loader.next_batch() for _ in range(n)]


def test_stdlib_corpus_is_this_interpreters_sources(corpus):
    files = stdlib_files()
    assert len(files) > 500 and all(f.suffix == ".py" for f in files)
    assert not any("site-packages" in f.parts for f in files)
    assert corpus.num_tokens == sum(f.stat().st_size for f in files)
    assert b"def " in bytes(corpus.read(0, 100_000).astype(np.uint8))


def test_same_seed_gives_same_batches_and_labels_are_shifted_inputs(corpus):
    a = batches(ShardedTokenLoader(corpus, 32, 8, seed=3), 3)
    b = batches(ShardedTokenLoader(corpus, 32, 8, seed=3), 3)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert xa.shape == (8, 32) and torch.equal(xa[:, 1:], ya[:, :-1])
    other = ShardedTokenLoader(corpus, 32, 8, seed=4).next_batch()[0]
    assert not torch.equal(a[0][0], other)


@pytest.mark.parametrize("dp", [2, 4])
def test_data_parallel_ranks_split_the_single_process_batch(corpus, dp):
    whole = batches(ShardedTokenLoader(corpus, 16, 8, seed=1), 2)
    shards = [batches(ShardedTokenLoader(corpus, 16, 8, dp_rank=r, dp_size=dp, seed=1), 2) for r in range(dp)]
    for step in range(2):
        assert torch.equal(torch.cat([shards[r][step][0] for r in range(dp)]), whole[step][0])


def test_resume_from_consumed_samples_continues_the_same_order(corpus):
    loader = ShardedTokenLoader(corpus, 16, 4, seed=2)
    batches(loader, 3)
    state = loader.state_dict()
    assert state == {"consumed_samples": 12}
    expected = loader.next_batch()
    resumed = ShardedTokenLoader(corpus, 16, 4, seed=2)
    resumed.load_state_dict(state)
    assert torch.equal(resumed.next_batch()[0], expected[0])
    direct = ShardedTokenLoader(corpus, 16, 4, seed=2, consumed_samples=12)
    assert torch.equal(direct.next_batch()[0], expected[0])


def test_epochs_wrap_with_a_new_permutation(tmp_path):
    (tmp_path / "a.bin").write_bytes(bytes(range(200)))
    corpus = TokenCorpus.from_source(str(tmp_path))
    loader = ShardedTokenLoader(corpus, 9, 2, seed=0)
    seen = [loader.sample(i)[0] for i in range(loader.num_samples * 2)]
    first, second = seen[: loader.num_samples], seen[loader.num_samples :]
    assert sorted(first) == sorted(second) and first != second


def test_user_token_files_npy_and_raw_bytes_concatenate_in_path_order(tmp_path):
    np.save(tmp_path / "b.npy", np.arange(300, 310, dtype=np.uint16))
    (tmp_path / "a.txt").write_bytes(b"hello")
    corpus = TokenCorpus.from_source(str(tmp_path))
    assert corpus.num_tokens == 15
    assert corpus.read(3, 5).tolist() == [ord("l"), ord("o"), 300, 301, 302]
    assert corpus.max_token() == 309


def test_too_small_corpus_is_rejected(tmp_path):
    (tmp_path / "t").write_bytes(b"tiny")
    with pytest.raises(ValueError, match="fewer than one global batch"):
        ShardedTokenLoader(TokenCorpus.from_source(str(tmp_path)), 32, 8)
