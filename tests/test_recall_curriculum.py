"""The recall curriculum's pieces (issue 14): prose that reuses no content word within its window, RecallStream's
layout and copy mask, the drafter's attention weights and the loss on where its full layer looks; the command
itself, one short call on the CPU."""
import json
import math

import pytest
import torch
from safetensors.torch import load_file

from ddprobe import texts
from ddprobe.engine import weights
from ddprobe.engine.generate import Engine
from ddprobe.engine.tokenizer import WordTokenizer
from ddprobe.training import recall_curriculum
from ddprobe.training.curriculum import attn_loss
from ddprobe.training.train import drafter_forward_train, target_forward_train
from ddprobe.training.traindata import REPEAT_PROMPT, RecallStream, copy_runs


def test_novel_prose_reuses_no_content_word_within_its_window():
    words = [w.lower().strip(".") for w in texts.novel(20_000, seed=7).split()]
    content = set(texts.ADJECTIVES + texts.NOUNS + texts.VERBS)
    last: dict[str, int] = {}
    for i, w in enumerate(words):
        if w in content:
            assert i - last.get(w, -10**9) > texts.NOVEL_WINDOW, (w, i)
            last[w] = i
    assert len(set(words) & content) > 0.9 * len(content)  # every slot still draws on (nearly) all its words
    assert texts.novel(300, seed=7) == texts.novel(300, seed=7)


def test_recall_stream_layout_and_copy_mask():
    """Every masked run is a passage asked for again: the request, the cue (its first names), then the rest of
    the passage, which stood earlier in the sequence; the passages of one sequence share no name."""
    tok = WordTokenizer.default()
    req = tok.encode(REPEAT_PROMPT)
    names = set(tok.encode(" ".join(texts.NAMES)))
    a, b = RecallStream(tok, 1024, 3, (16, 48)), RecallStream(tok, 1024, 3, (16, 48))
    x = a.batch(6)
    assert torch.equal(x, b.batch(6)) and torch.equal(a.last_mask, b.last_mask)  # deterministic from the seed
    gaps = []
    for seq, m in zip(x.tolist(), a.last_mask.tolist()):
        counts: dict[int, int] = {}
        for t in seq:
            if t in names:
                counts[t] = counts.get(t, 0) + 1
        assert max(counts.values()) <= 2  # each name in its passage and its copy, nowhere else
        runs = copy_runs(m)
        for i, j in runs:
            start = i - texts.RECALL_CUE_WORDS
            assert seq[start - len(req): start] == req
            copy = seq[start:j]
            assert all(t in names for t in copy)
            first = next(k for k in range(start) if seq[k: k + len(copy)] == copy)
            gaps.append(start - first)
        assert runs
    assert max(gaps) > 256 and min(gaps) < max(gaps)  # gaps spread over the sequence


def test_recall_stream_far_asks_across_the_whole_sequence():
    """far=1: every passage stands in the sequence's first part and is asked for in its last (the probe's layout
    at its longest context); the copy mask still marks each copy after its cue."""
    tok = WordTokenizer.default()
    req = tok.encode(REPEAT_PROMPT)
    s = RecallStream(tok, 4096, 5, (16, 48), far=1.0)
    x = s.batch(3)
    for seq, m in zip(x.tolist(), s.last_mask.tolist()):
        starts = [i for i, _ in copy_runs(m)]
        assert len(starts) >= 3
        for i in starts:
            start = i - texts.RECALL_CUE_WORDS
            assert seq[start - len(req): start] == req
            copy = seq[start: start + texts.RECALL_CUE_WORDS + 4]
            first = next(k for k in range(start) if seq[k: k + len(copy)] == copy)
            assert first < 0.2 * len(seq) and start > 0.8 * len(seq)


