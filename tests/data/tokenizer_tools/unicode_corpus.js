// A Unicode-heavy test corpus: hand-written snippets in many scripts plus seeded random documents
// that mix them with whitespace runs, digits, punctuation, code and combining marks. Deterministic
// (fixed seed), so the C++ tests and the reference see the same text.
//
// Left out on purpose, because the JavaScript reference differs from the Rust/Python tokenizers
// Megatron uses (those cases have their own C++ tests): U+0085 and U+FEFF (JS disagrees on
// whether they are \s), U+017F and U+212A (case-insensitive contractions), and characters
// assigned after Unicode 14 (the PCRE2 and Node tables differ in age).
'use strict';

const SNIPPETS = [
  // Latin with accents, precomposed and decomposed (NFC must recompose the second form)
  'Café naïve résumé Ångström façade über Straße Ærøskøbing Dvořák Łódź Đặng Việt Nam',
  'Cafe\u0301 nai\u0308ve re\u0301sume\u0301 A\u030Angstro\u0308m e\u0301\u0301 o\u0323\u0302 a\u0328\u0301',
  'İstanbul ıspanak ŞEHİR çiğdem — Türkçe; Ελληνικά: Καλημέρα κόσμε, ἀρχὴ ῥυθμός.',
  'Русский текст: Съешь же ещё этих мягких французских булок, да выпей чаю. Українська ґанок їжак',
  // CJK, Japanese, Korean
  '中文测试：我们的世界是由原子构成的。繁體中文與簡體中文，漢字「龍」。',
  '日本語のテキスト：東京は日本の首都です。カタカナとひらがな、ｶﾀｶﾅ（半角）。',
  '한국어 텍스트: 안녕하세요, 세계! 대한민국의 수도는 서울입니다. 한글 자모 ㄱㄴㄷ 각',
  // RTL scripts with marks
  'العربية: مَرْحَبًا بِالْعَالَم، هذا نص تجريبي ١٢٣٤٥٦٧٨٩٠ والأرقام 2024.',
  'עברית: שָׁלוֹם עוֹלָם, זהו טקסט לבדיקה. מספרים 42 ו־7.',
  // Indic and Southeast Asian
  'हिन्दी: नमस्ते दुनिया, यह एक परीक्षण है। अंक ०१२३४५६७८९ क्षत्रिय ज्ञान',
  'বাংলা ভাষা, தமிழ் மொழி, తెలుగు, ไทย: สวัสดีชาวโลก ภาษาไทย',
  // Emoji: ZWJ families, skin tones, flags, keycaps, variation selectors
  'Emoji 👨‍👩‍👧‍👦 family, 👩🏽‍💻 coder, 🏳️‍🌈 flag, 🇺🇸🇯🇵🇩🇪 flags, 1️⃣ #️⃣ ❤️ ☺︎ 🤷‍♀️ 🧑🏿‍🦱',
  '😀😃😄😁😆😅🤣😂🙂🙃😉😊😇 🥰😍🤩😘 👍🏻👍🏼👍🏽👍🏾👍🏿',
  // Whitespace of many kinds
  'tabs\there\t\tand\t\t\tmore\n\nnew  lines   and    spaces     end',
  'crlf line\r\nnext line\r\n\r\nblank before\rcarriage only',
  'nbsp\u00A0here, ideographic\u3000space, em\u2003space, thin\u2009space, narrow\u202Fnbsp',
  'line\u2028separator and paragraph\u2029separator, vertical\u000Btab, form\u000Cfeed',
  '   leading spaces and trailing spaces   ',
  '\n\n\nleading newlines',
  // Digits and numbers
  '0 1 12 123 1234 12345 123456 3.14159 2,718,281 1e-9 0xFF 1_000_000 ٣٤٥ ۱۲۳ ０１２３ ½ ² Ⅻ',
  'Phone: +1 (555) 123-4567, date 2024-01-31T23:59:59Z, version v1.2.3-rc.4',
  // Contractions and casing
  "I'm sure you're right; they've said we'll go, he'd know, it's John's. DON'T SHOUT, I'LL GO, WE'VE",
  // Code
  'def f(x):\n    return {"a": [1, 2, 3], \'b\': x ** 2}  # comment\n\n\tif x != 0:\n\t\tprint(f"{x=}")',
  '#include <vector>\nint main() {\n  std::vector<int> v{1, 2, 3};\n  for (auto& e : v) e <<= 1;\n  return v.size() > 2 ? 0 : -1;\n}\n',
  '<html><body class="x">&amp; &lt;tag&gt; &#x1F600;</body></html> https://example.com/a?b=c&d=e#f',
  // Symbols
  '∀x ∈ ℝ: x² ≥ 0 ∑ ∫ √ ∞ ≠ ≈ → ⇒ ← € £ ¥ ₹ © ® ™ § ¶ † ‡ • … ‰ ′ ″ ‹ › « » „ “ ” ‘ ’',
  'Special-looking text: <|endoftext|> <s> </s> [CLS] <unk> <pad> <bos> <eos> <|im_start|>',
  // Normalization: compatibility forms, singletons, exclusions, mark reordering, Hangul jamo
  'ﬁ ﬂ ① ㍻ Ａｂｃ Å Ω ℌ ǅ ⅓ x² ख़ क़ ⫝̸ ḍ̇ ạ̈ ệ e\u0323\u0302 o\u031B\u0323 a\u0301\u0316 \u1100\u1161\u11A8 \uAC00\u11A8 \u1112\u1161\u11AB ﾊﾟ が か\u3099 ℡ ㈱ ¼',
  // Byte-fallback fodder for 32k vocabularies: rare CJK and symbols
  '龘 靐 齉 爩 𠀀 𠀁 𪚥 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕬𝖇𝖈 🀄 🂡 ꙮ ᚠᚢᚦᚨᚱᚲ',
];

