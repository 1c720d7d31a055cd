"""Conformance cases oxla is known to fail, each with its reason; the ratchet only goes up."""

from __future__ import annotations

# Raise MIN_PASSING whenever more cases pass; never lower it.
MIN_PASSING = 2021

_RANDOM = ("expected values are draws from numpy's generator made when the case was built; oxla "
           "draws from a jax PRNG, so values cannot match (shapes and dtypes do)")
_IFFT = ("expected output is numpy's complex64 ifft, with 1.9e-7 noise where the exact value is 0 "
         "(above atol 1e-7); oxla's float64 FFT gives ~1e-16 there")

EXPECTED_FAILURES: dict[str, str] = {
    "test_bernoulli": _RANDOM,
    "test_bernoulli_double": _RANDOM,
    "test_bernoulli_double_expanded": _RANDOM,
    "test_bernoulli_expanded": _RANDOM,
    "test_bernoulli_seed": _RANDOM + " (a seed fixes oxla's draws, not numpy's)",
    "test_bernoulli_seed_expanded": _RANDOM + " (a seed fixes oxla's draws, not numpy's)",
    "test_training_dropout": _RANDOM,
    "test_training_dropout_default": _RANDOM,
    "test_training_dropout_default_mask": _RANDOM,
    "test_training_dropout_mask": _RANDOM,
    "test_dft_inverse": _IFFT,
    "test_dft_inverse_opset19": _IFFT,
}
