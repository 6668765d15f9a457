#!/usr/bin/env bash
# Both uses of the package on bundled Multi30k English→French data (examples/README.md):
#
#   A. rescoring: train a small sentence model, append its log p(hypothesis | source) to real Moses
#      100-best lists of 20 dev and 20 test sentences (`rescore`); with a Moses build in MOSES_HOME,
#      also tune a reranker on the dev list and rerank the test list (`rerank`);
#   B. phrase-table columns: train a small model on a slice of a real phrase table, annotate the
#      table with the model's two columns, score a few pairs and propose target phrases.
#
# Outputs go to runs/example/ (EXAMPLE_OUT=DIR elsewhere); a re-run replaces them. Training is
# bounded by steps, not by time, so a busy machine takes longer but trains the same models:
# SENTENCE_STEPS=200 updates of 32 sentence pairs, STEPS=1000 updates of 64 phrase pairs (the
# whole run: about two minutes on an idle 2-core CPU, docs/examples.md). Both models are far from
# trained: the example shows the commands and their outputs, not what trained models buy
# (docs/results.md has that). STEPS=5000 gives the phrase model a validation margin (true against
# shuffled targets) of about 28 nats on this table, against about 11 after 1,000 steps; the margin
# reached is printed, with a warning under 5 nats.
set -euo pipefail
cd "$(dirname "$0")/.."

E=examples
OUT=${EXAMPLE_OUT:-runs/example}
SENTENCE_STEPS=${SENTENCE_STEPS:-200}
STEPS=${STEPS:-1000}
MIN_MARGIN=5
mkdir -p "$OUT"

echo "== A1. train a sentence model (RNNsearch 'small', ${SENTENCE_STEPS} updates of 32 pairs) on 2,000 sentence pairs =="
phrase-scorer train --corpus "$E/multi30k.train2000.en.gz" "$E/multi30k.train2000.fr.gz" -o "$OUT/sentence-model" \
    --arch rnnsearch --preset small --batch-size 32 --max-steps "$SENTENCE_STEPS" \
    --valid-pairs 100 --valid-every "$SENTENCE_STEPS" --valid-metric nll --overwrite

echo
echo "== A2. rescore: append the model's log p(hypothesis | source) to Moses' n-best lists as RNN0 =="
for set in dev test; do
    phrase-scorer rescore "$E/$set.nbest.gz" --source "$E/$set.en" -m "$OUT/sentence-model" \
        -o "$OUT/$set.rescored.gz" --overwrite
done
echo "first hypotheses of the first test sentence (RNN0, then the hypothesis):"
gzip -dc "$OUT/test.rescored.gz" | sed -n 1,3p \
    | awk -F' [|][|][|] ' '{ match($3, /RNN0= [^ ]*/); print substr($3, RSTART + 6, RLENGTH - 6) "\t" $2 }'

echo
if [[ -n "${MOSES_HOME:-}" ]]; then
    echo "== A3. rerank: tune every feature's weight on the dev list (Moses' extractor and mert), rerank the test list =="
    phrase-scorer rerank --dev "$OUT/dev.rescored.gz" "$E/dev.fr" --test "$OUT/test.rescored.gz" \
        --ini "$E/moses.tuned.ini" --decoder-flags "-print-alignment-info-in-n-best" \
        -o "$OUT/test.reranked.txt" --overwrite
    gzip -dc "$E/test.nbest.gz" \
        | awk -F' [|][|][|] ' '!seen[$1]++ { sub(/^ +/, "", $2); sub(/ +$/, "", $2); print $2 }' > "$OUT/test.moses.txt"
    changed=$(paste -d '\t' "$OUT/test.moses.txt" "$OUT/test.reranked.txt" | awk -F'\t' '$1 != $2' | wc -l)
    echo "the reranker chose another hypothesis than Moses' 1-best for ${changed} of the 20 test sentences"
    echo "With a whole Moses system (tables, language model; tools/build_multi30k_moses.sh builds the Multi30k one)," \
         "one command trains the models and tunes the reranker: phrase-scorer build-reranker SYSTEM/moses.tuned.ini" \
         "--corpus train.en train.fr --tuning-set dev.en dev.fr -o WORK; then new text takes the same steps:" \
         "phrase-scorer translate-system --moses SYSTEM/moses.tuned.ini --reranker WORK/reranker.json new.en -o new.fr"
else
    echo "== A3. rerank: needs Moses' extractor and mert =="
    echo "MOSES_HOME is not set: with a Moses build there, this step tunes a reranker on the rescored dev list" \
         "(phrase-scorer rerank --dev ... --test ...) and writes the test list's reranked 1-best; docs/moses.md."
fi

echo
echo "== B1. train the phrase model ('small' network, ${STEPS} updates of 64 pairs) on a phrase-table slice =="
TABLE=$E/phrase-table.sample.gz
phrase-scorer train "$TABLE" -o "$OUT/model" --preset small --max-steps "$STEPS" \
    --valid-pairs 1000 --valid-every 500 --overwrite
# the last validation: mean log p(true target) - log p(another pair's target), nats per pair
margin=$(tail -n 1 "$OUT/model/train.log.jsonl" | sed -n 's/.*"valid_margin_pair": \([-0-9.eE+]*\).*/\1/p')
echo "validation margin after ${STEPS} steps: ${margin} nats per pair (true targets against shuffled ones)"
if awk -v m="$margin" -v min="$MIN_MARGIN" 'BEGIN { exit !(m == "" || m < min) }'; then
    echo "WARNING: a margin under ${MIN_MARGIN} nats means the model has barely learned; what follows will be" \
         "close to noise. Train longer: STEPS=5000 bash examples/run.sh" >&2
fi

echo
echo "== B2. annotate: append p(y|x) and e^(unknown words) to every line of the table =="
phrase-scorer annotate "$TABLE" -m "$OUT/model" -o "$OUT/phrase-table.rnn.gz" --overwrite
echo "first lines:"
gzip -dc "$OUT/phrase-table.rnn.gz" | sed -n 1,3p  # sed reads to the end: no SIGPIPE under pipefail

echo
echo "== B3. score a few pairs (natural-log log p(target | source)) =="
printf '%s\n' "a man ||| un homme" "a man ||| une femme" "a dog ||| un chien" "a dog ||| un homme" > "$OUT/pairs.txt"
paste -d '\t' <(phrase-scorer score -m "$OUT/model" "$OUT/pairs.txt") "$OUT/pairs.txt"

echo
echo "== B4. propose target phrases (ancestral sampling, then beam search) =="
phrase-scorer sample -m "$OUT/model" "a man in a blue shirt" "two dogs are playing" --top 5
phrase-scorer sample -m "$OUT/model" "a man in a blue shirt" --beam 5

echo
echo "Done. In $OUT: the sentence model (sentence-model/) and the rescored n-best lists (dev.rescored.gz,"
echo "test.rescored.gz; with MOSES_HOME, the reranked test 1-best test.reranked.txt and its reranker"
echo "test.reranked.txt.json); the phrase model (model/) and the annotated table (phrase-table.rnn.gz,"
echo "its signature phrase-table.rnn.gz.json)."
