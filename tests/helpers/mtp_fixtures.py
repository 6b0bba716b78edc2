"""Tiny MTP heads for tests: random ones in every layout, and one briefly trained on the
target's own samples (so acceptance is well above zero)."""
import copy

import numpy as np
import torch

from sonarspec_ext import LLM, SamplingParams
from sonarspec_ext.models.loader import load_model
from sonarspec_ext.models.mtp import MTPHead
from sonarspec_ext.models.mtp_loader import save_mtp_head


def random_head(target_dir: str, layout: str = "rmsnorm", seed: int = 0, feature_layers=(),
                fusion_std: float = 0.0, num_layers: int = 1) -> MTPHead:
    """``feature_layers``: a fused head (its fusion drawn with ``fusion_std``; 0: zero, as
    training starts it); ``num_layers``: its decoder layers."""
    target = load_model(target_dir)
    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = num_layers
    torch.manual_seed(seed)
    head = MTPHead(cfg, layout, feature_layers)
    with torch.no_grad():  # non-trivial norm weights and biases, so a wrong key mapping shows
        for name, p in head.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5) if "norm" in name else p.normal_(0, 0.1)
        if fusion_std:
            head.fusion.proj.weight.normal_(0, fusion_std)
    return head.bind(target)


def sampled_windows(target_dir: str, n: int, length: int, seed: int = 0) -> np.ndarray:
    """``n`` windows of the target's own sampled text (temperature 0.5)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 256, (4,), generator=g).tolist() for _ in range(n)]
    outs = LLM(target_dir).generate(prompts, SamplingParams(max_tokens=length - 4, temperature=0.5, seed=seed,
                                                            ignore_eos=True))
    return np.array([p + o.token_ids for p, o in zip(prompts, outs)], dtype=np.int32)


def trained_head(target_dir: str, work: str, layout: str = "rmsnorm", steps: int = 150,
                 feature_layers=()) -> MTPHead:
    from sonarspec_ext.train.features import FeatureSet, compute_features
    from sonarspec_ext.train.mtp_train import TrainConfig, train_head
    win = sampled_windows(target_dir, 72, 48)
    target = load_model(target_dir)
    quiet = dict(log=lambda *_: None, feature_layers=feature_layers)
    compute_features(target, win[:64], f"{work}/features/train", "t", "k", "float32", **quiet)
    compute_features(target, win[64:], f"{work}/features/val", "t", "k", "float32", **quiet)
    head = random_head(target_dir, layout, feature_layers=feature_layers)
    cfg = TrainConfig(max_steps=steps, lr=3e-3, warmup=10, unroll=2, eval_every=steps, batch_size=8)
    train_head(head, FeatureSet(f"{work}/features/train"), FeatureSet(f"{work}/features/val"), cfg,
               f"{work}/run", log=lambda *_: None)
    return head.eval()


def save(head: MTPHead, path: str, fmt: str = "sonarspec", **kw) -> str:
    save_mtp_head(head, path, fmt, **kw)
    return path
