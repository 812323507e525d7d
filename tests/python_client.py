"""Calls tally's /v1/score exactly as SGLang's docs call SGLang's: plain `requests.post`.

Usage: python3 tests/python_client.py http://127.0.0.1:PORT  (exit status 0 = compatible)
"""

import sys

import requests

url = sys.argv[1]
response = requests.post(
    f"{url}/v1/score",
    json={
        "query": "Is the following city the capital of France? ",
        "items": ["Paris", "London", "Berlin"],
        "label_token_ids": [9454, 2753],  # "Yes", "No" in the Qwen3 tokenizer
        "apply_softmax": True,
        "item_first": False,
    },
)
response.raise_for_status()
result = response.json()
scores = result["scores"]
assert result["object"] == "scoring", result
assert len(scores) == 3 and all(len(row) == 2 for row in scores), scores
assert all(abs(sum(row) - 1.0) < 1e-6 for row in scores), scores
assert result["usage"]["completion_tokens"] == 0, result
print("scores:", scores)

bad = requests.post(f"{url}/v1/score", json={"query": "q", "items": [], "label_token_ids": [1]})
assert bad.status_code == 400 and bad.json()["object"] == "error", bad.text
