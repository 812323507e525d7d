#!/usr/bin/env python3
"""tally's PyTorch peers: the same scoring workloads through HF transformers, on the same device.

Three ways PyTorch users score N items against one query:
  padded       each query+item as its own row, rows batched and right-padded;
  packed_mask  SGLang's multi-item packing: query + all items in one sequence, positions restarting
               after the query, a custom 4-D mask (each item sees the query and itself) through SDPA;
  kv_expand    the query prefilled once, its KV cache expanded over a batch of items.
All three run the LM head only on the rows that are scored, as tally does.

Before any peer is timed it must reproduce tally's float64 fixtures (HF-layout, token-id cases)
within 1e-3 in float32; the timed workload's scores of the three peers must also agree.

    pytorch_peers.py --model DIR --device cuda --dtype bfloat16 --scenario s1 --items 500 --out peers.json

Needs torch and transformers (the GPU machine has both); validated on the CPU with `--preset tiny`.
"""

import argparse
import json
import pathlib
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, DynamicCache

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "tests" / "fixtures"
SCENARIOS = {"s1": (2000, 20, 20), "s2": (1900, 10, 10)}  # static prefix, dynamic suffix, item tokens


def label_probabilities(model, hidden, labels, apply_softmax):
    """Next-token probabilities of `labels` from final hidden states `[rows, hidden]`."""
    logits = model.lm_head(hidden).float()
    if apply_softmax:
        return torch.softmax(logits[:, labels], dim=-1)
    return torch.log_softmax(logits, dim=-1)[:, labels].exp()


def hidden_states(model, **inputs):
    return model.model(**inputs).last_hidden_state


def padded(model, query, items, labels, apply_softmax, batch_rows):
    """Every item as its own row `query + item`, right-padded; the row's last real token is scored."""
    out = []
    for start in range(0, len(items), batch_rows):
        rows = [query + item for item in items[start : start + batch_rows]]
        width = max(map(len, rows))
        ids = torch.zeros(len(rows), width, dtype=torch.long, device=model.device)
        mask = torch.zeros_like(ids)
        for r, row in enumerate(rows):
            ids[r, : len(row)] = torch.tensor(row, device=model.device)
            mask[r, : len(row)] = 1
        hidden = hidden_states(model, input_ids=ids, attention_mask=mask)
        last = mask.sum(1) - 1
        out.append(label_probabilities(model, hidden[torch.arange(len(rows)), last], labels, apply_softmax))
    return torch.cat(out)


def packed_mask(model, query, items, labels, apply_softmax, batch_rows):
    """One sequence `query item1 … itemN`, item token k at position len(query)+k, 4-D additive mask."""
    del batch_rows  # one sequence holds every item
    q = len(query)
    lengths = [len(item) for item in items]
    total = q + sum(lengths)
    ids = torch.tensor([query + [t for item in items for t in item]], device=model.device)
    positions = torch.cat([torch.arange(q)] + [torch.arange(q, q + n) for n in lengths]).unsqueeze(0).to(model.device)
    allowed = torch.zeros(total, total, dtype=torch.bool, device=model.device)
    allowed[:q, :q] = torch.ones(q, q, dtype=torch.bool, device=model.device).tril()
    ends = []
    start = q
    for n in lengths:
        allowed[start : start + n, :q] = True
        allowed[start : start + n, start : start + n] = torch.ones(n, n, dtype=torch.bool, device=model.device).tril()
        start += n
        ends.append(start - 1)
    mask = torch.zeros(1, 1, total, total, dtype=model.dtype, device=model.device)
    mask.masked_fill_(~allowed, torch.finfo(model.dtype).min)
    hidden = hidden_states(model, input_ids=ids, position_ids=positions, attention_mask=mask)
    return label_probabilities(model, hidden[0, ends], labels, apply_softmax)


