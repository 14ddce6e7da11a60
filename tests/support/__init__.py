"""Helpers of the test suite: an independent evaluation, Hypothesis strategies, broken kernels."""
