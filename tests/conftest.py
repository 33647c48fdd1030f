"""Shared test helpers: where the optional real-MNIST file is."""

import os
import pathlib

# MNIST train class counts (dsfl.md / shared/data/README.md).
MNIST_COUNTS = (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949)


def mnist_path() -> pathlib.Path:
  """``$FEDJAX_KD_MNIST`` or ``../shared/data/mnist.npz`` beside the repo (may be absent)."""
  env = os.environ.get('FEDJAX_KD_MNIST')
  if env:
    return pathlib.Path(env)
  return pathlib.Path(__file__).resolve().parents[2] / 'shared/data/mnist.npz'
