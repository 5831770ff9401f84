"""Shipped trained weights: ``ddprobe/engine/weights/<preset>/`` holds model.safetensors
(keys ``target.*`` and ``drafter.*``), config.json (the ModelConfig it was trained with),
tokenizer.json (word-level vocabulary) and SHA256SUMS. Loaded from disk, never a network.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from ..physics.presets import DrafterConfig, TargetConfig
from .tokenizer import WordTokenizer

ROOT = Path(__file__).resolve().parent / "weights"
FILES = ("model.safetensors", "config.json", "tokenizer.json")


def preset_dir(name: str) -> Path:
    return ROOT / name


def has_weights(name: str) -> bool:
    return all((preset_dir(name) / f).is_file() for f in FILES)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify(name_or_dir: str | Path) -> None:
    """Check every shipped file against SHA256SUMS; ValueError naming the first bad file."""
    d = Path(name_or_dir) if isinstance(name_or_dir, Path) else preset_dir(name_or_dir)
    sums = d / "SHA256SUMS"
    if not sums.is_file():
        raise ValueError(f"{sums} is missing")
    for line in sums.read_text().splitlines():
        digest, fname = line.split()
        if sha256(d / fname) != digest:
            raise ValueError(f"{d / fname}: checksum mismatch (corrupt or changed weights)")


def load_tokenizer(name: str) -> WordTokenizer:
    return WordTokenizer.load(preset_dir(name) / "tokenizer.json")


def config_mismatch(name: str, config) -> str | None:
    """None when the shipped weights of ``name`` fit ``config``, else what differs."""
    saved = json.loads((preset_dir(name) / "config.json").read_text())["config"]
    have = json.loads(json.dumps(dataclasses.asdict(config), default=str))
    defaults = {"target": TargetConfig, "drafter": DrafterConfig}
    for part in ("target", "drafter"):
        fields = defaults[part].__dataclass_fields__
        # a field newer than the saved config matches when it holds its default (a dense model has no experts)
        diff = sorted(k for k in set(saved[part]) | set(have[part])
                      if saved[part].get(k, _default(fields.get(k))) != have[part].get(k))
        if diff:
            return f"the {part} config differs in {', '.join(diff)}"
    return None


def _default(f):
    return json.loads(json.dumps(f.default, default=str)) if f is not None and f.default is not dataclasses.MISSING \
        else None


def load_into(engine, name: str) -> None:
    """Load the preset's trained weights into ``engine`` (cast to its dtype and device)."""
    from safetensors.torch import load_file

    d = preset_dir(name)
    if not has_weights(name):
        raise ValueError(f"no trained weights for preset {name!r} under {d}")
    why = config_mismatch(name, engine.config)
    if why:
        raise ValueError(f"{d}: weights were trained for another config ({why})")
    state = load_file(str(d / "model.safetensors"))
    engine.load_state_dict(state)


def save(engine, name_or_dir: str | Path, tokenizer: WordTokenizer, extra: dict | None = None) -> Path:
    """Write model.safetensors (fp32), config.json, tokenizer.json and SHA256SUMS."""
    import torch
    from safetensors.torch import save_file

    d = Path(name_or_dir) if isinstance(name_or_dir, Path) or "/" in str(name_or_dir) else preset_dir(name_or_dir)
    d.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in engine.state_dict().items()}
    save_file(state, str(d / "model.safetensors"))
    cfg = dataclasses.asdict(engine.config)
    (d / "config.json").write_text(json.dumps({"config": cfg, **(extra or {})}, indent=1, default=str))
    tokenizer.save(d / "tokenizer.json")
    (d / "SHA256SUMS").write_text("".join(f"{sha256(d / f)}  {f}\n" for f in FILES))
    return d
