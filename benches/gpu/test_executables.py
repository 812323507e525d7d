#!/usr/bin/env python3
"""Reads `cargo test --no-run --message-format=json` on stdin; prints "NAME PATH" for every
integration-test executable it built (NAME: the test target, e.g. `kernels`)."""
import json
import sys

for line in sys.stdin:
    try:
        message = json.loads(line)
    except json.JSONDecodeError:
        continue
    if message.get("reason") == "compiler-artifact" and message.get("executable") and message["target"]["kind"] == ["test"]:
        print(message["target"]["name"], message["executable"])
