"""Every setting of the package, with its default, in one place.

One frozen dataclass per concern: the networks (:class:`ModelConfig` for the RNN Encoder-Decoder,
:class:`RNNsearchConfig` for the attention model, :class:`TransformerConfig` for the Transformer,
each with its presets), training
(:class:`TrainConfig`), scoring (:class:`ScoringOptions`) and annotation
(:class:`AnnotateOptions`). The command line takes its defaults from here, and the model
directory stores the first two as JSON. This module imports neither torch nor numpy.
"""

from __future__ import annotations

import math
from dataclasses import Field, asdict, dataclass, fields, replace
from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple, Type, Union

from phrase_scorer.errors import PhraseScorerError, Text, setting

# The largest sizes a network config may ask for: far above the papers' networks (1000 units,
# 30,000-word shortlists), low enough that a hand-edited config.json cannot ask for a network
# that no machine holds.
MAX_WIDTH = 1 << 16  # embedding, hidden, alignment and readout units, output rank
MAX_SHORTLIST = 1 << 24  # words per shortlist
MAX_MAXOUT_PIECES = 64
# The largest learning rate: the largest 32-bit float, since an update multiplies 32-bit weights
# by it (torch refuses a larger one at the first step).
MAX_LR = 3.4028234663852886e38
# The most hours of training a build takes (a century), and the widest tie margin (all of BLEU).
MAX_TRAINING_HOURS = 1e6
MAX_TIE_MARGIN = 100.0


