"""One short profiled run of a training feed: where the GPU's time goes, per stream and per
kind of work (issue 38's finding: with decode="gpu" ResNet-18's step doubled, 38.8 ms
against 19.5 ms, and the question left was which work takes the model's GPU time).

torch.profiler (CPU and CUDA activities) around ``steps`` steps of an already warmed-up feed;
from its device events (kernels and copies, each with its stream):

- the window (first device event's start to the last one's end) and the union of device
  busy time in it;
- per stream: busy time (its events' union), its share of the window, its top kernels;
- per kind of work (decode: nvJPEG / nvImageCodec kernels; rows: fastload's Triton row
  kernel; copy: memcpy / memset; model: the rest), busy time;
- overlap: the sum of the streams' busy times less the union (0: the streams never ran at
  once; the decode streams then queue behind the model, or the model behind them).

On the CPU (the dry run) there are no device events: the summary says so.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

import torch

DECODE_WORDS = ("nvjpeg", "nvimgcodec", "jpeg", "huffman", "idct", "dct")
TOP = 6


def kind_of(name: str) -> str:
    low = name.lower()
    if any(w in low for w in DECODE_WORDS):
        return "decode"
    if low.startswith("_rows") or "rowkernel" in low:
        return "rows"
    if "memcpy" in low or "memset" in low:
        return "copy"
    return "model"


def union_ns(spans: Iterable[tuple[int, int]]) -> int:
    """Total length of the union of [start, end) spans."""
    total, end_so_far = 0, None
    for start, end in sorted(spans):
        if end_so_far is None or start >= end_so_far:
            total += end - start
            end_so_far = end
        elif end > end_so_far:
            total += end - end_so_far
            end_so_far = end
    return total


def device_events(prof: Any) -> list[tuple[str, int, int, int]]:
    """(name, stream, start_ns, end_ns) of every device event (kernel, copy) of ``prof``."""
    out = []
    for e in prof.profiler.kineto_results.events():
        if "CUDA" not in str(e.device_type()):
            continue
        start = e.start_ns()
        out.append((e.name(), int(e.device_resource_id()), start, start + e.duration_ns()))
    return out


def summarize(events: list[tuple[str, int, int, int]], steps: int) -> dict:
    """The module doc's figures, in milliseconds, of ``events`` over ``steps`` steps."""
    if not events:
        return {"device_events": 0, "note": "no device events (not on CUDA)"}
    window = max(e[3] for e in events) - min(e[2] for e in events)
    by_stream: dict[int, list] = collections.defaultdict(list)
    by_kind: dict[str, list] = collections.defaultdict(list)
    for e in events:
        by_stream[e[1]].append(e)
        by_kind[kind_of(e[0])].append(e)
    streams = {}
    for stream, evs in sorted(by_stream.items(), key=lambda kv: -union_ns((e[2], e[3]) for e in kv[1])):
        busy = union_ns((e[2], e[3]) for e in evs)
        names: dict[str, int] = collections.Counter()
        for e in evs:
            names[e[0][:80]] += e[3] - e[2]
        streams[str(stream)] = {"busy_ms": busy / 1e6, "share": busy / window, "events": len(evs),
                                "kinds": dict(collections.Counter(kind_of(e[0]) for e in evs)),
                                "top_ms": {n: t / 1e6 for n, t in names.most_common(TOP)}}
    union = union_ns((e[2], e[3]) for e in events)
    stream_sum = sum(s["busy_ms"] for s in streams.values())
    return {"device_events": len(events), "steps": steps, "window_ms": window / 1e6,
            "window_ms_per_step": window / 1e6 / max(steps, 1), "busy_ms": union / 1e6, "busy_share": union / window,
            "overlap_ms": stream_sum - union / 1e6,
            "kinds_ms": {k: union_ns((e[2], e[3]) for e in evs) / 1e6 for k, evs in sorted(by_kind.items())},
            "streams": streams}


def lines(label: str, s: dict) -> list[str]:
    """The summary, printed."""
    if not s.get("device_events"):
        return [f"trace {label}: {s.get('note', 'nothing recorded')}"]
    out = [f"trace {label}: {s['steps']} steps, device window {s['window_ms']:.1f} ms "
           f"({s['window_ms_per_step']:.1f} ms/step), busy {s['busy_ms']:.1f} ms ({100 * s['busy_share']:.0f}%), "
           f"streams overlapping {s['overlap_ms']:.1f} ms",
           "  by kind (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in s["kinds_ms"].items())]
    for stream, st in s["streams"].items():
        out.append(f"  stream {stream}: busy {st['busy_ms']:.1f} ms ({100 * st['share']:.0f}%), "
                   f"{st['events']} events {st['kinds']}")
        out += [f"    {t:8.2f} ms  {n}" for n, t in st["top_ms"].items()]
    return out


def profiled(run: Any, device: torch.device) -> tuple[Any, list[tuple[str, int, int, int]]]:
    """(what ``run()`` returned, the device events) of ``run`` under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        result = run()
        if device.type == "cuda":
            torch.cuda.synchronize()
    return result, device_events(prof)
