"""Calls a live `tally serve` through the rerank clients people already run, unchanged: the
`cohere` SDK's v2 and v1 clients and Haystack's `HuggingFaceTEIRanker` (a TEI client). Each
answer must parse in the client and agree with tally's own /v1/rerank on the same documents.

Usage: python3 tests/rerank_clients.py http://127.0.0.1:PORT API_KEY MODEL  (exit status 0 = compatible)
Needs: pip install cohere==7.3.1 huggingface-api-haystack==3.1.0 requests (as .ci/run does).
"""

import os
import sys

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

import cohere
import requests
from haystack import Document
from haystack.utils import Secret
from haystack_integrations.components.rankers.huggingface_api import HuggingFaceTEIRanker
from haystack_integrations.components.rankers.huggingface_api.ranker import TruncationDirection

url, api_key, model = sys.argv[1:4]
query = "What is the capital of France?"
documents = [
    "Paris is the capital and largest city of France.",
    "Cells are the basic unit of life.",
    "The Eiffel Tower stands in Paris.",
    "Bananas are rich in potassium.",
    "Berlin is the capital of Germany.",
]

# tally's own answer: every document's relevance, by index.
reference = requests.post(
    f"{url}/v1/rerank",
    json={"query": query, "documents": documents},
    headers={"Authorization": f"Bearer {api_key}"},
)
reference.raise_for_status()
relevance = {r["index"]: r["relevance_score"] for r in reference.json()["results"]}
ranking = sorted(relevance, key=lambda i: (-relevance[i], i))
assert sorted(relevance) == list(range(len(documents))), relevance


def agrees(what, pairs):
    """`pairs`: (index, score) in the order the client returned them."""
    indices = [index for index, _ in pairs]
    assert indices == ranking[: len(indices)], f"{what}: order {indices}, expected {ranking}"
    for index, score in pairs:
        assert abs(score - relevance[index]) < 1e-6, f"{what}: document {index} scored {score}, expected {relevance[index]}"
    print(f"{what}: {indices}")


# Cohere's current client: POST /v2/rerank.
v2 = cohere.ClientV2(api_key=api_key, base_url=url)
answer = v2.rerank(model=model, query=query, documents=documents, top_n=3)
agrees("cohere.ClientV2.rerank", [(r.index, r.relevance_score) for r in answer.results])
assert answer.id, answer
# The server's context is 160 tokens: a long document needs max_tokens_per_doc, else it is a 400.
long = "Paris is the capital of France. " * 200
cut = v2.rerank(model=model, query=query, documents=[long, "Bananas."], max_tokens_per_doc=16)
assert [r.index for r in cut.results] and cut.meta.billed_units.input_tokens < 160 * 2, cut
try:
    v2.rerank(model=model, query=query, documents=[long, "Bananas."])
    raise AssertionError("an over-long document was scored without truncation")
except cohere.errors.BadRequestError as error:
    print("cohere.ClientV2.rerank over-long document:", error.status_code, error.body["message"][:80])
print("cohere.ClientV2.rerank max_tokens_per_doc=16:", cut.meta.billed_units.input_tokens, "tokens")

# Cohere's v1 client: POST /v1/rerank.
v1 = cohere.Client(api_key=api_key, base_url=url)
answer = v1.rerank(query=query, documents=documents, top_n=2, return_documents=True)
agrees("cohere.Client.rerank", [(r.index, r.relevance_score) for r in answer.results])
assert all(r.document.text == documents[r.index] for r in answer.results), answer

# A wrong key is refused, and the SDK raises its own error class for it.
try:
    cohere.ClientV2(api_key="wrong", base_url=url).rerank(model=model, query=query, documents=documents)
    raise AssertionError("a wrong key was accepted")
except cohere.errors.UnauthorizedError as error:
    print("cohere wrong key:", error.status_code)

# Haystack's TEI ranker: POST /rerank with `texts`, a bare sorted list back.
ranker = HuggingFaceTEIRanker(url=url, top_k=4, token=Secret.from_token(api_key))
ranked = ranker.run(query=query, documents=[Document(content=text) for text in documents])["documents"]
agrees("haystack HuggingFaceTEIRanker", [(documents.index(doc.content), doc.score) for doc in ranked])
# An over-long document: TEI truncates by default, and from the side the ranker asks.
scores = {}
for direction in [None, TruncationDirection.LEFT, TruncationDirection.RIGHT]:
    ranked = ranker.run(query=query, documents=[Document(content=long), Document(content="Bananas.")], truncation_direction=direction)["documents"]
    assert len(ranked) == 2, ranked
    scores[direction] = next(doc.score for doc in ranked if doc.content == long)
assert scores[None] == scores[TruncationDirection.RIGHT] != scores[TruncationDirection.LEFT], scores
print("haystack HuggingFaceTEIRanker truncation:", scores)
print("every client parsed its answer")
