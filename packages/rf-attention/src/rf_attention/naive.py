"""The plain quadratic references (see [`rf_attention.ops.naive`][rf_attention.ops.naive])."""

from rf_attention.ops.naive import naive_linear_attention, naive_rf_attention, naive_softmax_attention

__all__ = ["naive_linear_attention", "naive_rf_attention", "naive_softmax_attention"]
