"""Batches byte-identical to those the old main produced (issue 33), configuration by configuration.

``tests/golden_batches.json`` was written by ``python tests/golden.py --write`` on the main
branch before the batch-plan redesign: process and thread backends, 0-2 workers; ImageFolder,
LMDB, TFRecord (indexed and stream), WebDataset, a Subset and users' own datasets; region
decodes, MultiView, ``on_error="skip"`` with damaged files, decoder variants, ``decode="gpu"``
on the CPU; passes resumed mid-epoch on other backends, ranks and workers. A failure names the
first batch that differs and how.
"""

import pytest

import golden
from fastload.decode import roi

from conftest import need_formats

NEEDS = {"lmdb": ("lmdb",), "tfrecord": ("tfrecord",)}


def differences(want: dict, got: dict) -> list[str]:
    """What differs between two recorded runs, first batch first."""
    out = []
    if want["input"] != got["input"]:
        out.append(f"the input files differ ({want['input']} vs {got['input']}): another PIL or converter?")
    for key in sorted((set(want) | set(got)) - {"batches", "input"}):
        if want.get(key) != got.get(key):
            out.append(f"{key}: reference {want.get(key)!r}, now {got.get(key)!r}")
    a, b = want["batches"], got["batches"]
    if len(a) != len(b):
        out.append(f"{len(a)} batches in the reference, {len(b)} now")
    for k, (x, y) in enumerate(zip(a, b)):
        fields = [f for f in sorted(set(x) | set(y)) if x.get(f) != y.get(f)]
        if fields:
            shown = "; ".join(f"{f}: reference {x.get(f)}, now {y.get(f)}" for f in fields)
            out.append(f"batch {k} (epoch {x['epoch']}) differs in {shown}")
            break
    return out


@pytest.mark.parametrize("name", [c.name for c in golden.CONFIGS])
def test_batches_match_the_old_main(name, tmp_path):
    for prefix, formats in NEEDS.items():
        if prefix in name:
            need_formats(*formats)
    if ("region" in name or "gpu" in name) and not roi.available():
        pytest.skip("region decode and decode='gpu' on the CPU need nvImageCodec: fastload[roi]")
    reference = golden.load_reference()
    assert name in reference, f"no reference for {name}: python tests/golden.py --write --only {name} on the old main"
    found = differences(reference[name], golden.run(name, str(tmp_path)))
    assert not found, "\n".join(found)


def test_every_configuration_has_a_reference():
    assert set(golden.load_reference()) == set(golden.BY_NAME)
