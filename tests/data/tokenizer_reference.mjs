// Golden values for zerort's byte-level BPE tokenizer (data/tokenizer.h) from an independent
// implementation: Hugging Face's pure-JavaScript tokenizers (npm @huggingface/tokenizers).
//
// Trains three small byte-level BPE vocabularies (600 merges) on the repository's own Markdown,
// each with one of the pre-tokenisations zerort supports, written as Hugging Face tokenizer.json
// files: GPT-2's (ByteLevel with its regex), LLaMA-3's (Split on its regex, then ByteLevel;
// ignore_merges) and Qwen2's (NFC, Split on its regex with single digits, then ByteLevel), each
// with special tokens. And one SentencePiece-style vocabulary (characters seen at least 20 times,
// spaces as U+2581, runs of them kept together as SentencePiece's allow_whitespace_only_pieces
// does, <0xNN> byte tokens, <unk>, 600 merges) in the three layouts the Hub's converted files
// use: LLaMA-2's legacy one (Prepend and Replace normalizers, no pre-tokenizer, byte_fallback,
// fuse_unk, decoders Replace/ByteFallback/Fuse/Strip), Mistral's (a Metaspace pre-tokenizer with
// prepend_scheme "first") and a Replace-only one with no prefix (as Gemma's normalizer). Then
// encodes a set of test strings (Unicode, whitespace runs, digits, contractions, special tokens,
// combining characters, NUL, characters without a token) with @huggingface/tokenizers and writes
// the ids and the decoded text to tests/data/golden/tokenizer_golden.json.
//
// Regenerate (Node.js from Debian or elsewhere; the package from the npm registry):
//   mkdir -p /tmp/tokref && (cd /tmp/tokref && npm install @huggingface/tokenizers@0.2.0)
//   NODE_PATH=/tmp/tokref/node_modules node tests/data/tokenizer_reference.mjs
// CI does not run it; it reads the committed files.
import fs from "fs";
import path from "path";
import { createRequire } from "module";

const require = createRequire(path.join(process.env.NODE_PATH || ".", "x.js"));
const { Tokenizer } = require("@huggingface/tokenizers");
const here = path.dirname(new URL(import.meta.url).pathname);
const root = path.resolve(here, "../..");
const out = path.join(here, "golden");

// GPT-2's bytes_to_unicode: printable bytes as themselves, the rest as 256 + n.
const byteChar = [];
{
  const keep = [];
  for (let b = 33; b <= 126; b++) keep.push(b);
  for (let b = 161; b <= 172; b++) keep.push(b);
  for (let b = 174; b <= 255; b++) keep.push(b);
  let n = 0;
  for (let b = 0; b < 256; b++) {
    byteChar[b] = keep.includes(b) ? String.fromCodePoint(b) : String.fromCodePoint(256 + n++);
  }
}
const toByteLevel = (s) => Array.from(Buffer.from(s, "utf8"), (b) => byteChar[b]).join("");

const GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const LLAMA3 =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2 =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// JavaScript has no (?i:...) group: the training split expands it (the test encodes with the
// library, whatever its own handling).
const jsRegex = (p) =>
  new RegExp(p.replace("(?i:'s|'t|'re|'ve|'m|'ll|'d)", "'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"), "gu");

// Learns `merges` merges over `words` ([symbols, count] pairs; a null symbol, a character with no
// token, pairs with nothing), the most frequent pair first (ties: the smaller pair string),
// adding each merged token to `vocab`; the merge list in rank order.
function learnMerges(words, vocab, merges) {
  const rules = [];
  for (let i = 0; i < merges; i++) {
    const pairs = new Map();
    for (const [syms, c] of words) {
      for (let j = 0; j + 1 < syms.length; j++) {
        if (syms[j] === null || syms[j + 1] === null) continue;
        const k = syms[j] + " " + syms[j + 1];
        pairs.set(k, (pairs.get(k) || 0) + c);
      }
    }
    let best = null, bestCount = 0;
    for (const [k, c] of pairs) {
      if (c > bestCount || (c === bestCount && k < best)) [best, bestCount] = [k, c];
    }
    if (best === null || bestCount < 2) break;
    const [a, b] = best.split(" ");
    rules.push(best);
    vocab[a + b] = Object.keys(vocab).length;
    words = words.map(([syms, c]) => {
      const next = [];
      for (let j = 0; j < syms.length; j++) {
        if (j + 1 < syms.length && syms[j] === a && syms[j + 1] === b) {
          next.push(a + b);
          j++;
        } else next.push(syms[j]);
      }
      return [next, c];
    });
  }
  return rules;
}

function train(text, pattern, merges) {
  const counts = new Map();
  for (const m of text.matchAll(jsRegex(pattern))) {
    const w = toByteLevel(m[0]);
    counts.set(w, (counts.get(w) || 0) + 1);
  }
  const vocab = {};
  for (let b = 0; b < 256; b++) vocab[byteChar[b]] = b;
  const rules = learnMerges([...counts].map(([w, c]) => [Array.from(w), c]), vocab, merges);
  return { vocab, merges: rules };
}

