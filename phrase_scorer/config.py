"""Every setting of the package, with its default, in one place.

One frozen dataclass per concern: the network (:class:`ModelConfig`, with the presets), training
(:class:`TrainConfig`), scoring (:class:`ScoringOptions`) and annotation
(:class:`AnnotateOptions`). The command line takes its defaults from here, and the model
directory stores the first two as JSON. This module imports neither torch nor numpy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Optional, Tuple

from phrase_scorer.errors import PhraseScorerError

@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the network. The defaults are the paper's (section 4.1.1 and appendix A)."""

    embedding_dim: int = 100
    hidden_dim: int = 1000
    maxout_units: int = 500
    maxout_pieces: int = 2
    output_rank: int = 100
    source_shortlist: int = 15000
    target_shortlist: int = 15000
    init_std: float = 0.01  # N(0, 0.01^2) for every weight but the recurrent ones
    recurrent_init_scale: float = 0.01  # orthogonal recurrent matrices times this (Saxe et al.)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown model settings: {', '.join(sorted(unknown))}")
        return cls(**data)


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


@dataclass(frozen=True)
class TrainConfig:
    """Training settings. The defaults are the paper's where it gives one."""

    preset: str = DEFAULT_PRESET
    batch_size: int = 64  # pairs per update (paper: 64)
    adadelta_rho: float = 0.95
    adadelta_eps: float = 1e-6
    clip_norm: float = 1.0  # gradient-norm clipping
    valid_pairs: int = 5000  # about this many pairs held out, by source phrase
    valid_every: int = 1000  # steps between validations (and checkpoints)
    patience: int = 10  # validations without improvement before stopping
    max_steps: Optional[int] = None
    max_epochs: Optional[float] = None
    max_time: Optional[float] = None  # seconds
    seed: int = 1
    device: str = "auto"  # auto | cpu | cuda
    precision: str = "auto"  # on GPU: auto (bf16 where supported, else fp16) | bf16 | fp16 | fp32

    # Settings that --resume may change; all others must match the saved run.
    RESUMABLE = ("valid_every", "patience", "max_steps", "max_epochs", "max_time", "device", "precision")

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class ScoringOptions:
    """How the scorer batches its work; none of these change the scores."""

    batch_tokens: int = 8192  # target tokens (words + </s>) per decoder batch
    chunk_rows: int = 128  # rows of the N x V logits formed at once (small: they stay in cache)
    share_source_prefixes: bool = True
    share_target_prefixes: bool = True
    precision: str = "auto"  # fp32 on CPU; on GPU "auto" = bf16 where supported, else fp16


COLUMNS = ("prob", "unk")
UNK_SIDES = ("target", "source", "both")


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
            raise PhraseScorerError(f"--columns takes a comma-separated subset of {','.join(COLUMNS)}, got {','.join(self.columns)}")
        if self.unk_side not in UNK_SIDES:
            raise PhraseScorerError(f"--unk-side takes one of {', '.join(UNK_SIDES)}")


@dataclass(frozen=True)
class SampleOptions:
    """How candidates are generated and ranked."""

    samples: int = 50  # ancestral samples per source
    top: int = 5  # candidates shown per source
    beam: Optional[int] = None  # beam search with this width instead of sampling
    temperature: float = 1.0
    max_length: int = 10  # target words; a sample reaching it stops without </s>
    seed: int = 1
    allow_unk: bool = True  # may <unk> be generated?
    rank_by: str = "model"  # model | model+lm


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
class ExperimentOptions:
    """The paper's Table 1 comparison: how many tuning runs, and how to score."""

    runs: int = 3  # tuning runs per system, seeds 1..runs
    references: str = "auto"  # auto | tokenized | raw
    lang: str = "fr"  # target language, for detokenising raw references
    bootstrap_samples: int = 1000
