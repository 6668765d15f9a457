#!/usr/bin/env python3
"""Which library learns the subword segmentation: sentencepiece against HF tokenizers.

    python tools/bench_subwords.py [--pair en-cs] [--size 6000] [--write]

Each candidate learns a segmentation of the target side of the shared Multi30k training corpus
(lowercased, Moses-tokenised: the words a Moses system hands the models) with --size pieces,
then segments test 2016. Reported per candidate: the seconds to learn it (best of --repeats),
the words per second it segments, one word at a time as the models' vocabularies do (a cache
in front of it makes this matter only for new words), the pieces per test word and per test
sentence (what a model reads and predicts: fewer is faster to score), the share of test words
kept whole, and whether every training and test word comes back byte for byte from its pieces
(the output is word-level Moses text: a segmentation that changes a word is unusable).
"""

from __future__ import annotations

import gzip
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

SHARED = benchlib.ROOT.parent / "shared" / "data"
WORD_START = "\u2581"


def read(path: Path) -> List[List[str]]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [line.split() for line in lines]


def spm_candidate(kind: str, train_file: Path, size: int, work: Path) -> Callable[[str], List[str]]:
    import sentencepiece as spm

    prefix = work / f"spm-{kind}"
    spm.SentencePieceTrainer.train(
        input=str(train_file), model_prefix=str(prefix), vocab_size=size, model_type=kind,
        character_coverage=1.0, normalization_rule_name="identity", split_digits=False,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
        num_threads=1, minloglevel=2, max_sentence_length=100000)
    processor = spm.SentencePieceProcessor(model_file=str(prefix) + ".model")
    return lambda word: processor.encode(word, out_type=str)


def hf_candidate(kind: str, train_file: Path, size: int, work: Path) -> Callable[[str], List[str]]:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders

    specials = ["<pad>", "</s>", "<unk>"]
    if kind == "bpe":
        tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
        trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=specials, show_progress=False)
    else:
        tokenizer = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(vocab_size=size, special_tokens=specials, unk_token="<unk>",
                                          show_progress=False)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train([str(train_file)], trainer)
    return lambda word: tokenizer.encode(word, add_special_tokens=False).tokens


CANDIDATES: Dict[str, Callable] = {
    "sentencepiece unigram": lambda *a: spm_candidate("unigram", *a),
    "sentencepiece bpe": lambda *a: spm_candidate("bpe", *a),
    "tokenizers unigram": lambda *a: hf_candidate("unigram", *a),
    "tokenizers bpe": lambda *a: hf_candidate("bpe", *a),
}


def joined(pieces: Sequence[str]) -> str:
    return "".join(pieces).replace(WORD_START, " ").strip()


def measure(name: str, train: List[List[str]], test: List[List[str]], size: int, repeats: int) -> list:
    learn = float("inf")
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        train_file = work / "train.txt"
        train_file.write_text("".join(" ".join(words) + "\n" for words in train), encoding="utf-8")
        for _ in range(repeats):
            start = time.perf_counter()
            segment = CANDIDATES[name](train_file, size, work)
            learn = min(learn, time.perf_counter() - start)
        test_types = sorted({w for words in test for w in words})
        start = time.perf_counter()
        pieces = {w: segment(w) for w in test_types}
        speed = len(test_types) / (time.perf_counter() - start)
        train_types = {w for words in train for w in words}
        exact = all(joined(segment(w)) == w for w in train_types) and all(joined(p) == w for w, p in pieces.items())
    tokens = [w for words in test for w in words]
    per_word = sum(len(pieces[w]) for w in tokens) / len(tokens)
    whole = sum(len(pieces[w]) == 1 for w in tokens) / len(tokens)
    unknown = sum("<unk>" in pieces[w] for w in tokens) / len(tokens)
    return [name, f"{learn:.1f}", f"{speed:,.0f}", f"{per_word:.2f}", f"{per_word * len(tokens) / len(test):.1f}",
            f"{100 * whole:.1f}%", f"{100 * unknown:.2f}%", "yes" if exact else "no"]


def main() -> None:
    parser, _ = benchlib.bench_parser(__doc__)
    parser.add_argument("--pair", default="en-cs", help="a Multi30k pair under ../shared/data (en-cs, en-fr)")
    parser.add_argument("--size", type=int, default=6000,
                        help="pieces in the vocabulary (the small preset's shortlist)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    target = args.pair.split("-")[1]
    data = SHARED / f"multi30k-{args.pair}"
    train = read(data / f"train.tok.{target}.gz")
    test = read(data / f"test_2016_flickr.tok.{target}.gz")
    rows = [measure(name, train, test, args.size, args.repeats) for name in CANDIDATES]
    tokens = sum(map(len, test))
    header = ["library, model", "learn (s)", "words/s", "pieces per word", "pieces per sentence",
              "words kept whole", "words with <unk>", "every word back byte for byte"]
    m = benchlib.machine()
    markdown = (f"## Subword segmentation, {args.pair} (`tools/bench_subwords.py --pair {args.pair}`)\n\n"
                f"`python tools/bench_subwords.py --pair {args.pair} --size {args.size}` on {m['cpu']}: the "
                f"{target} side of Multi30k, {args.size} pieces, learnt on the {len(train):,} training sentences, "
                f"measured on the {tokens:,} words of test 2016 ({tokens / len(test):.1f} words per sentence); "
                "one thread.\n\n" + benchlib.markdown_table(header, rows))
    benchlib.report(f"subwords {args.pair}", markdown, args.write)


if __name__ == "__main__":
    main()
