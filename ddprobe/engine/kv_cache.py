"""Latent KV cache of one request, two layouts behind one interface.

- ``paged``: page_size=1 token pool (SGLang style). ``buffer[layer, slot]`` is one latent row;
  ``req_to_token[0, i]`` is the slot of committed token i. Free slots come from a free list,
  in order or shuffled with a seeded generator (a server that has run for hours).
- ``contiguous``: committed token i lives in row i; new rows go right after the prefix.

Use: ``write_idx, slots = cache.reserve(n)`` -> the model writes its n new rows at write_idx and
the attention plan gets ``slots`` (paged: prefix slots then the new ones; contiguous: None);
then ``cache.commit(keep)`` keeps new rows ``keep`` (indices into the n, in order) as the next
committed tokens and releases the others. With ``poison=True`` every unused row is NaN, so any
attention read outside the plan turns the output into NaN.
"""
from __future__ import annotations

import torch

LAYOUTS = ("paged", "contiguous")


class KVCache:
    def __init__(self, num_layers: int, capacity: int, dim: int, layout: str = "paged", *,
                 dtype=torch.float32, device="cpu", shuffle: bool = False, seed: int = 0,
                 poison: bool = False, max_requests: int = 1):
        if layout not in LAYOUTS:
            raise ValueError(f"unknown kv layout {layout!r}; known: {', '.join(LAYOUTS)}")
        if capacity < 1:
            raise ValueError(f"kv capacity must be >= 1, got {capacity}")
        self.layout, self.capacity, self.dim, self.poison = layout, capacity, dim, poison
        self.device = torch.device(device)
        fill = float("nan") if poison else 0.0
        self.buffer = torch.full((num_layers, capacity, dim), fill, dtype=dtype, device=self.device)  # [layers, slots, D]
        self.shuffle, self.seed = shuffle, seed
        # paged: [max_requests, capacity]: slot of every committed token; -1 = none
        self.req_to_token = (torch.full((max_requests, capacity), -1, dtype=torch.int64, device=self.device)
                             if layout == "paged" else None)
        self.reset(refill=False)

    def reset(self, refill: bool = True) -> None:
        """Empty the cache for a new request (same buffers: a captured CUDA graph stays valid).
        refill: NaN-poison every row again (poison=True)."""
        self.committed = 0  # committed tokens of request 0
        self._pending: torch.Tensor | None = None  # write_idx of the reserved, uncommitted rows
        if refill and self.poison:
            self.buffer.fill_(float("nan"))
        if self.layout == "paged":
            order = torch.arange(self.capacity, dtype=torch.int64)
            if self.shuffle:
                order = order[torch.randperm(self.capacity, generator=torch.Generator().manual_seed(self.seed))]
            self._free = order.tolist()[::-1]  # pop() from the end -> allocation in `order`

    def take_slots(self, n: int) -> list[int]:
        """Static step (paged): n free slots, host side; the caller returns the unused ones with
        ``give_back``."""
        if n > len(self._free):
            raise ValueError(f"context beyond the cache: {self.committed} committed + {n} new rows > capacity {self.capacity}")
        return [self._free.pop() for _ in range(n)]

    def give_back(self, slots: list[int]) -> None:
        self._free.extend(slots[::-1])

    @property
    def free_slots(self) -> int:
        return len(self._free) if self.layout == "paged" else self.capacity - self.committed

    def layer(self, i: int) -> torch.Tensor:  # [slots, D]
        return self.buffer[i]

    def committed_slots(self) -> torch.Tensor:  # [committed] int64 (paged) / rows (contiguous)
        if self.layout == "paged":
            return self.req_to_token[0, : self.committed]
        return torch.arange(self.committed, dtype=torch.int64, device=self.device)

    def reserve(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Room for n new rows -> (write_idx [n], slots [committed + n] or None)."""
        if self._pending is not None:
            raise RuntimeError("reserve() twice without commit()")
        if n < 1 or n > self.free_slots:
            raise ValueError(f"context beyond the cache: {self.committed} committed + {n} new rows "
                             f"> capacity {self.capacity}")
        if self.layout == "paged":
            new = torch.tensor([self._free.pop() for _ in range(n)], dtype=torch.int64, device=self.device)
            self._pending = new
            return new, torch.cat([self.req_to_token[0, : self.committed], new])
        self._pending = torch.arange(self.committed, self.committed + n, dtype=torch.int64, device=self.device)
        return self._pending, None

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` committed tokens and free the rest (prefix reuse: the prompt stays, what
        was decoded after it goes). Paged: the free list is rebuilt from the slot table, in the
        allocation order, so it holds every slot the kept tokens do not use."""
        if self._pending is not None:
            raise RuntimeError("truncate() between reserve() and commit()")
        if not 0 <= n <= self.committed:
            raise ValueError(f"cannot truncate {self.committed} committed tokens to {n}")
        if self.layout == "paged":
            used = self.req_to_token[0, :n]
            keep = torch.zeros(self.capacity, dtype=torch.bool)
            keep[used.cpu()] = True
            order = torch.arange(self.capacity, dtype=torch.int64)
            if self.shuffle:
                order = order[torch.randperm(self.capacity, generator=torch.Generator().manual_seed(self.seed))]
            free = order[~keep[order]]
            self._free = free.tolist()[::-1]
            self.req_to_token[0, n:] = -1
            if self.poison and free.numel():
                self.buffer[:, free.to(self.device)] = float("nan")
        elif self.poison:
            self.buffer[:, n:] = float("nan")
        self.committed = n

    def commit(self, keep: torch.Tensor | list[int]) -> None:
        """Keep reserved rows ``keep`` (increasing indices into the reserved n) as the next tokens."""
        if self._pending is None:
            raise RuntimeError("commit() without reserve()")
        new = self._pending
        keep = torch.as_tensor(keep, dtype=torch.int64, device=self.device)
        k, c = int(keep.numel()), self.committed
        if self.layout == "paged":
            kept = new[keep]
            self.req_to_token[0, c: c + k] = kept
            drop = torch.ones(new.numel(), dtype=torch.bool, device=self.device)
            drop[keep] = False
            freed = new[drop]
            if self.poison and freed.numel():
                self.buffer[:, freed] = float("nan")
            self._free.extend(freed.tolist()[::-1])
        else:
            # accepted rows are in increasing order and never before their destination: gather
            # (a copy) then write to the tail, then poison what is left of the reserved rows
            if k and not torch.equal(keep, torch.arange(k, device=self.device)):
                self.buffer[:, c: c + k] = self.buffer[:, new[keep]]
            if self.poison and new.numel() > k:
                self.buffer[:, c + k: c + new.numel()] = float("nan")
        self.committed = c + k
        self._pending = None
