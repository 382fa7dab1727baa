#!/usr/bin/env python3
"""Reads `cargo test --no-run --message-format=json` on stdin and prints one line per test
executable built: `PACKAGE TARGET KIND PATH DIR` (KIND is cargo's target kind: lib, bin, test;
DIR the package's directory, where `cargo test` runs it).
Used by scripts/test.sh and scripts/stress.sh to pick binaries out of a build."""
import json
import os
import sys

for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    # A package id is "<source url>#<version>", or "...#<name>@<version>" when the name is not
    # the last path segment.
    url, _, version = m["package_id"].partition("#")
    package = version.split("@")[0] if "@" in version else url.rsplit("/", 1)[-1]
    directory = os.path.dirname(m["manifest_path"])
    print(package, m["target"]["name"], m["target"]["kind"][0], m["executable"], directory)
