"""llama.cpp (through llama-cpp-python) for ``bench.quantized``, run as its own process:
``python llama_cpp_worker.py REQUEST.json`` prints a JSON result. A separate process keeps
llama.cpp's threads and CPU state (its AMX tiles, OpenMP runtime) apart from torch's and
sonarspec's. Imports nothing of sonarspec or torch.

Requests: {"op": "quantize", "src", "out", "ftype", "threads"} -> {"path"};
{"op": "decode", "path", "prompts" (token-id lists), "max_tokens", "repeats", "threads",
"prompt_lookup"} -> {"tok_s" (median over the rounds), "tokens" (of the last round)}.
"""
import json
import statistics
import sys
import time

import llama_cpp


def quantize(req):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, req["ftype"])
    params.allow_requantize = True
    params.nthread = req["threads"]
    if llama_cpp.llama_model_quantize(req["src"].encode(), req["out"].encode(), params) != 0:
        raise SystemExit(f"llama.cpp could not convert {req['src']} to {req['ftype']}")
    return {"path": req["out"]}


def decode(req):
    kwargs = {}
    if req.get("prompt_lookup"):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        kwargs["draft_model"] = LlamaPromptLookupDecoding()
    llm = llama_cpp.Llama(model_path=req["path"], n_ctx=1024, n_threads=req["threads"],
                          n_threads_batch=req["threads"], verbose=False, **kwargs)

    def run():
        outs = []
        for p in req["prompts"]:
            toks = []
            for t in llm.generate(p, top_k=1, temp=0.0, reset=True):
                toks.append(int(t))
                if len(toks) == req["max_tokens"]:
                    break
            outs.append(toks)
        return outs

    run()
    times, outs = [], None
    for _ in range(req["repeats"]):
        t0 = time.perf_counter()
        outs = run()
        times.append(time.perf_counter() - t0)
    n = len(req["prompts"]) * req["max_tokens"]
    return {"tok_s": round(n / statistics.median(times), 1), "tokens": outs}


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        request = json.load(fh)
    print(json.dumps({"quantize": quantize, "decode": decode}[request["op"]](request)))
