#!/usr/bin/env python3
"""Reads `cargo test --no-run --message-format=json` on stdin; prints "NAME PATH" for every
integration-test executable it built (NAME: the test target, e.g. `kernels`), only those of
package PACKAGE when one is given."""
import json
import sys


def package_name(package_id):
    # "name version (source)" before cargo 1.77; "source#name@version" or "source/name#version" since.
    if " " in package_id:
        return package_id.split(" ")[0]
    path, _, fragment = package_id.partition("#")
    return fragment.split("@")[0] if "@" in fragment else path.rstrip("/").rsplit("/", 1)[-1]


wanted = sys.argv[1] if len(sys.argv) > 1 else None
for line in sys.stdin:
    try:
        message = json.loads(line)
    except json.JSONDecodeError:
        continue
    if message.get("reason") != "compiler-artifact" or not message.get("executable") or message["target"]["kind"] != ["test"]:
        continue
    if wanted is None or package_name(message["package_id"]) == wanted:
        print(message["target"]["name"], message["executable"])