// Code point ranges assigned long before Unicode 14.
const RANGES = [
  [0x21, 0x7e], [0xa1, 0xff], [0x100, 0x17e], [0x180, 0x24f], [0x300, 0x36f], [0x391, 0x3a9],
  [0x3b1, 0x3c9], [0x410, 0x44f], [0x5d0, 0x5ea], [0x5b0, 0x5c2], [0x621, 0x64a], [0x64b, 0x652],
  [0x660, 0x669], [0x905, 0x939], [0x93e, 0x94d], [0x966, 0x96f], [0xe01, 0xe2e], [0x1100, 0x1112],
  [0x1161, 0x1175], [0x2000, 0x200a], [0x2010, 0x2027], [0x2190, 0x21ff], [0x2200, 0x22ff],
  [0x3041, 0x3094], [0x30a1, 0x30fa], [0x4e00, 0x9fa5], [0xac00, 0xd7a3], [0xff01, 0xff5e],
  [0x1f300, 0x1f5ff], [0x1f600, 0x1f64f], [0x1f680, 0x1f6c5], [0x20000, 0x2a6d6],
];
const SPACES = [' ', ' ', ' ', '  ', '   ', '\t', '\n', '\n\n', '\r\n', ' \n', '\n ', '\u00a0',
                '\u3000', '    ', '\t\t', ' \t ', '\n\n\n'];
const PUNCT = ['.', ',', '!', '?', ';', ':', '...', '—', '-', '(', ')', '"', "'", '«', '»', '「',
               '」', '、', '。', '!?', '--', '/', '\\', '@', '#', '$', '%', '&', '*'];

function rng(seed) {  // mulberry32
  return () => {
    seed |= 0; seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function randomDocument(rand) {
  const pick = (a) => a[Math.floor(rand() * a.length)];
  const words = SNIPPETS.join(' ').split(/\s+/).filter((w) => w);
  const parts = [];
  const n = 50 + Math.floor(rand() * 400);
  for (let i = 0; i < n; ++i) {
    const r = rand();
    if (r < 0.45) {
      parts.push(pick(words));
    } else if (r < 0.65) {
      const [lo, hi] = pick(RANGES);
      let w = '';
      const len = 1 + Math.floor(rand() * 8);
      for (let k = 0; k < len; ++k) w += String.fromCodePoint(lo + Math.floor(rand() * (hi - lo + 1)));
      parts.push(w);
    } else if (r < 0.75) {
      parts.push(String(Math.floor(rand() * 10 ** (1 + Math.floor(rand() * 9)))));
    } else if (r < 0.9) {
      parts.push(pick(PUNCT));
    } else {
      parts.push(pick(SPACES));
    }
    parts.push(rand() < 0.8 ? ' ' : pick(SPACES));
  }
  return parts.join('');
}

function documents(count = 160) {
  const rand = rng(20240531);
  const docs = SNIPPETS.slice();
  docs.push(SNIPPETS.join('\n'));
  for (let i = 0; i < count; ++i) docs.push(randomDocument(rand));
  return docs;
}

module.exports = { documents, SNIPPETS };
