"""Mean of each latency histogram between two scrapes of a server's /metrics: what the
server measured over one bench level, to set beside what the client measured.

    python benchmarks/metrics_delta.py BEFORE.txt AFTER.txt

Per `*_seconds` histogram (summed over its labels): requests observed between the scrapes
and their mean in ms. For dspark-serve: queue time, prefill time and TTFT as the gateway
sees them; the client's TTFT less the gateway's is HTTP, SSE and the client itself.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


def histogram_totals(text: str) -> dict[str, tuple[float, float]]:
    """name -> (sum, count) of every histogram in a Prometheus text scrape, over all labels."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        for sample in family.samples:
            if sample.name == family.name + "_sum":
                totals[family.name][0] += sample.value
            elif sample.name == family.name + "_count":
                totals[family.name][1] += sample.value
    return {name: (s, c) for name, (s, c) in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args()
    before = histogram_totals(args.before.read_text())
    after = histogram_totals(args.after.read_text())
    print("| histogram | observed | mean ms |")
    print("|---|---:|---:|")
    for name, (total, count) in sorted(after.items()):
        if not name.endswith("_seconds"):
            continue
        total0, count0 = before.get(name, (0.0, 0.0))
        observed = count - count0
        if observed > 0:
            print(f"| {name} | {observed:.0f} | {1e3 * (total - total0) / observed:.1f} |")


if __name__ == "__main__":
    main()
