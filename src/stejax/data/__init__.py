"""Data for the reference quantisation-aware training pipeline.

Load a dataset (the scikit-learn digits by default, or your own ``.npz`` or IDX
files), split it by seed into duplicate-free stratified parts, fit a normaliser on
the training part only, and iterate over minibatches in an explicit order. NumPy
only: scikit-learn is imported inside :func:`load_digits` alone, and nothing here
imports JAX.
"""

from stejax.data._batches import batches as batches
from stejax.data._dataset import Dataset as Dataset
from stejax.data._idx import read_idx as read_idx
from stejax.data._idx import write_idx as write_idx
from stejax.data._loaders import DIGITS_NAME as DIGITS_NAME
from stejax.data._loaders import load_digits as load_digits
from stejax.data._loaders import load_idx as load_idx
from stejax.data._loaders import load_npz as load_npz
from stejax.data._normalizer import Normalizer as Normalizer
from stejax.data._split import Splits as Splits
from stejax.data._split import assert_disjoint as assert_disjoint
from stejax.data._split import split as split
