"""Vector-quantised networks: codebooks that stay alive, FSQ, the metrics, and where codebooks collapse.

Pure functions on plain data: a frozen :class:`Codebook` configuration whose
methods take and return parameter PyTrees and a :class:`CodebookState`, so that a
whole training run jits and maps over seeds. Built on the latent estimators of
:mod:`stejax.estimators.latent`.
"""

from stejax.vq._codebook import CODE_INITS as CODE_INITS
from stejax.vq._codebook import Codebook as Codebook
from stejax.vq._codebook import CodebookOutput as CodebookOutput
from stejax.vq._codebook import CodebookState as CodebookState
from stejax.vq._codebook import kmeans as kmeans
from stejax.vq._codebook import kmeans_plus_plus as kmeans_plus_plus
from stejax.vq._codebook import l2_normalize as l2_normalize
from stejax.vq._codebook import nearest_code_matmul as nearest_code_matmul
from stejax.vq._compare import QUICK as QUICK
from stejax.vq._compare import SETUPS as SETUPS
from stejax.vq._compare import VARIANTS as VARIANTS
from stejax.vq._compare import CompareSettings as CompareSettings
from stejax.vq._compare import Setup as Setup
from stejax.vq._compare import Variant as Variant
from stejax.vq._compare import fsq_levels_for as fsq_levels_for
from stejax.vq._compare import judge_targets as judge_targets
from stejax.vq._fsq import FSQ as FSQ
from stejax.vq._fsq import FSQ_LEVELS as FSQ_LEVELS
from stejax.vq._losses import entropy_loss as entropy_loss
from stejax.vq._metrics import batch_usage as batch_usage
from stejax.vq._metrics import bits_per_sample as bits_per_sample
from stejax.vq._metrics import code_histogram as code_histogram
from stejax.vq._metrics import dead_codes as dead_codes
from stejax.vq._metrics import perplexity as perplexity
from stejax.vq._metrics import quantization_error as quantization_error
from stejax.vq._metrics import usage as usage
from stejax.vq._report import write_report as write_report
from stejax.vq._run import compare as compare
