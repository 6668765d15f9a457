#!/usr/bin/env bash
# Build the phrase-based Moses system of a Multi30k language pair (English→French or English→Czech)
# from a checkout of the Multi30k dataset and an existing Moses build: eflomal word alignment in
# both directions, grow-diag-final-and, train-model.perl steps 4-9, a 5-gram KenLM model, MERT on
# val, then test 2016 decoded and scored with sacrebleu. Every step is skipped when its output
# exists, so an interrupted run resumes where it stopped. Run with --help for the details.
set -euo pipefail

PROG=$(basename "$0")

usage() {
  cat <<EOF
Usage: $PROG --multi30k DIR --pair en-fr|en-cs --moses MOSES_HOME --out DIR [options]

Builds a tuned phrase-based Moses system from the Multi30k task-1 corpus, with the data, steps
and flags of the systems the documentation's figures were measured on, and prints its BLEU on
test 2016 (flickr).

Required:
  --multi30k DIR      a checkout of https://github.com/multi30k/dataset (or its data/task1/tok
                      folder): the lowercased, normalised, Moses-tokenised files
                      train.lc.norm.tok.{en,fr,cs}, val.lc.norm.tok.*, test_2016_flickr.lc.norm.tok.*
                      (plain or .gz)
  --pair PAIR         en-fr or en-cs (English is always the source)
  --moses DIR         a Moses build (MOSES_HOME): bin/moses, bin/symal, bin/lmplz, bin/build_binary,
                      mert's programs in bin/, and scripts/
  --out DIR           where the system is written (created; an existing one is resumed)

Options:
  --threads N         decoder threads (-threads N in MERT's decoder flags) and train-model.perl
                      --cores (default 2, as the shared systems)
  --max-iterations N  MERT iterations at most (default 10 for en-fr, 15 for en-cs)
  --symmetriser S     symal (Moses' own, default) or atools (fast_align's, eflomal's README)
  -h, --help          this help

Also needed on PATH: eflomal-align and sacrebleu (pip install eflomal sacrebleu), perl, gzip.

Steps (each skipped when its output exists):
   1 data       DIR/data/{train,val,test_2016_flickr}.tok.{en,TGT} (and .gz copies)
   2 align      eflomal-align in both directions (DIR/align/{fwd,rev})
   3 symmetrise grow-diag-final-and -> DIR/train/model/aligned.grow-diag-final-and
                (and DIR/aligned.grow-diag-final-and.gz)
   4 lm         lmplz -o 5 --discount_fallback -> DIR/lm.arpa.gz; build_binary -> DIR/lm.bin
   5 train      train-model.perl --first-step 4 --last-step 9 --alignment grow-diag-final-and
                --reordering msd-bidirectional-fe --lm 0:5:DIR/lm.bin:8
   6 package    DIR/phrase-table.gz, DIR/reordering-table.wbe-msd-bidirectional-fe.gz,
                DIR/moses.ini (paths relative to DIR)
   7 tune       mert-moses.pl val.tok.en val.tok.TGT moses moses.ini --decoder-flags
                "-threads N -v 0 -search-algorithm 1 -cube-pruning-pop-limit 400 -s 400"
                --maximum-iterations 10|15 -> DIR/moses.tuned.ini (paths relative to DIR)
   8 decode     moses -f moses.tuned.ini (run in DIR) on test 2016 and val
   9 nbest      DIR/val.nbest.gz: 100-best (distinct, with word alignments), first 100 val sentences
  10 score      sacrebleu --tokenize none; writes DIR/baseline.md and prints the test BLEU

Moses reads relative paths relative to the folder it is started in: run it from DIR, or rewrite
the paths (phrase-scorer moses-ini). About an hour on 2 cores (en-cs: more MERT iterations).
EOF
}

die() {
  echo "$PROG: error: $*" >&2
  exit 2
}

say() {
  echo "[$PROG] $*" >&2
}

# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------
MULTI30K="" PAIR="" MOSES="" OUT="" THREADS=2 MAX_ITERATIONS="" SYMMETRISER=symal

need_value() {
  [[ $# -ge 2 && -n $2 && $2 != --* ]] || die "$1 needs a value (see --help)"
}

while [[ $# -gt 0 ]]; do
  arg=$1
  if [[ $arg == --*=* ]]; then
    set -- "${arg%%=*}" "${arg#*=}" "${@:2}"
    arg=$1
  fi
  case $arg in
    -h | --help) usage; exit 0 ;;
    --multi30k) need_value "$@"; MULTI30K=$2; shift 2 ;;
    --pair) need_value "$@"; PAIR=$2; shift 2 ;;
    --moses) need_value "$@"; MOSES=$2; shift 2 ;;
    --out) need_value "$@"; OUT=$2; shift 2 ;;
    --threads) need_value "$@"; THREADS=$2; shift 2 ;;
    --max-iterations) need_value "$@"; MAX_ITERATIONS=$2; shift 2 ;;
    --symmetriser | --symmetrizer) need_value "$@"; SYMMETRISER=$2; shift 2 ;;
    *) die "unknown argument '$arg' (see --help)" ;;
  esac
