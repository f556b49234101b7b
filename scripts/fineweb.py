#!/usr/bin/env python3
"""
fineweb.py: download FineWeb-Edu (or plain FineWeb) from HuggingFace, tokenize it with the GPT-2 tokenizer
and write llm.c-format token shards that train_kla reads (see FORMATS.md, "Token shards").

Needs internet access and:  pip install datasets tiktoken

    python scripts/fineweb.py                 # FineWeb-Edu sample-10BT  -> data/edu_fineweb10B/
    python scripts/fineweb.py -v 100B         # FineWeb-Edu sample-100BT -> data/edu_fineweb100B/
    python scripts/fineweb.py -t classic      # FineWeb sample-10BT      -> data/fineweb10B/

Output: <prefix>_val_000000.bin, then <prefix>_train_000001.bin, <prefix>_train_000002.bin, ... with
<prefix> = edu_fineweb or fineweb. Shard 0 is the validation split, every later shard is training data.
Each shard holds --shard_size tokens (10^8 by default, 200 MB), except the last one, which holds the rest.

Tokenization: tiktoken "gpt2", encode_ordinary (special-token text in the documents is encoded as plain
text), with the end-of-text token 50256 put in front of every document, so documents are delimited by EOT.
The token stream is cut into shards without regard for document boundaries: a document that does not fit
in the current shard is split and continues at the start of the next one.

Shard format (uint16 variant): a 1024-byte header of 256 little-endian int32 slots, slot 0 = 20240520
(magic), slot 1 = 1 (version), slot 2 = number of tokens, the rest zero; then the tokens as little-endian
uint16. Files are written under a temporary name and renamed when complete, so an interrupted run never
leaves a truncated shard behind under a shard name.

Only the standard library is used besides datasets and tiktoken (no numpy needed).
"""
import argparse
import array
import multiprocessing as mp
import os
import struct
import sys
import time

SHARD_MAGIC = 20240520    # uint16 token shard
SHARD_VERSION = 1
HEADER_SLOTS = 256        # int32 slots = 1024 bytes
EOT = 50256               # GPT-2 <|endoftext|>
MAX_SHARD_TOKENS = 2**31 - 1  # the token count lives in an int32 header slot

DATASETS = {
    # --type: (HuggingFace repository, file prefix)
    "edu": ("HuggingFaceFW/fineweb-edu", "edu_fineweb"),
    "classic": ("HuggingFaceFW/fineweb", "fineweb"),
}
SAMPLES = {"10B": "sample-10BT", "100B": "sample-100BT"}  # --version: HuggingFace config name

# ----------------------------------------------------------------------------------------------------------
# tokenization, in worker processes

_encoder = None  # one tiktoken encoder per worker process, made by _init_worker


def _init_worker():
    global _encoder
    import tiktoken
    _encoder = tiktoken.get_encoding("gpt2")


def tokenize(text):
    """One document -> array of uint16 token ids, EOT first."""
    ids = _encoder.encode_ordinary(text)
    tokens = array.array("H", [EOT])
    # array("H") raises OverflowError for an id >= 2^16; GPT-2 ids are < 50257, so that can only be a bug
    tokens.extend(ids)
    return tokens


# ----------------------------------------------------------------------------------------------------------
# writing shards


def write_shard(path, parts, ntok):
    """Write one shard: the header, then the uint16 arrays in `parts` (ntok tokens in all)."""
    assert 0 < ntok <= MAX_SHARD_TOKENS
    assert sum(len(p) for p in parts) == ntok
    header = [0] * HEADER_SLOTS
    header[0] = SHARD_MAGIC
    header[1] = SHARD_VERSION
    header[2] = ntok
    tmp_path = path + ".tmp"
    with open(tmp_path, "wb") as f:
        f.write(struct.pack("<%di" % HEADER_SLOTS, *header))
        for part in parts:
            if sys.byteorder == "big":  # the format is little-endian; array writes native order
                part = array.array("H", part)
                part.byteswap()
            part.tofile(f)
    expected = 4 * HEADER_SLOTS + 2 * ntok
    actual = os.path.getsize(tmp_path)
    if actual != expected:
        raise RuntimeError(f"{tmp_path}: wrote {actual} bytes, expected {expected}")
    os.replace(tmp_path, path)  # only complete shards ever carry a shard name


class ShardWriter:
    """Collects the token stream and writes it out in shards of exactly shard_size tokens.

    Shard 0 is the validation shard, later ones are training shards; the shard index keeps counting across
    the split, so the files are <prefix>_val_000000.bin, <prefix>_train_000001.bin, ...
    """

    def __init__(self, out_dir, prefix, shard_size, max_shards=None):
        self.out_dir = out_dir
        self.prefix = prefix
        self.shard_size = shard_size
        self.max_shards = max_shards
        self.parts = []  # pieces of the shard being filled
        self.fill = 0    # tokens in self.parts
        self.index = 0   # index of the shard being filled
        self.paths = []  # shards written so far
        self.total_tokens = 0
        self.last_fill = 0  # tokens in the last shard written

    def done(self):
        return self.max_shards is not None and self.index >= self.max_shards

    def add(self, tokens):
        """Append one document's tokens; a document that overflows the shard continues in the next one."""
        pos = 0
        while pos < len(tokens) and not self.done():
            take = min(self.shard_size - self.fill, len(tokens) - pos)
            # whole documents are kept as they are; only the split one is copied in two pieces
            self.parts.append(tokens if (pos == 0 and take == len(tokens)) else tokens[pos:pos + take])
            self.fill += take
            pos += take
            if self.fill == self.shard_size:
                self.flush()

    def flush(self):
        """Write the shard being filled (a partial one at the end of the data); nothing if it is empty."""
        if self.fill == 0:
            return
        split = "val" if self.index == 0 else "train"
        path = os.path.join(self.out_dir, "%s_%s_%06d.bin" % (self.prefix, split, self.index))
        write_shard(path, self.parts, self.fill)
        self.paths.append(path)
        self.total_tokens += self.fill
        self.last_fill = self.fill
        print("wrote %s (%d tokens)" % (path, self.fill), flush=True)
        self.parts = []
        self.fill = 0
        self.index += 1


