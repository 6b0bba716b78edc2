"""Pure-Python twins of the native planner and step-metadata builder.

Not used by the engine: the tests check ``_C.Planner`` and ``_C.build_metadata`` against
them, and ``sonarspec bench-planner`` times them beside the native ones. They follow the
native semantics step for step (same admission order, same page handed out, same
preemption victim)."""
from __future__ import annotations

from collections import deque
from typing import Dict, List, Optional

import numpy as np

from ..runtime.metadata import TREE_MAX_NODES


class ReferencePlanner:
    def __init__(self, num_pages: int, page_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int):
        self.num_pages, self.page_size = num_pages, page_size
        self.max_num_seqs, self.budget, self.max_model_len = max_num_seqs, max_num_batched_tokens, max_model_len
        self.free = list(range(num_pages - 1, -1, -1))    # a stack: page 0 is handed out first
        self.seqs: Dict[int, dict] = {}
        self.waiting: deque = deque()
        self.running: List[int] = []

    def _pages_for(self, slots: int) -> int:
        return -(-slots // self.page_size)

    def _lookahead_room(self, num_slots: int, lookahead: int) -> int:
        return max(0, min(lookahead, self.max_model_len - num_slots))

    def add_request(self, seq_id: int, num_tokens: int) -> None:
        if seq_id in self.seqs:
            raise ValueError(f"sequence id {seq_id} is already in use")
        if num_tokens <= 0 or num_tokens > self.max_model_len or self._pages_for(num_tokens + 1) > self.num_pages:
            raise ValueError("request cannot fit")
        self.seqs[seq_id] = {"num_tokens": num_tokens, "num_computed": 0, "pages": []}
        self.waiting.append(seq_id)

    def append_tokens(self, seq_id: int, num_new: int) -> None:
        if not 0 <= num_new <= self.max_model_len - self.seqs[seq_id]["num_tokens"]:
            raise ValueError("appending past max_model_len")
        self.seqs[seq_id]["num_tokens"] += num_new

    def truncate(self, seq_id: int, length: int) -> None:
        s = self.seqs[seq_id]
        s["num_tokens"] = length
        s["num_computed"] = min(s["num_computed"], length)

    def commit(self, seq_id: int, num_computed: int) -> None:
        self.seqs[seq_id]["num_computed"] = num_computed

    def _release(self, s: dict) -> None:
        self.free.extend(reversed(s["pages"]))
        s["pages"] = []

    def _remove(self, seq_id: int) -> None:
        if seq_id in self.running:
            self.running.remove(seq_id)
        if seq_id in self.waiting:
            self.waiting.remove(seq_id)

    def finish(self, seq_id: int) -> None:
        self._release(self.seqs[seq_id])
        self._remove(seq_id)
        del self.seqs[seq_id]

    def _preempt(self, seq_id: int) -> None:
        s = self.seqs[seq_id]
        self._release(s)
        s["num_computed"] = 0
        self._remove(seq_id)
        self.waiting.appendleft(seq_id)

    def _grow(self, s: dict, slots: int) -> bool:
        need = self._pages_for(slots) - len(s["pages"])
        if need <= 0:
            return True
        if need > len(self.free):
            return False
        for _ in range(need):
            s["pages"].append(self.free.pop())
        return True

    def schedule(self, lookahead: int = 0):
        """The native plan's (scheduled, preempted, cached): the twin keeps no prefix cache,
        so nothing is found in one."""
        seqs, preempted, budget, i = [], [], self.budget, 0
        while i < len(self.running) and budget > 0:
            sid = self.running[i]
            s = self.seqs[sid]
            n = min(s["num_tokens"] - s["num_computed"], budget)
            if n <= 0:
                i += 1
                continue
            end = s["num_computed"] + n
            slots = end + (self._lookahead_room(end, lookahead) if end == s["num_tokens"] else 0)
            ok = self._grow(s, slots)
            while not ok and self.running[-1] != sid:
                victim = self.running[-1]
                preempted.append(victim)
                self._preempt(victim)
                ok = self._grow(s, slots)
            if not ok:
                preempted.append(sid)
                self._preempt(sid)
                break
            seqs.append((sid, s["num_computed"], n))
            s["num_computed"] += n
            budget -= n
            i += 1
        if preempted:
            return seqs, preempted, []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            sid = self.waiting[0]
            s = self.seqs[sid]
            n = min(s["num_tokens"] - s["num_computed"], budget)
            end = s["num_computed"] + n
            slots = end + (self._lookahead_room(end, lookahead) if end == s["num_tokens"] else 0)
            if not self._grow(s, slots):
                break
            self.waiting.popleft()
            self.running.append(sid)
            seqs.append((sid, s["num_computed"], n))
            s["num_computed"] += n
            budget -= n
        return seqs, preempted, []

    def page_table(self, seq_id: int) -> List[int]:
        return list(self.seqs[seq_id]["pages"])

    @property
    def num_free_pages(self) -> int:
        return len(self.free)


def build_metadata_reference(seqs, page_size: int, sliding_window: Optional[int] = None, trees=None,
                             want_mask: bool = True) -> dict:
    """numpy version of ``_C.build_metadata`` (same dict; trees as TreeBlock or None)."""
    B = len(seqs)
    q_lens = np.array([s[1] for s in seqs], dtype=np.int64)
    kv_lens = np.array([s[0] + s[1] for s in seqs], dtype=np.int64)
    q_max, kv_max, T = int(q_lens.max()), int(kv_lens.max()), int(q_lens.sum())
    out = {k: np.zeros(T, dtype=np.int64) for k in ("positions", "slot_mapping", "output_index", "token_seq",
                                                      "key_begin", "key_end", "tree_begin", "tree_mask")}
    max_pages = -(-kv_max // page_size)
    out["block_table"] = np.zeros((B, max_pages), dtype=np.int64)
    out["query_index"] = np.zeros((B, q_max), dtype=np.int64)
    used = [-(-(s[0] + s[1]) // page_size) for s in seqs]
    out["qo_indptr"] = np.concatenate([[0], np.cumsum(q_lens)])
    out["kv_indptr"] = np.concatenate([[0], np.cumsum(used)])
    out["kv_indices"] = np.concatenate([np.asarray(s[2][:u], dtype=np.int64) for s, u in zip(seqs, used)])
    out["kv_last_page_len"] = kv_lens - (np.array(used) - 1) * page_size
    out["kv_max"] = kv_max
    offset = 0
    for b, (start, n, table) in enumerate(seqs):
        pos = np.arange(start + n, dtype=np.int64)
        slots = np.asarray(table, dtype=np.int64)[pos // page_size] * page_size + pos % page_size
        out["block_table"][b, :used[b]] = table[:used[b]]
        rows = slice(offset, offset + n)
        out["slot_mapping"][rows] = slots[start:]
        out["query_index"][b, :n] = np.arange(offset, offset + n)
        out["output_index"][rows] = b * q_max + np.arange(n)
        out["token_seq"][rows] = b
        tree = None if trees is None else trees[b]
        if tree is None:
            out["positions"][rows] = pos[start:]
            out["key_end"][rows] = pos[start:] + 1
        else:
            out["positions"][rows] = tree.positions
            out["key_end"][rows] = out["tree_begin"][rows] = tree.begin
            out["tree_mask"][rows] = tree.bits
        offset += n
    if sliding_window:
        out["key_begin"] = np.maximum(out["positions"] + 1 - sliding_window, 0)
    has_tree = trees is not None and any(tr is not None for tr in trees)
    uniform_decode = bool((q_lens == 1).all() and (kv_lens == kv_max).all()) and not sliding_window and not has_tree
    out.update(uniform_queries=bool((q_lens == q_max).all()), uniform_decode=uniform_decode, has_tree=has_tree,
               mask=None)
    if want_mask and not uniform_decode:
        key = np.arange(kv_max)
        m = (key >= out["key_begin"][:, None]) & (key < out["key_end"][:, None])
        rel = key[None, :] - out["tree_begin"][:, None]
        bit = (out["tree_mask"].view(np.uint64)[:, None] >> np.clip(rel, 0, 63).astype(np.uint64)) & np.uint64(1)
        m |= (rel >= 0) & (rel < TREE_MAX_NODES) & (out["tree_mask"] != 0)[:, None] & bit.astype(bool)
        grid = np.zeros((B * q_max, kv_max), dtype=bool)
        grid[:, 0] = True   # padded query rows see one key so softmax stays finite
        grid[out["output_index"]] = m
        out["mask"] = grid.reshape(B, 1, q_max, kv_max)
    return out