done

[[ -n $MULTI30K ]] || die "--multi30k DIR is required (a checkout of github.com/multi30k/dataset; see --help)"
[[ -n $PAIR ]] || die "--pair en-fr|en-cs is required"
[[ -n $MOSES ]] || die "--moses MOSES_HOME is required (a Moses build with bin/ and scripts/)"
[[ -n $OUT ]] || die "--out DIR is required"

case $PAIR in
  en-fr) TGT=fr; DEFAULT_ITERATIONS=10 ;;
  en-cs) TGT=cs; DEFAULT_ITERATIONS=15 ;;
  *) die "--pair must be en-fr or en-cs, not '$PAIR'" ;;
esac
SRC=en
MAX_ITERATIONS=${MAX_ITERATIONS:-$DEFAULT_ITERATIONS}
[[ $THREADS =~ ^[1-9][0-9]*$ ]] || die "--threads must be a positive whole number, not '$THREADS'"
[[ $MAX_ITERATIONS =~ ^[1-9][0-9]*$ ]] || die "--max-iterations must be a positive whole number, not '$MAX_ITERATIONS'"
case $SYMMETRISER in
  symal | atools) ;;
  *) die "--symmetriser must be symal or atools, not '$SYMMETRISER'" ;;
esac

# The Multi30k files: the checkout's data/task1/tok/, or that folder itself.
[[ -d $MULTI30K ]] || die "Multi30k folder '$MULTI30K' does not exist (clone https://github.com/multi30k/dataset and pass its folder)"
if [[ -d $MULTI30K/data/task1/tok ]]; then
  TOK=$MULTI30K/data/task1/tok
else
  TOK=$MULTI30K
fi
SPLITS=(train val test_2016_flickr)
declare -A INPUT=()
for split in "${SPLITS[@]}"; do
  for lang in "$SRC" "$TGT"; do
    name=$split.lc.norm.tok.$lang
    if [[ -f $TOK/$name ]]; then
      INPUT[$split.$lang]=$TOK/$name
    elif [[ -f $TOK/$name.gz ]]; then
      INPUT[$split.$lang]=$TOK/$name.gz
    else
      die "'$TOK' has no $name (expected the Multi30k checkout's data/task1/tok files)"
    fi
  done
done

# The Moses build and the other programs.
[[ -d $MOSES ]] || die "Moses folder '$MOSES' does not exist (pass --moses MOSES_HOME, a Moses build)"
MOSES=$(cd "$MOSES" && pwd)
require_executable() {
  [[ -f $1 && -x $1 ]] || die "$2 is missing: $1 ($3)"
}
require_executable "$MOSES/bin/moses" "the Moses decoder" "build Moses, or point --moses elsewhere"
for program in extractor mert kbmira pro evaluator; do
  require_executable "$MOSES/bin/$program" "mert program $program" "build Moses with its mert tools"
done
for script in training/train-model.perl training/mert-moses.pl training/filter-model-given-input.pl; do
  [[ -f $MOSES/scripts/$script ]] || die "Moses script $script is missing: $MOSES/scripts/$script (--moses must be the build's root)"
