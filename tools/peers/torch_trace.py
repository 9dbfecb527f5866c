#!/usr/bin/env python3
"""Every allocation and free of a PyTorch training step, op by op: a TorchDispatchMode over
fake tensors (FakeTensorMode on the CPU device: the real ATen ops, their shapes and dtypes,
no memory and no arithmetic) around the step a case's PyTorch peer runs
(tools/peers/llm_lora_peer.py, seg_peer.py, sd_lora_peer.py: their `make` builds it, imported).

What `vramlab plan CASE --mimic pytorch` replays is learned from these traces, and
tests/test_mimic.c compares the mimic with the committed ones (tests/fixtures/trace/).

  python3 tools/peers/torch_trace.py --script llm_lora_peer.py --config '{...}' [--steps 2]

  python3 tools/peers/torch_trace.py --real --script llm_lora_peer.py --config '{...}'

--config is the peer's setup as `vramlab peer-config CASE --step RUNG` prints it. --real runs
the step on real tensors on the CPU instead (the values computed; the code path PyTorch takes
when it runs, which on fake tensors can differ: transformers' packed-sequence check cannot read
a fake value, so it builds a causal mask the real run does not). Prints one JSON object:
  {"script", "steps", "config" (the --config given), "real": whether --real, "torch", "transformers", "peft",
   "base_bytes": bytes of the storages alive when the trace began (parameters, an NF4 weight's
                 quantisation state, buffers, the batch: what the step does not allocate),
   "events": [[op, phase, bytes], ...]: bytes > 0 an allocation (a new storage an op made),
             bytes < 0 a free (that storage's last reference gone, after the op named),
             phase f (forward), b (backward), o (clip, optimizer, zero_grad), in step order,
   "steps_at": index into events where each step begins,
   "peak_bytes": the highest sum of live bytes (base included), "peak_at": its event index,
   "peak_phase"}
or {"error": ...} with exit status 1. A storage is counted once however many tensors view it;
its bytes are its nbytes (no allocator rounding: the CPU's and MemTracker's view).

A custom op whose kernel is Python (bitsandbytes' gemm_4bit, dequantize_4bit: registered with
torch.library.register_kernel) is traced inside under --real: its kernel runs with the tracer
active, so the temporaries it makes (the dequantised weight of an NF4 matmul) are events too.
On fake tensors the op's fake kernel is all there is (MemTracker sees no more)."""
import os
import sys
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import memtracker_peer  # noqa: E402
import peer_common  # noqa: E402


KERNELS = {}  # (an op's qualified name, device type) -> its Python kernel (capture_kernels)


def capture_kernels():
    """Keep every Python kernel registered from now on (before the peer's modules are imported:
    PEFT imports bitsandbytes, which registers its kernels at import)."""
    import torch
    register_kernel = torch.library.register_kernel

    def capture(op, device_types, func=None, *a, **k):
        devs = [device_types] if isinstance(device_types, str) else list(device_types or [None])

        def keep(fn):
            for d in devs:
                KERNELS[(op if isinstance(op, str) else str(op), d)] = fn
            return register_kernel(op, device_types, fn, *a, **k)
        return keep(func) if func is not None else keep
    torch.library.register_kernel = capture


def trace(torch, make, cfg, steps, real=False):
    import contextlib

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.weak import WeakIdKeyDictionary

    if not real:
        torch.nn.Module.to = memtracker_peer.fake_to
    state = {"phase": "f", "op": "init"}
    events, live = [], [0]
    seen = WeakIdKeyDictionary()
    refs = []

    def track(st, op):
        if st in seen:
            return False
        n = st.nbytes()
        seen[st] = n

        def gone(_ref, n=n):
            events.append([state["op"], state["phase"], -n])
        refs.append(weakref.ref(st, gone))
        return n

    class Tracer(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            qual = func._schema.name
            kern = real and (KERNELS.get((qual, "cpu")) or KERNELS.get((qual, "default")))
            if kern:  # a Python kernel: traced inside (its outputs are its last ops')
                with self:
                    out = kern(*args, **(kwargs or {}))
            else:
                out = func(*args, **(kwargs or {}))
            name = func.__name__
            state["op"] = name
            flat, _ = tree_flatten(out)
            for t in flat:
                if isinstance(t, torch.Tensor):
                    n = track(t.untyped_storage(), name)
                    if n:
                        events.append([name, state["phase"], n])
            return out

    with contextlib.nullcontext() if real else FakeTensorMode():
        st = make(torch, memtracker_peer.NoMemory(), cfg)
        base = 0
        pre = peer_common.before_step(torch, st)  # parameters, quantisation state, buffers, batch
        for t in pre:
            n = track(t.untyped_storage(), "init")
            base += n or 0
        orig_backward, orig_step = torch.Tensor.backward, st.opt.step

        def backward(self, *a, **k):
            state["phase"] = "b"
            r = orig_backward(self, *a, **k)
            state["phase"] = "o"  # what follows a micro-batch's backward until the next forward
            return r

        def ostep(*a, **k):
            state["phase"] = "o"
            return orig_step(*a, **k)
        torch.Tensor.backward = backward
        st.opt.step = ostep
        steps_at = []

        def micro_begins():
            state["phase"] = "f"
        with Tracer():
            for _ in range(steps):
                steps_at.append(len(events))
                st.one_step(fake=not real, each_micro=micro_begins)
        torch.Tensor.backward = orig_backward
    done = list(events)  # what the steps did: frees after this (the model's, when trace
    # returns) are not the step's
    cur, peak, at = base, base, -1
    for i, (_, _, n) in enumerate(done):
        cur += n
        if cur > peak:
            peak, at = cur, i
    return {"base_bytes": base, "steps_at": steps_at, "peak_bytes": peak, "peak_at": at,
            "peak_phase": done[at][1] if at >= 0 else None, "events": done}


def main():
    real = "--real" in sys.argv
    if real:
        sys.argv.remove("--real")
        capture_kernels()
    return memtracker_peer.cli(__doc__, lambda torch, make, cfg, steps: dict(config=cfg, real=real,
                                                                             **trace(torch, make, cfg, steps, real)))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