def kv_expand(model, query, items, labels, apply_softmax, batch_rows):
    """The query once into a KV cache; each batch of items continues from a copy expanded over it."""
    q = len(query)
    prefix = DynamicCache(config=model.config)
    model.model(input_ids=torch.tensor([query], device=model.device), past_key_values=prefix, use_cache=True)
    layers = [(layer.keys, layer.values) for layer in prefix.layers]
    out = []
    for start in range(0, len(items), batch_rows):
        batch = items[start : start + batch_rows]
        width = max(map(len, batch))
        ids = torch.zeros(len(batch), width, dtype=torch.long, device=model.device)
        mask = torch.zeros(len(batch), q + width, dtype=torch.long, device=model.device)
        mask[:, :q] = 1
        for r, item in enumerate(batch):
            ids[r, : len(item)] = torch.tensor(item, device=model.device)
            mask[r, q : q + len(item)] = 1
        cache = DynamicCache(config=model.config)
        for index, (keys, values) in enumerate(layers):
            cache.update(keys.expand(len(batch), -1, -1, -1), values.expand(len(batch), -1, -1, -1), index)
        positions = torch.arange(q, q + width, device=model.device).expand(len(batch), -1)
        hidden = hidden_states(model, input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
        last = torch.tensor([len(item) - 1 for item in batch], device=model.device)
        out.append(label_probabilities(model, hidden[torch.arange(len(batch)), last], labels, apply_softmax))
    return torch.cat(out)


PEERS = {"padded": padded, "packed_mask": packed_mask, "kv_expand": kv_expand}


def score(peer, model, request, batch_rows):
    query, items = request["query"], request["items"]
    if request.get("item_first"):
        # item + query: nothing to share, every pair is its own row.
        query, items, peer = [], [item + request["query"] for item in items], padded
    with torch.inference_mode():
        return peer(model, query, items, request["label_token_ids"], request.get("apply_softmax", False), batch_rows)


def load(path, device, dtype):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(device)
    return model.eval()


def check_fixtures(device, batch_rows):
    """Each peer against the float64 fixture scores, in float32. Returns {peer: worst relative error}."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    worst = {name: 0.0 for name in PEERS}
    checked = []
    for path in sorted((FIXTURES / "cases").glob("*.json")):
        case = json.loads(path.read_text())
        model_dir = FIXTURES / "models" / case["model"]
        request = case["request"]
        if not (model_dir / "config.json").exists() or isinstance(request["query"], str):
            continue  # GGUF checkpoints and text requests: transformers has no part in those
        model = load(model_dir, device, torch.float32)
        expected = torch.tensor(case["expected_scores"], dtype=torch.float64)
        for name, peer in PEERS.items():
            got = score(peer, model, request, batch_rows).double().cpu()
            worst[name] = max(worst[name], ((got - expected).abs() / expected.abs()).max().item())
        checked.append(path.stem)
    return worst, checked


def workload(scenario, items, vocab, seed):
    static, suffix, item_tokens = SCENARIOS[scenario]
    g = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(0, vocab, (n,), generator=g).tolist()
    static_prefix = ids(static)
    return lambda: {"query": static_prefix + ids(suffix), "items": [ids(item_tokens) for _ in range(items)], "label_token_ids": [9454, 2753] if vocab > 9454 else [0, 1]}


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="HF model directory (e.g. `tally make-model --preset qwen3-0.6b`)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--scenario", default="s1", choices=sorted(SCENARIOS))
    parser.add_argument("--items", type=int, default=500)
    parser.add_argument("--requests", type=int, default=4, help="timed requests per peer at most, after one warm-up")
    parser.add_argument("--seconds", type=float, default=None,
                        help="a peer stops timing once its timed requests took this long (at least one is timed): "
                        "the padded peer takes ~5 s a request on an H100, the packed one ~0.2")
    parser.add_argument("--batch-rows", type=int, default=64, help="rows per forward for padded and kv_expand")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--out")
    args = parser.parse_args()
    peers = args.peers.split(",")

    worst, checked = check_fixtures(args.device, args.batch_rows)
    print(f"fixtures ({len(checked)} cases, float32): " + ", ".join(f"{p} {worst[p]:.1e}" for p in PEERS), flush=True)
    bad = [p for p in peers if not worst[p] <= 1e-3]
    if bad:
        raise SystemExit(f"peers off the float64 fixtures: {bad}; not timing them")

    # The timed runs use what each peer would use in production: TF32/bf16 tensor cores allowed.
    torch.backends.cuda.matmul.allow_tf32 = True
    model = load(args.model, args.device, getattr(torch, args.dtype))
    make_request = workload(args.scenario, args.items, model.config.vocab_size, seed=0)
    requests = [make_request() for _ in range(args.requests + 1)]
    results, answers = {}, {}
    for name in peers:
        seconds = []
        for n, request in enumerate(requests):
            if args.seconds is not None and n > 1 and sum(seconds[1:]) >= args.seconds:
                break
            sync(args.device)
            start = time.perf_counter()
            scores = score(PEERS[name], model, request, args.batch_rows)
            sync(args.device)
            seconds.append(time.perf_counter() - start)
            if n == 1:
                # Every peer's answers to the same request: the first timed one.
                answers[name] = scores.double().cpu()
        warm = statistics.median(seconds[1:])
        results[name] = {"items_per_second": args.items / warm, "ms_per_item": warm * 1e3 / args.items, "warm_median_seconds": warm, "cold_seconds": seconds[0], "timed_requests": len(seconds) - 1}
        print(f"{name:12} {args.items / warm:10.1f} items/s  ({warm * 1e3:.1f} ms per request, cold {seconds[0]:.2f} s)", flush=True)
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    # Same answers on the timed workload (the first timed request). Label probabilities of a random model
    # are tiny, so they are compared as log-probabilities: max |Δ log p| (bf16 moves it ~0.1–1).
    first = peers[0]
    agreement = {name: (answers[name].log() - answers[first].log()).abs().max().item() for name in peers[1:]}
    best = max(results, key=lambda n: results[n]["items_per_second"])
    report = {
        "benchmark": "PyTorch peers (HF transformers, SDPA)",
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "dtype": args.dtype,
        "scenario": args.scenario,
        "items": args.items,
        "batch_rows": args.batch_rows,
        "fixture_cases": checked,
        "fixture_worst_rel_error_float32": worst,
        "max_abs_logprob_difference_from_" + first: agreement,
        "peers": results,
        "best": best,
    }
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"best": best, "agreement": agreement}))


if __name__ == "__main__":
    main()