# ----------------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Download FineWeb-Edu or FineWeb, tokenize it with GPT-2 (tiktoken) and write llm.c-format "
                    "uint16 token shards: shard 0 = val, the rest = train. Needs internet, datasets and tiktoken.",
    )
    parser.add_argument("-t", "--type", choices=["edu", "classic"], default="edu",
                        help="edu = HuggingFaceFW/fineweb-edu, classic = HuggingFaceFW/fineweb (default: %(default)s)")
    parser.add_argument("-v", "--version", choices=["10B", "100B"], default="10B",
                        help="which sample: 10B = sample-10BT, 100B = sample-100BT (default: %(default)s)")
    parser.add_argument("-s", "--shard_size", type=int, default=10**8, help="tokens per shard (default: %(default)s)")
    parser.add_argument("-o", "--output_dir", default=None,
                        help="output directory (default: data/edu_fineweb<version> or data/fineweb<version>)")
    parser.add_argument("-w", "--workers", type=int, default=max(1, (os.cpu_count() or 1) - 2),
                        help="tokenizer processes (default: CPU cores - 2, at least 1; here %(default)s)")
    parser.add_argument("--chunksize", type=int, default=16, help="documents handed to a worker at a time (default: %(default)s)")
    parser.add_argument("--max_shards", type=int, default=None,
                        help="stop after writing this many shards (for a quick try; default: all the data)")
    parser.add_argument("--streaming", action="store_true",
                        help="stream the dataset instead of downloading it to the HuggingFace cache first")
    args = parser.parse_args(argv)
    if not 1 <= args.shard_size <= MAX_SHARD_TOKENS:
        parser.error("--shard_size must be between 1 and %d (the header stores it in an int32)" % MAX_SHARD_TOKENS)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.chunksize < 1:
        parser.error("--chunksize must be at least 1")
    if args.max_shards is not None and args.max_shards < 1:
        parser.error("--max_shards must be at least 1")
    return args


def cannot_download(what, e):
    """The one-line error of a failed download (no network, HuggingFace unreachable, ...): the exception's first
    line only, never a traceback."""
    first = (str(e).strip().splitlines() or [""])[0]
    return "error: cannot download %s (%s: %s); this script needs internet access" % (what, type(e).__name__, first)


def main(argv=None):
    args = parse_args(argv)
    repo, prefix = DATASETS[args.type]
    sample = SAMPLES[args.version]
    out_dir = args.output_dir or os.path.join("data", prefix + args.version)

    # imported here so that --help works without them
    try:
        from datasets import load_dataset
        import tiktoken
    except ImportError as e:
        sys.exit("error: %s: this script needs `pip install datasets tiktoken`" % e)
    # tiktoken downloads the GPT-2 BPE files on first use; any failure of a download ends with one line
    try:
        encoder = tiktoken.get_encoding("gpt2")
    except Exception as e:
        sys.exit(cannot_download("tiktoken's gpt2 encoding", e))
    if encoder.eot_token != EOT:
        sys.exit("error: tiktoken gpt2 has EOT %d, expected %d" % (encoder.eot_token, EOT))

    os.makedirs(out_dir, exist_ok=True)
    print("dataset %s (%s) -> %s, %d tokens per shard, %d workers" % (repo, sample, out_dir, args.shard_size, args.workers),
          flush=True)
    try:
        dataset = load_dataset(repo, name=sample, split="train", streaming=args.streaming)
    except Exception as e:
        sys.exit(cannot_download("%s (%s)" % (repo, sample), e))
    texts = (doc["text"] for doc in dataset)  # only the text travels to the workers

    writer = ShardWriter(out_dir, prefix, args.shard_size, args.max_shards)
    t0 = time.time()
    ndocs = 0
    # imap keeps the documents in dataset order, so the shards are the same on every run
    try:
        with mp.Pool(args.workers, initializer=_init_worker) as pool:
            for tokens in pool.imap(tokenize, texts, chunksize=args.chunksize):
                writer.add(tokens)
                ndocs += 1
                if writer.done():
                    break  # leaving the with-block terminates the workers
    except OSError as e:  # a streamed download that breaks off (network errors are OSErrors)
        sys.exit(cannot_download("%s (%s), after %d documents" % (repo, sample, ndocs), e))
    writer.flush()  # the last, partial shard

    dt = time.time() - t0
    print("done: %d documents, %d tokens in %d shards under %s (%.0f s, %.0f tokens/s)"
          % (ndocs, writer.total_tokens, len(writer.paths), out_dir, dt, writer.total_tokens / max(dt, 1e-9)), flush=True)
    if writer.paths and writer.last_fill < args.shard_size:
        print("note: the last shard %s holds only %d tokens; the trainer refuses a shard with fewer than "
              "B*T*processes + 1 tokens (delete it if that happens)" % (writer.paths[-1], writer.last_fill), flush=True)


if __name__ == "__main__":
    main()
