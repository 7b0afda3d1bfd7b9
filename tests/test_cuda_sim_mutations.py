"""Each synchronization of the device stage is needed: remove a wait, a record_stream or
an event gate, or record an event too early, and a simulator scenario reports a race (or
its own check fails). The scenarios are the tests of test_cuda_sim_loader.py,
test_cuda_sim_defects.py and test_cuda_sim_gpu_decode.py, run here on mutated code."""

import pytest

import test_cuda_sim_defects as defects
import test_cuda_sim_gpu_decode as gpu_decode
import test_cuda_sim_loader as scenes
from cudasim.mutate import mutate
from fastload.device.gpudecode.stage import GpuDecodeStage
from fastload.device.prefetch import CudaPrefetcher
from fastload.sources.ring import BufferRing


def reads(sim, request):
    scenes.test_consumer_reads_each_batch(sim, "thread")


def drops(sim, request):
    scenes.test_consumer_drops_each_batch_at_once(sim, "thread")


def slots(sim, request):
    scenes.test_ring_slots_are_reused_only_after_their_copies(sim)


def failing_copy(sim, request):
    scenes.test_a_copy_failing_mid_batch_keeps_its_buffer_until_the_queued_copy_ran(sim)


def device_inputs(sim, request):
    defects.test_3_inputs_already_on_the_device_are_waited_for_and_kept(sim)


def closing(sim, request):
    scenes.test_close_with_copies_in_flight_waits_for_them(sim, "thread")


def gpu_reads(sim, request):
    photos = gpu_decode.make_photos(request.getfixturevalue("tmp_path"), request.getfixturevalue("monkeypatch"))
    gpu_decode.test_gpu_decode_consumer_drops_each_batch(sim, photos)


def gpu_closing(sim, request):
    photos = gpu_decode.make_photos(request.getfixturevalue("tmp_path"), request.getfixturevalue("monkeypatch"))
    gpu_decode.test_close_with_decode_work_in_flight_waits_for_it(sim, photos)


P, G = CudaPrefetcher, GpuDecodeStage
MUTATIONS = {
    "prefetch: no consumer wait_event": (P, "_cuda", [("consumer.wait_event(item.ready)", "pass")], reads),
    "prefetch: no record_stream of images": (P, "_cuda", [("item.images.record_stream(consumer)", "pass")], drops),
    "prefetch: no record_stream of labels": (P, "_cuda", [("item.labels.record_stream(consumer)", "pass")], drops),
    "prefetch: ready recorded before normalizing": (P, "_enqueue", [
        ("images = self.normalizer(images)", "ready.record(stream); images = self.normalizer(images)"),
        ("ready.record(stream)", "pass")], reads),
    "prefetch: buffer released without its copy event": (P, "_enqueue", [
        ("batch.release(copied)", "batch.release()")], slots),
    "prefetch: copy event recorded before the copies": (P, "_enqueue", [
        ("start.record(stream)", "start.record(stream); copied.record(stream)"),
        ("copied.record(stream)", "pass", 0)], slots),
    "prefetch: failed copy leaves its event unrecorded": (P, "_enqueue", [("if not recorded:", "if False:")],
                                                          failing_copy),
    "prefetch: no wait for device inputs' producer": (P, "_enqueue", [("stream.wait_stream(producer)", "pass")],
                                                      device_inputs),
    "prefetch: no record_stream of device inputs": (P, "_enqueue", [("t.record_stream(stream)", "pass")],
                                                    device_inputs),
    "prefetch: close() without synchronize": (P, "close", [("self._stream.synchronize()", "pass")], closing),
    "ring: slot handed out before its copy event": (BufferRing, "acquire", [
        ("if s.event is None or s.event.query():", "if True:")], slots),
    "gpu decode: no consumer wait_event": (G, "_cuda", [("consumer.wait_event(item.ready)", "pass")], gpu_reads),
    "gpu decode: no record_stream": (G, "_cuda", [("t.record_stream(consumer)", "pass")], gpu_reads),
    "gpu decode: ready recorded before decoding": (G, "_enqueue", [
        ("item = self._decode(batch, self._stream.cuda_stream)",
         "early = torch.cuda.Event(); early.record(self._stream); "
         "item = self._decode(batch, self._stream.cuda_stream)"),
        ("item.ready = torch.cuda.Event()", "item.ready = early"),
        ("item.ready.record(self._stream)", "pass")], gpu_reads),
    "gpu decode: close() without synchronize": (G, "close", [("self._stream.synchronize()", "pass")], gpu_closing),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_the_simulator_catches(sim, monkeypatch, request, mutation):
    owner, name, edits, scenario = MUTATIONS[mutation]
    mutate(monkeypatch, owner, name, edits)
    failed = None
    try:
        scenario(sim, request)
    except AssertionError as e:
        failed = str(e)
    races = sim.take_races()
    assert races or failed, f"{mutation}: no race reported and every check passed"
