"""The repository's tools/ scripts as modules, for the tests of their logic."""
import importlib
import os
import sys

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")


def import_tool(name: str):
    """tools/<name>.py imported (with tools/ on the path while it imports, so that its own
    imports of sibling scripts resolve)."""
    sys.path.insert(0, TOOLS)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(TOOLS)
