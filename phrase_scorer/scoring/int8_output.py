"""``--precision int8`` on a CPU: the output layer's product in 8-bit integers.

Forming the logits W_o t_i + b of every decoder step is about a third of a CPU's scoring time
(docs/benchmarks.md, "int8 against fp32"); in 8-bit integers (PyTorch's fbgemm kernels) it takes
less than half as long. Everything else (encoder, alignment, GRU, readout, the log-softmax and the sums)
stays fp32. What changes in the product:

- W_o (V', l): int8 per output word, symmetric: row v is stored as round(w_v / s_v) with
  s_v = max |w_v| / 127.
- t_i (N, l): each row is divided by its own largest |value| m_i, so that every row spans
  [-1, 1], and quantized to 7 bits over [-1, 1] (the *reduce range* of x86's kernels: AVX2's
  pairwise 16-bit sums of 8-bit products cannot saturate). The chunk carries one extra row
  (1, -1, 1, ...) that pins the quantization range at [-1, 1], so a row's integers, and its
  logits, do not depend on which other rows share its chunk.
- logits = m_i * (the dequantized product) + b, in fp32.

Measured effect (docs/precision.md): log p moves by a few thousandths of a nat per predicted
token. A run records ``precision: int8`` and the kernels' engine in its signature, and a resumed
run refuses to mix precisions.
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch
from torch import Tensor

from phrase_scorer.runtime.device import check_int8_kernels


def int8_engine() -> str:
    """The quantized kernels' engine that computes the product (what a signature records)."""
    return str(torch.backends.quantized.engine)


class Int8Product:
    """W_o t + b with W_o in int8 per row and each row of t in 7 bits over its own range; see the
    module docstring. Built once per output layer; read-only afterwards, so threads may share it."""

    def __init__(self, weight: Tensor, bias: Optional[Tensor]) -> None:
        check_int8_kernels()
        with torch.no_grad(), warnings.catch_warnings():
            # PyTorch marks its quantized-tensor constructors as deprecated; they are the way to
            # its fbgemm int8 kernels, which this class exists for.
            warnings.simplefilter("ignore", UserWarning)
            weight = weight.detach().float().cpu()  # (V', l)
            scales = weight.abs().amax(1).clamp_min(torch.finfo(torch.float32).tiny) / 127  # (V',)
            quantized = torch.quantize_per_channel(weight, scales.double(), torch.zeros(len(scales), dtype=torch.long),
                                                   0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(quantized, None)
        self.bias = None if bias is None else bias.detach().float().cpu()  # (V',)
        width = weight.size(1)
        self.range_row = torch.tensor([[1.0, -1.0]]).repeat(1, (width + 1) // 2)[:, :width]  # (1, l): pins [-1, 1]

    def __call__(self, features: Tensor) -> Tensor:
        """features (N, l) fp32 -> logits (N, V') fp32."""
        largest = features.abs().amax(1, keepdim=True).clamp_min_(torch.finfo(torch.float32).tiny)  # (N, 1) m_i
        rows = torch.cat([features / largest, self.range_row])  # (N + 1, l), each row within [-1, 1]
        product = torch.ops.quantized.linear_dynamic(rows, self.packed, True)[:-1]  # (N, V'), reduce_range
        if self.bias is None:
            return product.mul_(largest)
        return torch.addcmul(self.bias, product, largest)
