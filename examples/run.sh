#!/usr/bin/env bash
# The main job on the bundled example: train a small model on a real phrase table, annotate the
# table with the model's two columns, score a few pairs and propose target phrases.
#
# The table is every 40th line of the phrase table of a real Moses system (Multi30k
# English-French, 30,460 pairs). Outputs go to runs/example/. Takes about five minutes on an idle
# 2-core CPU; STEPS=20000 bash examples/run.sh trains longer.
#
# Training is bounded by steps, not by time: a model trained for a fixed time on a busy or slow
# machine may have learned nothing, and the samples below would be noise. 5,000 steps of 64 pairs
# take about four minutes on an idle 2-core CPU; with the default recipe they reach a
# true-vs-shuffled margin of about 28 nats on this table (11 after 1,000 steps; examples/README.md).
# The margin reached is printed after training, with a warning below 5 nats.
set -euo pipefail
cd "$(dirname "$0")/.."

TABLE=examples/phrase-table.sample.gz
OUT=runs/example
STEPS=${STEPS:-5000}
MIN_MARGIN=5
mkdir -p "$OUT"

echo "== 1. train the 'small' network for ${STEPS} steps =="
phrase-scorer train "$TABLE" -o "$OUT/model" --preset small --max-steps "$STEPS" \
    --valid-pairs 1000 --valid-every 500 --overwrite
# the last validation: mean log p(true target) - log p(another pair's target), nats per pair
margin=$(tail -n 1 "$OUT/model/train.log.jsonl" | sed -n 's/.*"valid_margin_pair": \([-0-9.eE+]*\).*/\1/p')
echo "validation margin after ${STEPS} steps: ${margin} nats per pair (true targets against shuffled ones)"
if awk -v m="$margin" -v min="$MIN_MARGIN" 'BEGIN { exit !(m == "" || m < min) }'; then
    echo "WARNING: a margin under ${MIN_MARGIN} nats means the model has barely learned; what follows will be" \
         "close to noise. Train longer: STEPS=20000 bash examples/run.sh" >&2
fi

echo
echo "== 2. annotate: append p(y|x) and e^(unknown words) to every line =="
phrase-scorer annotate "$TABLE" -m "$OUT/model" -o "$OUT/phrase-table.rnn.gz" --overwrite
echo "first lines:"
gzip -dc "$OUT/phrase-table.rnn.gz" | sed -n 1,3p  # sed reads to the end: no SIGPIPE under pipefail

echo
echo "== 3. score a few pairs (natural-log log p(target | source)) =="
printf '%s\n' "a man ||| un homme" "a man ||| une femme" "a dog ||| un chien" "a dog ||| un homme" > "$OUT/pairs.txt"
paste -d '\t' <(phrase-scorer score -m "$OUT/model" "$OUT/pairs.txt") "$OUT/pairs.txt"

echo
echo "== 4. propose target phrases (ancestral sampling, then beam search) =="
phrase-scorer sample -m "$OUT/model" "a man in a blue shirt" "two dogs are playing" --top 5
phrase-scorer sample -m "$OUT/model" "a man in a blue shirt" --beam 5

echo
echo "Done. The model is in $OUT/model, the annotated table in $OUT/phrase-table.rnn.gz"
echo "(its signature in $OUT/phrase-table.rnn.gz.json)."
