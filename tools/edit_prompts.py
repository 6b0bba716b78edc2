"""Code-editing chat prompts: a standard-library function's source with an instruction to
rewrite it (add type hints, rename variables, add comments, ...), so that the reply
repeats much of the prompt - the workload prompt lookup drafts are for. Built from
material every machine has; none of these tasks is in the chat corpus (its code prompts
ask to explain or to write code, never to edit code given in full).

    from edit_prompts import edit_prompts
    prompts = edit_prompts(40)   # [{"id": ..., "prompt": ...}, ...], the same list on every machine
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
from typing import Dict, List

MODULES = ["textwrap", "posixpath", "shlex", "string", "fnmatch", "difflib", "json.decoder", "json.encoder",
           "heapq", "bisect", "base64", "calendar", "colorsys", "glob", "html", "ipaddress", "keyword", "quopri",
           "statistics", "urllib.parse", "uuid", "copy", "csv", "gettext", "locale", "netrc", "pprint", "random"]

TASKS = [
    "Add type hints to this function and return the full code:",
    "Rename the local variables in this function to more descriptive names and return the full code:",
    "Add a comment above each block of this function explaining what it does, and return the full code:",
    "Rewrite this function with a docstring in Google style and return the full code:",
]

MAX_SOURCE_CHARS = 1200   # functions whose source is longer are left out (the prompt stays short)
LONG_SOURCE_CHARS = 8000  # edit_prompts(long=True): the functions past MAX_SOURCE_CHARS, up to this


def _functions(shortest: int = 200, longest: int = MAX_SOURCE_CHARS) -> List[str]:
    """Source of the module-level Python functions of MODULES (public, ``shortest`` to
    ``longest`` characters), taking one function of each module in turn (by name within a
    module), so that any prefix of the list spans the modules."""
    per_module = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        sources = []
        for fname, fn in sorted(vars(module).items()):
            if fname.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != module.__name__:
                continue
            try:
                src = inspect.getsource(fn)
            except (OSError, TypeError):
                continue
            if shortest <= len(src) <= longest:
                sources.append(src)
        per_module.append(sources)
    return [m[i] for i in range(max(map(len, per_module), default=0)) for m in per_module if i < len(m)]


def edit_prompts(limit: int = 0, long: bool = False) -> List[Dict]:
    """Up to ``limit`` prompts (0: all), each {"id", "prompt"}; task i goes with function i.
    ``long``: the functions of MAX_SOURCE_CHARS to LONG_SOURCE_CHARS characters instead
    (prompts of about 300-1000 tokens)."""
    prompts = []
    sources = _functions(MAX_SOURCE_CHARS + 1, LONG_SOURCE_CHARS) if long else _functions()
    for i, src in enumerate(sources):
        text = f"{TASKS[i % len(TASKS)]}\n\n```python\n{src}```"
        prompts.append({"id": hashlib.sha256(text.encode()).hexdigest()[:16], "prompt": text})
    return prompts[:limit] if limit else prompts
