"""Integer export of a trained QAT run: packed integer weights, an integer inference path, parity, sizes.

:func:`export_run` turns a run directory into an :class:`ExportResult`: the
:class:`ExportedModel` (int8 weights; int4 and int2 packed two and four to a
byte; binary packed eight to a byte; float32 scales), its parity with the
fake-quantised model on the test split (:class:`ParityReport`), and the size of
its weight file layer by layer (:class:`SizeReport`). :func:`stejax.artifacts.save_artifact`
writes it. :func:`encode_safetensors`, :func:`decode_safetensors` and
:func:`safetensors_file_size` write, check and size the safetensors files for
packages that store models of their own (``stejax.lm``); :func:`safetensors_layout` checks a header alone, for
a reader that takes the tensors one by one. Needs the optional extra
``stejax[train]``.
"""

from stejax.export._convert import ExportError as ExportError
from stejax.export._convert import export_model as export_model
from stejax.export._convert import layer_specs as layer_specs
from stejax.export._export import QUANTISATION_METHODS as QUANTISATION_METHODS
from stejax.export._export import ExportResult as ExportResult
from stejax.export._export import ParityError as ParityError
from stejax.export._export import encode_weights as encode_weights
from stejax.export._export import export_run as export_run
from stejax.export._export import quantisation_method as quantisation_method
from stejax.export._model import ExportedModel as ExportedModel
from stejax.export._model import InputFormat as InputFormat
from stejax.export._model import LayerSpec as LayerSpec
from stejax.export._model import WeightFormat as WeightFormat
from stejax.export._parity import TOLERANCE_RULE as TOLERANCE_RULE
from stejax.export._parity import LayerParity as LayerParity
from stejax.export._parity import ParityReport as ParityReport
from stejax.export._parity import ParitySet as ParitySet
from stejax.export._parity import check_parity_set as check_parity_set
from stejax.export._parity import parity as parity
from stejax.export._safetensors import SafetensorsError as SafetensorsError
from stejax.export._safetensors import decode_safetensors as decode_safetensors
from stejax.export._safetensors import encode_safetensors as encode_safetensors
from stejax.export._safetensors import safetensors_file_size as safetensors_file_size
from stejax.export._safetensors import safetensors_layout as safetensors_layout
from stejax.export._size import LayerSize as LayerSize
from stejax.export._size import SizeReport as SizeReport
from stejax.export._size import size_report as size_report
from stejax.lowbit._packing import CONTAINERS as CONTAINERS
from stejax.lowbit._packing import pack_codes as pack_codes
from stejax.lowbit._packing import unpack_codes as unpack_codes
