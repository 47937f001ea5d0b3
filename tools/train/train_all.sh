#!/bin/bash
# The whole training of the shipped default model (models/mini-v41), one command, deterministic given
# the seed: corpus -> tokenizer -> backbone -> DSpark draft -> assembled checkpoint directory.
#
#   bash tools/train/train_all.sh [OUT_MODEL_DIR]      # default: build/train/mini-v41
#
# Needs a CUDA GPU for the two training stages (an H200 takes ~7.5 min for the backbone and ~2 min for
# the draft; tools/train/RESULTS.md). Stages can be run one at a time with STAGES="corpus tokenizer" etc.
# (the recorded run did corpus + tokenizer on the dev machine and each training stage in its own GPU
# call, since one call there may last at most 10 minutes).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT_MODEL=${1:-build/train/mini-v41}
SEED=${SEED:-0}
STAGES=${STAGES:-"corpus tokenizer backbone dspark assemble"}
W=build/train
has() { [[ " $STAGES " == *" $1 "* ]]; }

if has corpus; then
  bash tools/train/install_corpus_deps.sh
  python3 tools/train/corpus.py --out $W/corpus
fi
if has tokenizer; then
  python3 tools/train/tokenizer.py --corpus $W/corpus/train.txt --out $W/tokenizer
fi
if has backbone; then
  python3 tools/train/train.py --preset h200 --device cuda --seed "$SEED" --steps 540 --ctx 256 --batch 64 \
    --lr 3e-3 --warmup 100 --corpus $W/corpus --tokenizer $W/tokenizer --out $W/v41-h200
fi
if has dspark; then
  python3 tools/train/train_dspark.py --backbone $W/v41-h200/model --corpus $W/corpus --out $W/dspark \
    --device cuda --steps 280 --seed "$SEED" --export --eval-init
fi
if has assemble; then
  # The DSpark export is a copy of the backbone directory plus model-dspark.safetensors, the index and
  # the dspark_* config keys: exactly the shipped layout.
  rm -rf "$OUT_MODEL" && mkdir -p "$(dirname "$OUT_MODEL")" && cp -r $W/dspark/ckpt "$OUT_MODEL"
  echo "model: $OUT_MODEL"
fi
