"""config.json's model ``arch`` -> the class that builds it."""

from __future__ import annotations

from typing import Dict, Type

from phrase_scorer.config import AnyModelConfig, ModelConfig, RNNsearchConfig
from phrase_scorer.model import RNNEncoderDecoder
from phrase_scorer.models.base import TranslationModel
from phrase_scorer.models.rnnsearch import RNNsearch

ARCHITECTURES: Dict[str, Type[TranslationModel]] = {
    ModelConfig.ARCH: RNNEncoderDecoder,
    RNNsearchConfig.ARCH: RNNsearch,
}


def build_model(config: AnyModelConfig, source_vocab_size: int, target_vocab_size: int) -> TranslationModel:
    """A freshly initialised model of ``config``'s architecture."""
    return ARCHITECTURES[config.arch](config, source_vocab_size, target_vocab_size)
