"""Safe artifacts: exported models on disk, verified on every load, gated and kept in a local registry.

An artifact is a directory: ``weights.safetensors`` (never pickle),
``parity.safetensors`` and a signed ``manifest.json`` (format, model contract,
quantisation, the sha256 of every file, environment, training metrics,
verification results, parent id). :func:`save_artifact` writes one atomically;
:func:`load_artifact` re-hashes every file, validates the safetensors headers
itself and checks the contract, refusing with :class:`ArtifactError`.
:func:`gate` runs the release checks; :class:`Registry` promotes through it,
rolls back and deletes nothing. Regression sets: :mod:`stejax.regress`.
Authenticity (the extra ``stejax[sign]``): :func:`sign_artifact` signs every
file with OpenSSF model signing (``model.sig``); :func:`verify_signature`
checks it against trusted keys; a :class:`Registry` that trusts keys accepts
only artifacts they signed.

Other artifact kinds (``stejax.lm``'s) are written and read with the same
pieces: :func:`staging_dir`, :func:`write_file_durably` and :func:`publish_dir`
(an atomic directory), :func:`seal_manifest` and :func:`check_manifest_integrity`
(the manifest's own sha256), :func:`check_listed_files` (every listed file's size
and sha256, nothing unlisted) and :func:`read_json_object` (a bounded JSON object).
"""

from stejax.artifacts._gate import GateCheck as GateCheck
from stejax.artifacts._gate import GateReport as GateReport
from stejax.artifacts._gate import estimators_used as estimators_used
from stejax.artifacts._gate import gate as gate
from stejax.artifacts._registry import Promotion as Promotion
from stejax.artifacts._registry import Registry as Registry
from stejax.artifacts._registry import RegistryEntry as RegistryEntry
from stejax.artifacts._registry import RegistryError as RegistryError
from stejax.artifacts._signing import SIGNATURE_FILE as SIGNATURE_FILE
from stejax.artifacts._signing import SignatureCheck as SignatureCheck
from stejax.artifacts._signing import SignatureError as SignatureError
from stejax.artifacts._signing import TrustedKey as TrustedKey
from stejax.artifacts._signing import keygen as keygen
from stejax.artifacts._signing import public_key as public_key
from stejax.artifacts._signing import sign_artifact as sign_artifact
from stejax.artifacts._signing import verify_signature as verify_signature
from stejax.artifacts._store import FORMAT as FORMAT
from stejax.artifacts._store import Artifact as Artifact
from stejax.artifacts._store import ArtifactError as ArtifactError
from stejax.artifacts._store import check_listed_files as check_listed_files
from stejax.artifacts._store import check_manifest_integrity as check_manifest_integrity
from stejax.artifacts._store import environment as environment
from stejax.artifacts._store import load_artifact as load_artifact
from stejax.artifacts._store import manifest_digest as manifest_digest
from stejax.artifacts._store import publish_dir as publish_dir
from stejax.artifacts._store import read_json_object as read_json_object
from stejax.artifacts._store import save_artifact as save_artifact
from stejax.artifacts._store import seal_manifest as seal_manifest
from stejax.artifacts._store import staging_dir as staging_dir
from stejax.artifacts._store import write_file_durably as write_file_durably
