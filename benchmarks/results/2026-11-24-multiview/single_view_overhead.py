import time, sys, numpy as np
import fastload as fl
from fastload.sources.fetch import BatchFetcher
from fastload.sources.inflight import InFlight
from fastload.sampler import BatchRequest
from fastload.prefetch import CudaPrefetcher
root = "/work/wt/multiview/data/sample/photos500"
ds = fl.ImageFolder(root, transform=fl.transforms.train(224))
f = BatchFetcher(ds, 0, "raise", InFlight(1))
p = CudaPrefetcher((), "cpu")
def run():
    batches = (f.fetch(BatchRequest(0, np.arange(b*32, b*32+32))) for b in range(15))
    return sum(x.shape[0] for x, y in p.run(batches))
run()
t = time.process_time(); n = run(); n += run()
print(f"{(time.process_time()-t)/n*1e6:.1f}")
