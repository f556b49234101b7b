#!/usr/bin/env python3
"""
hellaswag.py: writes a multiple-choice eval file in llm.c's format (FORMATS.md "Multiple-choice eval file"), which
`./train_kla --hellaswag FILE` scores (README "HellaSwag").

    python scripts/hellaswag.py             # HellaSwag val (10042 examples) -> data/hellaswag/hellaswag_val.bin
    python scripts/hellaswag.py --from-shards "data/demo/demo_val_*.bin" -n 100 -o data/demo/choice.bin

The first form needs internet access and `pip install tiktoken`: it downloads rowanz/hellaswag's
hellaswag_val.jsonl (the file llm.c's dev/data/hellaswag.py reads) and encodes each example as llm.c does: the
context `ctx`, and each of the 4 endings with a space in front (GPT-2's tokens carry their leading space), with
tiktoken's gpt2 encoding. Without network (or tiktoken) it stops with one `error:` line.

The second form needs neither: it cuts a small multiple-choice file out of llm.c-format uint16 token shards
(the tests use the demo corpus). An example is a span of one document: a context of --context tokens, then its
true continuation of --completion tokens; the 3 wrong completions are spans of --completion tokens from other
documents (--distractors spans), or --completion tokens drawn uniformly from the ids the shards hold (random); the
true one sits at a random place. A model of the text should pick the true continuation above chance (25%): against
random tokens a model that has learned only which tokens are common does, against spans of other documents it takes
a model that reads the context; --shuffle-labels draws each label at random instead (a file no model can beat
chance on).

Only the standard library is used besides tiktoken (no numpy needed).
"""
import argparse
import array
import glob
import json
import os
import random
import struct
import sys
import urllib.request

from fineweb import SHARD_MAGIC, SHARD_VERSION, HEADER_SLOTS, EOT, cannot_download

EVAL_MAGIC = 20240522
EVAL_VERSION = 1
START_EXAMPLE = 65535     # the delimiter word in front of each example
COMPLETIONS = 4
HELLASWAG_VAL_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"


def write_evalfile(path, examples):
    """examples: (label, context tokens, [completion tokens] * 4). One header of 256 int32 (magic, version,
    examples, the longest example record in bytes), then each example as uint16 words: START_EXAMPLE, the record's
    bytes, its index, the label, the number of completions, the context's length and tokens, each completion's
    length and tokens. Written under a temporary name and renamed when complete."""
    if not 0 < len(examples) < 2**16:
        sys.exit("error: %d examples; an eval file holds 1 to 65535" % len(examples))
    words = array.array("H")
    longest = 0
    for index, (label, context, completions) in enumerate(examples):
        assert 0 <= label < COMPLETIONS and len(completions) == COMPLETIONS
        record = [START_EXAMPLE, 0, index, label, COMPLETIONS, len(context)] + list(context)
        for c in completions:
            record += [len(c)] + list(c)
        if 2 * len(record) >= 2**16:
            sys.exit("error: example %d takes %d bytes; a record holds at most 65535" % (index, 2 * len(record)))
        record[1] = 2 * len(record)
        longest = max(longest, record[1])
        words.extend(record)
    header = [EVAL_MAGIC, EVAL_VERSION, len(examples), longest] + [0] * (HEADER_SLOTS - 4)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<%di" % HEADER_SLOTS, *header))
        if sys.byteorder != "little":
            words.byteswap()
        f.write(words.tobytes())
    os.replace(tmp, path)
    print("wrote %d examples to %s (%d bytes)" % (len(examples), path, 4 * HEADER_SLOTS + 2 * len(words)))


def hellaswag_examples():
    """HellaSwag val as llm.c's dev/data/hellaswag.py encodes it."""
    try:
        import tiktoken
    except ImportError as e:
        sys.exit("error: %s: this script needs `pip install tiktoken`" % e)
    try:
        enc = tiktoken.get_encoding("gpt2")
        with urllib.request.urlopen(HELLASWAG_VAL_URL, timeout=60) as r:
            lines = r.read().decode("utf-8").splitlines()
    except Exception as e:
        sys.exit(cannot_download("HellaSwag val (%s) or tiktoken's gpt2 encoding" % HELLASWAG_VAL_URL, e))
    examples = []
    for line in lines:
        ex = json.loads(line)
        examples.append((ex["label"], enc.encode(ex["ctx"]), [enc.encode(" " + e) for e in ex["endings"]]))
    return examples


