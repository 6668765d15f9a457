"""phrase-scorer: the RNN Encoder-Decoder of Cho et al. (2014) and RNNsearch as features for Moses.

The packages (docs/layout.md): ``training``, ``scoring``, ``generation`` and ``runtime`` beside
``io`` (file formats), ``moses`` (Moses' programs), ``models``, ``data``, ``analysis``,
``experiments`` and ``cli``; at this level only what all of them share.
"""

from __future__ import annotations

import importlib.abc
import sys

__version__ = "0.1.0"

#: Modules of version 0.1.0 that moved into the packages, old name -> new name. Importing an old
#: name fails with an ImportError naming the new one.
MOVED = {
    "train": "training.run",
    "checkpoints": "training.checkpoints",
    "optimisation": "training.optimisation",
    "stopping": "training.stopping",
    "validation": "training.validation",
    "prefetch": "training.prefetch",
    "scoring": "scoring.batch_scorer",
    "columns": "scoring.columns",
    "pair_scores": "scoring.score",
    "annotate": "scoring.annotate",
    "annotate_work": "scoring.annotate_work",
    "rescore": "scoring.rescore",
    "sampling": "generation.sampling",
    "translate": "generation.translate",
    "reranked_translation": "generation.reranked_translation",
    "device": "runtime.device",
    "distributed": "runtime.distributed",
    "threads": "runtime.threads",
    "progress": "runtime.progress",
    "resumable": "runtime.job",
    "io.parallel": "runtime.workers",
    "io.programs": "runtime.programs",
}


class _MovedModules(importlib.abc.MetaPathFinder):
    """Turns the import of a moved module into an ImportError that names its new place."""

    def find_spec(self, fullname, path=None, target=None):
        prefix = __name__ + "."
        old = fullname[len(prefix):] if fullname.startswith(prefix) else None
        if old in MOVED and old != "scoring":  # phrase_scorer.scoring is now the package
            new = f"{prefix}{MOVED[old]}"
            raise ImportError(f"{fullname} moved to {new} (docs/layout.md)", name=fullname)
        return None


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())
