"""The statistics both experiments report: paired bootstrap resampling against a baseline
(sacrebleu's), and Moses' smoothed sentence BLEU (for the oracle of an n-best list)."""
from __future__ import annotations

import math
from collections import Counter
from typing import List, Sequence

from phrase_scorer.moses.evaluate import references_kind


def paired_bootstrap_p(baseline: Sequence[str], system: Sequence[str], references: Sequence[str], *, kind: str = "auto",
                       lang: str = "fr", samples: int = 1000) -> float:
    """p of sacrebleu's paired bootstrap resampling test of ``system`` against ``baseline`` (BLEU,
    scored as :func:`phrase_scorer.moses.evaluate.score` scores them). Identical outputs get 1:
    sacrebleu would give them its smallest p, 1 / (samples + 1)."""
    if list(baseline) == list(system):
        return 1.0
    import sacrebleu
    from sacrebleu.significance import PairedTest

    hyps = [list(baseline), list(system)]
    kind = references_kind(references, kind)
    if kind == "raw":
        from sacremoses import MosesDetokenizer

        detok = MosesDetokenizer(lang=lang)
        hyps = [[detok.detokenize(h.split()) for h in side] for side in hyps]
    metric = sacrebleu.BLEU(tokenize="none" if kind == "tokenized" else "13a", force=kind == "tokenized")
    test = PairedTest([("baseline", hyps[0]), ("system", hyps[1])], {"BLEU": metric}, [list(references)],
                      test_type="bs", n_samples=samples)
    _, scores = test()
    result = scores["BLEU"][1]  # the system's, tested against the baseline's: a Result, never its name
    assert not isinstance(result, str) and result.p_value is not None
    return float(result.p_value)


def ngram_stats(hypothesis: Sequence[str], reference_counts: List[Counter], reference_length: int) -> List[int]:
    """Moses' BLEU statistics of one hypothesis: (matches, total) per order 1-4, reference length."""
    stats: List[int] = []
    for n in range(1, 5):
        counts = Counter(tuple(hypothesis[i:i + n]) for i in range(len(hypothesis) - n + 1))
        stats += [sum(min(c, reference_counts[n - 1][g]) for g, c in counts.items()), max(len(hypothesis) - n + 1, 0)]
    return stats + [reference_length]


def smoothed_sentence_bleu(stats: Sequence[int]) -> float:
    """Sentence BLEU with add-one smoothing of the orders above 1 (Lin and Och 2004), as Moses'
    sentence-level BLEU: for ranking a sentence's hypotheses."""
    if stats[1] == 0:
        return 0.0
    log_bleu = 0.0
    for n in range(4):
        add = 0 if n == 0 else 1
        matches, total = stats[2 * n] + add, stats[2 * n + 1] + add
        if matches == 0:
            return 0.0
        log_bleu += math.log(matches / total) / 4
    return math.exp(log_bleu + min(0.0, 1 - stats[8] / stats[1]))
