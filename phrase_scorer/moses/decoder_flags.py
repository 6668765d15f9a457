"""The decoder options a user may hand to Moses, and those refused.

phrase-scorer runs Moses with its own ``-f`` (the system), its own input on standard input, and,
where it reads n-best lists, its own ``-n-best-list``; it reads Moses' 1-best or n-best lines and
nothing else. ``--decoder-flags`` (``rerank`` records them in the reranker, and ``translate
--moses --reranker`` decodes with them) may only tune how Moses searches. Refused, each with one
line naming the option (Moses' names and short aliases, ``moses/Parameter.cpp``):

- options that make Moses write files of its own, which the tool never looks at and would
  overwrite a user's file by any name (``-n-best-list FILE N`` truncates FILE at every chunk);
- options that make Moses read files or features other than the moses.ini's (another system,
  weights or inputs than the ones the tool checks);
- options that change the lines Moses writes, which the tool reads as translations or n-best
  entries (a segmentation or an alignment would enter BLEU and the reranker's choice);
- options that make Moses do something other than translate its input (a server, the version);
- characters a shell reads: ``tune`` hands the options to mert-moses.pl, which runs Moses through
  a shell, where ``> FILE`` would write a file.

Moses reads a token as an option when it starts with ``-`` and a character that is not a digit
(``-5`` is a value); ``--name`` is read here as ``-name`` too, so no spelling slips through.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from phrase_scorer.errors import PhraseScorerError, Text, setting

WRITES_FILES = ("n-best-list", "lattice-samples", "output-search-graph", "osg", "output-search-graph-extended",
                "osgx", "output-search-graph-slf", "slf", "output-search-graph-hypergraph", "output-search-graph-pb",
                "pb", "translation-details", "T", "translation-all-details", "Tall", "tree-translation-details",
                "Ttree", "output-word-graph", "owg", "alignment-output-file", "output-unknowns", "server-log")
READS_FILES = ("config", "f", "input-file", "i", "weight-file", "wf", "references", "spe-src", "spe-trg", "spe-aln",
               "unknown-lhs", "distortion-file", "ttable-file", "lmodel-file", "generation-file",
               "global-lexical-file", "gl", "slmodel-file", "dlm-model")
CHANGES_SYSTEM = ("feature", "feature-add", "feature-overwrite", "feature-name-overwrite", "weight", "weight-add",
                  "weight-overwrite", "alternate-weight-setting", "aws")
CHANGES_OUTPUT = ("report-segmentation", "t", "report-segmentation-enriched", "tt", "print-id", "output-hypo-score",
                  "print-alignment-info", "report-all-factors", "output-factors", "print-passthrough",
                  "print-passthrough-in-n-best", "print-all-derivations", "labeled-n-best-list", "n-best-trees",
                  "report-all-factors-in-n-best", "mark-unknown", "mu")
# accepted: -include-segmentation-in-n-best and -print-alignment-info-in-n-best add n-best fields
# that the n-best reader keeps as read (io/nbest.py)
NOT_TRANSLATING = ("server", "daemon", "show-weights", "version")

WHY: Dict[str, str] = {
    **{name: "makes Moses write a file of its own, which phrase-scorer never reads" for name in WRITES_FILES},
    **{name: "makes Moses read a file other than the moses.ini's and the input phrase-scorer gives it"
       for name in READS_FILES},
    **{name: "changes the system's features or weights behind the moses.ini's back" for name in CHANGES_SYSTEM},
    **{name: "changes the lines Moses writes, which phrase-scorer reads as translations or n-best entries"
       for name in CHANGES_OUTPUT},
    **{name: "makes Moses do something other than translate its input" for name in NOT_TRANSLATING},
}
WHAT_TO_DO = {
    "n-best-list": "leave it out: phrase-scorer asks Moses for the n-best lists it reads itself",
    "config": "give the moses.ini as the command's own argument",
    "f": "give the moses.ini as the command's own argument",
}
SHELL_CHARACTERS = set(";&|<>()$`\\\"'*?[]{}~#!")


def option_name(token: str) -> Optional[str]:
    """The Moses option ``token`` names (without its dashes), or None for a value: Moses reads a
    token as an option when it starts with ``-`` and then a character that is not a digit."""
    if len(token) < 2 or not token.startswith("-") or token[1].isdigit():
        return None
    name = token[2:] if token.startswith("--") else token[1:]
    return name or None


def refused_decoder_flags(flags: str) -> List[Tuple[Optional[str], str]]:
    """The problems of ``flags``, in their order: (the option's name, or None for a character;
    what is wrong), one per option or character refused; empty when Moses may be given them."""
    problems: List[Tuple[Optional[str], str]] = []
    for character in dict.fromkeys(flags):  # a newline too: it ends mert-moses.pl's shell command, starts another
        if character in SHELL_CHARACTERS or not (character.isprintable() or character in " \t"):
            problems.append((None, f"holds {character!r}, which a shell reads (mert-moses.pl runs Moses "
                                   "through one)"))
    for token in flags.split():
        name = option_name(token)
        if name in WHY:
            problems.append((name, f"sets Moses' {token}: it {WHY[name]}"))
    return problems


def check_decoder_flags(flags: Optional[str], *, path: Optional[str] = None, key: Optional[str] = None) -> None:
    """Refuse decoder options Moses may not be given (see the module docstring), naming the first
    refused one. ``path`` and ``key``: the file (a reranker) and its key that hold them; without a
    key they are the command's ``decoder_flags`` setting."""
    problems = refused_decoder_flags(flags or "")
    if not problems:
        return
    name, problem = problems[0]
    if key is not None:
        raise PhraseScorerError(f"{key} {problem}", path=path,
                                hint="tune the reranker again with decoder flags that only set how Moses searches")
    hint = WHAT_TO_DO.get(name, "leave it out of the decoder flags") if name else \
        "give plain Moses options separated by spaces"
    raise PhraseScorerError(Text(setting("decoder_flags"), f" {problem}"), path=path, hint=hint)
