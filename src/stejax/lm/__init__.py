"""A quantised byte-level transformer language model: corpus, references, model, training, comparison, export, sampling.

GGUF export for llama.cpp: :func:`export_gguf` (``docs/llama-cpp.md``).

Needs the optional extras ``stejax[flax]`` and ``stejax[train]``; ``import stejax``
does not import it. Guide: ``docs/lm.md``.
"""

from stejax.lm._compare import FULL as FULL
from stejax.lm._compare import QUICK as QUICK
from stejax.lm._compare import CompareSettings as CompareSettings
from stejax.lm._compare import compare_lm as compare_lm
from stejax.lm._compare import train_from_scratch as train_from_scratch
from stejax.lm._configs import CONFIGS as CONFIGS
from stejax.lm._configs import INTEGER_CONFIGS as INTEGER_CONFIGS
from stejax.lm._configs import LMQuant as LMQuant
from stejax.lm._configs import lm_quant as lm_quant
from stejax.lm._configs import quantised_paths as quantised_paths
from stejax.lm._configs import quantize_lm as quantize_lm
from stejax.lm._corpus import SPLITS as SPLITS
from stejax.lm._corpus import Corpus as Corpus
from stejax.lm._corpus import build_corpus as build_corpus
from stejax.lm._corpus import check_disjoint as check_disjoint
from stejax.lm._corpus import split_of as split_of
from stejax.lm._decode import Decoding as Decoding
from stejax.lm._decode import decode as decode
from stejax.lm._gguf import BITS_PER_WEIGHT as BITS_PER_WEIGHT
from stejax.lm._gguf import GGUFError as GGUFError
from stejax.lm._gguf import GGUFExport as GGUFExport
from stejax.lm._gguf import check_input_block as check_input_block
from stejax.lm._gguf import export_gguf as export_gguf
from stejax.lm._gguf import gguf_name as gguf_name
from stejax.lm._gguf import gguf_types as gguf_types
from stejax.lm._gguf import input_differences as input_differences
from stejax.lm._gguf import llama_differences as llama_differences
from stejax.lm._gguf import llamacpp_input_blocks as llamacpp_input_blocks
from stejax.lm._gguf import read_gguf as read_gguf
from stejax.lm._llamacpp import LlamaCppGeneration as LlamaCppGeneration
from stejax.lm._llamacpp import llamacpp_greedy as llamacpp_greedy
from stejax.lm._llamacpp import llamacpp_logits as llamacpp_logits
from stejax.lm._llamacpp import llamacpp_rows as llamacpp_rows
from stejax.lm._llamacpp import load_llama as load_llama
from stejax.lm._lowbit import LowBitLinear as LowBitLinear
from stejax.lm._lowbit import LowBitLM as LowBitLM
from stejax.lm._lowbit import load_lowbit as load_lowbit
from stejax.lm._model import LLAMA as LLAMA
from stejax.lm._model import LayerCache as LayerCache
from stejax.lm._model import LMConfig as LMConfig
from stejax.lm._model import Transformer as Transformer
from stejax.lm._model import init_cache as init_cache
from stejax.lm._quantisers import activation_quantiser as activation_quantiser
from stejax.lm._quantisers import weight_quantiser as weight_quantiser
from stejax.lm._references import compressor_bpb as compressor_bpb
from stejax.lm._references import ngram_bpb as ngram_bpb
from stejax.lm._references import references as references
from stejax.lm._sample import Generation as Generation
from stejax.lm._sample import draw_byte as draw_byte
from stejax.lm._sample import generate as generate
from stejax.lm._train import LMTrainResult as LMTrainResult
from stejax.lm._train import TrainSettings as TrainSettings
from stejax.lm._train import bits_per_byte as bits_per_byte
from stejax.lm._train import learning_rate_schedule as learning_rate_schedule
from stejax.lm._train import load_checkpoint as load_checkpoint
from stejax.lm._train import save_checkpoint as save_checkpoint
from stejax.lm._train import train_lm as train_lm
from stejax.lm._train import weight_decay_schedule as weight_decay_schedule