def check_whole_number(name: str, value: Any, low: int = 1, high: Optional[int] = None) -> None:
    """Refuse a setting that is not an integer in [low, high] (a bool, a string, 2.5 or 1e9 too)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        upto = f" to {high:,}" if high is not None else " or more"
        raise PhraseScorerError(f"{name} is {value!r}; it must be a whole number from {low:,}{upto}")


def check_number(name: str, value: Any, low: float, high: float, low_open: bool = False,
                 high_open: bool = False) -> None:
    """Refuse a setting that is not a finite number (int or float, not a bool) in its range."""
    inside = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
              and (value > low if low_open else value >= low) and (value < high if high_open else value <= high))
    if not inside:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise PhraseScorerError(f"{name} is {value!r}; it must be a number in {interval}")


class ArchitectureConfig:
    """What the network configs share: ``arch`` names the architecture (class attribute ARCH),
    and the config goes to and from config.json's model section."""

    ARCH = ""
    CHOICES: ClassVar[Dict[str, Tuple[str, ...]]] = {}  # a text setting -> the values it takes
    arch: str
    __dataclass_fields__: ClassVar[Dict[str, Field[Any]]]  # the subclasses are dataclasses (for type checkers)

    def __post_init__(self) -> None:
        if self.arch != self.ARCH:
            raise ValueError(f"{type(self).__name__} is the {self.ARCH!r} architecture, not {self.arch!r}")
        for f in fields(self):  # every size a whole number in its range, every scale a finite number
            value = getattr(self, f.name)
            if isinstance(f.default, bool):
                if not isinstance(value, bool):
                    raise PhraseScorerError(f"model.{f.name} is {value!r}; it must be true or false")
            elif isinstance(f.default, str) and f.name != "arch":
                if value not in self.CHOICES[f.name]:
                    raise PhraseScorerError(f"model.{f.name} is {value!r}; it must be one of "
                                            f"{', '.join(self.CHOICES[f.name])}")
            elif f.name.endswith("_shortlist"):
                check_whole_number(f"model.{f.name}", value, 1, MAX_SHORTLIST)
            elif f.name == "maxout_pieces":
                check_whole_number(f"model.{f.name}", value, 1, MAX_MAXOUT_PIECES)
            elif isinstance(f.default, int):
                check_whole_number(f"model.{f.name}", value, 1, MAX_WIDTH)
            elif isinstance(f.default, float):
                check_number(f"model.{f.name}", value, 0.0, 1.0)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict):
        """``cls(**data)``, refusing settings ``cls`` does not have; a dict without ``arch``
        (written before the field existed) is read as ``cls``'s own architecture."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown model settings: {', '.join(sorted(unknown))}")
        return cls(**data)


@dataclass(frozen=True)
class ModelConfig(ArchitectureConfig):
    """Sizes of the RNN Encoder-Decoder. The defaults are the paper's (Cho et al. 2014, section
    4.1.1 and appendix A)."""

    ARCH = "encdec"  # the value of ``arch`` in config.json

    arch: str = ARCH
    embedding_dim: int = 100
    hidden_dim: int = 1000
    maxout_units: int = 500
    maxout_pieces: int = 2
    output_rank: int = 100
    source_shortlist: int = 15000
    target_shortlist: int = 15000
    init_std: float = 0.01  # N(0, 0.01^2) for every weight but the recurrent ones
    recurrent_init_scale: float = 0.01  # orthogonal recurrent matrices times this (Saxe et al.)


PRESETS: Dict[str, ModelConfig] = {
    # The paper's network (about 7.5 + 2 * 1.5 million parameters per 15k-word side).
    "paper": ModelConfig(),
    # Trains usefully in well under an hour on a 2-core CPU.
    "small": ModelConfig(
        embedding_dim=64, hidden_dim=256, maxout_units=128, output_rank=64,
        source_shortlist=6000, target_shortlist=6000,
    ),
    # For tests: trains and scores in seconds.
    "tiny": ModelConfig(
        embedding_dim=16, hidden_dim=32, maxout_units=16, output_rank=8,
        source_shortlist=500, target_shortlist=500,
    ),
}
DEFAULT_PRESET = "paper"

# Precisions (what each does: phrase_scorer/runtime/device.py; measured effect on scores: docs/precision.md).
# bf16 and fp16 are GPU autocast (a CPU runs them in fp32); int8 is the output layer's product on a CPU
# (scoring only). Training's "auto" is bf16 autocast on a GPU that supports it, else fp16.
PRECISIONS = ("fp32", "bf16", "fp16", "int8")
TRAIN_PRECISIONS = ("auto", "fp32", "bf16", "fp16")


@dataclass(frozen=True)
class RNNsearchConfig(ArchitectureConfig):
    """Sizes of RNNsearch (Bahdanau, Cho and Bengio 2015). The defaults are the paper's
    (appendices A and B: RNNsearch-30/-50 on WMT'14 En-Fr)."""

    ARCH = "rnnsearch"

    arch: str = ARCH
    embedding_dim: int = 620  # m
    hidden_dim: int = 1000  # n: GRU units per encoder direction, and decoder units
    alignment_dim: int = 1000  # n': hidden units of the alignment model
    maxout_units: int = 500  # l: readout units, each the max of maxout_pieces
    maxout_pieces: int = 2
    source_shortlist: int = 30000  # K_x
    target_shortlist: int = 30000  # K_y
    init_std: float = 0.01  # N(0, 0.01^2) for every weight but the recurrent and alignment ones
    alignment_init_std: float = 0.001  # N(0, 0.001^2) for W_a and U_a (v_a starts at 0)


RNNSEARCH_PRESETS: Dict[str, RNNsearchConfig] = {
    # The paper's RNNsearch (620 / 1000 / 1000 / 500, 30k-word shortlists).
    "paper": RNNsearchConfig(),
    # The encoder-decoder's "small" width, n = 256 GRU units (each encoder direction as wide as
    # the encoder-decoder's encoder), with the paper's proportions n' = n, l = n / 2 and
    # m = n / 2 (the paper: 0.62 n); and the encoder-decoder's 6,000-word shortlists, so that the
    # two architectures compare on the same words.
    "small": RNNsearchConfig(
        embedding_dim=128, hidden_dim=256, alignment_dim=256, maxout_units=128,
        source_shortlist=6000, target_shortlist=6000,
    ),
    # Twice "small"'s sizes (n = 512, the same proportions and shortlists): 2.9 times the
    # parameters, more capacity for the same words (docs/results.md, "A larger model").
    "medium": RNNsearchConfig(
        embedding_dim=256, hidden_dim=512, alignment_dim=512, maxout_units=256,
        source_shortlist=6000, target_shortlist=6000,
    ),
    # For tests: trains and scores in seconds.
    "tiny": RNNsearchConfig(
        embedding_dim=16, hidden_dim=24, alignment_dim=20, maxout_units=12,
        source_shortlist=500, target_shortlist=500,
    ),
}

@dataclass(frozen=True)
class TransformerConfig(ArchitectureConfig):
    """Sizes of the encoder-decoder Transformer (Vaswani et al. 2017), in its pre-norm form (each
    sublayer reads a normalised copy of its input and adds its output to it; a last layer norm on
    each side). The defaults are the paper's base model."""

    ARCH = "transformer"
    CHOICES: ClassVar[Dict[str, Tuple[str, ...]]] = {"positions": ("sinusoidal", "learned")}

    arch: str = ARCH
    model_dim: int = 512  # d_model: embeddings, every sublayer's input and output, the readout features
    ff_dim: int = 2048  # units of each feed-forward sublayer
    heads: int = 8  # attention heads (each model_dim / heads wide)
    encoder_layers: int = 6
    decoder_layers: int = 6
    source_shortlist: int = 30000
    target_shortlist: int = 30000
    positions: str = "sinusoidal"  # sinusoidal (any length) | learned (a table of max_positions rows)
    max_positions: int = 1024  # learned positions: the rows of the table (longer sequences are refused)
    # The target embedding is the output layer's matrix (Press and Wolf 2017): a third fewer
    # parameters in a small model, and the output rows of rare words learn from their inputs too.
    tie_target_embeddings: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.model_dim % (2 * self.heads):
            raise PhraseScorerError(f"model.model_dim is {self.model_dim}; it must be a multiple of twice "
                                    f"model.heads ({self.heads}), so that each head and each sinusoid pair is whole")


TRANSFORMER_PRESETS: Dict[str, TransformerConfig] = {
    # The paper's base model (512 / 2,048, 8 heads, 6 + 6 layers), 30k-word shortlists.
    "paper": TransformerConfig(),
    # Sized for a 2-core CPU: the width and depth of the small-data Transformers of the Multi30k
    # literature (128 / 256, 4 heads; Wu et al. 2021 use 4 + 4 layers) with 3 + 3 layers, and
    # the RNNs' 6,000-word shortlists (docs/transformer.md).
    "small": TransformerConfig(model_dim=128, ff_dim=256, heads=4, encoder_layers=3, decoder_layers=3,
                               source_shortlist=6000, target_shortlist=6000),
    # For tests: trains and scores in seconds.
    "tiny": TransformerConfig(model_dim=16, ff_dim=32, heads=2, encoder_layers=1, decoder_layers=2,
                              source_shortlist=500, target_shortlist=500),
}

# config.json's model "arch" -> the config class and its presets (no "arch": the encoder-decoder).
MODEL_CONFIGS: Dict[str, Type[ArchitectureConfig]] = {
    ModelConfig.ARCH: ModelConfig, RNNsearchConfig.ARCH: RNNsearchConfig, TransformerConfig.ARCH: TransformerConfig}
ARCH_PRESETS: Dict[str, Mapping[str, AnyModelConfig]] = {ModelConfig.ARCH: PRESETS,
                                                          RNNsearchConfig.ARCH: RNNSEARCH_PRESETS,
                                                          TransformerConfig.ARCH: TRANSFORMER_PRESETS}
AnyModelConfig = Union[ModelConfig, RNNsearchConfig, TransformerConfig]


def model_config_from_dict(data: dict) -> AnyModelConfig:
    """The model section of config.json, as the config of its architecture."""
    if not isinstance(data, dict):
        raise TypeError("the model settings are not a JSON object")
    arch = data.get("arch", ModelConfig.ARCH)
    if arch not in MODEL_CONFIGS:
        raise ValueError(f"unknown architecture {arch!r}; this version knows {', '.join(MODEL_CONFIGS)}")
    return MODEL_CONFIGS[arch].from_dict(data)


def preset_config(config: TrainConfig) -> AnyModelConfig:
    """The network of ``config.arch``'s preset ``config.preset``."""
    if config.arch not in ARCH_PRESETS:
        raise PhraseScorerError(f"unknown architecture {config.arch!r}; choose one of {', '.join(ARCH_PRESETS)}")
    presets = ARCH_PRESETS[config.arch]
    if config.preset not in presets:
        raise PhraseScorerError(f"unknown preset {config.preset!r} for {config.arch}; "
                                f"choose one of {', '.join(presets)}")
    return presets[config.preset]


@dataclass(frozen=True)
class Recipe:
    """How a network is optimised: the settings a training recipe fixes (each can be given on
    its own on the command line; config.json records the resolved values)."""

    optimizer: str  # adadelta | adam
    lr: float  # Adadelta's is 1.0 (its step size comes from its own running averages)
    clip_norm: float  # gradient-norm clipping
    loss: str  # pair: mean NLL per pair (the papers) | token: per target token (</s> included)
    label_smoothing: float  # share of each target's probability spread over the output vocabulary
    dropout: float  # on embeddings, encoder outputs and readout features, in training only
    init: str  # paper: the papers' initialisations | glorot: Glorot-uniform matrices, orthogonal recurrences
    lr_decay: float  # learning rate times this after lr_patience validations without improvement (1: never)
    lr_patience: int
    min_lr: float  # the rate is never decayed below this
    # Updates of linear warm-up to ``lr``, then the rate falls as 1 / sqrt(update) (Vaswani et al.
    # 2017; 0: no warm-up, a constant rate but for the plateau decay).
    warmup: int = 0


RECIPES: Dict[str, Recipe] = {
    # Today's runs of the papers: Adadelta (rho 0.95, eps 1e-6), the papers' initialisations,
    # mean log-likelihood per pair, no dropout, no schedule. For reproductions.
    "paper": Recipe(optimizer="adadelta", lr=1.0, clip_norm=1.0, loss="pair", label_smoothing=0.0, dropout=0.0,
                    init="paper", lr_decay=1.0, lr_patience=1, min_lr=0.0),
    # What trains a model that translates on a CPU in an hour (docs/training.md, docs/benchmarks.md):
    # Adam, a loss per target token with label smoothing, dropout, an initialisation whose
    # attention does not start at a saddle, and the rate halved on a validation plateau.
    "modern": Recipe(optimizer="adam", lr=1e-3, clip_norm=1.0, loss="token", label_smoothing=0.1, dropout=0.2,
                     init="glorot", lr_decay=0.5, lr_patience=2, min_lr=1e-5),
}
RECIPES["transformer"] = Recipe(
    # What trains the Transformer on a CPU (docs/transformer.md): Adam at a higher peak rate
    # reached by a linear warm-up and then decaying as 1 / sqrt(update), a loss per target token
    # with label smoothing, dropout 0.1 (0.3, the published small-data setting, cost 7.6 dev BLEU
    # at 3,000 updates on English-French), Glorot initialisation.
    optimizer="adam", lr=2e-3, clip_norm=1.0, loss="token", label_smoothing=0.1, dropout=0.1, init="glorot",
    lr_decay=1.0, lr_patience=2, min_lr=1e-5, warmup=1000)
DEFAULT_RECIPE = "modern"
# An architecture's recipe when none is named (the others': DEFAULT_RECIPE).
ARCH_RECIPES = {TransformerConfig.ARCH: "transformer"}
OPTIMIZERS = ("adadelta", "adam")
LOSSES = ("pair", "token")
INITS = ("paper", "glorot")
VALID_METRICS = ("nll", "bleu")
# train --vocabulary: whole words, or sentencepiece's byte-pair encoding or unigram model (the
# pieces per word of each, measured: docs/benchmarks.md, "Subword segmentation").
VOCABULARIES = ("words", "bpe", "unigram")
# At most this share of the pairs is held out for validation (the rest always trains).
MAX_VALID_SHARE = 0.1


@dataclass(frozen=True)
class TrainConfig:
    """Training settings. ``recipe`` names a :class:`Recipe`; the fields that are None take the
    recipe's values (:meth:`resolved`), so a setting given explicitly overrides the recipe's."""

    arch: str = "encdec"  # the architecture: a key of ARCH_PRESETS (encdec | rnnsearch | transformer)
    preset: str = DEFAULT_PRESET  # a preset of that architecture
    recipe: Optional[str] = None  # a key of RECIPES (None: the architecture's, ARCH_RECIPES, else DEFAULT_RECIPE)
    batch_size: int = 64  # pairs per update (paper: 64)
    # --- the recipe's settings (None: the recipe's) ---
    optimizer: Optional[str] = None
    lr: Optional[float] = None
    clip_norm: Optional[float] = None
    loss: Optional[str] = None
    label_smoothing: Optional[float] = None
    dropout: Optional[float] = None
    init: Optional[str] = None
    lr_decay: Optional[float] = None
    lr_patience: Optional[int] = None
    min_lr: Optional[float] = None
    warmup: Optional[int] = None
    adadelta_rho: float = 0.95  # Adadelta's (the paper's)
    adadelta_eps: float = 1e-6
    # --- validation and stopping ---
    valid_pairs: int = 5000  # about this many pairs held out, by source phrase (at most MAX_VALID_SHARE of them)
    valid_every: int = 1000  # steps between validations (and checkpoints)
    # What picks the best weights, early stopping and the rate's decay: nll (per token) | bleu
    # (greedy or --valid-beam translation of the validation pairs; sentence corpora only).
    # None: bleu for a sentence corpus, nll for a phrase table.
    valid_metric: Optional[str] = None
    valid_beam: int = 1  # beam of the validation translations (1: greedy)
    patience: int = 10  # validations without improvement before stopping
    # When training stops: the mean of the weights of the last K validations, kept as model.pt
    # when it validates better than the best single weights (0 or 1: no averaging).
    average_checkpoints: int = 0
    max_steps: Optional[int] = None
    max_epochs: Optional[float] = None
    max_time: Optional[float] = None  # seconds
    seed: int = 1
    device: str = "auto"  # auto | cpu | cuda
    precision: str = "auto"  # on GPU: auto (bf16 where supported, else fp16) | bf16 | fp16 | fp32; weights stay fp32
    max_length: Optional[int] = None  # sentence corpora: training pairs with a longer side are left out
    # The model reads (and writes) the target side last word first; its target vocabulary records it.
    right_to_left: bool = False
    # What the models read: whole words (shortlists) or subword pieces learnt by sentencepiece,
    # as many as the shortlist's words (phrase_scorer.subwords). One of VOCABULARIES.
    vocabulary: str = "words"

    # Settings that --resume may change; all others must match the saved run.
    RESUMABLE = ("valid_every", "patience", "max_steps", "max_epochs", "max_time", "device", "precision",
                 "average_checkpoints")
    RECIPE_SETTINGS = tuple(f.name for f in fields(Recipe))

    # The numeric settings and their ranges (as the command line's options have them): a whole
    # number from a minimum; a number in an interval (open at an end where the flag says so).
    WHOLE = {"batch_size": 1, "valid_pairs": 0, "valid_every": 1, "valid_beam": 1, "patience": 1,
             "average_checkpoints": 0, "lr_patience": 1, "max_steps": 1, "max_length": 1, "warmup": 0}
    OPTIONAL = ("lr_patience", "max_steps", "max_length", "warmup")
    NUMBERS = {"lr": (0.0, MAX_LR, True, False), "clip_norm": (0.0, math.inf, True, True),
               "label_smoothing": (0.0, 1.0, False, True), "dropout": (0.0, 1.0, False, True),
               "lr_decay": (0.0, 1.0, True, False), "min_lr": (0.0, math.inf, False, True),
               "adadelta_rho": (0.0, 1.0, True, True), "adadelta_eps": (0.0, 1.0, True, False),
               "max_epochs": (0.0, math.inf, True, True), "max_time": (0.0, math.inf, True, True)}

    def __post_init__(self) -> None:
        if self.recipe is None:  # the architecture's recipe (a frozen dataclass: set once, here)
            object.__setattr__(self, "recipe", ARCH_RECIPES.get(self.arch, DEFAULT_RECIPE))
        for name, low in self.WHOLE.items():
            if getattr(self, name) is not None or name not in self.OPTIONAL:  # None: the recipe's, or no limit
                check_whole_number(f"training.{name}", getattr(self, name), low,
                                   MAX_SHORTLIST if name in ("batch_size", "valid_beam") else None)
        for name, interval in self.NUMBERS.items():
            if getattr(self, name) is not None:
                check_number(f"training.{name}", getattr(self, name), *interval)
        check_whole_number("training.seed", self.seed, -(1 << 63), (1 << 63) - 1)
        if self.recipe not in RECIPES:
            raise PhraseScorerError(f"unknown recipe {self.recipe!r}; choose one of {', '.join(RECIPES)}")
        for name, value, allowed in (("optimizer", self.optimizer, OPTIMIZERS), ("loss", self.loss, LOSSES),
                                     ("init", self.init, INITS), ("valid_metric", self.valid_metric, VALID_METRICS),
                                     ("vocabulary", self.vocabulary, VOCABULARIES)):
            if value is not None and value not in allowed:
                raise PhraseScorerError(Text(setting(name), f" takes one of {', '.join(allowed)}, got {value!r}"))

    def resolved(self, corpus: bool = False) -> "TrainConfig":
        """Every None setting filled in: the recipe's values, and the validation metric of the
        data (``corpus``: sentence pairs)."""
        assert self.recipe is not None  # set by __post_init__
        recipe = RECIPES[self.recipe]
        filled = {name: getattr(recipe, name) for name in self.RECIPE_SETTINGS if getattr(self, name) is None}
        if self.valid_metric is None:
            filled["valid_metric"] = "bleu" if corpus else "nll"
        return replace(self, **filled)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "TrainConfig":
        """Settings saved in config.json. A run saved before recipes existed trained by the
        paper's recipe, so a saved config without ``recipe`` reads as ``paper``."""
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        if "recipe" not in data:
            data = {"recipe": "paper", "valid_metric": "nll", **data}
        return cls(**data)


def valid_share(valid_pairs: int, pairs: int) -> float:
    """The share of ``pairs`` held out for validation: about ``valid_pairs`` of them, and never
    more than MAX_VALID_SHARE, so that most pairs of a small corpus still train."""
    return min(valid_pairs, MAX_VALID_SHARE * pairs) / max(pairs, 1)


# Target tokens per scoring batch when none is given. A CPU gains nothing from larger batches; a
# GPU waits on the host's launches, and 65,536 rescored 1.4-2.1 times as fast as 8,192 on an H100
# and an H200 (docs/benchmarks.md, "On a GPU").
CPU_BATCH_TOKENS = 8192
GPU_BATCH_TOKENS = 65536
# On a CPU a one-pass batch computes every padded position of its targets, the trie one decoder
# step per node (targets sharing a prefix share it), each about 2.5 times as costly as a position of
# the pass (its key/value cache copied on, small products): the pass pays up to this many
# positions per node (docs/benchmarks.md, "The Transformer beside RNNsearch").
ONE_PASS_POSITIONS_PER_NODE = 2.5


@dataclass(frozen=True)
class ScoringOptions:
    """How the scorer works. The batching settings change the scores only by fp32 rounding (a few
    units in the 7th significant digit), so outputs record them beside the device and precision
    (``BatchScorer.describe``); ``precision`` changes them by more (docs/precision.md)."""

    # Target tokens (words + </s>) per decoder batch; None: the device's own (CPU_BATCH_TOKENS or
    # GPU_BATCH_TOKENS: scoring.batch_scorer.default_batch_tokens).
    batch_tokens: Optional[int] = None
    # Rows of the N x V logits formed at once; None: the device's own (scoring.default_chunk_rows:
    # cache-sized on a CPU, a few large kernels on a GPU).
    chunk_rows: Optional[int] = None
    share_source_prefixes: bool = True
    share_target_prefixes: bool = True
    # A model that scores a batch of targets in one teacher-forced pass (``scores_in_one_pass``:
    # the Transformer): True, every batch so; False, none (the targets' trie, one decoder step per
    # depth, as the RNNs); None, by the device: on a GPU every batch, on a CPU a batch whose padded
    # positions are at most ONE_PASS_POSITIONS_PER_NODE times its trie's nodes.
    one_pass: Optional[bool] = None
    # fp32 on every device by default: bf16 moves log p by hundredths of a nat (docs/precision.md).
    # bf16 | fp16: autocast on a GPU (state and output layer in half precision); a CPU ignores it.
    # int8: a CPU's output-layer product in 8-bit integers (scoring/int8_output.py); refused on a GPU.
    precision: str = "fp32"
    # How a CPU's threads share the work: "batches" (each thread scores whole batches on one core:
    # the same scores as one thread) or "operations" (every matrix product split over the threads).
    thread_split: str = "batches"


THREAD_SPLITS = ("batches", "operations")
COLUMNS = ("prob", "unk")
UNK_SIDES = ("target", "source", "both")

# The weight each annotate column starts with in moses.ini, until tuning sets it. Moses sees the
# log of a column: log p(y|x) <= 0 for "prob" and n_unk >= 0 (the number of unknown words) for
# "unk". A positive weight on log p prefers the pairs the model finds likely; the unknown-word
# feature is a penalty (Cho et al. 2014 count the words outside the shortlist to penalise them),
# so its weight starts negative: a positive start would reward unknown words until tuning.
START_WEIGHTS = {"prob": 0.2, "unk": -0.2}


def start_weights(columns: Tuple[str, ...] = COLUMNS) -> Tuple[float, ...]:
    """The moses.ini start weights of ``columns`` (annotate's column names), in that order."""
    return tuple(START_WEIGHTS[c] for c in columns)


@dataclass(frozen=True)
class AnnotateOptions:
    """What ``annotate`` writes. Changing any of these changes the output."""

    columns: Tuple[str, ...] = COLUMNS  # which columns to append, in this order
    unk_side: str = "target"  # whose unknown words the unk column counts
    length_normalize: bool = False  # prob column = exp(log p / (target words + 1))
    window_lines: int = 20000  # lines per window (and per gzip member / resume chunk)
    compress_level: int = 3  # gzip level of the library in use (ISA-L: 0-3, its best ratio at 3)

    def __post_init__(self) -> None:
        bad = [c for c in self.columns if c not in COLUMNS]
        if bad or not self.columns or len(set(self.columns)) != len(self.columns):
            raise PhraseScorerError(Text(setting("columns"), " takes a comma-separated subset of "
                                         f"{','.join(COLUMNS)}, got {','.join(self.columns)}"))
        if self.unk_side not in UNK_SIDES:
            raise PhraseScorerError(Text(setting("unk_side"), f" takes one of {', '.join(UNK_SIDES)}"))


@dataclass(frozen=True)
class RescoreOptions:
    """What ``rescore`` writes. Changing any of these changes the output."""

    normalize: bool = False  # log p / (words + 1), per predicted token, instead of log p
    window_lines: int = 20000  # about this many n-best lines (whole sentences) per window and resume chunk
    compress_level: int = 6


FORWARD_FEATURE_PREFIX = "RNN"  # default feature names: RNN0, RNN1, ... for -m models
REVERSE_FEATURE_PREFIX = "RNNReverse"  # and RNNReverse0, ... for --reverse-model models


@dataclass(frozen=True)
class RerankOptions:
    """How ``rerank`` runs Moses' optimiser on a fixed n-best list."""

    method: str = "mert"  # mert | mira (kbmira, batch MIRA)
    seeds: Tuple[int, ...] = (1, 2, 3)  # one optimiser run per seed; the best on dev is kept
    restarts: int = 20  # mert's random starting points per run (-n), as mert-moses.pl
    mira_iterations: int = 60  # kbmira's epochs (-J)
    threads: int = 1  # mert's threads
    mertdir: Optional[str] = None  # folder of extractor, mert, kbmira (default: MOSES_HOME/bin)
    ignore_features: Tuple[str, ...] = ()  # dense features of the lists left out (neither tuned nor used)
    # dev BLEU points (x 100) a model feature must buy to keep its tuned weight: one that buys no
    # more is weighted 0, and translate-system --moses --reranker does not run its model; negative: keep all
    min_feature_gain: float = 0.0


# The lowest sampling temperature: the logits divided by it stay far inside a 32-bit float (near
# 1e-36 they overflow to infinity and no word can be drawn); at 1e-6 sampling already draws the
# most probable word every time.
MIN_TEMPERATURE = 1e-6


@dataclass(frozen=True)
class SampleOptions:
    """How candidates are generated and ranked."""

    samples: int = 50  # ancestral samples per source
    top: int = 5  # candidates shown per source
    beam: Optional[int] = None  # beam search with this width instead of sampling
    temperature: float = 1.0  # at least MIN_TEMPERATURE
    max_length: int = 10  # target words; a sample reaching it stops without </s>
    seed: int = 1
    allow_unk: bool = True  # may <unk> be generated?
    rank_by: str = "model"  # model | model+lm


@dataclass(frozen=True)
class TranslateOptions:
    """How ``translate`` searches. ``<unk>`` is never generated (barred without renormalising)."""

    beam: int = 10  # beam width; 1 is greedy search
    length_normalize: bool = True  # rank ended hypotheses by log p per token (</s> included)
    max_length_ratio: float = 2.0  # at most ceil(ratio * source words) target words
    batch_sentences: int = 32  # sentences searched together


@dataclass(frozen=True)
class TranslateSystemOptions:
    """How ``translate-system`` runs the whole tuned system (Moses, the reranker's models and
    weights) over new text; none of it changes a line of the output."""

    # sentences decoded, rescored and reranked at a time (and resumed). One Moses serves every
    # chunk, so a small chunk costs no loading: the first chunk's lists, the part of Moses' time
    # nothing hides, come sooner (English-Czech test 2016: 70.2 s with 100 against 74.7 s with
    # 500; docs/benchmarks.md)
    chunk_sentences: int = 100
    # Moses decodes the next chunk while the models rescore this one (False: one after the other);
    # the output is the same bytes either way
    pipeline: bool = True
    # a model scores a hypothesis only while its weighted sum, with the unscored log p's taken as
    # 0, can still reach its sentence's best (rescoring/bounded.py); False: every hypothesis with
    # every model. The same choices. None: the device's own (default_bound): on a CPU, where a
    # model's time is its arithmetic, bound; on a GPU, where it is the host's launches, the staged
    # scoring's extra batches cost more than the hypotheses it skips (English-French test 2016 on
    # an H100: 25.7 s against 22.5 s; docs/benchmarks.md)
    bound: Optional[bool] = None
    decoder_threads: Optional[int] = None  # the decoder's threads; None: the cores
    decoder: str = "moses"  # the decoder program in the Moses installation's bin/
    working_dir: Optional[str] = None  # the chunks' files, made fresh; None: OUTPUT.work


def default_bound(device_type: str) -> bool:
    """Whether translate-system --moses --reranker bounds its scoring on a device of this type
    (``TranslateSystemOptions.bound`` None)."""
    return device_type == "cpu"


@dataclass(frozen=True)
class TuneOptions:
    """How ``tune`` runs mert-moses.pl."""

    method: str = "mert"  # mert | mira (batch MIRA)
    max_iterations: int = 10
    return_best_dev: bool = True  # keep the iteration with the best dev BLEU, not the last
    seed: int = 1  # for the optimiser's random restarts
    threads: Optional[int] = None  # decoder threads (default: all cores)
    decoder_flags: str = "-v 0"  # more decoder options, e.g. "-search-algorithm 1 -s 400"
    nbest: int = 100
    decoder: str = "moses"  # program in MOSES_HOME/bin
    mertdir: Optional[str] = None  # folder of mert's programs (default: MOSES_HOME/bin)


@dataclass(frozen=True)
class System:
    """A system of the Table 1 experiment."""

    name: str  # as in the report
    folder: str
    added_columns: int  # model columns kept from the annotated table


SYSTEMS = (System("Baseline", "baseline", 0), System("RNN", "rnn", 1), System("RNN + WP", "rnn+wp", 2))


@dataclass(frozen=True)
class ExperimentOptions:
    """The paper's Table 1 comparison: which systems, how many tuning runs and how each tunes, and
    how to score."""

    runs: int = 3  # tuning runs per system, seeds 1..runs
    references: str = "auto"  # auto | tokenized | raw
    lang: str = "fr"  # target language, for detokenising raw references
    bootstrap_samples: int = 1000
    tune: TuneOptions = TuneOptions()  # each run's mert-moses.pl (its seed is the run's)
    systems: Tuple[System, ...] = SYSTEMS  # the systems tuned and reported, in this order


# Moses' own -n-best-factor, what it decodes with when not told another (moses/parameters/NBestOptions.cpp)
MOSES_NBEST_FACTOR = 20


@dataclass(frozen=True)
class RescoreExperimentOptions:
    """``rescore-experiment``: the n-best lists, the rescoring, the reranking runs and the scoring."""

    # distinct hypotheses per sentence (Moses' -n-best-list FILE N distinct): on English-French
    # test 2016 the best row bought 62.97 BLEU with 100 against 63.15 with 500, for 3.7 times less
    # rescoring and 5 times less decoding (docs/results.md)
    nbest_size: int = 100
    # Moses' -n-best-factor: it extracts at most FACTOR x N paths to find N distinct hypotheses. Its
    # own default, MOSES_NBEST_FACTOR, leaves English-French 100-best lists 74 distinct hypotheses
    # per sentence and the ensemble row at 62.65 test BLEU; 100 gives 94 and 63.01 (docs/results.md)
    nbest_factor: int = 100
    decoder: str = TuneOptions.decoder
    decoder_flags: str = TuneOptions.decoder_flags
    threads: Optional[int] = None  # decoder and mert threads (default: all cores)
    normalize: bool = RescoreOptions.normalize  # per-token log p instead of log p
    runs: int = ExperimentOptions.runs  # optimiser runs per row, seeds 1..runs
    method: str = RerankOptions.method
    restarts: int = RerankOptions.restarts
    mertdir: Optional[str] = None
    references: str = ExperimentOptions.references
    lang: str = ExperimentOptions.lang
    bootstrap_samples: int = ExperimentOptions.bootstrap_samples


@dataclass(frozen=True)
class BuildRerankerOptions:
    """``build-reranker``: which sentence models it trains and how, how it chooses the vocabulary,
    and how it tunes and chooses the row (the lists, the optimiser: ``experiment``)."""

    # The kinds of experiments/build_reranker.py trained. A reverse Transformer was not kept on
    # either Multi30k pair (under 0.1 val BLEU beside the ensemble: docs/results.md), so the
    # defaults train the two ensemble members; "reverse" adds it.
    model_kinds: Tuple[str, ...] = ("forward", "right-to-left")
    members: int = 1  # forward and right-to-left models each trained this many times (seeds 1..members)
    # Each model's weights of its last K validations averaged when it stops, kept when the mean
    # validates better (training/averaging.py); 0: the best single weights
    average_checkpoints: int = 0
    vocabulary: Optional[str] = None  # words | bpe | unigram; None: chosen from the shortlist coverage
    # Subword pieces when a word shortlist leaves more than this share of the tuning set's tokens out
    # (either side). Multi30k: French 2.0%, Czech 8.2%; on Czech the BPE ensemble bought the same
    # BLEU as the word one and +0.35 chrF (docs/your-language-pair.md).
    bpe_above: float = 0.05
    # The recipe of the rescoring results (docs/your-language-pair.md): 8,000 updates of 80 pairs.
    # The architectures of the forward and right-to-left models (the Ensemble), each trained
    # ``members`` times: the first's models are forward, forward-2, right-to-left, ...; another's
    # carry its name (forward-transformer, forward-transformer-2, ...). And the reverse model's.
    # Two Transformer `small` models bought 63.13 (English-French) and 33.01 (English-Czech) test
    # 2016 BLEU in 0.55 idle hours of training, against 62.64 and 32.82 in 1.22 for three
    # RNNsearch ones (docs/transformer.md, "In the one command").
    archs: Tuple[str, ...] = ("transformer",)
    reverse_arch: str = "transformer"
    preset: str = "small"  # each architecture's preset of this name
    batch_size: int = 80
    valid_every: int = 500
    max_steps: int = 8000
    training_hours: Optional[float] = None  # all trainings together, shared equally; None: max_steps alone
    # (at most MAX_TRAINING_HOURS)
    # The trainings side by side, each on its share of the cores (None: on a CPU with 2 threads or
    # more; experiments/build_reranker.side_by_side_threads), or one after another
    side_by_side: Optional[bool] = None
    device: str = "auto"
    # A row is kept over a better one with more models when its tuning BLEU is within this much
    # (BLEU points, at most MAX_TIE_MARGIN)
    tie_margin: float = 0.1
    experiment: RescoreExperimentOptions = RescoreExperimentOptions()


@dataclass(frozen=True)
class EvaluateOptions:
    """How ``evaluate`` decodes a test set and scores it."""

    references: str = ExperimentOptions.references  # auto (tokenised if they carry Moses escapes) | tokenized | raw
    lang: str = ExperimentOptions.lang  # target language, for detokenising the output for raw references
    threads: Optional[int] = None  # decoder threads (default: all cores)
    decoder_flags: str = ""  # more decoder options
    decoder: str = TuneOptions.decoder  # program in MOSES_HOME/bin


@dataclass(frozen=True)
class MosesIniOptions:
    """How ``moses-ini`` patches a moses.ini for a phrase table with more score columns."""

    add_features: int = 2  # score columns added to the table
    # the new columns' start weights until tuning, one per column or one number for all of them;
    # None: START_WEIGHTS of annotate's first add_features columns, in order
    initial_weights: Union[None, float, Tuple[float, ...]] = None
    feature_name: Optional[str] = None  # the phrase-table feature's name=; None: the first phrase table
    absolute_paths: bool = False  # every relative path= made absolute too (against the ini's folder)
    check_table: bool = True  # the text table's score count on its first lines checked against num-features


@dataclass(frozen=True)
class NBestOrigin:
    """What ``rerank`` is told of the decoder its n-best lists came from; the reranker records it
    (neither is among the options it records)."""

    # the decoder's moses.ini: the optimiser starts from its [weight] section, and the reranker
    # records it as the system the lists came from when their totals show its weights; None:
    # start from weights fitted to the dev list's totals
    start_ini: Optional[str] = None
    # the decoder options the lists were made with, recorded in the reranker; None: not known (a
    # reranked translation then decodes its lists with Moses' own)
    decoder_flags: Optional[str] = None


@dataclass(frozen=True)
class RunOptions:
    """How ``annotate`` and ``rescore`` run; none of it changes a byte of what they write."""

    resume: bool = False  # continue the interrupted run that is making the output
    overwrite: bool = False  # replace an existing output
    # processes doing the host work beside the models (None: as many as the cores allow; 0: none,
    # all in this process)
    workers: Optional[int] = None


@dataclass(frozen=True)
class FigureSize:
    """A figure's size and resolution."""

    width: float  # inches
    height: float  # inches
    dpi: int = 100


@dataclass(frozen=True)
class ScorePlotOptions:
    """``plot scores``: which scores of an annotated table it plots, how it samples them, and the
    figure."""

    table_column: int = 0  # the table's score on the x axis (0: p(f|e))
    model_column: Optional[int] = None  # the model's p(y|x); None: from the table's signature, else the second last
    max_points: int = 2_000_000  # a uniform sample of this many pairs
    seed: int = 1  # the sample's
    table_label: str = "log p(f|e), phrase table"  # the x axis' label
    figure: FigureSize = FigureSize(7.0, 6.0)


@dataclass(frozen=True)
class EmbeddingMapOptions:
    """``plot embeddings``: what the 2-D map shows, how it is projected and labelled, and the
    figure."""

    kind: str = "words"  # words: the source word embeddings e(x) (Fig. 4) | phrases: representations c (Fig. 5)
    words: int = 1000  # the most frequent source words mapped (kind words)
    phrases: int = 2000  # source phrases mapped (kind phrases)
    min_words: int = 4  # the shortest phrase mapped
    method: str = "auto"  # auto (UMAP where installed, else t-SNE) | tsne | umap
    seed: int = 1  # the phrases' sample, the order they are labelled in, and the projection
    labels: int = 60  # points labelled in the figure
    figure: FigureSize = FigureSize(10.0, 8.0)


@dataclass(frozen=True)
class AlignmentPlotOptions:
    """``plot alignments``: which pairs' soft alignments it draws."""

    lines: Optional[Tuple[int, ...]] = None  # these lines (numbers from 1), in order; None: count pairs drawn
    count: int = 4  # pairs drawn at random (fixed by seed) when no lines are given
    seed: int = 1
    max_words: int = 30  # the longest side plotted: count draws among the pairs within it
