"""The draft's shape in a report (issue 61): a commit file's tree and chain cells side by side, and an advise file's
tree, chain or off decision per context. Tables only, from the typed rows and the summary; no torch. Every table says
its batch size (1: the steps are single-request steps)."""
from __future__ import annotations

from ..results import Result
from ..units import fmt_tokens
from .table import Table


def _f(v, spec: str = ".2f") -> str:
    return "-" if not isinstance(v, (int, float)) or isinstance(v, bool) else format(v, spec)


def commit_tables(r: Result) -> list[Table]:
    """Per text, context and budget: the tree's commit length beside the chain's at min(budget, L), the tree's own
    spine on the same steps, its gain over it, the share of commits from rank >= 1 siblings and the spine check.
    Empty for a file without shapes (before issue 61, or a server's)."""
    rows = [x for x in r.records if x.tree and x.commit_len is not None]
    if not any(x.tree == "chain" for x in rows) and not any(x.spine_commit_len for x in rows):
        return []
    depth = max((x.budget or 0 for x in rows if x.tree == "chain"), default=0)
    chain = {(x.text, x.ctx, x.budget): x for x in rows if x.tree == "chain"}
    out = []
    for x in sorted((x for x in rows if x.tree == "ddtree"), key=lambda x: (x.text, x.ctx, x.budget or 0)):
        c = chain.get((x.text, x.ctx, min(x.budget or 0, depth) if depth else None))
        out.append([x.text, fmt_tokens(x.ctx), _f(x.budget, "d"), _f(x.commit_len), _f(c.commit_len if c else None),
                    _f(c.budget if c else None, "d"), _f(x.spine_commit_len), _f(x.gain_over_spine) + "x",
                    _f(x.sibling_share, ".0%"), _f(x.spine_violations, "d")])
    return [Table("Tree and chain side by side (batch 1)",
                  ["text", "ctx", "budget", "ddtree commit", "chain commit", "chain depth", "tree's spine",
                   "gain over spine", "from siblings", "spine bugs"], out,
                  "The chain a budget buys is min(budget, L) deep. The tree's spine is its own rank-0 path, measured "
                  "on the same steps; from siblings: committed draft tokens from rank >= 1; spine bugs: steps where "
                  "the tree accepted fewer than its spine (a bug under greedy decoding, held at 0 by the tests).")]


def advise_tables(r: Result) -> list[Table]:
    """Tree, chain or off per path, text and context (``summary.decisions``), where a chain was among the choices."""
    ds = [d for d in (r.summary.get("decisions") or []) if isinstance(d, dict) and d.get("chain_tok_s") is not None]
    if not ds:
        return []
    rows = [[str(d["path"]), str(d["text"]), fmt_tokens(int(d["ctx"])), f"ddtree@{d['ddtree_budget']}",
             _f(d["ddtree_tok_s"], ".3g"), f"chain@{d['chain_depth']}", _f(d["chain_tok_s"], ".3g"),
             _f(d["plain_tok_s"], ".3g"), str(d["choice"]), _f(d["margin"]) + "x"] for d in ds]
    ran = "".join(f" {what}: {'; '.join(sorted(ks))}." for what, key in (("The chain ran on", "chain_kernel"),
                                                                       ("Plain decoding ran on", "plain_kernel"))
                  if (ks := {str(d[key]) for d in ds if d.get(key)}))
    return [Table(f"Tree, chain or off (batch {ds[0].get('batch', 1)})",
                  ["path", "text", "ctx", "tree", "tok/s", "chain", "tok/s", "off tok/s", "choice", "margin"], rows,
                  "The best tree and the best chain at each context against plain decoding; the margin is the "
                  "choice's tokens/s over the next best. Off is chosen only against a measured plain step." + ran)]