done
find_program() {  # NAME: MOSES/bin/NAME, else NAME on PATH; empty if neither
  if [[ -x $MOSES/bin/$1 ]]; then
    echo "$MOSES/bin/$1"
  else
    command -v "$1" || true
  fi
}
LMPLZ=$(find_program lmplz)
BUILD_BINARY=$(find_program build_binary)
[[ -n $LMPLZ ]] || die "KenLM's lmplz is not in $MOSES/bin nor on PATH (build Moses with KenLM)"
[[ -n $BUILD_BINARY ]] || die "KenLM's build_binary is not in $MOSES/bin nor on PATH"
if [[ $SYMMETRISER == symal ]]; then
  require_executable "$MOSES/bin/symal" "Moses' symal" "build Moses, or pass --symmetriser atools"
  SYMAL=$MOSES/bin/symal
else
  ATOOLS=$(command -v atools || true)
  [[ -n $ATOOLS ]] || die "atools (from fast_align) is not on PATH (or use --symmetriser symal)"
fi
EFLOMAL=$(command -v eflomal-align || true)
[[ -n $EFLOMAL ]] || die "eflomal-align is not on PATH (pip install eflomal)"
SACREBLEU=$(command -v sacrebleu || true)
[[ -n $SACREBLEU ]] || die "sacrebleu is not on PATH (pip install sacrebleu)"
command -v perl >/dev/null || die "perl is not on PATH (Moses' scripts need it)"

mkdir -p "$OUT" || die "cannot create --out folder '$OUT'"
OUT=$(cd "$OUT" && pwd)
LOGS=$OUT/logs
mkdir -p "$OUT/data" "$OUT/align" "$OUT/train/model" "$LOGS" "$OUT/tmp"

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
STEP=0
step() {  # NAME OUTPUT...: announce the step; returns 1 (skip) when every OUTPUT exists
  STEP=$((STEP + 1))
  local name=$1 missing=0 output
  shift
  for output in "$@"; do
    [[ -s $output ]] || missing=1
  done
  if [[ $missing == 0 ]]; then
    say "step $STEP/10 $name: done already (${1#"$OUT"/} exists), skipped"
    return 1
  fi
  say "step $STEP/10 $name ($(date '+%H:%M:%S'))"
  return 0
}

run_logged() {  # LOG COMMAND...: run COMMAND with its output in LOG; on failure show its end
  local log=$1
  shift
  if ! "$@" >"$log" 2>&1; then
    echo "---- last lines of $log ----" >&2
    tail -n 25 "$log" >&2
    echo "$PROG: error: step $STEP failed: $1 (full output in $log)" >&2
    exit 1
  fi
}

lines() {
  wc -l <"$1" | tr -d ' '
}

# Paths relative to OUT, as in the shared systems: every path= becomes the file's name, and the
# binarised LM (what tuning loaded, for speed) becomes the ARPA file it was built from.
relative_ini() {  # IN OUT
  sed -E -e 's#(path=)[^ ]*/([^/ ]+)#\1\2#g' -e 's#path=lm\.bin( |$)#path=lm.arpa.gz\1#' "$1" >"$2.tmp"
  mv "$2.tmp" "$2"
}