// A SentencePiece-style BPE: words begin at U+2581 (a run of them is one word), characters seen
// at least 20 times are the alphabet, the rest fall back to bytes.
const META = "\u2581";
function trainMeta(text, merges) {
  const spaced = META + text.replaceAll(" ", META);
  const chars = new Map();
  for (const c of spaced) chars.set(c, (chars.get(c) || 0) + 1);
  const vocab = { "<unk>": 0, "<s>": 1, "</s>": 2 };
  for (let b = 0; b < 256; b++) {
    vocab[`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`] = Object.keys(vocab).length;
  }
  for (const [c, n] of [...chars].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1))) {
    if (n >= 20 && !(c in vocab)) vocab[c] = Object.keys(vocab).length;
  }
  const counts = new Map();
  for (const w of spaced.match(new RegExp(`${META}+[^${META}]*|[^${META}]+`, "gu"))) {
    counts.set(w, (counts.get(w) || 0) + 1);
  }
  const words = [...counts].map(([w, c]) => [Array.from(w).map((x) => (x in vocab ? x : null)), c]);
  const rules = learnMerges(words, vocab, merges);
  return { vocab, merges: rules };
}

const text = ["README.md", "layers/README.md", "engine/README.md", "docs/design.md"]
  .map((f) => fs.readFileSync(path.join(root, f), "utf8"))
  .join("\n");

function metaTokenizerJson(kind) {
  const { vocab, merges } = trainMeta(text, 600);
  const added = ["<unk>", "<s>", "</s>"].map((content, id) => ({
    id, content, single_word: false, lstrip: false, rstrip: false, normalized: false,
    special: true,
  }));
  const replace = (a, b) => ({ type: "Replace", pattern: { String: a }, content: b });
  const decoders = [replace(META, " "), { type: "ByteFallback" }, { type: "Fuse" }];
  if (kind !== "replace") decoders.push({ type: "Strip", content: " ", start: 1, stop: 0 });
  return {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: kind === "llama2"
      ? { type: "Sequence", normalizers: [{ type: "Prepend", prepend: META }, replace(" ", META)] }
      : kind === "replace" ? replace(" ", META) : null,
    pre_tokenizer: kind === "mistral"
      ? { type: "Metaspace", replacement: META, prepend_scheme: "first", split: false }
      : null,
    post_processor: null,
    decoder: { type: "Sequence", decoders },
    model: { type: "BPE", dropout: null, unk_token: "<unk>", continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, ignore_merges: false,
             vocab, merges },
  };
}

function tokenizerJson(kind) {
  if (["llama2", "mistral", "replace"].includes(kind)) return metaTokenizerJson(kind);
  const pattern = { gpt2: GPT2, llama3: LLAMA3, qwen2: QWEN2 }[kind];
  const { vocab, merges } = train(text, pattern, 600);
  const specials = {
    gpt2: ["<|endoftext|>"],
    llama3: ["<|begin_of_text|>", "<|end_of_text|>"],
    qwen2: ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
  }[kind];
  let next = Object.keys(vocab).length;
  const added = specials.map((content) => ({
    id: next++, content, single_word: false, lstrip: false, rstrip: false, normalized: false,
    special: true,
  }));
  const byteLevel = (useRegex) => ({ type: "ByteLevel", add_prefix_space: false,
                                     trim_offsets: true, use_regex: useRegex });
  const split = (p) => ({ type: "Split", pattern: { Regex: p }, behavior: "Isolated",
                          invert: false });
  return {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: kind === "qwen2" ? { type: "NFC" } : null,
    pre_tokenizer: kind === "gpt2" ? byteLevel(true)
      : { type: "Sequence", pretokenizers: [split(pattern), byteLevel(false)] },
    post_processor: null,
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: false, byte_fallback: false,
             ignore_merges: kind === "llama3", vocab, merges },
  };
}

const strings = [
  "The shard manager gathers each unit's weights before its forward.",
  "Hello World",
  "  leading spaces, trailing   ",
  "tabs\tand\nnew lines\r\nand CRLF\n\n\nthree",
  "I'll say it's what they've done; DON'T, WE'LL",
  "numbers 1234567 3.14159 and 2026-11-27 and 1,000,000",
  "naïve café résumé",
  "日本語のテキスト and 中文",
  "emoji 😀👍🏽 and 🇫🇷",
  "Ελληνικά Русский עברית العربية",
  "e\u0301 (combining) vs é (precomposed)",
  "hello<|endoftext|>world <|end_of_text|> <|im_start|>user",
  "<|begin_of_text|>The start",
  "    def f(x):\n        return x ** 2  # square\n",
  "a  b   c    d\u00a0e\u2003f",
  "",
  "zerort",
  "nul\u0000inside and \u0000\u0000 twice",
  "<s>after a special token, </s> and <unk>",
  " leading space and a trailing one ",
  "rare characters: \u00fe\u00f0 \u2603 \u{1F980} \u{10FFFD}",
];

const golden = { generator: "tests/data/tokenizer_reference.mjs, @huggingface/tokenizers 0.2.0",
                 strings, tokenizers: {} };
for (const kind of ["gpt2", "llama3", "qwen2", "llama2", "mistral", "replace"]) {
  const json = tokenizerJson(kind);
  const file = `tokenizer_${kind}.json`;
  fs.writeFileSync(path.join(out, file), JSON.stringify(json));
  const tok = new Tokenizer(json, {});
  golden.tokenizers[kind] = {
    file,
    ids: strings.map((s) => tok.encode(s, { add_special_tokens: false }).ids),
    decoded: strings.map((s) => {
      const ids = tok.encode(s, { add_special_tokens: false }).ids;
      return ids.length ? tok.decode(ids) : "";
    }),
  };
  console.log(kind, Object.keys(json.model.vocab).length, "tokens,", json.model.merges.length,
              "merges");
}
fs.writeFileSync(path.join(out, "tokenizer_golden.json"), JSON.stringify(golden, null, 1));
