"""Prompt texts for the commit-length probe.

- predictable: "The cat sat on the mat." repeated: a good drafter commits nearly a whole
  block per step at any context length.
- novel: fluent, non-repeating English-like prose, deterministic from a seed: nothing in
  the context predicts the next words, so commit length falls toward 1.
- recall: a passage (a roster of invented names, each used once and nowhere else in the text)
  placed once at the start, novel filler after it, and at the end a request to repeat the
  passage followed by its first names: a target that recalls it, and a drafter that can still
  see (and copy from) the far context, commit long blocks. The roster is longer than the
  probe's default decode, so a perfect copy covers every new token.

Builders return text with at least ``min_words`` words; the probe tokenizes with the
backend's own tokenizer and cuts the token ids to the exact context length.
"""
from __future__ import annotations

import random
from collections import Counter, deque

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


def _names(n: int, seed: int = 2026) -> list[str]:
    """n distinct invented names (two consonant-vowel syllables and an optional closing consonant), none of
    them a word of the prose vocabulary: a recall passage made of them can only be found again by its own
    words, as a passage of a real text in a real vocabulary is (a 200-word grammar repeats every word pair
    of a passage many times over 100k tokens of filler)."""
    rng = random.Random(seed)
    taken, out = set(WORDS), []
    while len(out) < n:
        w = "".join(rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(2))
        w += rng.choice(["", "n", "r", "s"])
        if w not in taken:
            taken.add(w)
            out.append(w)
    return out


NAMES = _names(288)  # the recall passage's vocabulary (lower case; capitalized in the text); 216 + 288 < 512


def _words(text: str) -> int:
    return len(text.split())


def predictable(min_words: int) -> str:
    reps = max(1, -(-min_words // _words(PREDICTABLE_SENTENCE)))
    return " ".join([PREDICTABLE_SENTENCE] * reps)


NOVEL_WINDOW = 128  # words: novel prose uses no adjective, noun or verb twice within this many words


class Recent:
    """The last ``window`` words of a text, for prose that does not reuse a content word within them. Real prose
    rarely repeats its content words a few sentences apart; a small target trained on prose that does learns no
    reason not to, and at temperature 0 its own prose falls into loops ("this humble hunter ... this humble
    hunter") that a drafter able to copy then predicts (docs/tiny-model.md)."""

    def __init__(self, window: int = NOVEL_WINDOW):
        self.window, self.words, self.count = window, deque(), Counter()

    def push(self, word: str) -> None:
        self.words.append(word)
        self.count[word] += 1
        if len(self.words) > self.window:
            self.count[self.words.popleft()] -= 1

    def pick(self, rng: random.Random, pool: list[str]) -> str:
        """A word of ``pool`` not among the recent ones (rejection sampling: every pool holds more words than
        a window can hold of it, 1.5x or more), pushed."""
        w = rng.choice(pool)
        while self.count[w] > 0:
            w = rng.choice(pool)
        self.push(w)
        return w


def sentence(rng: random.Random, recent: Recent | None = None) -> str:
    """One sentence of the grammar. ``recent``: adjectives, nouns and verbs are drawn among those not used in its
    window (and the sentence's words are pushed into it); None: every word uniform within its slot."""
    def word(pool: list[str], content: bool) -> str:
        if recent is None:
            return rng.choice(pool)
        if content:
            return recent.pick(rng, pool)
        w = rng.choice(pool)
        recent.push(w)
        return w

    def phrase() -> str:
        return f"{word(DETERMINERS, False)} {word(ADJECTIVES, True)} {word(NOUNS, True)}"

    s = f"{phrase()} {word(ADVERBS, False)} {word(VERBS, True)} {phrase()} {word(PREPOSITIONS, False)} {phrase()}"
    if rng.random() < 0.5:
        s += f" {rng.choice(CONNECTIVES)} {phrase()} {word(VERBS, True)} {phrase()}"
    return s[0].upper() + s[1:] + "."


def novel(min_words: int, seed: int = 0) -> str:
    """Grammatical sentences drawn from ~10^12 combinations, no adjective, noun or verb used twice within
    NOVEL_WINDOW words: no span long enough to copy repeats."""
    rng, recent = random.Random(seed), Recent()
    out: list[str] = []
    n = 0
    while n < min_words:
        s = sentence(rng, recent)
        out.append(s)
        n += _words(s)
    return " ".join(out)


RECALL_CUE_WORDS = 4  # the recall prompt ends with the passage's first words, so the copy can start


def roster(n: int, rng: random.Random, pool: list[str] | None = None) -> str:
    """n distinct names of ``pool`` (NAMES by default) in a random order, capitalized: "Kelomar Zavi Dunesos ..."."""
    return names_text(rng.sample(NAMES if pool is None else pool, n))


def names_text(names: list[str]) -> str:
    """Names as a passage's text: capitalized, in the order given."""
    return " ".join(w.capitalize() for w in names)


def recall_words(new_tokens: int) -> int:
    """Names in the recall passage for a decode of ``new_tokens``: enough that a target copying it perfectly
    copies for the whole decode (a name is at least one token), so commit length measures the copy alone. With a
    64-word passage and 128 new tokens, even a perfect copy would end after ~60 tokens and the rest would be novel
    text: at 8 tokens a step for the copy and ~1.6 for novel text, about 2.6 at best. At most len(NAMES): a decode
    of more than len(NAMES) - 4 new tokens runs past the passage's end."""
    return min(len(NAMES), max(64, new_tokens + RECALL_CUE_WORDS + 28))


RECALL_WORDS = recall_words(128)  # the probe's default decode: 160 names
RECALL_MAX_NEW = len(NAMES) - RECALL_CUE_WORDS - 28  # the longest decode a whole passage still covers


def recall(min_words: int, seed: int = 0, passage_words: int = RECALL_WORDS) -> tuple[str, str]:
    """(prompt, passage): the passage (a roster of ``passage_words`` distinct names) first, novel filler, then
    the request and the passage's first words. The filler is sized so the whole prompt has at least
    ``min_words`` words."""
    if not RECALL_CUE_WORDS < passage_words <= len(NAMES):
        raise ValueError(f"a recall passage has {RECALL_CUE_WORDS + 1} to {len(NAMES)} names, got {passage_words}")
    passage = roster(passage_words, random.Random(seed + 1_000_003))
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
