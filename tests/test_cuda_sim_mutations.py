"""Each synchronization of the device driver is needed: remove a wait, a record_stream or
an event gate, or record an event too early, and a simulator scenario reports a race (or
its own check fails). The scenarios are the tests of test_cuda_sim_loader.py,
test_cuda_sim_defects.py and test_cuda_sim_gpu_decode.py, run here on mutated code; a
mutation of the driver's own loop must be caught on both of its executors (the host copy
and GPU decode, which runs on the driver's thread)."""

import pytest

import test_cuda_sim_defects as defects
import test_cuda_sim_gpu_decode as gpu_decode
import test_cuda_sim_loader as scenes
from cudasim.mutate import mutate
from fastload.device.copy import HostCopy
from fastload.device.driver import DeviceDriver
from fastload.device.gpudecode.executor import GpuDecode
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


D, H, G = DeviceDriver, HostCopy, GpuDecode
MUTATIONS = {
    "driver: no consumer wait_event": (D, "_cuda", [("consumer.wait_event(batch.ready)", "pass")], reads),
    "driver: no record_stream of images": (D, "_cuda", [("view.record_stream(consumer)", "pass")], drops),
    "driver: no record_stream of labels": (D, "_cuda", [("batch.labels.record_stream(consumer)", "pass")], drops),
    "driver: ready recorded before normalizing": (D, "_queue", [
        ("images = self.normalizer(staged.images)", "ready.record(stream); images = self.normalizer(staged.images)"),
        ("ready.record(stream)", "pass")], reads),
    "driver: close() without synchronize": (D, "close", [("stream.synchronize()", "pass")], closing),
    "driver on gpu decode: no consumer wait_event": (D, "_cuda", [("consumer.wait_event(batch.ready)", "pass")],
                                                     gpu_reads),
    "driver on gpu decode: no record_stream of images": (D, "_cuda", [("view.record_stream(consumer)", "pass")],
                                                         gpu_reads),
    "driver on gpu decode: no record_stream of labels": (D, "_cuda", [
        ("batch.labels.record_stream(consumer)", "pass")], gpu_reads),
    "driver on gpu decode: ready recorded before normalizing": (D, "_queue", [
        ("images = self.normalizer(staged.images)", "ready.record(stream); images = self.normalizer(staged.images)"),
        ("ready.record(stream)", "pass")], gpu_reads),
    "driver on gpu decode: ready recorded before staging": (D, "_queue", [
        ("staged = self.executor.stage(item, self._placement(stream))",
         "early = torch.cuda.Event(); early.record(stream); staged = self.executor.stage(item, self._placement(stream))"),
        ("ready.record(stream)", "ready = early")], gpu_reads),
    "driver on gpu decode: close() without synchronize": (D, "close", [("stream.synchronize()", "pass")],
                                                          gpu_closing),
    "copy: buffer released without its copy event": (H, "_copy", [("batch.release(copied)", "batch.release()")], slots),
    "copy: copy event recorded before the copies": (H, "_copy", [
        ("start.record(stream)", "start.record(stream); copied.record(stream)"),
        ("copied.record(stream)", "pass", 0)], slots),
    "copy: failed copy leaves its event unrecorded": (H, "_copy", [("if not recorded:", "if False:")], failing_copy),
    "copy: no wait for device inputs' producer": (H, "_copy", [("stream.wait_stream(producer)", "pass")],
                                                  device_inputs),
    "copy: no record_stream of device inputs": (H, "_copy", [("t.record_stream(stream)", "pass")], device_inputs),
    "ring: slot handed out before its copy event": (BufferRing, "acquire", [
        ("if s.event is None or s.event.query():", "if True:")], slots),
    "gpu decode: work queued off the driver's stream": (G, "stage", [
        ("with torch.cuda.stream(at.stream):", "if True:")], gpu_reads),
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
