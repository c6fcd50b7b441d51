import random
import re

import pytest

from lra_data import (
    ListOpsConfig,
    evaluate_listops,
    generate_listops,
    generate_tree,
    listops_symbols,
    read_listops_tsv,
    tokenize_listops,
    tree_to_string,
    tree_value,
    write_listops_tsv,
)

SMALL = {"min_length": 10, "max_length": 80, "max_depth": 5, "max_args": 5}


def test_evaluator_follows_the_operator_definitions():
    assert evaluate_listops("( ( ( [MAX 2 ) 9 ) ] )") == 9
    assert evaluate_listops("[MIN 3 [MAX 1 0 ] 5 ]") == 1
    assert evaluate_listops("[MED 1 2 ]") == 1  # int(median) truncates 1.5
    assert evaluate_listops("[MED 9 1 4 ]") == 4
    assert evaluate_listops("[SM 8 7 9 ]") == 4  # 24 mod 10
    assert evaluate_listops("7") == 7


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("[MAX 1 2", "not closed"),
        ("[MAX 1 2 ] ]", "closes no operator"),
        ("[SM ]", "without arguments"),
        ("1 2", "second expression"),
        ("( )", "no symbols"),
    ],
)
def test_evaluator_refuses_malformed_expressions(source, message):
    with pytest.raises(ValueError, match=message):
        evaluate_listops(source)


def test_every_generated_expression_evaluates_to_its_label():
    pairs = generate_listops(200, seed=3, **SMALL)
    assert len(pairs) == 200
    for source, label in pairs:
        assert evaluate_listops(source) == label
    assert len({label for _, label in pairs}) >= 5


def test_generated_lengths_lie_strictly_within_the_bounds():
    for source, _ in generate_listops(200, seed=4, **SMALL):
        assert 10 < len(listops_symbols(source)) < 80


def test_default_generator_makes_lra_sized_expressions():
    pairs = generate_listops(3, seed=0)
    for source, label in pairs:
        assert 500 < len(tokenize_listops(source)) < 2000
        assert evaluate_listops(source) == label


def test_generated_strings_are_in_the_release_parenthesized_format():
    for source, _ in generate_listops(50, seed=5, **SMALL):
        assert re.fullmatch(r"[()\[\]A-Z0-9 ]+", source)
        assert source.startswith("( ")
        assert source.endswith(" )")
        depth = 0
        for symbol in source.split():
            depth += {"(": 1, ")": -1}.get(symbol, 0)
            assert depth >= 0
        assert depth == 0
        # Each parenthesized pair holds exactly two parts: the left-nested binary form of the LRA code.
        assert source.count("(") == len(listops_symbols(source)) - 1


def test_same_seed_gives_the_same_expressions_and_another_seed_others():
    assert generate_listops(20, seed=7, **SMALL) == generate_listops(20, seed=7, **SMALL)
    assert generate_listops(20, seed=7, **SMALL) != generate_listops(20, seed=8, **SMALL)


def test_tree_value_and_string_agree_with_the_stack_evaluator():
    rng = random.Random(0)
    config = ListOpsConfig(max_depth=6, max_args=4, min_length=0, max_length=10_000)
    for _ in range(300):
        tree, length = generate_tree(rng, config)
        source = tree_to_string(tree)
        assert tree_value(tree) == evaluate_listops(source)
        assert length == len(listops_symbols(source))


def test_operator_probability_zero_gives_single_digits_and_one_always_operators_to_max_depth():
    rng = random.Random(0)
    digits = ListOpsConfig(max_depth=5, max_args=3, min_length=0, max_length=100, operator_prob=0.0)
    assert all(generate_tree(rng, digits)[1] == 1 for _ in range(50))
    full = ListOpsConfig(max_depth=3, max_args=2, min_length=0, max_length=100, operator_prob=1.0)
    # Depth 3 with exactly 2 arguments everywhere: 2 + 2 * (2 + 2 * 1) = 10 tokens.
    assert all(generate_tree(rng, full)[1] == 10 for _ in range(20))


def test_impossible_length_bounds_are_refused_up_front():
    with pytest.raises(ValueError, match="min_length: no expression of depth <= 2"):
        generate_listops(1, seed=0, max_depth=2, min_length=500)
    with pytest.raises(ValueError, match="min_length, max_length"):
        generate_listops(1, seed=0, min_length=10, max_length=11)


def test_generator_gives_up_with_a_clear_error_when_bounds_are_too_rare():
    with pytest.raises(
        RuntimeError, match=r"only 0 of 5 expressions had a length in \(70, 80\) after 10 draws"
    ):
        generate_listops(5, seed=0, min_length=70, max_length=80, max_depth=5, max_args=5, max_attempts=10)


def test_written_tsv_reads_back_through_the_release_reader(tmp_path):
    pairs = generate_listops(30, seed=9, **SMALL)
    path = write_listops_tsv(pairs, tmp_path / "basic_train.tsv")
    assert path.read_text().splitlines()[0] == "Source\tTarget"
    examples = list(read_listops_tsv(path))
    assert [label for _, label in examples] == [label for _, label in pairs]
    for (tokens, _), (source, _) in zip(examples, pairs, strict=True):
        assert tokens.tolist() == tokenize_listops(source).tolist()
