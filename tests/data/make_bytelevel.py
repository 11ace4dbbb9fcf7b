#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Writes the byte-level BPE fixture test_tokenizer reads: a tokenizer.json configured as
Llama 3's (its regex Split, ByteLevel pre-tokenizer and decoder, ignore_merges, a
<|begin_of_text|> template, special tokens after the BPE vocabulary), trained by Hugging Face's
tokenizers library on the text below, and the ids that library gives a set of texts (fixed
ones, then seeded random ones): with and without the template's BOS, and without it under
GPT-2's pre-tokenizer (ByteLevel with use_regex) in place of the Split, and under two other
Splits: by a plain string (" ") and by a pattern that matches empty strings ("(?=[A-Z])").
Also a small compact copy (300 ids) that `make fuzz` seeds its corpus with.

  python3 -m venv /tmp/tk && /tmp/tk/bin/pip install tokenizers
  /tmp/tk/bin/python tests/data/make_bytelevel.py tests/data
"""
import json
import random
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>"]
CORPUS = """Once upon a time, there was a little girl named Lily. She liked to play in the park
with her friends. They're happy; we'll see what you've got. I'm sure it's fine, isn't it?
The quick brown fox jumps over the lazy dog 1234567890 times: 3.14159, 2,718 and 42%!
def attention(q, k, v):\n    return softmax(q @ k.T / sqrt(d)) @ v  # O(n) memory\n
Der schnelle braune Fuchs springt über den faulen Hund. Größe, Maß und Straße.
Le renard brun rapide saute par-dessus le chien paresseux. À bientôt, ça va? Noël, été.
Быстрая коричневая лиса прыгает через ленивую собаку. Привет, мир!
敏捷的棕色狐狸跳过了懒狗。注意力机制在长序列上的内存是线性的。
素早い茶色の狐がのろまな犬を飛び越える。カタカナとひらがな。
الثعلب البني السريع يقفز فوق الكلب الكسول
Emoji: 😀 👍🏽 👨‍👩‍👧 🇫🇷 ✨ — “quotes” ‘single’ … and tabs\tand\r\nwindows lines.
<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>
"""


def random_texts(rng, count):
    pieces = ["hello", " world", "'s", "'LL", "'Re", "1", "12", "1234567", " 42", "  ", "   ",
              "\n", "\n\n", "\r\n", "\t", " \t ", "!", "?!", "...", "—", "“", "é", "e\u0301",
              "Größe", "ça", "мир", "注意力", "カタ", "الكلب", "😀", "👍🏽", "👨‍👩‍👧", "\u00a0",
              "\u3000", "\u2009", "<|eot_id|>", "<|begin_of_text|>", "x", "Q", "_", "@", "#1",
              "a1b2", "3.14", "(", ")", "{}", "\u200b", "\u0085", "\ufeff", "ﬁ", "Ⅻ", "²", "٣"]
    out = []
    for _ in range(count):
        out.append("".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))))
    return out


def build(vocab_size):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS] * 3, trainer)
    base = tok.get_vocab_size()
    tok.add_special_tokens(SPECIALS)
    bos = tok.token_to_id(SPECIALS[0])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{SPECIALS[0]} $A", pair=f"{SPECIALS[0]} $A {SPECIALS[0]} $B:1",
                                      special_tokens=[(SPECIALS[0], bos)])])
    return tok, base, bos


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_bytelevel.py OUT_DIR")
    out = sys.argv[1]
    small, _, _ = build(300)
    with open(f"{out}/bytelevel_small.json", "w", encoding="utf-8") as f:
        f.write(json.dumps(json.loads(small.to_str()), ensure_ascii=False, separators=(",", ":")))
    tok, base, bos = build(1000)
    with open(f"{out}/bytelevel_tokenizer.json", "w", encoding="utf-8") as f:  # one line a section
        j = json.loads(tok.to_str())
        f.write("{\n" + ",\n".join(json.dumps(k) + ": " + json.dumps(v, ensure_ascii=False, separators=(",", ":"))
                                    for k, v in j.items()) + "\n}\n")
    texts = [line for line in CORPUS.split("\n") if line] + [
        "", " ", "  leading", "trailing  ", "a   b", "  \n\n  x", "x\n \n", "I'M YOU'LL WE'D",
        "rock'n'roll", "abc123def4567", "1,234,567.89", "e\u0301t\u00e9", "\u00a0nbsp\u3000ideo",
        "!!!\n\n", "Hello<|eot_id|>World", "<|end_of_text|>", "tab\t\tend", "\u200bzero", "ﬁnancial Ⅻ²٣"]
    texts += random_texts(random.Random(20261204), 200)
    cases = []
    for t in texts:
        plain = tok.encode(t, add_special_tokens=False).ids
        assert tok.decode(plain, skip_special_tokens=False) == t, t
        cases.append({"text": t, "ids": tok.encode(t).ids, "ids_plain": plain})
    variants = {
        "ids_gpt2": pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        "ids_string": pre_tokenizers.Sequence([
            pre_tokenizers.Split(" ", behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        "ids_empty": pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex("(?=[A-Z])"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
    }
    for key, pre in variants.items():
        tok.pre_tokenizer = pre
        for case in cases:
            case[key] = tok.encode(case["text"], add_special_tokens=False).ids
    with open(f"{out}/bytelevel_ids.json", "w", encoding="utf-8") as f:  # one line a case
        head = {"bos": bos, "base_vocab": base, "vocab_size": tok.get_vocab_size()}
        f.write(json.dumps(head)[:-1] + ', "cases": [\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in cases))
        f.write("\n]}\n")


if __name__ == "__main__":
    main()
