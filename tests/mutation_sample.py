"""A reproducible sample of mutmut's mutants, for ``make mutate MUTATE_SAMPLE=K``.

    python tests/mutation_sample.py K [SEED]

Prints the names of about one mutant in K of every mutated function (at least one per function),
read from the ``mutants/`` folder that ``mutmut run`` generated, leaving out those already
checked, so that a stopped run resumes. The pick within a function starts at an offset drawn from
the function's name and SEED: the same K and SEED give the same sample on every machine.
"""

from __future__ import annotations

import json
import sys
import zlib
from collections import defaultdict
from pathlib import Path


def sample(meta_files: list[Path], every: int, seed: int) -> list[str]:
    """Names of every ``every``-th unchecked mutant of each function, from a seeded offset."""
    by_function: dict[str, list[tuple[int, str, object]]] = defaultdict(list)
    for meta in meta_files:
        for name, exit_code in json.loads(meta.read_text())["exit_code_by_key"].items():
            function, number = name.rsplit("__mutmut_", 1)
            by_function[function].append((int(number), name, exit_code))
    picked = []
    for function, mutants in sorted(by_function.items()):
        mutants.sort()
        start = zlib.crc32(f"{seed}:{function}".encode()) % min(every, len(mutants))
        picked += [name for _, name, exit_code in mutants[start::every] if exit_code is None]
    return picked


def main() -> None:
    every = int(sys.argv[1])
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    meta_files = sorted(Path("mutants").rglob("*.py.meta"))
    if not meta_files:
        sys.exit("mutation_sample.py: no mutants/ folder: run `mutmut run` first")
    print("\n".join(sample(meta_files, every, seed)))


if __name__ == "__main__":
    main()
