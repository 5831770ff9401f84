"""Prompt texts for the commit-length probe.

- predictable: "The cat sat on the mat." repeated: a good drafter commits nearly a whole
  block per step at any context length.
- novel: fluent, non-repeating English-like prose, deterministic from a seed: nothing in
  the context predicts the next words, so commit length falls toward 1.
- recall: a novel passage placed once at the start, novel filler after it, and at the end
  a request to repeat the passage followed by its first words: a drafter that can still
  see (and copy from) the far context commits long blocks. The passage is longer than the
  decode (``recall_words``), so a target that copies it copies for every new token.

Builders return text with at least ``min_words`` words; the probe tokenizes with the
backend's own tokenizer and cuts the token ids to the exact context length.
"""
from __future__ import annotations

import random

PREDICTABLE_SENTENCE = "The cat sat on the mat."

# A small closed vocabulary keeps the text word-level and the generator fluent-looking.
DETERMINERS = ["the", "a", "every", "one", "that", "this", "some", "no"]
ADJECTIVES = """quiet bright old young small large red green blue silver golden dark pale warm cold heavy light
quick slow gentle rough smooth tall short narrow wide distant nearby hidden open broken careful curious silent
loud ancient modern simple strange familiar lonely busy tired clever brave proud humble calm wild soft hard
""".split()
NOUNS = """river mountain garden window teacher doctor farmer sailor painter writer engine bridge tower forest
valley harbor village market station library kitchen castle island desert meadow lantern letter journey
promise song story dream shadow morning evening winter summer autumn spring storm cloud stone feather
mirror clock candle basket ladder wagon horse falcon wolf fox rabbit owl whale turtle merchant soldier
captain student scholar baker weaver hunter pilot engineer poet child elder stranger neighbor traveler
""".split()
VERBS = """watched followed carried found built painted opened closed crossed reached guarded measured
remembered forgot praised answered visited left repaired studied described collected borrowed returned
noticed ignored welcomed warned protected explored discovered finished started chose lifted moved
""".split()
PREPOSITIONS = ["near", "beyond", "under", "above", "behind", "beside", "across", "toward", "inside", "around"]
ADVERBS = ["slowly", "quietly", "suddenly", "carefully", "often", "rarely", "gladly", "barely", "once", "again"]
CONNECTIVES = ["and then", "while", "because", "although", "before", "after", "so", "but"]

WORDS = sorted(set(DETERMINERS + ADJECTIVES + NOUNS + VERBS + PREPOSITIONS + ADVERBS
                   + [w for c in CONNECTIVES for w in c.split()]
                   + PREDICTABLE_SENTENCE.lower().rstrip(".").split()
                   + "repeat the passage from the start : please".split()))

KINDS = ("predictable", "novel", "recall")


def _words(text: str) -> int:
    return len(text.split())


def predictable(min_words: int) -> str:
    reps = max(1, -(-min_words // _words(PREDICTABLE_SENTENCE)))
    return " ".join([PREDICTABLE_SENTENCE] * reps)


def sentence(rng: random.Random) -> str:
    def phrase() -> str:
        return f"{rng.choice(DETERMINERS)} {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"

    s = f"{phrase()} {rng.choice(ADVERBS)} {rng.choice(VERBS)} {phrase()} {rng.choice(PREPOSITIONS)} {phrase()}"
    if rng.random() < 0.5:
        s += f" {rng.choice(CONNECTIVES)} {phrase()} {rng.choice(VERBS)} {phrase()}"
    return s[0].upper() + s[1:] + "."


def novel(min_words: int, seed: int = 0) -> str:
    """Grammatical sentences drawn from ~10^12 combinations: no span long enough to copy repeats."""
    rng = random.Random(seed)
    out: list[str] = []
    n = 0
    while n < min_words:
        s = sentence(rng)
        out.append(s)
        n += _words(s)
    return " ".join(out)


RECALL_CUE_WORDS = 4  # the recall prompt ends with the passage's first words, so the copy can start


def recall_words(new_tokens: int) -> int:
    """Words in the recall passage for a decode of ``new_tokens``: enough that a target copying it perfectly
    copies for the whole decode (a word is at least one token), so commit length measures the copy alone. With a
    64-word passage and 128 new tokens, even a perfect copy would end after ~60 tokens and the rest would be novel
    text: at 8 tokens a step for the copy and ~1.6 for novel text, about 2.6 at best."""
    return max(64, new_tokens + RECALL_CUE_WORDS + 28)


RECALL_WORDS = recall_words(128)  # the probe's default decode: 160 words


def recall(min_words: int, seed: int = 0, passage_words: int = RECALL_WORDS) -> tuple[str, str]:
    """(prompt, passage): passage first, novel filler, then the request and the passage's first words.

    The filler is sized so the whole prompt has at least ``min_words`` words."""
    passage = novel(passage_words, seed=seed + 1_000_003)
    cue_words = passage.split()[:RECALL_CUE_WORDS]
    tail = "Repeat the passage from the start: " + " ".join(cue_words)
    filler_words = max(0, min_words - _words(passage) - _words(tail))
    filler = novel(filler_words, seed=seed + 2_000_003) if filler_words else ""
    prompt = " ".join(p for p in (passage, filler, tail) if p)
    return prompt, passage


def build(kind: str, min_words: int, seed: int = 0) -> str:
    """Text of ``kind`` with at least ``min_words`` words (recall: the passage comes back at the end)."""
    if kind == "predictable":
        return predictable(min_words)
    if kind == "novel":
        return novel(min_words, seed)
    if kind == "recall":
        return recall(min_words, seed)[0]
    raise ValueError(f"unknown text kind {kind!r}; known: {', '.join(KINDS)}")
