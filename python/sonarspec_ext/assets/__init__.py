"""Packaged default models (trained by ``tools/train_base_models.py``)."""
from __future__ import annotations

import os

NAMES = ("target", "draft", "mtp")


def path(name: str) -> str:
    """Directory of a packaged model: ``"target"``, ``"draft"`` or ``"mtp"``."""
    if name not in NAMES:
        raise ValueError(f"unknown packaged model {name!r}; choose one of {NAMES}")
    d = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    if not os.path.isfile(os.path.join(d, "config.json")):
        raise FileNotFoundError(f"packaged model {name!r} is not present in this installation ({d})")
    return d


def resolve(model: str, default_name: str) -> str:
    """``"default"`` -> the packaged model ``default_name``; anything else is a directory."""
    return path(default_name) if model == "default" else model
