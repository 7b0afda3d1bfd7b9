"""One rank (no DDP): every sample of an epoch exactly once, and len(loader) the number of
batches that come, as DataLoader does: for any worker count, backend and drop_last, and a
dataset size that no batch size or worker count divides (209)."""

import collections
import math

import numpy as np
import pytest
import torch

import fastload as fl

N, BATCH = 209, 16


class Numbers(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return np.full((4, 4, 3), i % 251, np.uint8), i


CASES = [("process", 0)] + [(backend, w) for backend in ("process", "thread") for w in (1, 2, 3)]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("backend,workers", CASES)
def test_every_sample_once_and_len_is_the_batches_that_come(backend, workers, drop_last):
    with fl.Loader(Numbers(), batch_size=BATCH, num_workers=workers, backend=backend, device="cpu",
                   drop_last=drop_last, shuffle=True, normalize=False) as loader:
        for _ in range(2):  # two epochs: a persistent worker's second pass too
            sizes, seen = [], collections.Counter()
            for _, y in loader:
                sizes.append(len(y))
                seen.update(y.tolist())
            expected = N // BATCH * BATCH if drop_last else N
            assert sum(sizes) == expected and max(seen.values()) == 1, (sizes, seen.most_common(2))
            assert len(loader) == len(sizes) == (N // BATCH if drop_last else math.ceil(N / BATCH))


@pytest.mark.xfail(strict=True, reason="issue 28 item 9, not fixed yet: a stream's worker slots are padded to "
                   "equal lengths (for equal batch counts across ranks) also on one rank, so 2 workers read one "
                   "record twice and each slot ends in its own short batch; drop_last cuts every slot")
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("workers", [2, 3])
def test_a_stream_on_one_rank_gives_every_record_once(tmp_path, monkeypatch, workers, drop_last):
    from wds_servers import write_shards

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write_shards(tmp_path / "data", [70, 70, 69])
    ds = fl.WebDataset(str(tmp_path / "data"), fl.transforms.eval(16, resize=20))
    with fl.Loader(ds, batch_size=BATCH, num_workers=workers, device="cpu", drop_last=drop_last,
                   normalize=False) as loader:
        sizes, seen = [], collections.Counter()
        for _, y in loader:
            sizes.append(len(y))
            seen.update(y.tolist())
    assert sum(sizes) == (N // BATCH * BATCH if drop_last else N) and max(seen.values()) == 1
    assert len(loader) == len(sizes) == (N // BATCH if drop_last else math.ceil(N / BATCH))
