"""A CUDA stream simulator: the GPU path of fastload tested on a machine without a GPU.

The real ``fastload.Loader(device="cuda")`` runs end to end with ``torch.cuda`` patched
(:mod:`cudasim.patch`); device tensors are CPU tensors that say they are on ``cuda:k``
(:mod:`cudasim.tensor`); streams, events and copies follow CUDA's ordering rules, with
work completing as late as the rules allow (:mod:`cudasim.device`); a caching allocator
reuses freed blocks as PyTorch's does, ``record_stream`` included (:mod:`cudasim.memory`);
and a happens-before detector (:mod:`cudasim.clocks`) reports every pair of accesses that
no wait orders, naming both. It proves ordering, never speed.

Why a tensor subclass and module patches rather than a TorchFunctionMode or
TorchDispatchMode: modes are per thread, and the Loader touches device tensors and pinned
memory from several (the device driver's thread, DataLoader's pin-memory thread); a
subclass carries its device wherever it goes, and patches of ``torch.cuda`` and the
factories hold in every thread.

Use the ``sim`` fixture (tests/conftest.py): the test fails at teardown if any
race was reported, unless it took them with ``sim.take_races()``.
"""

from __future__ import annotations

from .device import ACTIVE, Simulator
from .patch import install
from .tensor import SimTensor

__all__ = ["SimTensor", "Simulator", "install", "simulated", "take_races"]


def take_races(simulator: Simulator) -> list[str]:
    """Ends the simulated program (every queued copy has run) and returns the races, cleared."""
    simulator.finish()
    races, simulator.races = simulator.races, []
    return races


Simulator.take_races = take_races  # type: ignore[attr-defined]


def simulated(monkeypatch, request):
    """The ``sim`` fixture's body (tests/conftest.py): a simulator installed for one test,
    two GPUs unless ``@pytest.mark.sim(devices=..., seed=...)`` says otherwise."""
    marker = request.node.get_closest_marker("sim")
    simulator = install(monkeypatch, **(marker.kwargs if marker else {}))
    try:
        yield simulator
        races = take_races(simulator)
        assert not races, "\n".join(races[:5])
    finally:
        simulator.allocator.live = False
        ACTIVE.remove(simulator)