def test_drafter_attention_weights_and_the_loss_on_them():
    """drafter_forward_train(full_attn=) returns the full layer's log weights with the same output; attn_loss is
    ~0 when every head puts its weight on the copy's source rows and log(rows / sources) when it spreads evenly."""
    cfg_eng = Engine("tiny", seed=1, max_ctx=256, dtype=torch.float64)
    tok = WordTokenizer.default()
    stream = RecallStream(tok, 128, 2, (8, 24), copy_share=0.9)
    x = stream.batch(2)
    _, feats = target_forward_train(cfg_eng.target, x)
    names = torch.zeros(len(tok) + 8, dtype=torch.bool)
    names[tok.encode(" ".join(texts.NAMES))] = True
    copy_at = [int(m.nonzero()[4]) for m in stream.last_mask]  # an anchor inside each sequence's first copy
    anc = torch.tensor([[c] for c in copy_at])
    att: list = []
    lp = drafter_forward_train(cfg_eng.drafter, cfg_eng.target, x, feats, anc, att)
    assert torch.allclose(lp, drafter_forward_train(cfg_eng.drafter, cfg_eng.target, x, feats, anc), atol=1e-9)
    logw = att[0]
    assert torch.allclose(logw.exp().sum(-1), torch.ones(logw.shape[:-1], dtype=logw.dtype))
    n_draft = cfg_eng.config.drafter.block_size - 1
    # weights by hand: all on the source rows, or even over the context rows before the anchor
    on_src = torch.full_like(logw, -math.inf)
    even = torch.full_like(logw, -math.inf)
    expect = []
    for b in range(2):
        a = int(anc[b, 0])
        even[b, :, :, :a] = -math.log(a)
        for k in range(1, n_draft + 1):
            src = [j for j in range(k, a) if x[b, j - k] == x[b, a]]
            assert src  # the bonus (a name) stood in its passage
            on_src[b, :, k, src] = -math.log(len(src))
            expect.append(math.log(a / len(src)))
    assert attn_loss(on_src, x, anc, names, n_draft).item() < 1e-9
    assert abs(attn_loss(even, x, anc, names, n_draft).item() - sum(expect) / len(expect)) < 1e-6
    assert attn_loss(logw, x, anc, names, n_draft).item() > 0.1  # the seeded drafter does not look there yet


def test_the_curriculum_trains_saves_resumes_and_ships(tmp_path, capsys):
    """Stage A (two steps) saves a state and logs its checks; a second call resumes that state and ships it: a
    weights folder whose checksums hold and whose tensors are the state's, with the recipe and the calls' logs."""
    run1 = tmp_path / "rc"
    recall_curriculum.main(["--device", "cpu", "--out", str(run1), "--stages", "A", "--a-steps", "2",
                            "--a-batch", "2", "--checks", "300"])
    log = json.loads((run1 / "log.json").read_text())
    assert [e.get("stage") or e.get("saved") or e.get("check") for e in log] == ["A", "A", "A"]
    assert log[0]["step"] == 2 and 0 <= log[0]["copy"] <= 1 and log[0]["loss"] > 0
    assert set(log[2]["copy"]) == {"300"}
    state = torch.load(run1 / "state.pt")
    assert not torch.equal(state["target.embed_tokens.weight"],
                           Engine("tiny", seed=0).state_dict()["target.embed_tokens.weight"])
    ship = tmp_path / "ship"
    recall_curriculum.main(["--device", "cpu", "--out", str(ship), "--resume", str(run1 / "state.pt"),
                            "--stages", "ship", "--ship-logs", str(run1 / "log.json")])
    weights.verify(ship)
    shipped = load_file(str(ship / "model.safetensors"))
    assert shipped.keys() == state.keys() and all(torch.equal(shipped[k], state[k]) for k in state)
    train_log = json.loads((ship / "train_log.json").read_text())
    assert train_log["calls"][0]["entries"] == log and train_log["resumed"] == str(run1 / "state.pt")
    assert "training" in json.loads((ship / "config.json").read_text()) and not (ship / "log.json").exists()


@pytest.mark.parametrize("argv, says", [(["--stages", "A,Z"], "unknown stage 'Z'"),
                                        (["--tune-steps", "300"], "--tune-steps takes two step counts"),
                                        (["--checks", "1k"], "comma-separated integers"),
                                        (["--resume", "nowhere.pt"], "--resume nowhere.pt: no such file")])
def test_the_curriculum_refuses_bad_options_in_one_line(tmp_path, capsys, argv, says):
    with pytest.raises(SystemExit) as e:
        recall_curriculum.main(["--device", "cpu", "--out", str(tmp_path / "rc"), *argv])
    assert e.value.code == 2 and says in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "rc").exists()  # nothing written before the options hold
