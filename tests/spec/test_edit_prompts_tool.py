"""tools/edit_prompts.py: the code-editing workloads of tools/bench_draft_stop.py."""
from helpers.tools import import_tool


def test_short_and_long_edit_prompts_split_the_functions_by_length():
    tool = import_tool("edit_prompts")
    short, long = tool.edit_prompts(), tool.edit_prompts(long=True)
    code = lambda p: p["prompt"].split("```python\n", 1)[1].removesuffix("```")  # noqa: E731
    assert len(short) >= 40 and len(long) >= 20
    assert all(200 <= len(code(p)) <= tool.MAX_SOURCE_CHARS for p in short)
    assert all(tool.MAX_SOURCE_CHARS < len(code(p)) <= tool.LONG_SOURCE_CHARS for p in long)
    assert not {p["id"] for p in short} & {p["id"] for p in long}
    assert tool.edit_prompts(5, long=True) == long[:5]   # a prefix of the same list
