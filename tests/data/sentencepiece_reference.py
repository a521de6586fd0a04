#!/usr/bin/env python3
"""Golden values for zerort's SentencePiece tokenizer from SentencePiece's own Python binding.

tests/data/golden/sentencepiece_tiny.model was written by
    zerort data train-tokenizer tests/data/golden/sentencepiece_tiny.model --vocab-size 512 \
        --threads 2
(a BPE model trained on the built-in corpus with LLaMA's settings: byte fallback, digits split,
identity normalisation). This script encodes the strings of tokenizer_golden.json with the
Python binding (Debian: apt-get install python3-sentencepiece) and writes the ids and the decoded
text to tests/data/golden/sentencepiece_golden.json, which tests/data/tokenizer_test.cc reads.
CI does not run it.

    /usr/bin/python3 tests/data/sentencepiece_reference.py
"""
import json
import os

import sentencepiece as spm

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
sp = spm.SentencePieceProcessor(model_file=os.path.join(here, "sentencepiece_tiny.model"))
with open(os.path.join(here, "tokenizer_golden.json")) as f:
    strings = json.load(f)["strings"]
ids = [sp.encode(s) for s in strings]
out = {
    "generator": f"tests/data/sentencepiece_reference.py, sentencepiece {spm.__version__}",
    "vocab_size": sp.get_piece_size(),
    "eos": sp.eos_id(),
    "strings": strings,
    "ids": ids,
    "decoded": [sp.decode(i) for i in ids],
}
with open(os.path.join(here, "sentencepiece_golden.json"), "w") as f:
    json.dump(out, f, indent=1)
print("wrote sentencepiece_golden.json:", sum(len(i) for i in ids), "ids")
