"""Generating target phrases: ancestral sampling and beam search (section 4.3, Tables 3-4).

:func:`propose` takes raw or tokenised source phrases and returns, for each, its candidate target
phrases ranked by log p(y|x). Candidates come from ``n`` ancestral samples (duplicates merged,
with their counts) or, with ``beam``, from beam search. Every candidate's log p is then computed
by :class:`~phrase_scorer.scoring.BatchScorer`, the scorer behind ``score`` and ``annotate``, so
the numbers agree with theirs. A target language model (ARPA or KenLM binary, read with the
``kenlm`` module) can add its log-probability as a second score and to the ranking.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from phrase_scorer.config import SampleOptions
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.model import FIRST_OUTPUT_ID, RNNEncoderDecoder
from phrase_scorer.scoring import BatchScorer, pad
from phrase_scorer.vocab import EOS_ID, UNK_ID, Vocabulary

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

    def __init__(self, vocab: Vocabulary, lang: str = "en", tokenize: bool = True, lowercase: Optional[bool] = None) -> None:
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


def _start(model: RNNEncoderDecoder, sources: Sequence[Sequence[int]], copies: int):
    """Per-source decoder inputs, each repeated ``copies`` times: h'_0, C c, O_c c + O_w m_x."""
    device = next(model.parameters()).device
    src, src_len = pad(sources, device)
    c, mean_emb = model.encoder(src, src_len)  # (S, H), (S, E)
    h, ctx = model.decoder.start(c)
    source_term = model.readout.source_term(c, mean_emb)
    repeat = lambda t: t.repeat_interleave(copies, 0)  # noqa: E731  (S*copies, ...)
    return repeat(h), repeat(ctx), repeat(source_term)


def _step_log_probs(model: RNNEncoderDecoder, prev: Tensor, h: Tensor, ctx: Tensor, source_term: Tensor,
                    first: bool, allow_unk: bool, temperature: float = 1.0) -> Tuple[Tensor, Tensor]:
    """One decoder step for N rows: prev ids (N,) -> (log p over output classes (N, V'), h'_t)."""
    decoder, readout = model.decoder, model.readout
    prev_emb = decoder.first_input(len(prev)) if first else decoder.embed(prev)  # (N, E)
    h = decoder.step(decoder.input_proj(prev_emb), h, ctx)  # (N, H)
    logits = readout.logits(readout.features(h, prev_emb, source_term)).float()  # (N, V')
    log_probs = torch.log_softmax(logits / temperature, -1)  # the model's own log p (at temperature 1)
    # Barred tokens are removed without renormalising, so that scores stay the model's log p:
    # </s> at the first step (a phrase has at least one word), and <unk> unless allowed.
    if first:
        log_probs[:, EOS_ID - FIRST_OUTPUT_ID] = -math.inf
    if not allow_unk:
        log_probs[:, UNK_ID - FIRST_OUTPUT_ID] = -math.inf
    return log_probs, h


@torch.inference_mode()
def ancestral_samples(model: RNNEncoderDecoder, sources: Sequence[Sequence[int]], n: int, *, temperature: float = 1.0,
                      max_length: int = 10, seed: int = 1, allow_unk: bool = True) -> List[List[Tuple[Tuple[int, ...], bool]]]:
    """``n`` samples y ~ p(y|x) per source: lists of (target ids, ended with </s>)."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    h, ctx, source_term = _start(model, sources, n)
    N = h.size(0)
    prev = torch.zeros(N, dtype=torch.long, device=h.device)
    words: List[List[int]] = [[] for _ in range(N)]
    done = torch.zeros(N, dtype=torch.bool)
    for t in range(max_length + 1):
        log_probs, h = _step_log_probs(model, prev, h, ctx, source_term, t == 0, allow_unk, temperature)
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
        prev = choice.to(h.device)
    out = []
    for s in range(len(sources)):
        out.append([(tuple(words[i]), bool(done[i])) for i in range(s * n, (s + 1) * n)])
    return out


@torch.inference_mode()
def beam_search(model: RNNEncoderDecoder, source: Sequence[int], beam: int, *, max_length: int = 10,
                allow_unk: bool = True) -> List[Tuple[Tuple[int, ...], float]]:
    """The ``beam`` most probable complete targets found by beam search, best first."""
    model.eval()
    h, ctx, source_term = _start(model, [source], 1)
    live: List[Tuple[Tuple[int, ...], float]] = [((), 0.0)]
    finished: List[Tuple[Tuple[int, ...], float]] = []
    for t in range(max_length + 1):
        K = len(live)
        prev = torch.tensor([seq[-1] if seq else 0 for seq, _ in live], device=h.device)
        log_probs, h = _step_log_probs(model, prev, h, ctx.expand(K, -1), source_term.expand(K, -1), t == 0, allow_unk)
        totals = torch.tensor([score for _, score in live], device=h.device).unsqueeze(1) + log_probs  # (K, V')
        values, flat = totals.flatten().topk(min(2 * beam, totals.numel()))
        next_live, rows = [], []
        for value, index in zip(values.tolist(), flat.tolist()):
            row, cls = divmod(index, totals.size(1))
            token = cls + FIRST_OUTPUT_ID
            if value == -math.inf:
                break
            if token == EOS_ID:
                finished.append((live[row][0], value))
            elif t < max_length and len(next_live) < beam:
                next_live.append((live[row][0] + (token,), value))
                rows.append(row)
        finished.sort(key=lambda item: -item[1])
        finished = finished[:beam]
        if not next_live or (len(finished) == beam and finished[-1][1] >= next_live[0][1]):
            break  # scores only fall: no live hypothesis can still enter the top `beam`
        live = next_live
        h = h[torch.tensor(rows, device=h.device)]
    return finished


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
            preparer: Optional[SourcePreparer] = None, language_model: Optional[TargetLanguageModel] = None) -> List[Proposals]:
    """Candidate target phrases for each source phrase, ranked; see the module docstring."""
    if options.rank_by not in ("model", "model+lm"):
        raise PhraseScorerError("--rank-by takes model or model+lm")
    if options.rank_by == "model+lm" and language_model is None:
        raise PhraseScorerError("--rank-by model+lm needs a language model (--lm FILE)")
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
                hint="the model knows nothing of this phrase; check tokenisation and case (--no-tokenize, --lang)",
            )
        results.append(Proposals(text, words, unknown))
    source_ids = [src_vocab.encode(p.words) for p in results]

    generated: List[Dict[Tuple[int, ...], Tuple[int, bool]]] = []
    if options.beam:
        for ids in source_ids:
            found = beam_search(model, ids, options.beam, max_length=options.max_length, allow_unk=options.allow_unk)
            generated.append({seq: (1, True) for seq, _ in found if seq})
    else:
        samples = ancestral_samples(model, source_ids, options.samples, temperature=options.temperature,
                                    max_length=options.max_length, seed=options.seed, allow_unk=options.allow_unk)
        for per_source in samples:
            counts = Counter(seq for seq, _ in per_source if seq)
            complete: Dict[Tuple[int, ...], bool] = {}
            for seq, ended in per_source:
                complete[seq] = complete.get(seq, False) or ended
            generated.append({seq: (count, complete[seq]) for seq, count in counts.items()})

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
