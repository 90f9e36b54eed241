"""What `decode.recase` and `decode.protect` cost plain text, measured side by side: a model
translates the same plain sentences with both `auto` (the default) and both `off`, the two
loaded once each and alternating in rounds in this one process, so machine noise hits both
alike. Reports the median seconds of each, the overhead in percent (the goal: within 3%), and
how many outputs differ (a plain line in ordinary case is read as given; a line whose output
lost a number is read again with its numbers taken out, and a source without final
punctuation gives an output without).

    python scripts/bench_textform.py --model RUN [--src FILE] [--lines 1000] [--rounds 3]

The source lines default to the model's test split. The last line is one JSON object with
every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
from functools import partial

import torch

import attn_mt
from attn_mt.data.text import read_lines
from bench.common import cpu_name, timed_window

BOTH_OFF = {"recase": "off", "protect": "off"}


def main(argv: list[str] | None = None) -> None:
    """Parse the options, time both settings in rounds, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a run folder or .pt checkpoint")
    parser.add_argument("--src", help="plain source lines (default: the model's test split)")
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    settings: dict[str, dict[str, str]] = {"on": {}, "off": BOTH_OFF}
    translators = {
        name: attn_mt.load(args.model, device=args.device, decode={"beam": args.beam, **extra})
        for name, extra in settings.items()
    }
    src = args.src or translators["on"].config.data.test.src
    if src is None:
        parser.error("the model's config names no test split; give --src FILE")
    lines = read_lines(src)[: args.lines]
    device = translators["on"].device
    outputs = {name: t.translate(lines) for name, t in translators.items()}  # warm-up
    times: dict[str, list[float]] = {name: [] for name in translators}
    for _ in range(args.rounds):
        for name, translator in translators.items():
            times[name].append(timed_window(partial(translator.translate, lines), device)[0])
    median = {name: statistics.median(values) for name, values in times.items()}
    overhead = 100 * (median["on"] / median["off"] - 1)
    differ = sum(a != b for a, b in zip(outputs["on"], outputs["off"], strict=True))
    hardware = cpu_name() if device.type == "cpu" else torch.cuda.get_device_name(device)
    print(f"{len(lines)} lines of {src}, beam {args.beam}, {args.rounds} rounds on {hardware}")
    print(f"recase and protect auto  {median['on']:8.2f} s (median)")
    print(f"both off                 {median['off']:8.2f} s")
    print(f"overhead                 {overhead:8.2f} %")
    print(f"outputs that differ      {differ:8d} of {len(lines)}")
    figures = {name: round(value, 3) for name, value in median.items()}
    found = {"bench": "textform", "hardware": hardware, "lines": len(lines), "beam": args.beam}
    found |= {"median_s": figures, "overhead_percent": round(overhead, 2), "outputs_differ": differ}
    print(json.dumps(found))
