#!/usr/bin/env python3
"""What PyTorch's real CPU peak is made of: a rung's step run for real (the peer's `make`,
imported) with build/libvlmemcount.so preloaded in its "who" mode (VL_MEMCOUNT_WHO=1): every
live heap block is kept with what allocated it, the ATen op running at the time (a
TorchDispatchMode names each op) and whether it is a tensor's storage (the op's outputs,
the parameters, NF4 quantisation state, buffers and batch, marked as such), so the malloc-counted peak the peer
measures splits into tensors and what is no tensor: buffers a library takes for itself
(oneDNN's reorders and scratchpads, MKL's packing, through PyTorch's CPU allocator or its
own), C++ objects (autograd's nodes), Python objects. Neither the mimic nor MemTracker sees
the second part; this names it.

  python3 tools/peers/heap_breakdown.py --lib build/libvlmemcount.so --script seg_peer.py --config '{...}' [--steps 2]

--config and --script as tools/peers/memtracker_peer.py takes them (the peer's setup as
`vramlab peer-config CASE --step RUNG` prints it). The process re-runs itself with the
library preloaded. `steps` steps run (default 2: the first makes the optimizer's state and the
libraries' first-use buffers); the peak is the last step's, above the live bytes before the
setup began (the peer's base). Prints one JSON object:
  {"script", "steps", "peak_bytes": the last step's peak above the base (the peer's measure),
   "tensor_bytes_at_peak", "no_tensor_bytes_at_peak" (they sum to peak_bytes),
   "tensor_peak_bytes": the highest tensor bytes at any time in that step,
   "no_tensor_kept_bytes": what is no tensor and still held after the step (what the
       libraries keep after first use),
   "no_tensor_at_peak": [[class, op, bytes], ...] the largest sites, class one of
       c10_allocator (a buffer a library took through PyTorch's CPU allocator, no op's output),
       libtorch_cpu (oneDNN's or MKL's own), operator_new, python, small (under 4 KiB), other;
       op the ATen op that was running ("-": none),
   "seconds", "torch", ...}
or {"error": ...} with exit status 1. The dispatch mode and the bookkeeping make the step
slow: its timings mean nothing and are not taken."""
import ctypes
import gc
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import memtracker_peer  # noqa: E402
import peer_common  # noqa: E402


def preload_self():
    """--lib PATH taken off argv; the process re-executed with PATH preloaded in who mode."""
    lib = None
    if "--lib" in sys.argv:
        i = sys.argv.index("--lib")
        lib = sys.argv[i + 1] if i + 1 < len(sys.argv) else None
        del sys.argv[i:i + 2]
    if os.environ.get("VL_MEMCOUNT_WHO") == "1":
        return
    if not lib:
        return  # run() says why
    env = dict(os.environ, VL_MEMCOUNT_WHO="1", VL_MEMCOUNT_LIB=os.path.abspath(lib))
    env["LD_PRELOAD"] = ":".join(x for x in (env["VL_MEMCOUNT_LIB"], os.environ.get("LD_PRELOAD")) if x)
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


def read_dump(path):
    with open(path) as f:
        head = [int(x) for x in f.readline().split()]
        rows = []
        for line in f:
            cls, op, base, peak, now = line.rstrip("\n").split("\t")
            rows.append((cls, op, int(base), int(peak), int(now)))
    return head, rows


def breakdown(torch, make, cfg, steps):
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    path = os.environ.get("VL_MEMCOUNT_LIB", "")
    if os.environ.get("VL_MEMCOUNT_WHO") != "1" or not path:
        raise RuntimeError("libvlmemcount is not preloaded in who mode (give --lib build/libvlmemcount.so)")
    lib = ctypes.CDLL(path)
    lib.vl_memcount_who_dump.restype = ctypes.c_int
    lib.vl_memcount_who_tensor.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.vl_memcount_who_op.argtypes = [ctypes.c_char_p]
    names = {}

    def tensor(t, op):
        if isinstance(t, torch.Tensor) and t.device.type == "cpu" and not t.is_meta:
            lib.vl_memcount_who_tensor(t.untyped_storage().data_ptr(), names.setdefault(op, op.encode()))

    class Tag(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__
            lib.vl_memcount_who_op(names.setdefault(name, name.encode()))
            try:
                out = func(*args, **(kwargs or {}))
            finally:
                lib.vl_memcount_who_op(None)
            for t in tree_flatten(out)[0]:
                tensor(t, name)
            return out

    gc.collect()
    lib.vl_memcount_who_base()  # the peer's base: before anything of the setup exists
    st = make(torch, peer_common.Memory(torch, "cpu"), cfg)
    for t in peer_common.before_step(torch, st):  # parameters, quantisation state, buffers, batch
        tensor(t, "before_step")
    t0 = time.perf_counter()
    for k in range(steps):
        gc.collect()
        if k == steps - 1:
            lib.vl_memcount_who_reset_peak()
        with Tag():
            st.one_step()
    gc.collect()
    secs = time.perf_counter() - t0
    fd, dump = tempfile.mkstemp(prefix="vl-heap-", suffix=".tsv")
    os.close(fd)
    try:
        if lib.vl_memcount_who_dump(dump.encode()) != 0:
            raise RuntimeError("libvlmemcount could not write its sites")
        (live, peak, _tl, tpeak), rows = read_dump(dump)
    finally:
        os.unlink(dump)
    base = sum(r[2] for r in rows)
    at_peak = [(c, op, pk - b) for c, op, b, pk, _ in rows]
    tensor_at = sum(n for c, _, n in at_peak if c == "tensor")
    other = sorted(((c, op, n) for c, op, n in at_peak if c != "tensor" and n > 0), key=lambda r: -r[2])
    kept = sum(now - b for c, _, b, _, now in rows if c != "tensor")
    return {"peak_bytes": peak - base, "tensor_bytes_at_peak": tensor_at,
            "no_tensor_bytes_at_peak": peak - base - tensor_at, "tensor_peak_bytes": tpeak,
            "no_tensor_kept_bytes": kept, "no_tensor_at_peak": [list(r) for r in other[:8]],
            "live_after_bytes": live - base, "seconds": secs}


if __name__ == "__main__":
    preload_self()
    code = memtracker_peer.cli(__doc__, breakdown)
    sys.stdout.flush()
    os._exit(code)
