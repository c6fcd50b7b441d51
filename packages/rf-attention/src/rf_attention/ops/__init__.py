"""The attention kernels, one module per mode, as flash-linear-attention lays out its ops.

- [`naive`][rf_attention.ops.naive]: the plain quadratic references the fast paths are tested against;
- [`features`][rf_attention.ops.features]: stabilized features, the closed forms and their VJPs;
- [`noncausal`][rf_attention.ops.noncausal]: the chunked non-causal kernel;
- [`causal`][rf_attention.ops.causal]: the chunked causal kernel;
- [`recurrent`][rf_attention.ops.recurrent]: the recurrent (decoding) form, prefill state and step;
- [`window`][rf_attention.ops.window]: the sliding-window hybrid (exact softmax weights, then features);
- [`common`][rf_attention.ops.common]: the normalizer's guard, the group rule and the helpers they share.
"""
