"""The names of the files in a model directory (no torch here: the output rule reads them).

A model directory made by ``train`` holds its config, the two vocabularies (with a subword model's
sentencepiece models), the best weights,
the last checkpoint, the training log, the pair cache (a folder) and, with
``--average-checkpoints``, the weights of the last validations (a folder). Other files a user
keeps there (translations, notes) are not the model's.
"""

CONFIG = "config.json"
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
