#!/usr/bin/env bash
# The main job on the bundled example: train a small model on a real phrase table, annotate the
# table with the model's two columns, score a few pairs and propose target phrases.
#
# The table is every 40th line of the phrase table of a real Moses system (Multi30k
# English-French, 30,460 pairs). Outputs go to runs/example/. Takes about five minutes on a
# 2-core CPU; MINUTES=10 bash examples/run.sh trains longer.
set -euo pipefail
cd "$(dirname "$0")/.."

TABLE=examples/phrase-table.sample.gz
OUT=runs/example
MINUTES=${MINUTES:-3}
mkdir -p "$OUT"

echo "== 1. train the 'small' network for ${MINUTES} minutes =="
phrase-scorer train "$TABLE" -o "$OUT/model" --preset small --max-time "${MINUTES}m" \
    --valid-pairs 1000 --valid-every 500 --overwrite

echo
echo "== 2. annotate: append p(y|x) and e^(unknown words) to every line =="
phrase-scorer annotate "$TABLE" -m "$OUT/model" -o "$OUT/phrase-table.rnn.gz"
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