def read_documents(pattern):
    """The documents of the uint16 shards matching pattern: the token runs between EOTs."""
    paths = sorted(glob.glob(pattern))
    if not paths:
        sys.exit("error: --from-shards %s: no file matches" % pattern)
    docs = []
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        header = struct.unpack("<3i", data[:12]) if len(data) >= 4 * HEADER_SLOTS else None
        if header is None or header[:2] != (SHARD_MAGIC, SHARD_VERSION) or len(data) != 4 * HEADER_SLOTS + 2 * header[2]:
            sys.exit("error: %s: not a uint16 token shard (FORMATS.md \"Token shards\")" % path)
        tokens = array.array("H", data[4 * HEADER_SLOTS:])
        if sys.byteorder != "little":
            tokens.byteswap()
        doc = []
        for t in tokens:
            if t == EOT:
                docs.append(doc)
                doc = []
            else:
                doc.append(t)
        docs.append(doc)
    return docs


def shard_examples(args):
    """args.num examples cut out of the shards (module docstring), from args.seed."""
    docs = read_documents(args.from_shards)
    need = args.context + args.completion
    long_docs = [i for i, d in enumerate(docs) if len(d) >= need]
    ids = sorted(set(t for d in docs for t in d))
    if len(long_docs) < 2:
        sys.exit("error: --from-shards %s: fewer than 2 documents of %d tokens or more" % (args.from_shards, need))
    rng = random.Random(args.seed)

    def span(d, n):
        start = rng.randrange(len(docs[d]) - n + 1)
        return docs[d][start:start + n]

    examples = []
    for _ in range(args.num):
        d = rng.choice(long_docs)
        passage = span(d, need)
        truth = passage[args.context:]
        wrong = []
        while len(wrong) < COMPLETIONS - 1:
            if args.distractors == "random":
                wrong.append([rng.choice(ids) for _ in range(args.completion)])
                continue
            o = rng.choice(long_docs)
            if o != d:
                wrong.append(span(o, args.completion))
        label = rng.randrange(COMPLETIONS)
        completions = wrong[:label] + [truth] + wrong[label:]
        if args.shuffle_labels:
            label = rng.randrange(COMPLETIONS)
        examples.append((label, passage[:args.context], completions))
    return examples


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--output", help="the eval file (default data/hellaswag/hellaswag_val.bin)")
    p.add_argument("--from-shards", help="glob of uint16 token shards to cut a small file from (no network)")
    shard_flags = {"num": 100, "context": 24, "completion": 8, "seed": 1337, "distractors": "spans", "shuffle_labels": False}
    p.add_argument("-n", "--num", type=int, help="--from-shards: examples (default 100)")
    p.add_argument("--context", type=int, help="--from-shards: context tokens (default 24)")
    p.add_argument("--completion", type=int, help="--from-shards: tokens per completion (default 8)")
    p.add_argument("--seed", type=int, help="--from-shards: seed of the choices (default 1337)")
    p.add_argument("--distractors", choices=["spans", "random"], help="--from-shards: the wrong completions: spans of other documents (default) or random tokens")
    p.add_argument("--shuffle-labels", action="store_true", default=None, help="--from-shards: random labels (a negative control)")
    args = p.parse_args(argv)
    for name, default in shard_flags.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
        elif not args.from_shards:
            p.error("--%s: only --from-shards uses it" % name.replace("_", "-"))
    if args.num < 1 or args.context < 1 or args.completion < 1:
        p.error("-n, --context and --completion must be >= 1")
    if args.from_shards:
        examples = shard_examples(args)
        output = args.output or "data/demo/choice.bin"
    else:
        examples = hellaswag_examples()
        output = args.output or os.path.join("data", "hellaswag", "hellaswag_val.bin")
    if os.path.dirname(output):
        os.makedirs(os.path.dirname(output), exist_ok=True)
    write_evalfile(output, examples)


if __name__ == "__main__":
    main()
