#!/usr/bin/env node
// Makes the TikTokenizer test fixture from the npm package `tiktoken` (the tiktoken library's
// own core compiled to WASM, with OpenAI's cl100k_base ranks):
//   vocab.json      a vocabulary in Megatron's TikTokenizer format (a JSON list of
//                   {rank, token_bytes (base64), token_str}), cut to its first VOCAB entries, as
//                   Megatron cuts a file to --vocab-size minus the special tokens
//   reference.json  texts and the ids tiktoken gives them with that vocabulary, Megatron's
//                   v1/v2 patterns and its special tokens, built the way Megatron's
//                   TikTokenTokenizer builds its tiktoken.Encoding (ranks offset by the number of
//                   special tokens; encode(text, allowed_special="all"))
// Megatron's format wants the 256 single bytes first, in byte order (its loader asserts
// token_bytes == bytes([rank]) below 256); cl100k_base orders them otherwise, so the single bytes
// are moved first and the other tokens keep their relative order: BPE compares only merged
// tokens' ranks, so every text splits into the same token strings as under cl100k_base itself.
//
// usage (from the repository root; scripts/install_deps.sh installs tiktoken from package.json):
//   node tests/data/tiktoken/make_fixture.js [NODE_MODULES_DIR]
'use strict';
const fs = require('fs');
const path = require('path');

const modules = process.argv[2] || 'node_modules';
const { Tiktoken } = require(path.resolve(modules, 'tiktoken'));
const cl100k = require(path.resolve(modules, 'tiktoken/encoders/cl100k_base.json'));

const VOCAB = 1900;        // entries kept (Megatron: --vocab-size 2000 minus 100 special tokens)
const NUM_SPECIAL = 100;   // --tiktoken-num-special-tokens 100
const SPECIAL = ['<unk>', '<s>', '</s>', '<mask>', '<pad>', '<cls>', '<sep>'];
// Megatron's patterns (megatron/core/tokenizers/text/libraries/tiktoken_tokenizer.py).
const PATTERNS = {
  v1: String.raw`[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+`,
  v2: String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
};

// cl100k_base's tokens (base64) in rank order: lines of "<x> <first rank> <token> <token> ...".
const ranked = [];
for (const line of cl100k.bpe_ranks.split('\n').filter(Boolean)) {
  const [, first, ...tokens] = line.split(' ');
  tokens.forEach((t, i) => { ranked[Number(first) + i] = t; });
}
const bytesOf = (b64) => Buffer.from(b64, 'base64');
const singles = Array.from({ length: 256 }, (_, i) => Buffer.from([i]).toString('base64'));
const merged = ranked.filter((t) => t !== undefined && bytesOf(t).length > 1);
const tokens = singles.concat(merged).slice(0, VOCAB);

const vocab = tokens.map((t, rank) => ({ rank, token_bytes: t, token_str: bytesOf(t).toString('utf8') }));
fs.writeFileSync(path.join(__dirname, 'vocab.json'), JSON.stringify(vocab) + '\n');

const specials = SPECIAL.concat(Array.from({ length: NUM_SPECIAL - SPECIAL.length }, (_, i) => `<SPECIAL_${i + SPECIAL.length}>`));
const specialIds = Object.fromEntries(specials.map((s, i) => [s, i]));
const bfe = `! ${NUM_SPECIAL} ${tokens.join(' ')}`;

const TEXTS = [
  'Hello world',
  "The jury said it didn't find any evidence; they'll report on Tuesday.",
  'HelloWorld camelCaseIdentifiers and ALLCAPS words',
  'Numbers: 3.14159, 2026-11-25, 1000000 and x86_64',
  '  leading spaces\n\nnew paragraph\r\nwindows line\ttab    run   ',
  'Café naïve résumé — “quotes” … ünïcödé',
  '東京は日本の首都です。中文也可以。',
  'emoji 🙂👍🏽 and symbols ∑∫√ ≠ ≤',
  'specials <s> in text </s> and <SPECIAL_42> and <sep><pad>',
  'path/to/file.cpp: x += y; // comment\n    return a->b[i];',
  'a\n\n\n   \n b',
  '',
];
const cases = [];
for (const [name, pat] of Object.entries(PATTERNS)) {
  const enc = new Tiktoken(bfe, specialIds, pat);
  for (const text of TEXTS) cases.push({ pattern: name, text, ids: Array.from(enc.encode(text, 'all')) });
  enc.free();
}
const reference = {
  source: 'tiktoken (npm 1.0.22, WASM core) with cl100k_base ranks reordered and cut as described in make_fixture.js',
  vocab_size: NUM_SPECIAL + VOCAB,
  num_special_tokens: NUM_SPECIAL,
  cases,
};
fs.writeFileSync(path.join(__dirname, 'reference.json'), JSON.stringify(reference, null, 1) + '\n');
console.log(`wrote ${vocab.length} vocabulary entries and ${cases.length} reference cases`);
