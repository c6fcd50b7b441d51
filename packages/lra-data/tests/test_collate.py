import pytest
import torch

from lra_data import Batch, PairBatch, collate, pad


def _items():
    return [(torch.tensor([5, 1, 2]), 1), (torch.tensor([7]), 0), (torch.tensor([1, 1, 1, 1]), 3)]


def test_collate_pads_to_the_longest_and_masks_exactly_the_padding():
    batch = collate(_items())
    assert isinstance(batch, Batch)
    assert batch.tokens.tolist() == [[5, 1, 2, 0], [7, 0, 0, 0], [1, 1, 1, 1]]
    assert batch.key_padding_mask.tolist() == [
        [False, False, False, True],
        [False, True, True, True],
        [False, False, False, False],
    ]
    assert batch.labels.tolist() == [1, 0, 3]
    assert batch.tokens.dtype == torch.int64
    assert batch.key_padding_mask.dtype == torch.bool


def test_token_one_for_a_black_pixel_is_not_masked():
    batch = collate([(torch.tensor([1, 1]), 0), (torch.tensor([1]), 1)])
    assert batch.key_padding_mask.tolist() == [[False, False], [False, True]]


def test_collate_pads_to_a_fixed_length():
    batch = collate(_items(), length=6)
    assert batch.tokens.shape == (3, 6)
    assert batch.key_padding_mask.sum(1).tolist() == [3, 5, 2]


def test_collate_refuses_a_sequence_longer_than_the_fixed_length():
    with pytest.raises(
        ValueError, match=r"length: sequences\[2\] has 4 tokens, more than the fixed length 3"
    ):
        collate(_items(), length=3)


def test_retrieval_collate_returns_both_documents_padded_separately():
    items = [
        ((torch.tensor([3, 4]), torch.tensor([9])), 1),
        ((torch.tensor([2]), torch.tensor([8, 8, 8])), 0),
    ]
    batch = collate(items)
    assert isinstance(batch, PairBatch)
    assert batch.tokens_0.tolist() == [[3, 4], [2, 0]]
    assert batch.key_padding_mask_0.tolist() == [[False, False], [False, True]]
    assert batch.tokens_1.tolist() == [[9, 0, 0], [8, 8, 8]]
    assert batch.key_padding_mask_1.tolist() == [[False, True, True], [False, False, False]]
    assert batch.labels.tolist() == [1, 0]


def test_collate_refuses_empty_and_mixed_batches():
    with pytest.raises(ValueError, match="batch: expected at least one item"):
        collate([])
    with pytest.raises(ValueError, match="got a mix"):
        collate([(torch.tensor([1]), 0), ((torch.tensor([1]), torch.tensor([2])), 1)])


def test_pad_refuses_tensors_that_are_not_one_dimensional():
    with pytest.raises(ValueError, match=r"sequences\[1\]: expected a 1-d token tensor, got \(2, 2\)"):
        pad([torch.tensor([1]), torch.ones(2, 2, dtype=torch.long)])
