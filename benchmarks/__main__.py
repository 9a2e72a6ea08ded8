"""``make bench``: run benchmarks by name (default: all). ``python -m benchmarks memory_store``."""

from __future__ import annotations

import importlib
import sys

ALL = [
    "memory_store",
    "file_store",
    "sqlite_store",
    "postgres_store",
    "runtime_graph",
    "streaming",
]


def main(argv: list[str]) -> int:
    names = argv or ALL
    for name in names:
        try:
            module = importlib.import_module(f"benchmarks.{name}")
        except ModuleNotFoundError as exc:
            print(f"== {name}: not available ({exc})")
            continue
        print(f"== {name}")
        module.main()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
