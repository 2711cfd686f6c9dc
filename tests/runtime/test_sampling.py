"""Host-side sampling used by generate(): greedy, temperature, top-k, top-p."""

import numpy as np
import pytest

from llmc.runtime.generate import sample

LOGITS = np.array([0.1, 2.0, -1.0, 1.5, 0.0, 2.0, -3.0], dtype=np.float32)


def test_greedy_is_first_argmax():
    assert sample(LOGITS, None, 0.0, 0, 1.0) == 1  # indices 1 and 5 tie; the first wins, like torch.argmax


def test_top_k_excludes_everything_else():
    rng = np.random.default_rng(0)
    seen = {sample(LOGITS, rng, 5.0, 2, 1.0) for _ in range(300)}
    assert seen == {1, 5}


def test_top_p_keeps_the_smallest_nucleus():
    rng = np.random.default_rng(1)
    # probabilities at temperature 1: the two 2.0 logits hold ~0.33 each, 1.5 ~0.20: p=0.6 keeps just those two
    seen = {sample(LOGITS, rng, 1.0, 0, 0.6) for _ in range(300)}
    assert seen == {1, 5}


def test_temperature_sampling_follows_softmax():
    rng = np.random.default_rng(2)
    n = 20000
    counts = np.bincount([sample(LOGITS, rng, 1.0, 0, 1.0) for _ in range(n)], minlength=LOGITS.size)
    p = np.exp(LOGITS - LOGITS.max())
    p /= p.sum()
    # 5 standard deviations of a binomial count: fails only if the distribution is wrong
    assert np.all(np.abs(counts - n * p) <= 5 * np.sqrt(n * p * (1 - p)) + 1)


def test_seeded_runs_repeat():
    a = [sample(LOGITS, np.random.default_rng(7), 1.0, 0, 1.0) for _ in range(5)]
    b = [sample(LOGITS, np.random.default_rng(7), 1.0, 0, 1.0) for _ in range(5)]
    assert a == b


@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
def test_top_k_one_is_greedy(temperature):
    rng = np.random.default_rng(3)
    assert all(sample(LOGITS, rng, temperature, 1, 1.0) in (1, 5) for _ in range(50))
