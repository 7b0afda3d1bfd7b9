import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from fastload.collate import alloc_batch, fast_collate


def _samples(n=4, h=5, w=7):
    rng = np.random.default_rng(0)
    return [(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), i * 10) for i in range(n)]


def test_layout_values_and_labels():
    samples = _samples()
    samples[1] = (samples[1][0][:, ::-1], 10)  # a flipped view, as RandomHorizontalFlip returns
    images, labels = fast_collate(samples, pin=False)
    assert images.dtype == torch.uint8 and images.shape == (4, 5, 7, 3) and images.is_contiguous()
    for i, (img, _) in enumerate(samples):
        assert np.array_equal(images[i].numpy(), img)
    assert labels.dtype == torch.int64 and labels.tolist() == [0, 10, 20, 30]


def test_mixed_sizes_is_a_clear_error():
    samples = _samples() + [(np.zeros((6, 7, 3), np.uint8), 1)]
    with pytest.raises(ValueError, match=r"sample 4 has shape \(6, 7, 3\) but the batch holds \(5, 7, 3\)"):
        fast_collate(samples)


def test_wrong_dtype_or_rank_is_a_type_error():
    with pytest.raises(TypeError, match="sample 0"):
        fast_collate([(np.zeros((4, 4), np.uint8), 0)])
    with pytest.raises(TypeError, match="sample 1"):
        fast_collate([(np.zeros((4, 4, 3), np.uint8), 0), (np.zeros((4, 4, 3), np.float32), 0)])
    with pytest.raises(ValueError, match="empty"):
        fast_collate([])


class _Batches(Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        return fast_collate(_samples())


def test_batch_built_in_a_worker_is_in_shared_memory():
    loader = DataLoader(_Batches(), batch_size=None, num_workers=1)
    images, labels = next(iter(loader))
    assert images.is_shared()
    assert images.shape == (4, 5, 7, 3)


def test_main_process_batch_is_plain_without_cuda():
    t = alloc_batch((2, 3), pin=False)
    assert not t.is_shared() and not t.is_pinned()


def test_out_buffer_is_filled_in_place_and_checked():
    samples = _samples(3)
    out = torch.zeros((5, 5, 7, 3), dtype=torch.uint8)
    images, labels = fast_collate(samples, out=out)
    assert images.data_ptr() == out.data_ptr() and images.shape == (3, 5, 7, 3)
    assert np.array_equal(out[2].numpy(), samples[2][0])
    with pytest.raises(ValueError, match="cannot hold"):
        fast_collate(_samples(6), out=out)
