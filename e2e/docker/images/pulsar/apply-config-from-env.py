#!/usr/bin/env python3
"""apply-config-from-env.py FILE...: set Pulsar config keys from the environment.

Written for e2e/docker's local Pulsar image; it follows the documented behaviour of the script
of the same name in the official apachepulsar/pulsar image:
  - PULSAR_PREFIX_<key>=<value> sets <key> in every FILE, adding the line if the key is absent;
  - <key>=<value> for a key already present (uncommented) in a FILE replaces its value.
Each FILE is a Java properties file of key=value lines; comments and order are kept.
"""
import os
import sys

PREFIX = "PULSAR_PREFIX_"


def apply(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    index = {}
    for i, line in enumerate(lines):
        s = line.strip()
        if not s or s.startswith("#") or "=" not in s:
            continue
        index[s.split("=", 1)[0].strip()] = i
    changed = []
    for name, value in sorted(os.environ.items()):
        if name.startswith(PREFIX):
            key = name[len(PREFIX):]
        elif name in index:
            key = name
        else:
            continue
        if not key:
            continue
        if key in index:
            lines[index[key]] = f"{key}={value}"
        else:
            index[key] = len(lines)
            lines.append(f"{key}={value}")
        changed.append(key)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    for key in changed:
        print(f"[{path}] {key} set from the environment")


def main(argv):
    if len(argv) < 2:
        print("usage: apply-config-from-env.py FILE...", file=sys.stderr)
        return 2
    for path in argv[1:]:
        apply(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
