#!/usr/bin/env python3
"""kiln's WordPiece against Hugging Face's BertWordPieceTokenizer (PyPI `tokenizers`).

    python3 tools/wordpiece_parity.py build/bin/kiln-text [--wordnet /usr/share/wordnet]

Two checks, each the token ids of every line, kiln's (`kiln-text --encode`) against
Hugging Face's (uncased: lower-casing, accent stripping, text cleaning, CJK as words):
  1. every WordNet gloss with the 4096-token vocabulary kiln-text trains on the corpus;
  2. lines in Latin, Greek, Cyrillic, CJK and full-width forms with punctuation, controls
     and odd spaces, with a vocabulary holding every character they contain (before and
     after lower-casing and accent stripping) and their words, so that the comparison
     reaches the normalization rather than stopping at [UNK].
Needs a Python with `tokenizers` (pip install tokenizers); exits 1 on any difference.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import unicodedata

SAMPLES = [
    "ΑΒΓ Δέλτα Ύψος Привет Ёлка Йод ΟΔΟΣ ÀÉÎÕÜ Ångström",
    "Łódź Œuvre Straße ǅ façade naïve café résumé Ĳssel İstanbul ħ ŉ ſ",
    "２０２０年 ｆｕｌｌ－ｗｉｄｔｈ «guillemets» ¿qué? ¡sí! — – … · §5 ¶ 日本語のテキスト",
    "Hello, world! It's 3.14 $5 (e.g.) “quoted” don't\tTabs\x01and\u00a0nbsp\u200bzero-width",
    "a" * 101 + " " + "b" * 100 + " ΪΫ Ѐ Ѓ Ї Ќ Ѝ Ў ѐ ѓ ї ќ ѝ ў ΐ ΰ",
]


def sample_vocab(lines):
    variants = []
    for text in lines:
        lower = text.lower()
        stripped = "".join(c for c in unicodedata.normalize("NFD", lower) if unicodedata.category(c) != "Mn")
        variants += [text, lower, stripped]
    chars = sorted(set("".join(variants)) - set(" \t\n\r\u00a0"))
    words = sorted({w for v in variants for w in v.split()})
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + ["##" + c for c in chars] + words
    return list(dict.fromkeys(tokens))


def compare(kiln_text, vocab, lines, label):
    from tokenizers import BertWordPieceTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lines.txt")
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write("\n".join(lines) + "\n")
        out = subprocess.run([kiln_text, "--vocab", vocab, "--encode", path], check=True, capture_output=True,
                             text=True).stdout.split("\n")
    hf = BertWordPieceTokenizer(vocab, lowercase=True, strip_accents=True, clean_text=True,
                                handle_chinese_chars=True)
    bad = 0
    for i, line in enumerate(lines):
        theirs = hf.encode(line).ids
        ours = [int(x) for x in out[i].split()]
        if ours != theirs:
            bad += 1
            if bad <= 5:
                print(f"{label} line {i + 1}: {line[:80]!r}\n  hf   {hf.encode(line).tokens}\n"
                      f"  kiln {[hf.id_to_token(x) for x in ours]}")
    print(f"{label}: {len(lines) - bad} of {len(lines)} lines give the same ids")
    return bad == 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kiln_text", help="the kiln-text binary (build/bin/kiln-text)")
    parser.add_argument("--wordnet", default="/usr/share/wordnet")
    args = parser.parse_args()
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        sys.exit("wordpiece_parity: needs the PyPI package tokenizers (pip install tokenizers)")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        vocab = os.path.join(tmp, "vocab.txt")
        subprocess.run([args.kiln_text, "--wordnet", args.wordnet, "--out", vocab], check=True,
                       stdout=subprocess.DEVNULL)
        glosses = []
        for name in ("data.noun", "data.verb", "data.adj", "data.adv"):
            with open(os.path.join(args.wordnet, name), encoding="utf-8") as f:
                glosses += [line.split(" | ", 1)[1].strip() for line in f if not line.startswith("  ")]
        ok &= compare(args.kiln_text, vocab, glosses, "WordNet glosses, kiln's 4096-token vocabulary")
        sample = os.path.join(tmp, "sample-vocab.txt")
        with open(sample, "w", encoding="utf-8") as f:
            f.write("\n".join(sample_vocab(SAMPLES)) + "\n")
        ok &= compare(args.kiln_text, sample, SAMPLES, "multi-script samples")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
