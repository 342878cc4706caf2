"""The reference QAT models: a functional MLP and a small convolutional net, fake-quantised.

Plain data and pure functions: configs are frozen dataclasses, parameters a
documented PyTree (:func:`param_spec`), and :func:`apply` maps one example to its
logits (batch it with ``jax.vmap``). :func:`preset` names the QAT configurations
the reports compare.
"""

from stejax.model._config import PRESETS as PRESETS
from stejax.model._config import ConvConfig as ConvConfig
from stejax.model._config import LayerQuant as LayerQuant
from stejax.model._config import MLPConfig as MLPConfig
from stejax.model._config import ModelConfig as ModelConfig
from stejax.model._config import QATConfig as QATConfig
from stejax.model._config import Quantizer as Quantizer
from stejax.model._config import preset as preset
from stejax.model._contract import InputContract as InputContract
from stejax.model._contract import OutputContract as OutputContract
from stejax.model._contract import input_contract as input_contract
from stejax.model._contract import output_contract as output_contract
from stejax.model._forward import apply as apply
from stejax.model._init import init_params as init_params
from stejax.model._spec import check_params as check_params
from stejax.model._spec import param_spec as param_spec
