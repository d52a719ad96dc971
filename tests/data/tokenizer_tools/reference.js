#!/usr/bin/env node
// Reference token ids for the C++ tokenizer tests, from the JavaScript implementations installed
// by npm: gpt-3-encoder (GPT-2) and @lenml/tokenizers (a transformers.js port) for tokenizer.json.
//
// usage: node reference.js gpt2|hf|text|norm MODEL_DIR OUT_PREFIX CORPUS...
// CORPUS: brown (one document per Brown file), brown-chunks (the same text cut into pieces of
// three paragraphs: for tokenizers without pre-tokenization, whose JavaScript BPE is slow on
// long documents) or unicode. Writes OUT_PREFIX.CORPUS.jsonl, one line per document:
// {"text": ..., "ids": [...], "decoded": ...}. Kind "text" writes the corpus itself instead, as
// OUT_PREFIX.CORPUS.txt with its documents one after another (for line-based CLI references);
// kind "norm" writes {"text", "nfc", "nfd", "nfkc", "nfkd"} per document.
'use strict';
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '../../..');
const [kind, modelDir, outPrefix, ...corpora] = process.argv.slice(2);
if (!corpora.length) {
  console.error('usage: node reference.js gpt2|hf MODEL_DIR OUT_PREFIX CORPUS...');
  process.exit(2);
}

function corpusDocuments(corpus) {
  const brown = () =>
    require(path.join(root, 'scripts/brown_to_jsonl.js')).brownDocuments().map((d) => d.text);
  if (corpus === 'brown') return brown();
  if (corpus === 'brown-chunks') {
    const out = [];
    for (const doc of brown()) {
      const paras = doc.split('\n\n');
      for (let i = 0; i < paras.length; i += 3) out.push(paras.slice(i, i + 3).join('\n\n'));
    }
    return out;
  }
  if (corpus === 'unicode') return require('./unicode_corpus.js').documents();
  throw new Error(`unknown corpus ${corpus}`);
}

function tokenizer() {
  if (kind === 'gpt2') {
    const enc = require(path.join(root, 'node_modules/gpt-3-encoder'));
    return { encode: (t) => enc.encode(t), decode: (ids) => enc.decode(ids) };
  }
  if (kind === 'hf') {
    const { TokenizerLoader } = require(path.join(root, 'node_modules/@lenml/tokenizers'));
    const read = (f) => JSON.parse(fs.readFileSync(path.join(modelDir, f), 'utf8'));
    const cfgPath = path.join(modelDir, 'tokenizer_config.json');
    const tok = TokenizerLoader.fromPreTrained({
      tokenizerJSON: read('tokenizer.json'),
      tokenizerConfig: fs.existsSync(cfgPath) ? read('tokenizer_config.json') : {},
    });
    return {
      encode: (t) => tok.encode(t),
      decode: (ids) => (ids.length ? tok.decode(ids) : ''),
    };
  }
  throw new Error(`unknown kind ${kind}`);
}

if (kind === 'norm') {  // Unicode normalization forms of each document, from Node's ICU
  for (const corpus of corpora) {
    const lines = corpusDocuments(corpus).map((text) => JSON.stringify({
      text, nfc: text.normalize('NFC'), nfd: text.normalize('NFD'),
      nfkc: text.normalize('NFKC'), nfkd: text.normalize('NFKD'),
    }));
    fs.writeFileSync(`${outPrefix}.${corpus}.jsonl`, lines.join('\n') + '\n');
  }
  process.exit(0);
}

if (kind === 'text') {
  for (const corpus of corpora) {
    fs.writeFileSync(`${outPrefix}.${corpus}.txt`, corpusDocuments(corpus).join('\n') + '\n');
  }
  process.exit(0);
}

const tok = tokenizer();
for (const corpus of corpora) {
  const fd = fs.openSync(`${outPrefix}.${corpus}.jsonl`, 'w');
  for (const text of corpusDocuments(corpus)) {
    const ids = tok.encode(text);
    fs.writeSync(fd, JSON.stringify({ text, ids, decoded: tok.decode(ids) }) + '\n');
  }
  fs.closeSync(fd);
}
