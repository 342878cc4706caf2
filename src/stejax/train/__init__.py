"""The reference quantisation-aware training pipeline: train one model, or compare the QAT presets.

Pure functions for one step (:func:`forward`, :func:`loss`, :func:`update`), a
training loop with one explicit key stream, early stopping and a non-finite guard
(:func:`train`; :func:`train_seeds` runs several seeds of one recipe as one
program), run directories written with safetensors and JSON (:func:`save_run`,
:func:`load_run`), data-parallel training over a device mesh, on one host or
many (:func:`data_mesh`, ``train(..., mesh=...)``), and the comparison of every
QAT preset over seeds, a split per seed, paired with float
(:func:`compare`, :func:`paired_delta`). Needs the optional extra
``stejax[train]`` (optax, scikit-learn, safetensors; matplotlib for the plots).
"""

from stejax.train._compare import SPLITS as SPLITS
from stejax.train._compare import compare as compare
from stejax.train._compare import paired_delta as paired_delta
from stejax.train._compare import time_steps as time_steps
from stejax.train._config import TrainConfig as TrainConfig
from stejax.train._config import make_optimizer as make_optimizer
from stejax.train._loop import load_splits as load_splits
from stejax.train._loop import train as train
from stejax.train._parallel import DATA_AXIS as DATA_AXIS
from stejax.train._parallel import PARAM_SHARDINGS as PARAM_SHARDINGS
from stejax.train._parallel import compiled_parallel_update as compiled_parallel_update
from stejax.train._parallel import data_mesh as data_mesh
from stejax.train._parallel import gather as gather
from stejax.train._parallel import param_shardings as param_shardings
from stejax.train._parallel import place as place
from stejax.train._parallel import shard_batch as shard_batch
from stejax.train._products import PRODUCTS as PRODUCTS
from stejax.train._products import IntegerProducts as IntegerProducts
from stejax.train._result import KeyCheck as KeyCheck
from stejax.train._result import TrainResult as TrainResult
from stejax.train._rundir import Run as Run
from stejax.train._rundir import load_params as load_params
from stejax.train._rundir import load_run as load_run
from stejax.train._rundir import save_params as save_params
from stejax.train._rundir import save_run as save_run
from stejax.train._seeds import train_seeds as train_seeds
from stejax.train._step import Batch as Batch
from stejax.train._step import NonFiniteError as NonFiniteError
from stejax.train._step import StepMetrics as StepMetrics
from stejax.train._step import TrainStep as TrainStep
from stejax.train._step import compiled_statistics as compiled_statistics
from stejax.train._step import compiled_train_step as compiled_train_step
from stejax.train._step import compiled_update as compiled_update
from stejax.train._step import evaluate as evaluate
from stejax.train._step import forward as forward
from stejax.train._step import logged_update as logged_update
from stejax.train._step import loss as loss
from stejax.train._step import needs_key as needs_key
from stejax.train._step import raise_if_nonfinite as raise_if_nonfinite
from stejax.train._step import step_statistics as step_statistics
from stejax.train._step import update as update
