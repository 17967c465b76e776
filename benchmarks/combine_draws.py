"""Pool the over-sampled steps' results of several draws (seeds) into one table.

``bench_simulate.py --sections rollout_partial`` and ``--sections rollout_staleness`` each run one draw
(``--seed``); this reads their JSON results and prints the section's table over all the draws' settings
pooled: means over every setting of every draw (each draw has the same settings, so the mean of the draws'
means), the lowest and worst over all of them, and the slower ones counted over all of them.

    python benchmarks/combine_draws.py rollout_staleness benchmarks/results/simulate_rollout_staleness.json \
        benchmarks/results/simulate_rollout_staleness_seed12.json ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_simulate import PARTIAL_COLUMNS, PARTIAL_RUNS, STALENESS_RUNS, partial_rows  # noqa: E402
from common import table  # noqa: E402

SECTIONS = {"rollout_partial": PARTIAL_RUNS, "rollout_staleness": STALENESS_RUNS}


def combine(section: str, paths: list[str]) -> list:
    """The section's rows over the settings of every result file in ``paths`` pooled (one draw each)."""
    if section not in SECTIONS:
        raise SystemExit(f"combine_draws.py: error: argument section: got {section!r}; expected one of "
                         + ", ".join(SECTIONS))
    pooled = []
    for draw, path in enumerate(paths):
        try:
            settings = json.loads(Path(path).read_text(encoding="utf-8"))[section]["settings"]
        except (OSError, ValueError, KeyError) as exc:
            raise SystemExit(f"combine_draws.py: error: argument paths: got {path!r}; expected a bench_simulate "
                             f"result with a {section} section ({exc})") from None
        pooled += [x[:7] + [draw] for x in settings]
    return partial_rows(pooled, SECTIONS[section])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("section", choices=sorted(SECTIONS))
    parser.add_argument("paths", nargs="+", help="bench_simulate.py results, one draw (--seed) each")
    args = parser.parse_args(argv)
    rows = combine(args.section, args.paths)
    print(table(f"{args.section} over {len(args.paths)} draws pooled", PARTIAL_COLUMNS, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
