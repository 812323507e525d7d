"""How well /v1/rerank ranks on a model that is not a reranker: ten factual questions, each
ranked against the ten answers (its own and the other nine), through a live `tally serve`.
Reports top-1 accuracy and mean reciprocal rank beside chance (10% and 0.29).

Usage: python3 benches/rerank_on_chat_model.py --tally target/release/tally --model MODEL [--out result.json]
"""

import argparse
import json
import platform
import subprocess
import time

import requests

PAIRS = [
    ("What is the capital of France?", "Paris is the capital and largest city of France."),
    ("How many legs does a spider have?", "Spiders have eight legs."),
    ("What do bees make?", "Bees produce honey from the nectar of flowers."),
    ("Who wrote Romeo and Juliet?", "Romeo and Juliet is a tragedy written by William Shakespeare."),
    ("At what temperature does water boil?", "Water boils at 100 degrees Celsius at sea level."),
    ("Which planet is known as the Red Planet?", "Mars is called the Red Planet because of its reddish appearance."),
    ("What language is spoken in Brazil?", "The official language of Brazil is Portuguese."),
    ("How do plants make their food?", "Plants make their food through photosynthesis, using sunlight."),
    ("What is the largest ocean?", "The Pacific Ocean is the largest and deepest ocean on Earth."),
    ("What is the currency of Japan?", "The currency of Japan is the yen."),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tally", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out")
    args = parser.parse_args()

    server = subprocess.Popen([args.tally, "serve", "--model", args.model, "--port", "0"], stderr=subprocess.PIPE, text=True)
    try:
        for line in server.stderr:
            if "ready: serving the API on http://" in line:
                url = line[line.index("http://") :].strip()
                break
        else:
            raise SystemExit("tally serve exited before it was ready")
        documents = [answer for _, answer in PAIRS]
        ranks = []
        for truth, (query, _) in enumerate(PAIRS):
            response = requests.post(f"{url}/v1/rerank", json={"query": query, "documents": documents})
            response.raise_for_status()
            order = [result["index"] for result in response.json()["results"]]
            ranks.append(order.index(truth) + 1)
            print(f"{query:45} right answer ranked {ranks[-1]:2} of {len(documents)}")
    finally:
        server.terminate()
        server.wait()
    chance_mrr = sum(1 / rank for rank in range(1, len(PAIRS) + 1)) / len(PAIRS)
    result = {
        "model": args.model.split("/")[-1],
        "machine": f"{platform.processor() or platform.machine()}, {platform.system()}",
        "date": time.strftime("%Y-%m-%d"),
        "queries": len(PAIRS),
        "documents_per_query": len(PAIRS),
        "top1_accuracy": sum(rank == 1 for rank in ranks) / len(ranks),
        "mean_reciprocal_rank": sum(1 / rank for rank in ranks) / len(ranks),
        "chance_top1_accuracy": 1 / len(PAIRS),
        "chance_mean_reciprocal_rank": chance_mrr,
        "ranks": ranks,
    }
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as out:
            json.dump(result, out, indent=1)
            out.write("\n")


if __name__ == "__main__":
    main()
