"""config.json's model ``arch`` -> the class that builds it."""

from __future__ import annotations

from typing import Callable, Dict, Type

import torch

from phrase_scorer.config import AnyModelConfig, ModelConfig, RNNsearchConfig
from phrase_scorer.models import encdec, rnnsearch
from phrase_scorer.models.encdec import RNNEncoderDecoder
from phrase_scorer.models.base import TranslationModel, count_parameters
from phrase_scorer.models.rnnsearch import RNNsearch
from phrase_scorer.vocab import SPECIALS

ARCHITECTURES: Dict[str, Type[TranslationModel]] = {
    ModelConfig.ARCH: RNNEncoderDecoder,
    RNNsearchConfig.ARCH: RNNsearch,
}
# (config, target vocabulary size, source words, target words) -> the forward pass's FLOPs by part
FORWARD_FLOPS: Dict[str, Callable[..., Dict[str, float]]] = {
    ModelConfig.ARCH: encdec.forward_flops,
    RNNsearchConfig.ARCH: rnnsearch.forward_flops,
}


def training_flops_per_pair(config: AnyModelConfig, target_vocab_size: int, source_length: float,
                            target_length: float) -> float:
    """FLOPs of one training pair of ``config``'s architecture: forward plus backward, about
    three times the forward pass (the backward pass runs two products per forward product)."""
    return 3.0 * FORWARD_FLOPS[config.arch](config, target_vocab_size, source_length, target_length)["total"]


def build_model(config: AnyModelConfig, source_vocab_size: int, target_vocab_size: int) -> TranslationModel:
    """A freshly initialised model of ``config``'s architecture."""
    return ARCHITECTURES[config.arch](config, source_vocab_size, target_vocab_size)


def full_size_parameters(config: AnyModelConfig) -> int:
    """Parameters of ``config``'s network with full shortlists (their words, <pad>, </s>, <unk>);
    counted on the meta device, so no weight is allocated."""
    with torch.device("meta"):
        model = build_model(config, config.source_shortlist + len(SPECIALS), config.target_shortlist + len(SPECIALS))
    return count_parameters(model)