# eflomal's links (i-j: source word i, target word j) as symal's input (the .bal format
# giza2bal.pl writes): per sentence a count, then the target side with, for each target word, the
# source position its forward link points to, then the source side with, for each source word,
# the target position of its reverse link (1-based, 0: none). The words themselves are not used.
links_to_bal() {  # SRC TGT FWD REV
  awk -v src="$1" -v tgt="$2" -v fwd="$3" -v rev="$4" '
    function fail(msg) { print "links_to_bal: line " k ": " msg > "/dev/stderr"; bad = 1; exit 1 }
    BEGIN {
      k = 0
      while ((getline s < src) > 0) {
        k++
        if ((getline t < tgt) <= 0 || (getline f < fwd) <= 0 || (getline r < rev) <= 0)
          fail("the corpus and the alignments differ in length")
        m = split(s, sw, " "); n = split(t, tw, " ")
        for (i = 1; i <= m; i++) a[i] = 0
        for (j = 1; j <= n; j++) b[j] = 0
        nf = split(f, fl, " ")
        for (x = 1; x <= nf; x++) {
          split(fl[x], p, "-"); i = p[1] + 1; j = p[2] + 1
          if (i < 1 || i > m || j < 1 || j > n) fail("link " fl[x] " outside the sentence pair")
          if (b[j] == 0) b[j] = i; else doubled++
        }
        nr = split(r, rl, " ")
        for (x = 1; x <= nr; x++) {
          split(rl[x], p, "-"); i = p[1] + 1; j = p[2] + 1
          if (i < 1 || i > m || j < 1 || j > n) fail("link " rl[x] " outside the sentence pair")
          if (a[i] == 0) a[i] = j; else doubled++
        }
        line = n; for (j = 1; j <= n; j++) line = line " w"; line = line " #"
        for (j = 1; j <= n; j++) line = line " " b[j]
        print "1"; print line
        line = m; for (i = 1; i <= m; i++) line = line " w"; line = line " #"
        for (i = 1; i <= m; i++) line = line " " a[i]
        print line
      }
      if ((getline t < tgt) > 0 || (getline f < fwd) > 0 || (getline r < rev) > 0)
        fail("the corpus and the alignments differ in length")
      if (doubled) print "links_to_bal: " doubled " words with two links in one direction (kept the first)" > "/dev/stderr"
    }'
}

sort_links() {  # each line's i-j links in order of i, then j
  awk '{
    n = split($0, l, " ")
    for (x = 1; x <= n; x++) { split(l[x], p, "-"); key[x] = p[1] * 100000 + p[2] }
    for (x = 2; x <= n; x++) {
      k = key[x]; v = l[x]
      for (y = x - 1; y >= 1 && key[y] > k; y--) { key[y + 1] = key[y]; l[y + 1] = l[y] }
      key[y + 1] = k; l[y + 1] = v
    }
    line = ""
    for (x = 1; x <= n; x++) line = line (x > 1 ? " " : "") l[x]
    print line
  }'
}

# ---------------------------------------------------------------------------------------------
# 1. Data: the Multi30k files under the names the shared systems use
# ---------------------------------------------------------------------------------------------
DATA=$OUT/data
data_outputs=()
for split in "${SPLITS[@]}"; do
  data_outputs+=("$DATA/$split.tok.$SRC" "$DATA/$split.tok.$TGT" "$DATA/$split.tok.$SRC.gz" "$DATA/$split.tok.$TGT.gz")
done
if step data "${data_outputs[@]}"; then
  for split in "${SPLITS[@]}"; do
    for lang in "$SRC" "$TGT"; do
      input=${INPUT[$split.$lang]}
      dest=$DATA/$split.tok.$lang
      if [[ $input == *.gz ]]; then
        gzip -cd "$input" >"$dest.tmp"
      else
        cp "$input" "$dest.tmp"
      fi
      mv "$dest.tmp" "$dest"
      gzip -c "$dest" >"$dest.gz.tmp"  # (the names phrase-scorer's documented commands use)
      mv "$dest.gz.tmp" "$dest.gz"
    done
    [[ $(lines "$DATA/$split.tok.$SRC") == $(lines "$DATA/$split.tok.$TGT") ]] \
      || { rm -f "$DATA/$split".tok.*; die "$split: the $SRC and $TGT files differ in length"; }
  done
fi
say "  train $(lines "$DATA/train.tok.$SRC"), val $(lines "$DATA/val.tok.$SRC"), test 2016 $(lines "$DATA/test_2016_flickr.tok.$SRC") sentence pairs"

# ---------------------------------------------------------------------------------------------
# 2. Word alignment: eflomal in both directions (its default model 3, IBM1+HMM+fertility)
# ---------------------------------------------------------------------------------------------
FWD=$OUT/align/fwd REV=$OUT/align/rev
if step align "$FWD" "$REV"; then
  rm -f "$FWD.tmp" "$REV.tmp"
  run_logged "$LOGS/align.log" "$EFLOMAL" --overwrite -s "$DATA/train.tok.$SRC" -t "$DATA/train.tok.$TGT" \
    -f "$FWD.tmp" -r "$REV.tmp"
  mv "$FWD.tmp" "$FWD"
  mv "$REV.tmp" "$REV"
