"""``sonarspec train-mtp``: corpus -> target features -> trained head -> export -> validation
through the inference engine."""
from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from typing import List, Optional, Sequence

import numpy as np
import torch

from ..models.loader import checkpoint_fingerprint, load_model, load_tokenizer, resolve_quantization
from ..models.mtp import MTPHead, check_num_layers
from ..models.mtp_loader import read_mtp_head, save_mtp_head
from .data import read_corpus
from .features import FeatureSet, compute_features
from .mtp_train import TrainConfig, train_head
from .windows import pack_documents, segment_prompts, tokenize_documents

EXPORT_FORMATS = ("sonarspec", "eagle1", "deepseek")


def _check_writable(out: str) -> None:
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"output directory {out!r} is an existing file")
    parent = os.path.dirname(os.path.abspath(out)) or "."
    probe = out if os.path.isdir(out) else parent
    try:   # the export writes a temporary directory beside ``out``: try one now
        os.makedirs(parent, exist_ok=True)   # missing parents are made, as for --work
        os.rmdir(tempfile.mkdtemp(prefix=".probe-", dir=parent))
        ok = os.access(probe, os.W_OK)
    except OSError:
        ok = False
    if not ok:
        raise ValueError(f"output directory {out!r} cannot be written (check that {probe!r} exists and is writable)")


def export_head(head: MTPHead, out: str, fmt: str, target_num_layers: int, info: dict,
                dtype: str = "float32") -> None:
    """Writes the head to ``out`` through a temporary directory, so a failed export never
    leaves a directory that looks complete."""
    tmp = tempfile.mkdtemp(prefix=".export-", dir=os.path.dirname(os.path.abspath(out)) or ".")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)   # mkdtemp makes it private; the head is an ordinary directory
    try:
        save_mtp_head(head, tmp, fmt, dtype=dtype, target_num_layers=target_num_layers)
        with open(os.path.join(tmp, "training.json"), "w") as fh:
            json.dump(info, fh, indent=2)
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def validate_in_engine(target_dir: str, head_dir: str, prompts: List[List[int]], k: int, max_tokens: int,
                       method: str = "mtp", quantization: str = "auto") -> dict:
    """Greedy speculative decoding (``method``: an MTP head, or a draft model with
    "draft_target") of held-out prompts through the engine (the target loaded with
    ``quantization``) -> acceptance per draft position and tau, checked token for token
    against plain decoding."""
    from ..llm import LLM
    from ..params import SamplingParams, SpecConfig
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm = LLM(target_dir, spec=SpecConfig(method=method, draft=head_dir, num_draft_tokens=k),
              quantization=quantization)
    got = [o.token_ids for o in llm.generate(prompts, params)]
    plain = [o.token_ids for o in LLM(target_dir, quantization=quantization).generate(prompts, params)]
    s = llm.stats()
    return {"method": method, "num_draft_tokens": k, "num_prompts": len(prompts), "max_tokens": max_tokens,
            "accepted_per_position": s["accepted_per_position"], "tau": s["acceptance_length"],
            "equal_to_plain_decoding": got == plain}


def frequent_tokens(tokens: np.ndarray, vocab_size: int, n: int):
    """(the ``n`` most frequent of ``tokens``' ids, sorted; the share of tokens they cover)."""
    counts = np.bincount(tokens.reshape(-1), minlength=vocab_size)
    ids = np.sort(np.argsort(-counts, kind="stable")[:n])
    return torch.from_numpy(ids.astype(np.int64)), float(counts[ids].sum() / counts.sum())


