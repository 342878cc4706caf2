"""Spiking neural networks trained with surrogate gradients.

Neurons as pure step functions (:class:`Leaky`, :class:`Synaptic`,
:class:`RecurrentLeaky`, :class:`AdaptiveLeaky`, :class:`LeakyIntegrator`) whose
spike function is any catalog spiking surrogate or your own (:class:`Spike`);
the time loop (:func:`run`: ``jax.lax.scan``, checkpointing, truncated BPTT);
encoders (:func:`rate`, :func:`latency`, :func:`delta`); losses and metrics; a
feed-forward network (:func:`forward`); training over split seeds in one
vmapped program (:func:`train_seeds`) and the surrogate comparison
(:func:`compare`). The Flax NNX modules are in :mod:`stejax.snn.nnx` (extra
``stejax[flax]``); training needs optax (``stejax[train]``).
"""

from stejax.snn._compare import CONFIGS as CONFIGS
from stejax.snn._compare import FULL as FULL
from stejax.snn._compare import QUICK as QUICK
from stejax.snn._compare import Tier as Tier
from stejax.snn._compare import compare as compare
from stejax.snn._compare import config_name as config_name
from stejax.snn._encode import delta as delta
from stejax.snn._encode import latency as latency
from stejax.snn._encode import rate as rate
from stejax.snn._losses import accuracy_first_spike as accuracy_first_spike
from stejax.snn._losses import accuracy_rate as accuracy_rate
from stejax.snn._losses import activity_regularizer as activity_regularizer
from stejax.snn._losses import ce_mean_membrane as ce_mean_membrane
from stejax.snn._losses import ce_per_step as ce_per_step
from stejax.snn._losses import ce_spike_count as ce_spike_count
from stejax.snn._losses import mse_count as mse_count
from stejax.snn._losses import spike_stats as spike_stats
from stejax.snn._network import Dense as Dense
from stejax.snn._network import NetConfig as NetConfig
from stejax.snn._network import NetOutput as NetOutput
from stejax.snn._network import NetParams as NetParams
from stejax.snn._network import forward as forward
from stejax.snn._network import init_net as init_net
from stejax.snn._neurons import RESETS as RESETS
from stejax.snn._neurons import AdaptiveLeaky as AdaptiveLeaky
from stejax.snn._neurons import AdaptiveParams as AdaptiveParams
from stejax.snn._neurons import AdaptiveState as AdaptiveState
from stejax.snn._neurons import Leaky as Leaky
from stejax.snn._neurons import LeakyIntegrator as LeakyIntegrator
from stejax.snn._neurons import LeakyParams as LeakyParams
from stejax.snn._neurons import RecurrentLeaky as RecurrentLeaky
from stejax.snn._neurons import RecurrentParams as RecurrentParams
from stejax.snn._neurons import RecurrentState as RecurrentState
from stejax.snn._neurons import Synaptic as Synaptic
from stejax.snn._neurons import SynapticParams as SynapticParams
from stejax.snn._neurons import SynapticState as SynapticState
from stejax.snn._neurons import decay_logit as decay_logit
from stejax.snn._spike import REFERENCE_SPIKES as REFERENCE_SPIKES
from stejax.snn._spike import SURROGATES as SURROGATES
from stejax.snn._spike import Spike as Spike
from stejax.snn._time import run as run
from stejax.snn._train import SeedsResult as SeedsResult
from stejax.snn._train import SNNTrainConfig as SNNTrainConfig
from stejax.snn._train import load_seed_splits as load_seed_splits
from stejax.snn._train import make_optimizer as make_optimizer
from stejax.snn._train import make_train_step as make_train_step
from stejax.snn._train import train_seeds as train_seeds
