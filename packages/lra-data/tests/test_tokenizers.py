import numpy as np
import pytest

from lra_data import (
    LISTOPS_VOCAB,
    detokenize_bytes,
    detokenize_listops,
    listops_symbols,
    rgb_to_gray,
    tokenize_bytes,
    tokenize_listops,
    tokenize_pixels,
)


def test_listops_tokens_keep_operator_brackets_and_closing_bracket_and_drop_parentheses():
    assert listops_symbols("( ( ( [MAX 2 ) 9 ) ] )") == ["[MAX", "2", "9", "]"]
    ids = tokenize_listops("( ( ( [MAX 2 ) 9 ) ] )")
    assert [LISTOPS_VOCAB[i] for i in ids] == ["[MAX", "2", "9", "]"]
    assert detokenize_listops(ids) == "[MAX 2 9 ]"


def test_listops_vocabulary_has_padding_at_zero_and_every_symbol_once():
    assert LISTOPS_VOCAB[0] == "<pad>"
    assert len(set(LISTOPS_VOCAB)) == len(LISTOPS_VOCAB) == 16
    assert set(LISTOPS_VOCAB[1:]) == {"[MAX", "[MIN", "[MED", "[SM", "]", *map(str, range(10))}


def test_listops_unknown_symbol_is_refused_with_its_name():
    with pytest.raises(ValueError, match=r"unknown ListOps symbol '\[FIRST'"):
        tokenize_listops("( [FIRST 1 ] )")
    with pytest.raises(ValueError, match=r"unknown ListOps symbol 'MAX'"):
        tokenize_listops("MAX 1 2 ]")  # the bracket-less form the TF tokenizer produced


def test_byte_tokens_are_bytes_plus_one_and_round_trip():
    text = "caf\u00e9 \x00!"
    ids = tokenize_bytes(text)
    assert ids.tolist() == [b + 1 for b in text.encode("utf-8")]
    assert ids.min() >= 1
    assert detokenize_bytes(np.concatenate([ids, [0, 0]])) == text.encode("utf-8")


def test_black_pixels_are_token_one_not_padding():
    image = np.array([[0, 255], [7, 0]], dtype=np.uint8)
    assert tokenize_pixels(image).tolist() == [1, 256, 8, 1]


def test_pixel_tokenizer_refuses_non_uint8_images():
    with pytest.raises(ValueError, match="expected a uint8 gray image, got dtype float32"):
        tokenize_pixels(np.zeros((2, 2), dtype=np.float32))


def test_gray_conversion_follows_tensorflow_rgb_to_grayscale():
    rgb = np.array(
        [[0, 0, 0], [255, 255, 255], [255, 0, 0], [0, 255, 0], [0, 0, 255], [10, 200, 30]], np.uint8
    )
    gray = rgb_to_gray(rgb)
    expected = [
        int(np.floor((0.2989 * r + 0.5870 * g + 0.1140 * b) / 255 * 255.5)) for r, g, b in rgb.astype(float)
    ]
    assert gray.tolist() == expected
    assert gray.tolist()[:3] == [0, 255, 76]


def test_kept_brackets_tell_apart_expressions_that_alphanumeric_tokens_confuse():
    a, b = "[MAX 2 [MIN 3 4 ] 5 ]", "[MAX 2 [MIN 3 4 5 ] ]"
    alphanumeric = [[s.strip("[]") for s in x.split() if s.strip("[]")] for x in (a, b)]
    assert alphanumeric[0] == alphanumeric[1]  # what the TF tokenizer saw: the same sequence
    assert tokenize_listops(a).tolist() != tokenize_listops(b).tolist()
