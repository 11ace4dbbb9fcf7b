# SPDX-License-Identifier: MIT
"""The runner's peer on a CUDA machine: Hugging Face transformers (SDPA attention) on a Llama
shape with random bf16 weights, measured the way `flashattn bench-model` and
`flashattn bench-serve` measure the runner.

  prefill   one prompt of P tokens, batch 1 (median of --reps after a warm-up)
  decode    greedy generation after a 512-token prompt at batch B: tokens of the decode steps
            over their time (the prefill timed alone and subtracted)
  serve     bench-serve's workload (the same seeded lengths: splitmix64 of --seed) served by
            static batching: requests in arrival order, --serve-batch at a time, prompts
            left-padded to the batch's longest, each batch generating its longest output.
            Throughput = requested output tokens / wall time. --serve-batches K times the first K
            batches only (the batches are drawn alike) and says so in the result.

Prints one line per measurement and, with --json FILE, one JSON object per line.
"""
import argparse
import json
import statistics
import sys
import time

SHAPES = {
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000, max_position_embeddings=8192, rope_theta=10000.0),
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                      rope_theta=500000.0),
}

MASK = (1 << 64) - 1


def splitmix(state):
    """bench_serve.c's next_u64: (new state, value)."""
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def workload(n, p_lo, p_hi, o_lo, o_hi, seed):
    """The (prompt, output) lengths bench-serve draws for --requests n --seed seed."""
    s, out = seed & MASK, []
    for _ in range(n):
        s, a = splitmix(s)
        s, b = splitmix(s)
        out.append((p_lo + a % (p_hi - p_lo + 1), o_lo + b % (o_hi - o_lo + 1)))
    return out


def parse_list(text):
    return [int(x) for x in text.split(",") if x]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=sorted(SHAPES), default="7b")
    ap.add_argument("--prefill", default="2048,8192", help="prompt lengths for the prefill rows ('' = none)")
    ap.add_argument("--decode-batch", default="1,32", help="batch sizes for the decode rows ('' = none)")
    ap.add_argument("--decode-prompt", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--serve-requests", type=int, default=512, help="bench-serve's --requests (0 = no serve row)")
    ap.add_argument("--serve-prompt", default="128,2048", help="bench-serve's --prompt-len LO,HI")
    ap.add_argument("--serve-output", default="64,512", help="bench-serve's --output-len LO,HI")
    ap.add_argument("--serve-batch", type=int, default=32)
    ap.add_argument("--serve-batches", type=int, default=0, help="time only the first K batches (0 = all)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", help="append one JSON object per measurement to this file")
    a = ap.parse_args(argv)

    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    if not torch.cuda.is_available():
        print("hf_peer: no CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(a.seed)
    cfg = LlamaConfig(**SHAPES[a.config], attn_implementation="sdpa", torch_dtype=torch.bfloat16)
    t = time.time()
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    # random weights at the scale that keeps activations finite through 32 layers
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
    torch.cuda.synchronize()
    print(f"hf_peer: {a.config}, transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}, built in {time.time() - t:.1f} s", flush=True)
    common = dict(shape=a.config, transformers=transformers.__version__, torch=torch.__version__,
                  device=torch.cuda.get_device_name())
    sink = open(a.json, "a") if a.json else None

    def emit(row):
        row = {**common, **row}
        print(json.dumps(row), flush=True)
        if sink:
            sink.write(json.dumps(row) + "\n")
            sink.flush()

    def ids(batch, n):
        return torch.randint(3, cfg.vocab_size, (batch, n), device="cuda")

    def timed(fn, reps):
        fn()
        torch.cuda.synchronize()
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            out.append(time.perf_counter() - t0)
        return statistics.median(out)

    gen = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        for n in parse_list(a.prefill):
            x = ids(1, n)
            s = timed(lambda: model(x, use_cache=False, logits_to_keep=1), a.reps)
            emit(dict(row="prefill", batch=1, tokens=n, seconds=s, tok_s=n / s))
        for b in parse_list(a.decode_batch):
            x = ids(b, a.decode_prompt)
            pre = timed(lambda: model.generate(x, max_new_tokens=1, min_new_tokens=1, **gen), 3)
            tot = timed(lambda: model.generate(x, max_new_tokens=a.decode_tokens + 1,
                                               min_new_tokens=a.decode_tokens + 1, **gen), 3)
            s = tot - pre
            emit(dict(row="decode", batch=b, prompt=a.decode_prompt, tokens=b * a.decode_tokens, seconds=s,
                      tok_s=b * a.decode_tokens / s, step_ms=1e3 * s / a.decode_tokens))
        if a.serve_requests > 0:
            p_lo, p_hi = parse_list(a.serve_prompt)
            o_lo, o_hi = parse_list(a.serve_output)
            reqs = workload(a.serve_requests, p_lo, p_hi, o_lo, o_hi, a.seed)
            batches = [reqs[i:i + a.serve_batch] for i in range(0, len(reqs), a.serve_batch)]
            timed_batches = batches[:a.serve_batches] if a.serve_batches > 0 else batches
            wall = out_tokens = 0.0
            for i, bt in enumerate(timed_batches):
                n = max(p for p, _ in bt)
                new = max(o for _, o in bt)
                x = ids(len(bt), n)
                # left padding: every prompt ends at the batch's last column
                mask = torch.zeros_like(x)
                for r, (p, _) in enumerate(bt):
                    mask[r, n - p:] = 1
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                model.generate(x, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, **gen)
                torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                wall += dt
                out_tokens += sum(o for _, o in bt)
                print(f"hf_peer: serve batch {i + 1}/{len(timed_batches)}: {len(bt)} requests, prompt {n}, "
                      f"{new} new tokens, {dt:.1f} s", file=sys.stderr, flush=True)
            emit(dict(row="serve", requests=a.serve_requests, prompt_len=[p_lo, p_hi], output_len=[o_lo, o_hi],
                      seed=a.seed, batch=a.serve_batch, batches_timed=len(timed_batches),
                      batches_total=len(batches), output_tokens=out_tokens, seconds=wall,
                      tok_s=out_tokens / wall))
    return 0


if __name__ == "__main__":
    sys.exit(main())
