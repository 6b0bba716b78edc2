"""``sonarspec bench``: its options and the benchmark each ``--spec`` runs."""
from __future__ import annotations

import argparse
import sys

from ..params import QUANTIZATION_CHOICES


def add_bench_parser(sub, positive_int) -> None:
    b = sub.add_parser("bench", help="decode speed vs transformers on the same weights")
    b.add_argument("--spec", default="none", choices=["none", "all", "mtp", "eagle_tree", "quantized"],
                   help="none: plain decoding vs transformers; quantized: a GGUF file's blocks, plain and "
                        "speculative (MTP K=--mtp-ks[0], ngram), beside llama.cpp on the same files (with "
                        "llama-cpp-python) and the bandwidth floor; all: every speculation scheme on the target; "
                        "mtp: plain, draft_target and MTP heads; eagle_tree: MTP chains and trees of the same "
                        "depths (--mtp-ks) plus tree-vs-chain verification attention")
    b.add_argument("--model", default="synthetic-30m",
                   help="HF model dir, .gguf file, smollm2, or synthetic-30m (random 30M Llama; with --spec all: the "
                        "packaged target)")
    b.add_argument("--draft", default="default",
                   help="draft model for --spec all/quantized ('default': the one that goes with the model, if any; "
                        "'none': no draft_target rows)")
    b.add_argument("--ks", type=positive_int, nargs="+", default=[2, 4, 6],
                   help="draft_target draft lengths (--spec quantized: the first)")
    b.add_argument("--draft-quantization", default="auto", choices=QUANTIZATION_CHOICES,
                   help="the drafters' weights (SpecConfig.quantization; auto: a float drafter in Q8_0 "
                        "beside a block-quantized target)")
    b.add_argument("--mtp", default="default",
                   help="MTP head dir for --spec all/mtp ('default': packaged head; 'none': no MTP rows)")
    b.add_argument("--mtp-ks", type=positive_int, nargs="+", default=[1, 2, 3, 4], help="MTP draft lengths (tree depths)")
    b.add_argument("--lookup-draft-tokens", type=int, default=8,
                   help="--spec all/mtp/quantized: a row of MTP chains (K=3, else the longest --mtp-ks; quantized: "
                        "--mtp-ks[0]) with lookup drafts of up to this many tokens (0: none)")
    b.add_argument("--tree-top-k", type=positive_int, default=None, help="eagle_tree: children per expanded node (4)")
    b.add_argument("--tree-nodes", type=positive_int, default=None, help="eagle_tree: draft nodes per tree (16)")
    b.add_argument("--spec-max-batch", type=int, default=None,
                   help="speculate only while at most this many sequences decode (engine option spec_max_batch)")
    b.add_argument("--spec-control", default="always", choices=["always", "adaptive"],
                   help="--spec all/mtp/eagle_tree: adaptive: each scheme speculates only while it measures "
                        "faster than plain decoding (engine option adaptive_speculation)")
    b.add_argument("--plot", default=None, help="write a PNG chart (--spec all; needs matplotlib)")
    b.add_argument("--batch-sizes", type=positive_int, nargs="+", default=[1, 8], help="batch sizes to measure")
    b.add_argument("--prompt-len", type=positive_int, default=32, help="--spec none: random prompt length")
    b.add_argument("--max-tokens", type=positive_int, default=128, help="tokens generated per prompt")
    b.add_argument("--repeats", type=positive_int, default=5, help="timed rounds (medians are reported)")
    b.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    b.add_argument("--no-transformers", action="store_true", help="skip the transformers baseline")
    b.add_argument("--no-llama-cpp", action="store_true", help="--spec quantized: skip llama.cpp")
    b.add_argument("--quantization", default="none", choices=QUANTIZATION_CHOICES,
                   help="the target's weights (none: float; auto: a GGUF file's own blocks; --spec quantized "
                        "always uses each file's own)")
    b.add_argument("--device", default="cpu", help="--spec all/mtp/eagle_tree: cpu or cuda")
    b.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="with --device cuda: small steps as CUDA graphs (the default there) or eager launches")
    b.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="--spec all/mtp/eagle_tree: activation dtype")
    b.add_argument("--temperature", type=float, default=0.0,
                   help="--spec all/mtp/eagle_tree: sample at this temperature (0: greedy)")
    b.add_argument("--seeded", action="store_true",
                   help="with --temperature: seed each prompt's request (coupled sampling: outputs checked equal "
                        "to plain decoding's); unseeded requests are rejection-sampled")
    b.add_argument("--top-p", type=float, default=1.0, help="--spec all/mtp/eagle_tree: nucleus for sampling")
    b.add_argument("--draft-sampling", action=argparse.BooleanOptionalAction, default=True,
                   help="draw sampled requests' drafts from the drafter's distribution (engine option "
                        "draft_sampling; --no-draft-sampling: their top tokens)")
    b.add_argument("--json", default=None, help="write results to this JSON file")
    b.set_defaults(func=run_bench)


