"""config.json's model ``arch`` -> the class that builds it."""

from __future__ import annotations

from typing import Any, Callable, Dict, Type

import torch
from torch.overrides import TorchFunctionMode

from phrase_scorer.config import AnyModelConfig, ModelConfig, RNNsearchConfig, TransformerConfig
from phrase_scorer.models import encdec, rnnsearch, transformer
from phrase_scorer.models.encdec import RNNEncoderDecoder
from phrase_scorer.models.base import TranslationModel, count_parameters
from phrase_scorer.models.rnnsearch import RNNsearch
from phrase_scorer.models.transformer import Transformer
from phrase_scorer.vocab import SPECIALS

ARCHITECTURES: Dict[str, Type[TranslationModel]] = {
    ModelConfig.ARCH: RNNEncoderDecoder,
    RNNsearchConfig.ARCH: RNNsearch,
    TransformerConfig.ARCH: Transformer,
}
# (config, target vocabulary size, source words, target words) -> the forward pass's FLOPs by part
FORWARD_FLOPS: Dict[str, Callable[..., Dict[str, float]]] = {
    ModelConfig.ARCH: encdec.forward_flops,
    RNNsearchConfig.ARCH: rnnsearch.forward_flops,
    TransformerConfig.ARCH: transformer.forward_flops,
}


def training_flops_per_pair(config: AnyModelConfig, target_vocab_size: int, source_length: float,
                            target_length: float) -> float:
    """FLOPs of one training pair of ``config``'s architecture: forward plus backward, about
    three times the forward pass (the backward pass runs two products per forward product)."""
    return 3.0 * FORWARD_FLOPS[config.arch](config, target_vocab_size, source_length, target_length)["total"]


def build_model(config: AnyModelConfig, source_vocab_size: int, target_vocab_size: int) -> TranslationModel:
    """A freshly initialised model of ``config``'s architecture."""
    return ARCHITECTURES[config.arch](config, source_vocab_size, target_vocab_size)


class _LeaveUninitialised(TorchFunctionMode):
    """In-place initialisers (``normal_``, ``uniform_``, ``kaiming_uniform_``, ``zero_``, ...) do
    nothing: the modules of a model whose weights are loaded next, or that only shows its shapes,
    are built without drawing weights (on the meta device, drawing them would also import
    torch._dynamo, about 2 s)."""

    INITIALISERS = frozenset({"normal_", "uniform_", "zero_", "zeros_", "ones_", "fill_", "constant_",
                              "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_",
                              "trunc_normal_", "orthogonal_"})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.INITIALISERS:
            return args[0] if args else kwargs.get("tensor")
        return func(*args, **(kwargs or {}))


def uninitialised_model(config: AnyModelConfig, source_vocab_size: int, target_vocab_size: int,
                        device: Any = "cpu") -> TranslationModel:
    """A model of ``config``'s architecture whose weights hold whatever memory held (nothing on
    the meta device): for weights loaded right after (every one is, with a strict state dict), or
    for the shapes alone."""
    with torch.device(device), _LeaveUninitialised():
        return ARCHITECTURES[config.arch](config, source_vocab_size, target_vocab_size, initialise=False)


def full_size_parameters(config: AnyModelConfig) -> int:
    """Parameters of ``config``'s network with full shortlists (their words, <pad>, </s>, <unk>);
    counted on the meta device, so no weight is allocated."""
    model = uninitialised_model(config, config.source_shortlist + len(SPECIALS),
                                config.target_shortlist + len(SPECIALS), "meta")
    return count_parameters(model)
