import time, os, sys, statistics
import fastload as fl
persist = sys.argv[1] == "1"
w = fl.Loader(fl.WebDataset("/tmp/bench-data/photos2000-wds", transform=fl.transforms.train(224)), batch_size=128, num_workers=2, normalize=False, device="cpu", shuffle=True, seed=0, stall_warning=0, persistent_workers=persist)
f = fl.Loader(fl.ImageFolder("/tmp/bench-data/photos2000", transform=fl.transforms.train(224)), batch_size=128, num_workers=2, normalize=False, device="cpu", shuffle=True, seed=0, stall_warning=0, backend="thread")
for _ in w: pass
for _ in f: pass
rates = []
for e in range(1, 8):
    w.set_epoch(e); sum(1 for _ in w)
    f.set_epoch(e); time.sleep(0.5); t=time.perf_counter(); n=sum(x.shape[0] for x,_ in f); rates.append(n/(time.perf_counter()-t))
print("persistent" if persist else "per-pass  ", round(statistics.median(rates)), [round(r) for r in rates])
w.close(); f.close()
