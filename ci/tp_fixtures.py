#!/usr/bin/env python3
"""ci/tp_fixtures.py N FIXTURE...: the fixtures whose drafter geometry tensor parallelism N allows
(docs/spec/tensor-parallel.md §1 checks 3-6: N divides the query heads, the intermediate size and the
vocabulary, and N and the KV heads divide one or the other), one per line, in the order given."""
import json
import os
import sys


def allows(config, n):
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads", heads)
    return (heads % n == 0 and (kv % n == 0 or n % kv == 0) and config["intermediate_size"] % n == 0
            and config["vocab_size"] % n == 0)


def main():
    if len(sys.argv) < 2 or not sys.argv[1].isdigit():
        sys.exit("usage: ci/tp_fixtures.py N FIXTURE...")
    n = int(sys.argv[1])
    for fixture in sys.argv[2:]:
        with open(os.path.join(fixture, "fixture.json")) as f:
            drafter = json.load(f)["drafter_dir"]
        with open(os.path.join(fixture, drafter, "config.json")) as f:
            if allows(json.load(f), n):
                print(fixture)


if __name__ == "__main__":
    main()
