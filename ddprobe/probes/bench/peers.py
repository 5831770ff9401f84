"""Production MLA decode kernels as benchmark peers: FlashMLA and FlashInfer MLA (fa3 and fa2 backends).

    pip install 'ddprobe[peers]'     # sgl-flash-mla (SGLang's FlashMLA fork) and flashinfer-python

Also PyTorch's own attention as weaker peers: ``sdpa_peer`` (scaled_dot_product_attention with a dense bool
mask) and ``flex_peer`` (FlexAttention with a block mask), heads x rows folded into one query dimension.

SGLang's own Triton verify is not here: it takes the tree mask and the page_size=1 pool, so it runs as the verify
path ``sglang`` (ddprobe/engine/kernels/sglang.py) beside ``paged`` in the same benchmark.

Used by ``verify_bench`` (``ddprobe bench verify``). ``make(name, ...)`` builds everything a peer needs once
(workspace, page table, plan) and returns ``run(q [R, H, D], kv [rows, D]) -> out [R, H, v_dim]``; when the
library is missing, the GPU is not one it runs on, or it refuses the shape, it raises ``PeerUnavailable``
with the reason, and the benchmark records that reason instead of a time.

Neither library takes a tree mask. Both run with a causal mask over the R new rows (row i sees the whole
prefix and new rows 0..i: the `chain` tree), which costs what a tree mask would: every row sees the whole
prefix, and the new rows are R of prefix + R columns. Their output is checked against the fp32 reference
under that causal mask. Both read the same contiguous cache rows as `split`: FlashMLA through pages of
64 rows (a view of the rows, identity page table; the kv tensor must hold a multiple of 64 rows, see
``rows_for``), FlashInfer through page size 1 (identity index list) with the latent and rope parts as two
strided views of the 576-wide rows.
"""
from __future__ import annotations

import warnings

PEERS = ("flashmla", "flashinfer-fa3", "flashinfer-fa2")
FLASHMLA_PAGE = 64
WORKSPACE_BYTES = 128 * 2**20


class PeerUnavailable(RuntimeError):
    """The peer cannot run here; the message says why (one line)."""