def _mtp_head(mtp: str, model: str):
    """``--mtp`` as a head: None for 'none'; for 'default' the head that goes with the
    model (``spec.factory.find_mtp_head``: the packaged target's, SmolLM2's), or None."""
    if mtp != "default":
        return None if mtp == "none" else mtp
    from ..assets import resolve
    from ..spec.factory import find_mtp_head
    return find_mtp_head(resolve(model, "target"))


def run_bench(args) -> int:
    from . import bench_decode, print_table, write_json
    if args.spec == "quantized":
        from .quantized import bench_quantized, print_quantized_table
        from ..assets import resolve
        from ..spec.factory import find_draft_model
        mtp = _mtp_head(args.mtp, args.model)   # found once, for the model's own file: run on every file
        draft = None if args.draft == "none" else args.draft
        if draft == "default":
            draft = find_draft_model(resolve(args.model, "target"))
        info = bench_quantized(args.model, mtp, args.max_tokens, args.repeats, args.threads,
                               with_llama_cpp=not args.no_llama_cpp, mtp_k=args.mtp_ks[0], draft=draft,
                               draft_k=args.ks[0], draft_quantization=args.draft_quantization,
                               lookup_tokens=args.lookup_draft_tokens)
        print_quantized_table(info)
        if args.json:
            write_json(info, args.json)
        return 0
    if args.spec in ("all", "mtp", "eagle_tree"):
        from .spec import bench_spec, plot_spec, print_spec_table
        target = "default" if args.model == "synthetic-30m" else args.model
        mtp = _mtp_head(args.mtp, target)
        draft = None if args.draft == "none" else args.draft
        if args.spec != "all" and mtp is None:
            raise ValueError(f"--spec {args.spec} needs an MTP head: pass --mtp DIR (none is packaged for "
                             f"{args.model})")
        full, tree = args.spec == "all", args.spec == "eagle_tree"
        from ..spec.factory import TREE_NUM_NODES, TREE_TOP_K
        trees = [(d, args.tree_top_k or TREE_TOP_K, args.tree_nodes or TREE_NUM_NODES)
                 for d in (args.mtp_ks if tree else [3] if full else [])]
        info = bench_spec(target, None if tree else draft, args.ks, args.batch_sizes, args.max_tokens,
                          args.repeats, full and not args.no_transformers, args.threads, mtp, args.mtp_ks,
                          with_ngram=full, spec_max_batch=args.spec_max_batch, trees=trees if mtp else (),
                          device=args.device, dtype=args.dtype, temperature=args.temperature, top_p=args.top_p,
                          draft_sampling=args.draft_sampling, cuda_graphs=args.cuda_graphs,
                          quantization=args.quantization, draft_quantization=args.draft_quantization,
                          adaptive=args.spec_control == "adaptive",
                          lookup_tokens=0 if tree else args.lookup_draft_tokens, seeded=args.seeded)
        if tree:
            from .attention import bench_tree_attention, print_attention_table
            from ..models.loader import load_config
            info["attention"] = bench_tree_attention(load_config(info["target"]))
        print_spec_table(info)
        if tree:
            print("\nverification attention, one layer (float32, CPU): tree vs chain of equal query count")
            print_attention_table(info["attention"])
        if args.json:
            write_json(info, args.json)
        if args.plot and not plot_spec(info, args.plot):
            print("bench: matplotlib is not installed; no chart written", file=sys.stderr)
        return 0
    if (args.device != "cpu" or args.dtype != "float32" or args.temperature or args.top_p != 1.0
            or args.cuda_graphs is not None or args.seeded):
        raise ValueError("--device, --dtype, --temperature, --top-p, --seeded and --cuda-graphs apply to --spec "
                         "all/mtp/eagle_tree; --spec none runs greedy float32 on the CPU")
    info = bench_decode(None if args.model == "synthetic-30m" else args.model, args.batch_sizes,
                        args.prompt_len, args.max_tokens, args.repeats, args.threads,
                        with_transformers=not args.no_transformers, quantization=args.quantization)
    print_table(info)
    if args.json:
        write_json(info, args.json)
    return 0
