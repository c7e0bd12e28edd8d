"""The package imports and the smallest 4D layout of the tiny model is a valid one."""
import pytest

from minipar.plan.config import ConfigError, ModelConfig, ParallelConfig


def test_tiny_model_accepts_a_2x2x2x2_layout():
    model = ModelConfig.preset("tiny")
    layout = ParallelConfig(tp=2, cp=2, pp=2, dp=2)
    assert layout.validate(model, seq_len=32, global_batch=8) is layout
    assert layout.world_size == 16


def test_a_bad_layout_is_refused_with_the_flag_named():
    with pytest.raises(ConfigError, match=r"--tp 3 does not divide n_heads=8"):
        ParallelConfig(tp=3).validate(ModelConfig.preset("tiny"), seq_len=32, global_batch=8)
