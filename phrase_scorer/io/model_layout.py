"""The names of the files in a model directory (no torch here: the output rule reads them), and
the rule for the versions of the files the package reads.

A model directory made by ``train`` holds its config, the two vocabularies (with a subword model's
sentencepiece models), the best weights,
the last checkpoint, the training log, the pair cache (a folder) and, with
``--average-checkpoints``, the weights of the last validations (a folder). Other files a user
keeps there (translations, notes) are not the model's.
"""

from typing import Any, Optional

from phrase_scorer.errors import PhraseScorerError

CONFIG = "config.json"
CONFIG_VERSION = 1  # config.json's "version": the schema this package writes, and the newest it reads
SOURCE_VOCAB = "vocab.source.json"
TARGET_VOCAB = "vocab.target.json"
SOURCE_SUBWORDS = "subwords.source.model"  # sentencepiece models of a subword model (train --vocabulary bpe|unigram)
TARGET_SUBWORDS = "subwords.target.model"
BEST_WEIGHTS = "model.pt"
CHECKPOINT = "checkpoint.pt"
TRAIN_LOG = "train.log.jsonl"
CACHE = "cache"
RECENT_WEIGHTS = "recent"  # folder of the weights of the last validations (train --average-checkpoints)
MODEL_FILES = (CONFIG, SOURCE_VOCAB, TARGET_VOCAB, SOURCE_SUBWORDS, TARGET_SUBWORDS, BEST_WEIGHTS, CHECKPOINT,
               TRAIN_LOG)
# Any of these makes a folder a model (complete or not); the vocabularies alone are a setup's leftovers.
MODEL_STATE_FILES = (CONFIG, BEST_WEIGHTS, CHECKPOINT, TRAIN_LOG)


def refuse_newer_version(found: Any, reads_up_to: int, *, path: Any, what: str, first: int = 1,
                         damaged_hint: Optional[str] = None) -> int:
    """The version ``found`` in a versioned file (``what``: how messages name it, such as
    ``config``), checked: a version newer than ``reads_up_to`` (the newest this package reads) is
    refused with the upgrade to make; one that is not a whole number from ``first`` on is refused
    as damaged. Older versions are the caller's to read."""
    if found is None:
        raise PhraseScorerError(f"damaged: it records no {what} version", path=path,
                                hint=damaged_hint or "restore the file")
    if isinstance(found, bool) or not isinstance(found, int) or found < first:
        raise PhraseScorerError(f"damaged: its {what} version {found!r} is not a whole number from {first}", path=path,
                                hint=damaged_hint or "restore the file")
    if found > reads_up_to:
        raise PhraseScorerError(f"written by a newer phrase-scorer ({what} version {found}, this one reads up to "
                                f"{reads_up_to})", path=path, hint="upgrade phrase-scorer")
    return found