fi

# ---------------------------------------------------------------------------------------------
# 3. Symmetrisation: grow-diag-final-and, where train-model.perl expects it
# ---------------------------------------------------------------------------------------------
ALIGNED=$OUT/train/model/aligned.grow-diag-final-and
if step symmetrise "$ALIGNED" "$OUT/aligned.grow-diag-final-and.gz"; then
  if [[ $SYMMETRISER == symal ]]; then
    # The flags train-model.perl gives symal for grow-diag-final-and.
    links_to_bal "$DATA/train.tok.$SRC" "$DATA/train.tok.$TGT" "$FWD" "$REV" >"$OUT/align/train.bal"
    # (Through stdin and stdout, as train-model.perl runs it.)
    "$SYMAL" -alignment=grow -diagonal=yes -final=yes -both=yes \
      <"$OUT/align/train.bal" >"$OUT/align/symal.out" 2>"$LOGS/symmetrise.log" \
      || { tail -n 25 "$LOGS/symmetrise.log" >&2; echo "$PROG: error: symal failed (see $LOGS/symmetrise.log)" >&2; exit 1; }
    # symal writes a sentence's links by target position; sort them by source position as
    # atools and the shared systems' files have them (the order means nothing to Moses).
    sort_links <"$OUT/align/symal.out" >"$ALIGNED.tmp"
    rm -f "$OUT/align/train.bal" "$OUT/align/symal.out"
  else
    "$ATOOLS" -c grow-diag-final-and -i "$FWD" -j "$REV" >"$ALIGNED.tmp" 2>"$LOGS/symmetrise.log" \
      || { tail -n 25 "$LOGS/symmetrise.log" >&2; echo "$PROG: error: atools failed (see $LOGS/symmetrise.log)" >&2; exit 1; }
  fi
  [[ $(lines "$ALIGNED.tmp") == $(lines "$DATA/train.tok.$SRC") ]] \
    || { rm -f "$ALIGNED.tmp"; echo "$PROG: error: the symmetrised alignment has the wrong number of lines" >&2; exit 1; }
  mv "$ALIGNED.tmp" "$ALIGNED"
  gzip -c "$ALIGNED" >"$OUT/aligned.grow-diag-final-and.gz.tmp"
  mv "$OUT/aligned.grow-diag-final-and.gz.tmp" "$OUT/aligned.grow-diag-final-and.gz"
fi

# ---------------------------------------------------------------------------------------------
# 4. Language model: 5-gram KenLM of the target side of the training data
# ---------------------------------------------------------------------------------------------
if step lm "$OUT/lm.arpa.gz" "$OUT/lm.bin"; then
  lmplz_arpa() {
    "$LMPLZ" -o 5 --discount_fallback -S 1G -T "$OUT/tmp" <"$DATA/train.tok.$TGT" >"$OUT/lm.arpa.tmp"
  }
  run_logged "$LOGS/lmplz.log" lmplz_arpa
  run_logged "$LOGS/build_binary.log" "$BUILD_BINARY" "$OUT/lm.arpa.tmp" "$OUT/lm.bin.tmp"
  gzip -c "$OUT/lm.arpa.tmp" >"$OUT/lm.arpa.gz.tmp"
  mv "$OUT/lm.arpa.gz.tmp" "$OUT/lm.arpa.gz"
  mv "$OUT/lm.bin.tmp" "$OUT/lm.bin"
  rm -f "$OUT/lm.arpa.tmp"
fi

# ---------------------------------------------------------------------------------------------
# 5. Phrase table, reordering table, moses.ini: train-model.perl from the word alignment on
# ---------------------------------------------------------------------------------------------
MODEL=$OUT/train/model
if step train "$MODEL/moses.ini"; then
  run_logged "$LOGS/train-model.log" perl "$MOSES/scripts/training/train-model.perl" \
    --root-dir "$OUT/train" --corpus "$DATA/train.tok" --f "$SRC" --e "$TGT" \
    --first-step 4 --last-step 9 --alignment grow-diag-final-and \
    --reordering msd-bidirectional-fe --lm "0:5:$OUT/lm.bin:8" --cores "$THREADS"
  [[ -s $MODEL/moses.ini ]] || { echo "$PROG: error: train-model.perl wrote no $MODEL/moses.ini (see $LOGS/train-model.log)" >&2; exit 1; }