def train_mtp(target_dir: str, data: Sequence[str], out: str, work: Optional[str] = None, layout: str = "rmsnorm",
              seq_len: int = 256, max_windows: int = 2000, feature_dtype: str = "bfloat16",
              formats: Sequence[str] = ("sonarspec",), exclude: Sequence[str] = (), resume: bool = False,
              validate_prompts: int = 16, validate_tokens: int = 64, cfg: Optional[TrainConfig] = None,
              draft_vocab_size: int = 0, export_dtype: str = "float32", quantization: str = "auto",
              init_from: Optional[str] = None, feature_layers: Sequence[int] = (), head_layers: int = 1,
              log=print) -> dict:
    """``quantization``: how the target is loaded for the feature pass and the engine
    validation (``LLM``'s option; the head learns the features of the target as it is
    served); the frozen embedding and lm_head the head trains against are float.
    ``init_from``: a head directory of the same layout to start from (fine-tuning; a head
    without ``feature_layers`` may start one with them: its fusion starts at zero); its
    draft vocabulary is kept unless ``draft_vocab_size`` asks for a new one.
    ``feature_layers``: target layers the head reads besides the final states (EAGLE-3
    style fused features, ``models.mtp.FeatureFusion``). ``head_layers``: the head's decoder
    layers; started from a shallower head, the layers it lacks begin as identities (their
    output projections zero), so training starts from exactly that head."""
    cfg = cfg or TrainConfig()
    bad = [f for f in formats if f not in EXPORT_FORMATS]
    if bad:
        raise ValueError(f"unknown export format {bad[0]!r}; choose from {EXPORT_FORMATS}")
    if "eagle1" in formats and layout != "eagle1" or "deepseek" in formats and layout != "rmsnorm":
        raise ValueError(f"a {layout} head can be exported as sonarspec"
                         + (" or deepseek" if layout == "rmsnorm" else " or eagle1"))
    check_num_layers(head_layers)   # before the target loads
    if head_layers != 1 and any(f != "sonarspec" for f in formats):
        raise ValueError(f"a head of {head_layers} decoder layers can be exported as sonarspec only "
                         f"(the eagle1 and deepseek layouts hold one)")
    _check_writable(out)
    work = work or out.rstrip("/") + ".work"
    torch.manual_seed(cfg.seed)
    target = load_model(target_dir)
    quant = resolve_quantization(quantization, target_dir)
    feature_target = target if quant == "none" else load_model(target_dir, quantization=quantization)
    tokenizer = load_tokenizer(target_dir)
    train_docs, val_docs = read_corpus(data, exclude)
    eot = tokenizer.eos_token_id
    train_win = pack_documents(tokenize_documents(tokenizer, train_docs, eot), seq_len, max_windows)
    val_win = pack_documents(tokenize_documents(tokenizer, val_docs, eot), seq_len, max(1, max_windows // 20))
    log(f"data: {len(train_docs)} train / {len(val_docs)} validation documents -> "
        f"{len(train_win)} / {len(val_win)} windows of {seq_len} tokens "
        f"({train_win.drafted.mean():.0%} of the training positions drafted)")
    fp, tok_fp = checkpoint_fingerprint(target_dir), tokenizer.fingerprint()
    feature_fp = fp if quant == "none" else f"{fp}-{quant}"   # features of the quantized target differ
    head_cfg = copy.deepcopy(target.config)
    head_cfg.num_hidden_layers = head_layers
    head = MTPHead(head_cfg, layout, feature_layers).bind(target)   # checks the layers against the target
    features = "features" + "".join(f"-{x}" for x in head.feature_layers)   # a directory per set of layers
    for name, win in (("train", train_win), ("val", val_win)):
        compute_features(feature_target, win, os.path.join(work, features, name), feature_fp, tok_fp,
                         feature_dtype, log=log, feature_layers=head.feature_layers)
    del feature_target
    train_fs = FeatureSet(os.path.join(work, features, "train"), feature_fp)
    val_fs = FeatureSet(os.path.join(work, features, "val"), feature_fp)
    if init_from:
        start = read_mtp_head(init_from, target.config, compact_weights=False)
        if start.layout != layout:
            raise ValueError(f"{init_from}: the head has the {start.layout} layout, this run trains {layout}")
        if start.feature_layers not in ((), head.feature_layers):
            raise ValueError(f"{init_from}: the head reads target layers {list(start.feature_layers)}, this run "
                             f"trains one reading {list(head.feature_layers)}")
        if len(start.layers) > head_layers:
            raise ValueError(f"{init_from}: the head has {len(start.layers)} decoder layers, this run trains "
                             f"{head_layers}")
        missing, _ = head.load_state_dict(start.state_dict(), strict=False)
        added = head.layers[len(start.layers):]
        added_names = tuple(f"layers.{i}." for i in range(len(start.layers), head_layers))
        lacking = [k for k in missing if not k.startswith(("fusion.",) + added_names)]
        if lacking:
            raise ValueError(f"{init_from}: the head lacks {lacking[0]}")
        for layer in added:   # residual blocks that add nothing yet
            torch.nn.init.zeros_(layer.self_attn.o_proj.weight)
            torch.nn.init.zeros_(layer.mlp.down_proj.weight)
        log(f"starting from the head in {init_from}"
            + (f" ({len(added)} decoder layer(s) added as identities)" if len(added) else ""))
    ids = coverage = None
    drafted = train_win.tokens[train_win.drafted]
    if draft_vocab_size:   # the head proposes from these tokens only, so it is trained over them
        ids, coverage = frequent_tokens(drafted, target.config.vocab_size, draft_vocab_size)
        log(f"draft vocabulary: the {len(ids)} most frequent tokens cover {coverage:.1%} of the training tokens")
    elif init_from and start.draft_vocab is not None:   # fine-tuning keeps the head's vocabulary
        ids = start.draft_vocab.cpu()
        coverage = float(np.isin(drafted, ids.numpy()).mean())
        draft_vocab_size = len(ids)
        log(f"draft vocabulary of {init_from}: {len(ids)} tokens, {coverage:.1%} of the training tokens")
    history = train_head(head, train_fs, val_fs, cfg, os.path.join(work, f"train-{layout}"), resume, log, ids)
    head.eval()
    if ids is not None:
        head.set_draft_vocab(ids)
    info = {"target_fingerprint": fp, "target_quantization": quant, "init_from": init_from,
            "tokenizer_fingerprint": tok_fp, "layout": layout, "data": list(data),
            "seq_len": seq_len, "train_windows": len(train_win), "val_windows": len(val_win),
            "train": history["config"], "final_val": history["val"][-1] if history["val"] else None,
            "num_params": sum(p.numel() for p in head.parameters()),
            "feature_layers": list(head.feature_layers),
            "draft_vocab_size": draft_vocab_size or None, "draft_vocab_coverage": coverage,
            "export_dtype": export_dtype}
    export_head(head, out, "sonarspec", target.config.num_hidden_layers, info, export_dtype)
    for fmt in formats:
        if fmt != "sonarspec":
            export_head(head, f"{out.rstrip('/')}-{fmt}", fmt, target.config.num_hidden_layers, info, export_dtype)
    prompts = segment_prompts(val_win.tokens, val_win.segments, val_win.drafted, validate_prompts)
    if prompts:
        info["engine_validation"] = validate_in_engine(target_dir, out, prompts, max(3, cfg.unroll), validate_tokens,
                                                       quantization=quantization)
        log("engine validation: acceptance per position "
            + " ".join(f"{a:.3f}" for a in info["engine_validation"]["accepted_per_position"])
            + f", tau {info['engine_validation']['tau']:.3f}")
        with open(os.path.join(out, "training.json"), "w") as fh:
            json.dump(info, fh, indent=2)
    return info
