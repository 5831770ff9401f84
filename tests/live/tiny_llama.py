"""Build the tiny HF-format Llama checkpoint (config, safetensors, tokenizer) that the live vLLM tests serve.

Run with the Python that has vLLM (it brings torch, transformers and tokenizers):

    .venv-vllm/bin/python tests/live/tiny_llama.py OUT_DIR

Built, not trained, in about a second: what greedy decoding does is set by construction, so a live test measures
vLLM and ddprobe, never the luck of a training run on a busy 2-core machine.

- Tokenizer: word level (``tokenizers``' WordLevel over the words and punctuation of ``ddprobe.texts``, both
  cases), and two added tokens, ``The cat`` and ``the mat.``, so that ddprobe's predictable sentence "The cat sat
  on the mat." is the four tokens ``The cat | sat | on | the mat.``, none of which novel prose ever uses.
- Model: a 2-layer Llama whose residual stream starts as the token's one-hot embedding and whose final head maps
  each token to its successor: around the sentence's 4-token cycle, and for every other token along one seeded
  random cycle through all of them. Attention and MLP weights are random (std 0.02; their output projections 0.002): they run
  and perturb the stream, but the head's margin (checked below, on the model's own forward) keeps every greedy pick.
  So greedy decoding continues a repeated sentence forever (ngram speculation accepts every draft) and, after
  novel prose, walks a path that repeats no token for hundreds of tokens (ngram drafts rarely match).
"""
from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # ddprobe.texts is stdlib only: no project install is needed in vLLM's venv

from ddprobe import texts  # noqa: E402

SPECIALS = ["[UNK]", "<s>", "</s>"]
SENTENCE = ["The cat", "sat", "on", "the mat."]  # texts.PREDICTABLE_SENTENCE in this tokenizer
SEED = 53
LAYERS, HEAD_DIM, MLP, STD = 2, 64, 128, 0.02
OUT_STD = 0.002  # o_proj and down_proj: what the layers add to the stream stays small beside the one-hot
PROSE_WORDS = 600  # words of novel prose whose pairs the successor cycle takes first
MIN_MARGIN = 0.5  # logit of the intended next token over the runner-up, at least, at every checked position


def vocabulary() -> list[str]:
    """Specials, the sentence's added tokens, then every word (both cases) and punctuation mark of the texts."""
    words = set(texts.WORDS) | {w.capitalize() for w in texts.WORDS} | {n.capitalize() for n in texts.NAMES}
    sample = " ".join([texts.novel(3000, s) for s in range(3)] + [texts.recall(400, 0)[0]])
    words |= set(re.findall(r"\w+|[^\w\s]+", sample))
    return SPECIALS + SENTENCE + sorted(w for w in words if w not in SENTENCE)


def successors(vocab: list[str]) -> list[int]:
    """next[i]: the token greedy decoding picks after token i. The sentence's four tokens form their own cycle. Every
    other token lies on one cycle through all of them (so no output repeats itself for hundreds of tokens), laid
    out first from the word pairs of ddprobe's novel prose (seed 0: the probe's default), each pair taken where
    neither word has its place yet and it closes no loop, then the pieces joined in a seeded random order. So
    some phrases of the model's output are phrases of the novel prompt: ngram speculation finds them and drafts
    the prompt's continuation, which the model follows for a few tokens and then leaves (partial acceptance)."""
    ids = {w: i for i, w in enumerate(vocab)}
    nxt: list[int | None] = [None] * len(vocab)
    for a, b in zip(SENTENCE, SENTENCE[1:] + SENTENCE[:1]):
        nxt[ids[a]] = ids[b]
    rest = {i for i, w in enumerate(vocab) if w not in SENTENCE and w not in SPECIALS}
    prev: dict[int, int] = {}
    head = {i: i for i in rest}  # each piece's first token, kept for the piece's last token
    prose = [ids.get(w, 0) for w in re.findall(r"\w+|[^\w\s]+", texts.novel(PROSE_WORDS, 0))]
    for a, b in zip(prose, prose[1:]):
        if a in rest and b in rest and nxt[a] is None and b not in prev and head[a] != b:
            nxt[a], prev[b] = b, a
            first, last = head.pop(a), _last(nxt, b)
            head[last] = first
    pieces = [h for t, h in head.items()]  # first tokens of the pieces, in no particular order yet
    pieces.sort()
    random.Random(SEED).shuffle(pieces)
    for p, q in zip(pieces, pieces[1:] + pieces[:1]):
        nxt[_last(nxt, p)] = q
    for s in SPECIALS:
        nxt[ids[s]] = pieces[0]
    return [int(n) for n in nxt]


