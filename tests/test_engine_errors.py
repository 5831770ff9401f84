"""Bad input gets a clear ValueError."""
from __future__ import annotations

import pytest
import torch

from ddprobe.engine import Engine, ModelConfig


@pytest.fixture(scope="module")
def eng() -> Engine:
    return Engine("tiny", budget=8, max_ctx=64)


def test_empty_prompt(eng):
    with pytest.raises(ValueError, match="empty prompt"):
        eng.generate([], 4)
    with pytest.raises(ValueError, match="empty prompt"):
        eng.greedy_reference([], 4)


def test_budget_below_one():
    with pytest.raises(ValueError, match="budget must be >= 1"):
        Engine("tiny", budget=0)


def test_context_beyond_the_cache(eng):
    with pytest.raises(ValueError, match="context beyond the cache"):
        eng.generate(list(range(40)), 20)  # 40 + 20 + 9 rows > 64
    assert len(eng.generate(list(range(40)), 15).tokens) == 15  # 40 + 15 + 9 = 64 fits


def test_other_bad_arguments(eng):
    with pytest.raises(ValueError, match="max_new_tokens"):
        eng.generate([1], 0)
    with pytest.raises(ValueError, match="token ids"):
        eng.generate([1, eng.config.target.vocab_size], 4)
    with pytest.raises(ValueError, match="temperature"):
        eng.generate([1], 4, temperature=-1.0)


def test_bad_config_and_paths():
    with pytest.raises(ValueError, match="unknown preset 'huge'; known: tiny, k2"):
        ModelConfig.from_name("huge")
    with pytest.raises(ValueError, match="L >= 1"):
        ModelConfig.from_name("tiny", block_size=1)
    with pytest.raises(ValueError, match="unknown config field"):
        ModelConfig.from_name("tiny", nope=3)
    with pytest.raises(ValueError, match="heads"):
        ModelConfig.from_name("k2", heads=0)
    with pytest.raises(ValueError, match="unknown attention path"):
        Engine("tiny", attn="flash")
    with pytest.raises(ValueError, match="unknown kv layout"):
        Engine("tiny", kv_layout="pages")
    with pytest.raises(ValueError, match="tree shape"):
        Engine("tiny", tree_shape="star")


def test_incompatible_attention_path_and_layout():
    pytest.importorskip("triton")
    with pytest.raises(ValueError, match="needs kv_layout='paged'"):
        Engine("tiny", attn="paged", kv_layout="contiguous")
    with pytest.raises(ValueError, match="needs kv_layout='contiguous'"):
        Engine("tiny", attn="split", kv_layout="paged")
    assert Engine("tiny", attn="split", dtype=torch.float32).kv_layout == "contiguous"  # default: the path's
    assert Engine("tiny").kv_layout == "paged"  # reference works on both; paged is the default


def test_a_path_that_cannot_take_the_models_rows_is_refused_naming_them():
    """split_ws is written for K2's 512 + 64 rows: the tiny model (64 + 32, rope 32) is refused before any weight
    is made, with its real widths."""
    with pytest.raises(ValueError, match=r"split_ws takes MLA rows of 512 \+ 64; this model's are 64 \+ 32"):
        Engine("tiny", attn="split_ws")
