"""Generating target phrases: ancestral sampling and beam search (section 4.3, Tables 3-4).

:func:`propose` takes raw or tokenised source phrases and returns, for each, its candidate target
phrases ranked by log p(y|x). Candidates come from ``n`` ancestral samples (duplicates merged,
with their counts) or, with ``beam``, from beam search. Every candidate's log p is then computed
by :class:`~phrase_scorer.scoring.batch_scorer.BatchScorer`, the scorer behind ``score`` and ``annotate``, so
the numbers agree with theirs. A target language model (ARPA or KenLM binary, read with the
``kenlm`` module) can add its log-probability as a second score and to the ranking.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from phrase_scorer.config import SampleOptions
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.inputs import text_lines
from phrase_scorer.models.base import FIRST_OUTPUT_ID, Memory, TranslationModel
from phrase_scorer.scoring.batch_scorer import BatchScorer, pad
from phrase_scorer.vocab import EOS_ID, PAD_ID, UNK_ID, Vocabulary

LN10 = math.log(10.0)


@dataclass
class Candidate:
    words: List[str]
    log_prob: float  # natural log p(y|x), from BatchScorer
    count: int = 1  # how many samples produced it (beam search: 1)
    complete: bool = True  # False: the sample hit the length limit before </s>
    lm_log_prob: Optional[float] = None  # natural log, when a language model is given

    @property
    def text(self) -> str:
        return " ".join(self.words)

    @property
    def rank_score(self) -> float:
        return self.log_prob + (self.lm_log_prob or 0.0)


@dataclass
class Proposals:
    source: str  # as given
    words: List[str]  # tokenised, as the model sees them
    unknown_words: List[str]
    candidates: List[Candidate] = field(default_factory=list)


# --- the source side -----------------------------------------------------------------------------


class SourcePreparer:
    """Turns raw text into table-style tokens: Moses tokenisation and escaping (sacremoses), and
    lowercasing when the model's source vocabulary has no capitals (as for a lowercased corpus)."""

    def __init__(self, vocab: Vocabulary, lang: str = "en", tokenize: bool = True,
                 lowercase: Optional[bool] = None) -> None:
        self.tokenize = tokenize
        self.lowercase = lowercase if lowercase is not None else not any(t != t.lower() for t in vocab.tokens[3:])
        self._tokenizer = None
        if tokenize:
            from sacremoses import MosesTokenizer

            self._tokenizer = MosesTokenizer(lang=lang)

    def __call__(self, text: str) -> List[str]:
        text = text.strip()
        if self.lowercase:
            text = text.lower()
        if self._tokenizer is not None:
            return self._tokenizer.tokenize(text, escape=True)
        return text.split()


def display(words: Sequence[str]) -> str:
    """A phrase for people: Moses escapes undone (``&apos;`` -> ``'``), <unk> kept visible."""
    from sacremoses import MosesDetokenizer

    return MosesDetokenizer().unescape_xml(" ".join(words))


# --- generation ------------------------------------------------------------------------------------


def _encode_rows(model: TranslationModel, sources: Sequence[Sequence[int]], copies: int) -> Memory:
    """Each source encoded once, its memory row repeated ``copies`` times (len(sources) * copies rows)."""
    device = next(model.parameters()).device
    src, src_len = pad(sources, device)
    memory = model.encode(src, src_len)
    return memory.select(torch.arange(len(sources), device=device).repeat_interleave(copies))


def _next_log_probs(model: TranslationModel, rows: Memory, state: Tensor, prev: Tensor, first: bool,
                    allow_unk: bool, temperature: float = 1.0) -> Tuple[Tensor, Tensor]:
    """One decoder step for N rows: prev ids (N,) -> (log p over output classes (N, V'), new state)."""
    state, features = model.step(rows, state, prev)  # (N, D), (N, R)
    logits = model.logits(features).float()  # (N, V')
    log_probs = torch.log_softmax(logits / temperature, -1)  # the model's own log p (at temperature 1)
    # Barred tokens are removed without renormalising, so that scores stay the model's log p:
    # </s> at the first step (a phrase or a sentence has at least one word), and <unk> unless allowed.
    if first:
        log_probs[:, EOS_ID - FIRST_OUTPUT_ID] = -math.inf
    if not allow_unk:
        log_probs[:, UNK_ID - FIRST_OUTPUT_ID] = -math.inf
    return log_probs, state