def _last(nxt: list, i: int) -> int:
    while nxt[i] is not None and nxt[i] != i:
        i = nxt[i]
    return i


def tokenizer(vocab: list[str]):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()  # \w+|[^\w\s]+
    tok.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    tok.add_tokens([AddedToken(w, special=False, normalized=False) for w in SENTENCE[::3]])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>", eos_token="</s>")


def model(vocab: list[str], nxt: list[int]):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    v = len(vocab)
    hidden = -(-v // HEAD_DIM) * HEAD_DIM
    cfg = LlamaConfig(vocab_size=v, hidden_size=hidden, intermediate_size=MLP, num_hidden_layers=LAYERS,
                      num_attention_heads=hidden // HEAD_DIM, num_key_value_heads=1, head_dim=HEAD_DIM,
                      max_position_embeddings=8192, rms_norm_eps=1e-6, tie_word_embeddings=False,
                      bos_token_id=vocab.index("<s>"), eos_token_id=vocab.index("</s>"), torch_dtype="float32")
    torch.manual_seed(SEED)
    m = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, OUT_STD if name.endswith(("o_proj.weight", "down_proj.weight")) else STD)
        m.model.embed_tokens.weight.zero_()
        m.model.embed_tokens.weight[:, :v] = torch.eye(v)  # token i: the unit vector e_i
        m.lm_head.weight.zero_()
        for i, j in enumerate(nxt):
            m.lm_head.weight[j, i] = 1.0  # e_i after the final norm scores its successor
    return m


def check(m, tok, nxt: list[int]) -> float:
    """The smallest margin of the intended successor over the runner-up, on the model's own forward over
    predictable and novel text; raises when any greedy pick differs from ``nxt``."""
    import torch

    margins = []
    for text in (texts.predictable(600), texts.novel(600, 0), texts.novel(600, 1)):
        ids = tok(text, add_special_tokens=False)["input_ids"][:700]
        with torch.no_grad():
            logits = m(torch.tensor([ids])).logits[0]
        want = torch.tensor([nxt[i] for i in ids])
        top2 = logits.topk(2, dim=-1)
        if not bool((top2.indices[:, 0] == want).all()):
            bad = int((top2.indices[:, 0] != want).nonzero()[0])
            raise SystemExit(f"tiny_llama: position {bad} picks {int(top2.indices[bad, 0])}, not {int(want[bad])}")
        margins.append(float((top2.values[:, 0] - top2.values[:, 1]).min()))
    return min(margins)


def build(out: Path) -> dict:
    vocab = vocabulary()
    nxt = successors(vocab)
    tok = tokenizer(vocab)
    if tok("The cat sat on the mat. The", add_special_tokens=False)["input_ids"] != \
            [vocab.index(w) for w in SENTENCE] + [vocab.index("The")]:
        raise SystemExit("tiny_llama: the tokenizer does not split the predictable sentence as intended")
    m = model(vocab, nxt)
    margin = check(m, tok, nxt)
    if margin < MIN_MARGIN:
        raise SystemExit(f"tiny_llama: greedy margin {margin:.3f} below {MIN_MARGIN}")
    out.mkdir(parents=True, exist_ok=True)
    m.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    info = {"vocab": len(vocab), "hidden": m.config.hidden_size, "layers": LAYERS, "margin": margin,
            "params": sum(p.numel() for p in m.parameters())}
    (out / "build.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: tiny_llama.py OUT_DIR")
    print(json.dumps(build(Path(sys.argv[1]))))