fi

# ---------------------------------------------------------------------------------------------
# 6. The model files at the top of OUT, as the shared systems have them
# ---------------------------------------------------------------------------------------------
REORDERING=reordering-table.wbe-msd-bidirectional-fe.gz
if step package "$OUT/phrase-table.gz" "$OUT/$REORDERING" "$OUT/moses.ini"; then
  for table in phrase-table.gz "$REORDERING"; do
    cp "$MODEL/$table" "$OUT/$table.tmp"
    mv "$OUT/$table.tmp" "$OUT/$table"
  done
  relative_ini "$MODEL/moses.ini" "$OUT/moses.ini"
fi

# ---------------------------------------------------------------------------------------------
# 7. MERT on val
# ---------------------------------------------------------------------------------------------
DECODER_FLAGS="-threads $THREADS -v 0 -search-algorithm 1 -cube-pruning-pop-limit 400 -s 400"
if step tune "$OUT/moses.tuned.ini"; then
  if [[ ! -s $OUT/tuning/moses.ini ]]; then
    if [[ -d $OUT/tuning ]]; then
      say "  an unfinished tuning run is in $OUT/tuning: starting MERT again"
      rm -rf "$OUT/tuning"
    fi
    # Started in data/ so that the tuned config's header names the dev set val.tok.en.
    run_mert() {
      (cd "$DATA" && perl "$MOSES/scripts/training/mert-moses.pl" "val.tok.$SRC" "val.tok.$TGT" \
        "$MOSES/bin/moses" "$MODEL/moses.ini" --mertdir "$MOSES/bin" --working-dir "$OUT/tuning" \
        --decoder-flags "$DECODER_FLAGS" --maximum-iterations "$MAX_ITERATIONS")
    }
    run_logged "$LOGS/mert.log" run_mert
    [[ -s $OUT/tuning/moses.ini ]] || { echo "$PROG: error: mert-moses.pl wrote no $OUT/tuning/moses.ini (see $LOGS/mert.log)" >&2; exit 1; }
  fi
  relative_ini "$OUT/tuning/moses.ini" "$OUT/moses.tuned.ini"
fi

# ---------------------------------------------------------------------------------------------
# 8. Decoding test 2016 and val with the tuned system, from OUT (its paths are relative to it)
# ---------------------------------------------------------------------------------------------
tuned_moses() {  # INPUT OUTPUT [MOSES OPTIONS...]: the tuned system, started in OUT
  (cd "$OUT" && "$MOSES/bin/moses" -f moses.tuned.ini -threads "$THREADS" "${@:3}" <"$1" >"$2")
}
decode() {  # INPUT OUTPUT LOG
  run_logged "$3" tuned_moses "$1" "$2.tmp"
  [[ $(lines "$2.tmp") == $(lines "$1") ]] || { echo "$PROG: error: Moses translated $(lines "$2.tmp") of $(lines "$1") lines (see $3)" >&2; exit 1; }
  mv "$2.tmp" "$2"
}
TEST_OUT=$OUT/test_2016_flickr.tuned.$TGT
VAL_OUT=$OUT/val.tuned.$TGT
if step decode "$TEST_OUT" "$VAL_OUT"; then
  [[ -s $TEST_OUT ]] || decode "$DATA/test_2016_flickr.tok.$SRC" "$TEST_OUT" "$LOGS/decode-test.log"
  [[ -s $VAL_OUT ]] || decode "$DATA/val.tok.$SRC" "$VAL_OUT" "$LOGS/decode-val.log"
fi

