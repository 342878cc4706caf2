"""``stejax serve``: a bounded-shape inference service with metrics, verified hot swap and rollback.

Every request is padded to the smallest configured batch bucket, and every
bucket is compiled ahead of time at start-up, so no request ever compiles;
bodies, rows and queues are bounded; inputs are checked for shape, dtype and
finiteness. A candidate artifact goes live only after the release gate passes,
in one atomic swap, and the previous verified model stays ready for rollback.
Needs the optional extra ``stejax[serve]`` (Starlette via FastAPI, uvicorn,
prometheus-client).
"""

from stejax.serve._app import create_app as create_app
from stejax.serve._config import ServeConfig as ServeConfig
from stejax.serve._inputs import RequestError as RequestError
from stejax.serve._metrics import compilations as compilations
from stejax.serve._model import CompiledModel as CompiledModel
from stejax.serve._model import Prediction as Prediction
from stejax.serve._model import ServedModel as ServedModel
from stejax.serve._model import compile_model as compile_model
from stejax.serve._model import served_model_from_artifact as served_model_from_artifact
from stejax.serve._service import Busy as Busy
from stejax.serve._service import Service as Service
from stejax.serve._service import SwapResult as SwapResult
from stejax.serve._sources import ArtifactSource as ArtifactSource
from stejax.serve._sources import ModelSource as ModelSource
from stejax.serve._sources import Refused as Refused
from stejax.serve._sources import RegistrySource as RegistrySource
