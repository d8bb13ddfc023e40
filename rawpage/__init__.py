"""rawpage: PagedAttention and continuous batching, on NumPy, CuPy and our own CUDA kernels."""
# ruff: noqa: E402  (the imports after `__path__ +=` need the folders it adds)

from rawpage import _blas_env  # noqa: F401  (first: before anything loads NumPy, and with it OpenBLAS)
from rawpage._checkout import checkout_folders

__path__ += checkout_folders()  # rawpage.models and rawpage.cuda importable from a checkout

from rawpage.engine_args import EngineArgs
from rawpage.llm import LLM
from rawpage.lora import LoRARequest
from rawpage.outputs import CompletionOutput, EmbeddingOutput, EmbeddingRequestOutput, RequestOutput
from rawpage.pooling.pooler import PoolingParams
from rawpage.sampling_params import SamplingParams
from rawpage.structured_output import StructuredOutputsParams

__version__ = "0.1.0"
__all__ = [
    "LLM",
    "SamplingParams",
    "StructuredOutputsParams",
    "EngineArgs",
    "LoRARequest",
    "RequestOutput",
    "CompletionOutput",
    "PoolingParams",
    "EmbeddingRequestOutput",
    "EmbeddingOutput",
    "__version__",
]
