#!/usr/bin/env bash
# The back-translation loop on Multi30k, end to end, as measured in docs/results.md:
#   1. split the 29k training pairs: the first 14,500 are the parallel data, the English side
#      of the other 14,500 plays monolingual English;
#   2. train en->de on the parallel half;
#   3. sample-translate the monolingual English into synthetic German (--sample --top-p 0.9);
#   4. train de->en on the parallel half alone, and on it plus the tagged synthetic pairs;
#   5. score both de->en models on test_2016_flickr with beam 5.
# Every run stops at the same number of updates (STEPS), so the comparison does not depend on
# the machine's speed. Usage, from the repository root:
#   ATTN_MT_DATA=../shared/data bash scripts/backtranslation.sh [WORK_DIR] [STEPS]
set -euo pipefail
WORK=${1:-runs/backtranslation}
STEPS=${2:-1000}
DATA=${ATTN_MT_DATA:?set ATTN_MT_DATA to the folder that holds multi30k/}/multi30k
ATTN_MT=${ATTN_MT:-attn-mt}
mkdir -p "$WORK/data"
cd "$WORK"

half=14500
# sed, not head: head stops reading early, zcat dies of SIGPIPE, and pipefail ends the script
zcat "$DATA/train.de.gz" | sed -n "1,${half}p" > data/real.de
zcat "$DATA/train.en.gz" | sed -n "1,${half}p" > data/real.en
zcat "$DATA/train.en.gz" | tail -n +$((half + 1)) > data/mono.en
for split in val test_2016_flickr; do
  for lang in de en; do zcat "$DATA/$split.$lang.gz" > "data/$split.$lang"; done
done

# config NAME SRC TGT TRAIN_ENTRIES...: the default recipe, a shorter warm-up for STEPS updates
config() {
  local name=$1 src=$2 tgt=$3
  shift 3
  {
    echo "data:"
    echo "  src_lang: $src"
    echo "  tgt_lang: $tgt"
    echo "  train:"
    for entry in "$@"; do echo "    - $entry"; done
    cat <<EOF
  valid: {src: data/val.$src, tgt: data/val.$tgt}
  test: {src: data/test_2016_flickr.$src, tgt: data/test_2016_flickr.$tgt}
  max_len: 100
tokenizer: {vocab_size: 8000, model_type: unigram, joint: true}
model: {d_model: 256, heads: 4, encoder_layers: 3, decoder_layers: 3, d_ff: 1024, dropout: 0.3, norm: pre}
train: {out_dir: $name, max_steps: $STEPS, seed: 1, lr: 0.001, warmup: $((STEPS / 2)), batch_tokens: 4096, eval_every: $((STEPS / 4)), patience: 0, precision: auto}
decode: {beam: 5, length_penalty: 1.0}
EOF
  } > "$name.yaml"
}

config en_de en de "{src: data/real.en, tgt: data/real.de}"
config de_en de en "{src: data/real.de, tgt: data/real.en}"
config de_en_bt de en "{src: data/real.de, tgt: data/real.en}" \
  "{src: data/bt.de, tgt: data/mono.en, tag: <bt>}"

"$ATTN_MT" train --config en_de.yaml
"$ATTN_MT" translate --model en_de --sample --top-p 0.9 --seed 1 < data/mono.en > data/bt.de
"$ATTN_MT" train --config de_en.yaml
"$ATTN_MT" train --config de_en_bt.yaml
for run in de_en de_en_bt; do
  echo "$run: $("$ATTN_MT" evaluate --model $run --split test --beam 5)"
done