@torch.inference_mode()
def ancestral_samples(model: TranslationModel, sources: Sequence[Sequence[int]], n: int, *, temperature: float = 1.0,
                      max_length: int = 10, seed: int = 1,
                      allow_unk: bool = True) -> List[List[Tuple[Tuple[int, ...], bool]]]:
    """``n`` samples y ~ p(y|x) per source: lists of (target ids, ended with </s>)."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    rows = _encode_rows(model, sources, n)
    state = model.start(rows)  # (N, D)
    N = len(rows)
    prev = torch.full((N,), PAD_ID, dtype=torch.long, device=state.device)  # no previous word
    words: List[List[int]] = [[] for _ in range(N)]
    done = torch.zeros(N, dtype=torch.bool)
    for t in range(max_length + 1):
        log_probs, state = _next_log_probs(model, rows, state, prev, t == 0, allow_unk, temperature)
        if t == max_length:
            break  # the limit: no more words, and no </s> drawn
        choice = torch.multinomial(log_probs.exp().cpu(), 1, generator=generator).squeeze(1) + FIRST_OUTPUT_ID
        for i in torch.nonzero(~done).squeeze(1).tolist():
            token = int(choice[i])
            if token == EOS_ID:
                done[i] = True
            else:
                words[i].append(token)
        if done.all():
            break
        prev = choice.to(state.device)
    out = []
    for s in range(len(sources)):
        out.append([(tuple(words[i]), bool(done[i])) for i in range(s * n, (s + 1) * n)])
    return out


Hypothesis = Tuple[Tuple[int, ...], float]  # target ids (no </s>), natural-log p(y|x) with </s>


def normalized_score(hypothesis: Hypothesis) -> float:
    """log p(y|x) per target token, </s> included: the ranking of length-normalised search."""
    return hypothesis[1] / (len(hypothesis[0]) + 1)


@torch.inference_mode()
def beam_search_batch(model: TranslationModel, sources: Sequence[Sequence[int]], beam: int, *,
                      max_length: Union[int, Sequence[int]] = 10, allow_unk: bool = True,
                      length_normalize: bool = False) -> List[List[Hypothesis]]:
    """Beam search for many sources at once: for each source, its ``beam`` best complete targets
    found, best first. The one beam search of the package, for phrases and for sentences.

    A source's search keeps ``k`` live hypotheses, ``k`` = ``beam`` minus the targets that have
    ended: at each step the ``k`` best one-word extensions of its live hypotheses (``</s>``
    among them) are kept, and those ending in ``</s>`` are set aside. It stops when ``beam``
    targets have ended; at ``max_length`` words (per source, or one limit for all) only ``</s>``
    may follow. Width 1 is greedy search. Live hypotheses of all sources run through one
    ``model.step`` per step. Scores are the model's log p(y|x), ``</s>`` included (``</s>`` is
    barred at the first step, ``<unk>`` unless ``allow_unk``, without renormalising). The ended
    targets are ranked by log p, or with ``length_normalize`` by log p per token (``</s>``
    included), which favours longer targets.
    """
    model.eval()
    B = len(sources)
    limits = [max_length] * B if isinstance(max_length, int) else list(max_length)
    device = next(model.parameters()).device
    rows = _encode_rows(model, sources, 1)  # B rows, then one per live hypothesis
    state = model.start(rows)  # (N, D)
    # the live hypotheses of all sources, a source's rows contiguous; row i of rows/state is live[i]
    live_source: List[int] = list(range(B))
    live: List[Hypothesis] = [((), 0.0)] * B
    finished: List[List[Hypothesis]] = [[] for _ in range(B)]
    eos = EOS_ID - FIRST_OUTPUT_ID
    for t in range(max(limits, default=0) + 1):
        prev = torch.tensor([seq[-1] if seq else PAD_ID for seq, _ in live], dtype=torch.long, device=device)
        log_probs, state = _next_log_probs(model, rows, state, prev, t == 0, allow_unk)  # (N, V'), (N, D)
        at_limit = torch.tensor([t >= limits[b] for b in live_source], device=device)  # (N,)
        log_probs[at_limit] = torch.where(torch.arange(log_probs.size(1), device=device) == eos, log_probs[at_limit],
                                          -math.inf)  # only </s> may follow
        totals = torch.tensor([score for _, score in live], device=device).unsqueeze(1) + log_probs  # (N, V')
        # each source's live rows side by side, padded with -inf, and one top-k for all sources
        V = totals.size(1)
        grid = totals.new_full((B, beam, V), -math.inf)  # (B, beam, V')
        grid[torch.tensor(live_source, device=device), torch.tensor(_slots(live_source), device=device)] = totals
        values, flat = grid.flatten(1).topk(min(beam, beam * V), 1)  # (B, beam)
        first_row = _first_rows(live_source, B)
        next_source: List[int] = []
        next_live: List[Hypothesis] = []
        next_rows: List[int] = []
        for b, (source_values, source_flat) in enumerate(zip(values.tolist(), flat.tolist())):
            if first_row[b] is None:
                continue  # this source's search has ended
            width = beam - len(finished[b])
            for value, index in zip(source_values[:width], source_flat[:width]):
                if value == -math.inf:
                    break
                local_row, cls = divmod(index, V)
                row = first_row[b] + local_row
                if cls == eos:
                    finished[b].append((live[row][0], value))
                else:
                    next_source.append(b)
                    next_live.append((live[row][0] + (cls + FIRST_OUTPUT_ID,), value))
                    next_rows.append(row)
        if not next_live:
            break
        live, live_source = next_live, next_source
        index = torch.tensor(next_rows, dtype=torch.long, device=device)
        rows, state = rows.select(index), state[index]
    key = normalized_score if length_normalize else (lambda h: h[1])
    return [sorted(found, key=lambda h: -key(h)) for found in finished]


def _slots(live_source: List[int]) -> List[int]:
    """The rank of each live row among its source's rows (rows of a source are contiguous)."""
    out, previous, k = [], None, 0
    for b in live_source:
        k = k + 1 if b == previous else 0
        out.append(k)
        previous = b
    return out


