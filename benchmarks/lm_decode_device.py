"""Decoding of large random-weight LMs on this device, and the resident bytes of every bench model and form.

    python benchmarks/lm_decode_device.py --resident --out docs/results/lm_decode_resident.json
    python benchmarks/lm_decode_device.py --model 1B --forms bfloat16,int8@pallas --batches 1,16 --out part.json
    python benchmarks/lm_decode_device.py --plot-from docs/results/lm_decode.json --out docs/img/lm_decode_resident.png

A form written ``FORM@pallas`` or ``FORM@xla`` runs its low-bit products with that implementation;
``FORM@pallas-vpu`` runs the Pallas kernels that multiply a few rows on the TPU's vector unit instead of
its MXU (rows with ``"product": "pallas-vpu"``), e.g.::

    python benchmarks/lm_decode_device.py --model 1B --forms ternary-2bit@pallas,ternary-2bit@pallas-vpu --out p.json

Low-bit models put each block's q/k/v side by side as one layer and its gate/up as another, as
``stejax.lm.load_lowbit`` does by default (rows with ``"projections": "fused"``); ``--separate-projections``
keeps one product per kernel (``"separate"``).

``benchmarks/lm_decode_device.sh`` runs the accelerator parts and merges them into
``docs/results/lm_decode_device.json``.
"""

import sys

from stejax.bench._lm_decode import main

if __name__ == "__main__":
    main(sys.argv[1:], prog="python benchmarks/lm_decode_device.py")
