"""Word-level tokenizer for the engine's presets.

One id per word or punctuation mark, lowercased. A word-level vocabulary keeps the
predictable/novel contrast clean: byte-level text stays partly predictable inside words
even when the prose is novel. The default vocabulary is the probe texts' closed word list;
a trained model ships its own (``WordTokenizer.load``).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

SPECIALS = ["<pad>", "<unk>", "<bos>", "<eos>"]
PUNCT = [".", ",", ":", "?", "!", ";"]
_SPLIT = re.compile(r"[A-Za-z0-9']+|[^\sA-Za-z0-9']")
_SPACE = re.compile(r"\s")
CHUNK = 1 << 16  # characters per regex call in ``encode``


class WordTokenizer:
    def __init__(self, words: list[str]):
        vocab = SPECIALS + [p for p in PUNCT if p not in words] + [w for w in words if w not in SPECIALS]
        if len(set(vocab)) != len(vocab):
            raise ValueError("tokenizer vocabulary has duplicate entries")
        self.vocab = vocab
        self.ids = {w: i for i, w in enumerate(vocab)}
        self.unk_id = self.ids["<unk>"]

    @classmethod
    def default(cls) -> "WordTokenizer":
        from ..texts import NAMES, WORDS  # the probe texts' closed vocabulary: prose words, then the names

        return cls(list(WORDS) + list(NAMES))

    @classmethod
    def load(cls, path: str | Path) -> "WordTokenizer":
        data = json.loads(Path(path).read_text())
        tok = cls.__new__(cls)
        tok.vocab = list(data["vocab"])
        tok.ids = {w: i for i, w in enumerate(tok.vocab)}
        tok.unk_id = tok.ids["<unk>"]
        return tok

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"type": "word", "vocab": self.vocab}, indent=0))

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """Word-level ids, read ``CHUNK`` characters at a time (cut at whitespace, which no token spans): one regex
        call over a 20 MB text holds Python's lock for seconds, and a server's event loop with it."""
        out: list[int] = []
        at = 0
        while at < len(text):
            ws = _SPACE.search(text, min(at + CHUNK, len(text)))
            end = ws.start() if ws else len(text)
            out += [self.ids.get(w.lower(), self.unk_id) for w in _SPLIT.findall(text, at, end)]
            at = max(end, at + 1) if ws else len(text)
        return out

    def decode(self, ids: list[int]) -> str:
        out: list[str] = []
        cap = True
        for i in ids:
            w = self.vocab[i] if 0 <= i < len(self.vocab) else "<unk>"
            if w in PUNCT:
                out.append(w)
                cap = w in ".?!"
                continue
            out.append((" " if out else "") + (w.capitalize() if cap else w))
            cap = False
        return "".join(out)