# ---------------------------------------------------------------------------------------------
# 9. A 100-best list of the first 100 val sentences, with word alignments
# ---------------------------------------------------------------------------------------------
if step nbest "$OUT/val.nbest.gz"; then
  head -n 100 "$DATA/val.tok.$SRC" >"$OUT/tmp/val100.$SRC"
  run_logged "$LOGS/nbest.log" tuned_moses "$OUT/tmp/val100.$SRC" /dev/null \
    -n-best-list "$OUT/tmp/val.nbest" 100 distinct -print-alignment-info-in-n-best
  gzip -c "$OUT/tmp/val.nbest" >"$OUT/val.nbest.gz.tmp"
  mv "$OUT/val.nbest.gz.tmp" "$OUT/val.nbest.gz"
  rm -f "$OUT/tmp/val.nbest" "$OUT/tmp/val100.$SRC"
fi

# ---------------------------------------------------------------------------------------------
# 10. BLEU (sacrebleu on the tokenised, escaped text as Moses writes it) and baseline.md
# ---------------------------------------------------------------------------------------------
STEP=$((STEP + 1))
say "step $STEP/10 score"
bleu_line() {  # REFERENCE HYPOTHESIS
  "$SACREBLEU" "$1" -i "$2" --tokenize none -w 1 -f text
}
TEST_LINE=$(bleu_line "$DATA/test_2016_flickr.tok.$TGT" "$TEST_OUT")
VAL_LINE=$(bleu_line "$DATA/val.tok.$TGT" "$VAL_OUT")
TEST_BLEU=$(awk '{print $3}' <<<"$TEST_LINE")
VAL_BLEU=$(awk '{print $3}' <<<"$VAL_LINE")
SIGNATURE=$(awk '{sub(/^BLEU\|/, "", $1); print $1}' <<<"$TEST_LINE")
# mert-moses.pl's own BLEU and iteration, from the tuned config's header.
MERT_BLEU=$(awk '/^# BLEU / {printf "%.2f", 100 * $3; exit}' "$OUT/moses.tuned.ini")
MERT_ITERATION=$(awk '/^# We were before running iteration / {print $NF; exit}' "$OUT/moses.tuned.ini")
TARGET_NAME=French
if [[ $TGT == cs ]]; then
  TARGET_NAME=Czech
fi

cat >"$OUT/baseline.md.tmp" <<EOF
# Tuned baseline: Multi30k English→$TARGET_NAME, phrase-based Moses

| set | sentences | BLEU |
|---|---|---|
| val (MERT dev set) | $(lines "$DATA/val.tok.$SRC") | ${MERT_BLEU:-?} (mert-moses.pl's own BLEU${MERT_ITERATION:+, before iteration $MERT_ITERATION}); $VAL_BLEU decoded again with \`moses.tuned.ini\` |
| test 2016 flickr | $(lines "$DATA/test_2016_flickr.tok.$SRC") | $TEST_BLEU |

- Built by \`tools/build_multi30k_moses.sh --pair $PAIR\` on $(date -u '+%Y-%m-%d'): $(lines "$DATA/train.tok.$SRC") training
  sentence pairs, eflomal both directions, grow-diag-final-and ($SYMMETRISER), \`train-model.perl
  --first-step 4 --last-step 9 --alignment grow-diag-final-and --reordering msd-bidirectional-fe
  --lm 0:5:lm.bin:8\`, 5-gram KenLM (\`lmplz -o 5 --discount_fallback\`).
- Tuning: \`mert-moses.pl\` on val, MERT, 100-best, decoder flags \`$DECODER_FLAGS\`,
  at most $MAX_ITERATIONS iterations. One tuning run: MERT is noisy, so differences under about 0.5 BLEU
  between single runs mean little.
- Test decoding: \`moses -f moses.tuned.ini < test_2016_flickr.tok.en\` (run in this folder).
- Scoring: sacrebleu on the lowercased, tokenised, escaped text as Moses outputs it against
  \`test_2016_flickr.tok.$TGT\`, \`--tokenize none\` (signature \`$SIGNATURE\`;
  test 2016: ${TEST_LINE#*= }). Scores computed this way are comparable only with each other.
EOF
mv "$OUT/baseline.md.tmp" "$OUT/baseline.md"

say "val BLEU $VAL_BLEU (MERT's own: ${MERT_BLEU:-?}); written: $OUT/baseline.md"
echo "test 2016 BLEU ($PAIR, tuned): $TEST_BLEU"
