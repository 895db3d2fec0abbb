"""The hand-off's conversions between numpy arrays (TensorFlow's and JAX's host calls) and torch
tensors: memory shared both ways, bfloat16 through its bits, read-only arrays without a warning."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from ringtrain.keras.handoff import to_numpy, to_torch


def test_a_writable_array_is_shared_not_copied():
    array = np.arange(6, dtype=np.float32)
    tensor = to_torch(array)
    tensor.mul_(2)
    assert array.tolist() == [0, 2, 4, 6, 8, 10]
    assert np.shares_memory(to_numpy(tensor), array)


def test_a_read_only_array_is_read_without_a_warning():
    array = np.arange(4, dtype=np.float64)
    array.flags.writeable = False  # as JAX hands arrays to a callback
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensor = to_torch(array)
    assert tensor.dtype is torch.float64 and tensor.tolist() == [0, 1, 2, 3]


def test_bfloat16_crosses_through_its_bits():
    ml_dtypes = pytest.importorskip("ml_dtypes")  # numpy's bfloat16 (TensorFlow's and JAX's)
    array = np.array([1.5, -2.0, 3.25], dtype=ml_dtypes.bfloat16)
    tensor = to_torch(array)
    assert tensor.dtype is torch.bfloat16 and tensor.tolist() == [1.5, -2.0, 3.25]
    back = to_numpy(tensor)
    assert back.dtype == ml_dtypes.bfloat16 and np.shares_memory(back, array)