def rows_for(n: int) -> int:
    """Rows to allocate for n cache rows so that FlashMLA's 64-row pages cover them."""
    return -(-n // FLASHMLA_PAGE) * FLASHMLA_PAGE


def _need_hopper(name: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise PeerUnavailable(f"{name} needs a CUDA GPU")
    if torch.cuda.get_device_capability()[0] != 9:
        raise PeerUnavailable(f"{name} is timed here on Hopper (sm_90) only, this GPU is "
                              f"sm_{''.join(map(str, torch.cuda.get_device_capability()))}")


def _flashmla(prefix: int, rows: int, heads: int, v_dim: int, sm_scale: float):
    import torch

    _need_hopper("flashmla")
    try:
        import flash_mla
    except Exception as e:  # noqa: BLE001  (ImportError, or a library that fails to load)
        raise PeerUnavailable(f"flash_mla does not import ({type(e).__name__}: {str(e)[:120]}); "
                              "pip install 'ddprobe[peers]'") from None
    n = prefix + rows
    pages = rows_for(n) // FLASHMLA_PAGE
    block_table = torch.arange(pages, dtype=torch.int32, device="cuda")[None]
    seqlens = torch.tensor([n], dtype=torch.int32, device="cuda")
    meta, _ = flash_mla.get_mla_metadata()

    def run(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        if kv.shape[0] < pages * FLASHMLA_PAGE:
            raise PeerUnavailable(f"flashmla needs the cache rows padded to {FLASHMLA_PAGE} (rows_for)")
        k_cache = kv[: pages * FLASHMLA_PAGE].view(pages, FLASHMLA_PAGE, 1, kv.shape[1])
        out, _ = flash_mla.flash_mla_with_kvcache(q[None], k_cache, block_table, seqlens, v_dim, meta,
                                                  softmax_scale=sm_scale, causal=True, use_legacy=True)
        return out[0]
    return run


def _flashinfer(backend: str, prefix: int, rows: int, heads: int, v_dim: int, pe_dim: int, sm_scale: float, dtype):
    import torch

    _need_hopper(f"flashinfer-{backend}")
    try:
        from flashinfer.mla import BatchMLAPagedAttentionWrapper
    except Exception as e:  # noqa: BLE001
        raise PeerUnavailable(f"flashinfer does not import ({type(e).__name__}: {str(e)[:120]}); "
                              "pip install 'ddprobe[peers]'") from None
    n = prefix + rows
    dev = "cuda"
    w = BatchMLAPagedAttentionWrapper(torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev), backend=backend)
    i32 = dict(dtype=torch.int32, device=dev)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 0.7.2 deprecates the flat plan/run forms; they still work
        w.plan(qo_indptr=torch.tensor([0, rows], **i32), kv_indptr=torch.tensor([0, n], **i32),
               kv_indices=torch.arange(n, **i32), kv_len_arr=torch.tensor([n], **i32), num_heads=heads,
               head_dim_ckv=v_dim, head_dim_kpe=pe_dim, page_size=1, causal=True, sm_scale=sm_scale,
               q_data_type=dtype, kv_data_type=dtype)

    def run(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        c = kv[:n].view(n, 1, kv.shape[1])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return w.run(q_nope=q[..., :v_dim], q_pe=q[..., v_dim:], ckv_cache=c[..., :v_dim], kpe_cache=c[..., v_dim:])
    return run


# ---------------------------------------------------------------- PyTorch's own attention (weak peers)
def sdpa_peer(prefix, mask, heads, v_dim):
    """SDPA over the contiguous cache with a dense bool mask; heads x rows folded (MQA)."""
    import torch
    import torch.nn.functional as F

    full = torch.cat([torch.ones(mask.shape[0], prefix, dtype=torch.bool, device=mask.device), mask], 1)
    dense = full.repeat_interleave(heads, dim=0)[None, None]  # [1,1,Hq,n] row hq = r*H+h

    def run(q, kv, sm_scale):
        r, h, d = q.shape
        n = prefix + r
        qf = q.reshape(1, 1, r * h, d)
        k = kv[:n].view(1, 1, n, d)
        v = kv[:n, :v_dim].unsqueeze(0).unsqueeze(0)
        o = F.scaled_dot_product_attention(qf, k, v, attn_mask=dense, scale=sm_scale)
        return o.view(r, h, v_dim)
    return run


def flex_peer(prefix, mask, heads, v_dim):
    """FlexAttention with a block mask built from the tree (compiled once per shape)."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    r = mask.shape[0]
    n = prefix + r
    tree = mask

    def mask_mod(b, h, qi, ki):
        row = qi // heads
        col = (ki - prefix).clamp(min=0)
        return (ki < prefix) | tree[row, col]
    bm = create_block_mask(mask_mod, 1, 1, r * heads, n, device=mask.device)
    fa = torch.compile(flex_attention, dynamic=False)

    def run(q, kv, sm_scale):
        rr, h, d = q.shape
        qf = q.reshape(1, 1, rr * h, d)
        k = kv[:n].view(1, 1, n, d)
        v = kv[:n, :v_dim].unsqueeze(0).unsqueeze(0)
        o = fa(qf, k, v, block_mask=bm, scale=sm_scale, kernel_options={"BLOCK_M": 32, "BLOCK_N": 32, "num_stages": 1})
        return o.view(rr, h, v_dim)
    return run


def make(name: str, prefix: int, rows: int, heads: int, v_dim: int, pe_dim: int, sm_scale: float, dtype=None):
    """A ready-to-time peer ``run(q, kv)`` (bf16 unless ``dtype``); PeerUnavailable (with the reason) when it
    cannot run here."""
    if name == "flashmla":
        return _flashmla(prefix, rows, heads, v_dim, sm_scale)
    if name in ("flashinfer-fa3", "flashinfer-fa2"):
        import torch

        return _flashinfer(name.rsplit("-", 1)[1], prefix, rows, heads, v_dim, pe_dim, sm_scale,
                           dtype or torch.bfloat16)
    raise ValueError(f"unknown peer {name!r}; known: {', '.join(PEERS)}")