def _first_rows(live_source: List[int], B: int) -> List[Optional[int]]:
    """The first live row of each source, None for a source with none."""
    first: List[Optional[int]] = [None] * B
    for row, b in enumerate(live_source):
        if first[b] is None:
            first[b] = row
    return first


def beam_search(model: TranslationModel, source: Sequence[int], beam: int, *, max_length: int = 10,
                allow_unk: bool = True, length_normalize: bool = False) -> List[Hypothesis]:
    """The best complete targets of one source by :func:`beam_search_batch`, best first."""
    return beam_search_batch(model, [source], beam, max_length=max_length, allow_unk=allow_unk,
                             length_normalize=length_normalize)[0]


# --- ranking -----------------------------------------------------------------------------------------


class TargetLanguageModel:
    """A KenLM model of the target language: natural-log probability of a phrase (no <s>, </s>)."""

    def __init__(self, path: str) -> None:
        try:
            import kenlm
        except ImportError:  # pragma: no cover - kenlm is a dependency
            raise PhraseScorerError("the kenlm module is missing", hint="pip install kenlm") from None
        try:
            self.model = kenlm.Model(str(path))
        except (OSError, IOError, RuntimeError) as exc:
            raise PhraseScorerError(f"cannot read the language model ({exc})", path=path) from None

    def log_prob(self, words: Sequence[str]) -> float:
        return self.model.score(" ".join(words), bos=False, eos=False) * LN10


