"""Where the model runs and in which precision.

Every command resolves ``--device`` and ``--precision`` here, so that what a run used can be
named exactly (``cpu`` or ``cuda:<GPU name>``; ``fp32``, ``bf16``, ``fp16`` or ``int8``) in a
model's checkpoint and in an output's signature.

What each precision does (docs/precision.md has the measured effect on scores):

- ``fp32``: every operation in single precision. On a GPU, TF32 tensor-core arithmetic is turned
  off for the run, so GPU and CPU compute the same function (up to summation order).
- ``bf16`` / ``fp16`` (GPU only): ``torch.autocast``. Matrix products and the GRU steps run in
  half precision, so the recurrent state is carried from step to step in half precision and the
  logits come out of a half-precision output layer; only the log-softmax (and the sum of a
  pair's log-probabilities) is done in fp32. Training keeps fp32 weights and optimiser state,
  with loss scaling for fp16.

- ``int8`` (CPU scoring only): the output layer's product in 8-bit integers, everything else in
  fp32 (:mod:`phrase_scorer.scoring.int8_output`).

Otherwise a CPU runs in fp32 whatever ``--precision`` says.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator, Tuple

import torch

from phrase_scorer.config import PRECISIONS, TRAIN_PRECISIONS
from phrase_scorer.errors import PhraseScorerError, Text, setting

log = logging.getLogger(__name__)

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
HALF_PRECISIONS = tuple(_DTYPES)  # the precisions a GPU runs under autocast


def resolve_device(name: str) -> torch.device:
    """``auto`` (the GPU when PyTorch sees one), ``cpu`` or ``cuda``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise PhraseScorerError(Text(setting("device", "cuda"), " was asked for, but PyTorch sees no CUDA device"),
                                hint=Text("use ", setting("device", "cpu")))
    return torch.device(name)


def device_label(device: torch.device) -> str:
    """``cpu`` or ``cuda:<GPU name>``: what a signature records."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return device.type


def resolve_precision(device: torch.device, precision: str) -> str:
    """The precision a run on ``device`` actually uses: fp32, bf16, fp16 or int8.

    ``auto`` (training only) is bf16 on a GPU that supports it, else fp16. A CPU runs half
    precision in fp32; asking it for half precision is logged, not an error. ``int8`` (scoring)
    is a CPU's only, and refused on a GPU.
    """
    known = list(dict.fromkeys((*TRAIN_PRECISIONS, *PRECISIONS)))
    if precision not in known:
        raise PhraseScorerError(f"unknown precision {precision!r}; choose one of {', '.join(known)}")
    if precision == "int8":
        if device.type == "cuda":
            raise PhraseScorerError(Text(setting("precision", "int8"), " is for scoring on a CPU"),
                                    hint=Text("on a GPU use ", setting("precision", "bf16"), " or ",
                                              setting("precision", "fp16"), ", or score on the CPU with ",
                                              setting("device", "cpu")))
        check_int8_kernels()
        return "int8"
    if device.type != "cuda":
        if precision in _DTYPES:
            log.warning("%s applies on a GPU only; the CPU runs in fp32", setting("precision", precision))
        return "fp32"
    if precision == "auto":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return precision


@contextlib.contextmanager
def precision_context(device: torch.device, precision: str) -> Iterator[None]:
    """Run the enclosed model code in the resolved ``precision`` (see the module docstring)."""
    if device.type != "cuda":
        yield
        return
    if precision in _DTYPES:
        with torch.autocast(device_type="cuda", dtype=_DTYPES[precision]):
            yield
        return
    backends: Tuple[Any, ...] = (torch.backends.cuda.matmul, torch.backends.cudnn)  # typed apart; both have allow_tf32
    saved = [b.allow_tf32 for b in backends]
    for b in backends:
        b.allow_tf32 = False
    try:
        yield
    finally:
        for b, value in zip(backends, saved):
            b.allow_tf32 = value


def int8_kernels_available() -> bool:
    """Whether this PyTorch has the dynamic int8 linear kernels (fbgemm) the int8 product needs."""
    ops = getattr(torch.ops, "quantized", None)
    try:
        return ops is not None and hasattr(ops, "linear_dynamic") and hasattr(ops, "linear_prepack") \
            and hasattr(torch, "quantize_per_channel") and "fbgemm" in torch.backends.quantized.supported_engines
    except RuntimeError:
        return False


def check_int8_kernels() -> None:
    if not int8_kernels_available():
        raise PhraseScorerError(
            Text(setting("precision", "int8"), " needs PyTorch's int8 CPU kernels (fbgemm), which this PyTorch "
                 f"({torch.__version__}) does not have"), hint=Text("use ", setting("precision", "fp32")))
