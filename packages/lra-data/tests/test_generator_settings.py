"""The generators' integer settings and counts are checked as integers, naming the setting."""

import pytest

from lra_data import ListOpsConfig, PathfinderConfig, generate_listops, generate_pathfinder


@pytest.mark.parametrize(
    ("config", "setting", "message"),
    [
        (ListOpsConfig, {"max_depth": 0}, r"max_depth: expected an integer >= 1, got 0"),
        (ListOpsConfig, {"max_args": 4.0}, r"max_args: expected an integer >= 2, got 4.0"),
        (ListOpsConfig, {"min_length": -1}, r"min_length: expected an integer >= 0, got -1"),
        (ListOpsConfig, {"max_length": "80"}, r"max_length: expected an integer, got '80'"),
        (PathfinderConfig, {"size": 7}, r"size: expected an integer >= 8, got 7"),
        (PathfinderConfig, {"num_segments": 1.5}, r"num_segments: expected an integer >= 1, got 1.5"),
        (PathfinderConfig, {"num_distractors": -1}, r"num_distractors: expected an integer >= 0, got -1"),
        (PathfinderConfig, {"max_tries": True}, r"max_tries: expected an integer >= 1, got True"),
    ],
    ids=lambda value: "-".join(value) if isinstance(value, dict) else None,
)
def test_integer_settings_must_be_integers_within_their_range(config, setting, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        config(**setting)


@pytest.mark.parametrize("generator", [generate_listops, generate_pathfinder])
def test_a_negative_count_is_refused(generator):
    with pytest.raises(ValueError, match=r"^n: expected an integer >= 0, got -1$"):
        generator(-1, seed=0)
