"""Run as: python benchmarks/results/2026-11-27-tune-choice/diag_windows.py PHOTOS (on 2026-11-27 from /tmp).

Per candidate, in one Loader: the tuner's figure (2 warm-up batches, 3 windows of 1 s, median)
then whole epochs for 4 s after it (steady). Interleaved ABBA, 3 repeats."""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
import fastload as fl  # noqa: E402
from fastload.config import LoaderConfig  # noqa: E402

root = sys.argv[1]
ds = fl.ImageFolder(root, transform=fl.transforms.train(224))
cands = [(bs, be) for bs in (64, 128, 256) for be in ("process", "thread")]
res = {c: {"tuner": [], "first_window": [], "steady": [], "startup": []} for c in cands}
for r in range(3):
    for bs, be in cands if r % 2 == 0 else cands[::-1]:
        t0 = time.perf_counter()
        cfg = LoaderConfig(
            device="cpu",
            shuffle=True,
            seed=0,
            batch_size=bs,
            num_workers=2,
            backend=be,
            prefetch_factor=2,
            pin_memory=False,
        )
        with fl.Loader(ds, cfg) as loader:
            epoch = 0

            def batches():
                global epoch
                while True:
                    loader.set_epoch(epoch)
                    epoch += 1
                    yield from loader

            it = batches()
            for _ in range(2):
                next(it)
            res[(bs, be)]["startup"].append(time.perf_counter() - t0)
            rates = []
            for _ in range(3):
                s, n = time.perf_counter(), 0
                while time.perf_counter() - s < 1.0:
                    x, _ = next(it)
                    n += x.shape[0]
                rates.append(n / (time.perf_counter() - s))
            res[(bs, be)]["tuner"].append(statistics.median(rates))
            res[(bs, be)]["first_window"].append(rates[0])
            # finish this epoch, then whole epochs
            del it
            s, n = time.perf_counter(), 0
            while time.perf_counter() - s < 4.0:
                loader.set_epoch(epoch)
                epoch += 1
                for x, _ in loader:
                    n += x.shape[0]
            res[(bs, be)]["steady"].append(n / (time.perf_counter() - s))
for c, v in res.items():
    med = {k: statistics.median(x) for k, x in v.items()}
    print(
        f"bs={c[0]:>3} {c[1]:<7} tuner-figure {med['tuner']:6.0f} (first window {med['first_window']:6.0f}) "
        f"steady {med['steady']:6.0f} ratio {med['tuner'] / med['steady']:.2f} startup {med['startup']:.2f}s | "
        f"tuner {[round(x) for x in v['tuner']]} steady {[round(x) for x in v['steady']]}"
    )
with open("/proc/loadavg") as f:
    print("loadavg", f.read().split()[:3])