def propose(loaded, sources: Sequence[str], options: SampleOptions = SampleOptions(), *,
            preparer: Optional[SourcePreparer] = None,
            language_model: Optional[TargetLanguageModel] = None) -> List[Proposals]:
    """Candidate target phrases for each source phrase, ranked; see the module docstring."""
    if options.rank_by not in ("model", "model+lm"):
        raise PhraseScorerError(Text(setting("rank_by"), " takes model or model+lm"))
    if options.rank_by == "model+lm" and language_model is None:
        raise PhraseScorerError(Text(setting("rank_by", "model+lm"), " needs a language model (",
                                     setting("language_model", "FILE"), ")"))
    preparer = preparer or SourcePreparer(loaded.source_vocab)
    model = loaded.model
    src_vocab, tgt_vocab = loaded.source_vocab, loaded.target_vocab
    results = []
    for text in sources:
        words = preparer(text)
        if not words:
            raise PhraseScorerError(f"empty source phrase {text!r}", hint="give at least one word")
        unknown = [w for w in words if w not in src_vocab]
        if len(unknown) == len(words):
            raise PhraseScorerError(
                f"every word of {text!r} is outside the model's source shortlist ({', '.join(unknown)})",
                hint=Text("the model knows nothing of this phrase; check tokenisation and case (",
                          setting("tokenize", False), ", ", setting("lang"), ")"),
            )
        results.append(Proposals(text, words, unknown))
    source_ids = [src_vocab.encode(p.words) for p in results]

    generated: List[Dict[Tuple[int, ...], Tuple[int, bool]]] = []
    if options.beam:
        found = beam_search_batch(model, source_ids, options.beam, max_length=options.max_length,
                                  allow_unk=options.allow_unk)
        generated = [{seq: (1, True) for seq, _ in per_source if seq} for per_source in found]
    else:
        samples = ancestral_samples(model, source_ids, options.samples, temperature=options.temperature,
                                    max_length=options.max_length, seed=options.seed, allow_unk=options.allow_unk)
        for per_source in samples:
            counts = Counter(seq for seq, _ in per_source if seq)
            ends: Dict[Tuple[int, ...], bool] = {}  # whether a sample of the sequence ended with </s>
            for seq, ended in per_source:
                ends[seq] = ends.get(seq, False) or ended
            generated.append({seq: (count, ends[seq]) for seq, count in counts.items()})

    generated = [as_words(cands, tgt_vocab) for cands in generated]
    scorer = BatchScorer(model)
    pair_sources = [ids for ids, cands in zip(source_ids, generated) for _ in cands]
    pair_targets = [list(seq) for cands in generated for seq in cands]
    log_probs = iter(scorer.score(pair_sources, pair_targets).tolist())
    for proposal, cands in zip(results, generated):
        for seq, (count, complete) in cands.items():
            words = tgt_vocab.decode(seq)
            candidate = Candidate(words=words, log_prob=next(log_probs), count=count, complete=complete)
            if language_model is not None:
                candidate.lm_log_prob = language_model.log_prob(words)
            proposal.candidates.append(candidate)
        key = (lambda c: -c.rank_score) if options.rank_by == "model+lm" else (lambda c: -c.log_prob)
        proposal.candidates.sort(key=lambda c: (not c.complete, key(c)))
        proposal.candidates = proposal.candidates[: options.top]
    return results


def as_words(candidates: Dict[Tuple[int, ...], Tuple[int, bool]], vocab: Vocabulary
             ) -> Dict[Tuple[int, ...], Tuple[int, bool]]:
    """Generated id sequences as the ids of the words they spell (:meth:`Vocabulary.encode` of
    their words), merged where they spell the same words: a subword model can generate one word
    sequence in several segmentations, and its score of a word sequence is the one of its own
    segmentation (a word model's sequences are unchanged). Counts add up; complete if any is."""
    merged: Dict[Tuple[int, ...], Tuple[int, bool]] = {}
    for seq, (count, complete) in candidates.items():
        key = tuple(vocab.encode(vocab.decode(seq)))  # in the model's order, as seq
        if not key:
            continue  # pieces that spell no word
        before = merged.get(key, (0, False))
        merged[key] = (before[0] + count, before[1] or complete)
    return merged


def read_source_phrases(path: str) -> list:
    """The non-blank lines of ``path`` (``-``: stdin), as UTF-8 text."""
    return [text for _, text in text_lines(path, hint="give the source phrases as UTF-8 text") if text.strip()]
