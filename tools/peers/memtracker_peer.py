#!/usr/bin/env python3
"""PyTorch's own memory estimate of a rung's training step: MemTracker
(torch.distributed._tools.mem_tracker) over the step the case's PyTorch peer runs
(tools/peers/llm_lora_peer.py, seg_peer.py, sd_lora_peer.py: their `make` builds it,
imported), traced on
fake tensors (FakeTensorMode on the config's device: the real ops' shapes, dtypes and
allocations, no memory and no arithmetic). A CUDA config traces on a fake CUDA device, which
needs a GPU: autograd's backward asks the device for its context, so without one it is an
error that says so (the CPU trace runs anywhere). The model, its optimizer and the batch are built
under the fake mode, then `steps` training steps are traced (default 2: the first creates
the optimizer's state, the second is the steady step the real peer's peak is measured on;
the peak is over both). On fake tensors no value can be read, so the loss is not summed and
GradScaler's overflow check and scale update are left out (peer_common.Stepper.one_step).

  python3 tools/peers/memtracker_peer.py --script llm_lora_peer.py --config '{...}'

--config is the peer's setup as `vramlab peer-config CASE --step RUNG` prints it ("config");
--script the peer it belongs to ("script"). Prints one JSON object:
  {"script", "device": "cpu (fake)" | "cuda (fake)", "steps", "peak_bytes": MemTracker's total peak,
   "categories": {"PARAM": bytes, "BUFFER", "GRAD", "ACT", "TEMP", "OPT", "OTH"} at that peak,
   "build_seconds": building the model and optimizer on fake tensors,
   "trace_seconds": the traced steps, "torch", "transformers", "peft", "torchvision",
   "diffusers"}
or {"error": ...} with exit status 1 (an import that fails also names "missing").
--as-shipped leaves MemTracker's per-module peak loop in (see total_peak_only: the same total
peak, a slower trace; "as_shipped": true in the reply): how long PyTorch's estimator takes as
PyTorch ships it. One
process per rung: a process that traced an earlier rung may keep state (compiled kernels,
caches) that a later trace does not see again. Anything a library prints goes to stderr."""
import argparse
import importlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import peer_common  # noqa: E402

# the peers MemTracker can trace: their module and what they import
PEERS = {"llm_lora_peer.py": ("llm_lora_peer", ("transformers", "peft")),
         "seg_peer.py": ("seg_peer", ("torchvision",)),
         "sd_lora_peer.py": ("sd_lora_peer", ("diffusers", "transformers", "peft"))}


class NoMemory:
    """The peers' Memory on fake tensors: nothing to count (MemTracker counts)."""
    kind, why = None, "fake tensors"

    def live(self):
        return 0


def versions():
    out = {}
    for name in ("torch", "transformers", "peft", "torchvision", "diffusers"):
        mod = sys.modules.get(name)
        if mod is not None:
            out[name] = mod.__version__
    return out


def fake_to(self, *args, **kwargs):
    """torch.nn.Module.to for a module of fake tensors: each parameter converted (floating
    ones to the dtype) is replaced by a new Parameter of the converted tensor, as
    torch.__future__'s overwrite mode does (the old one is freed: the same bytes as the
    in-place conversion). Module._apply swaps a fake parameter in place, which fails
    ("Couldn't swap ...: weakref associated with it", torch 2.15) even when nothing changes."""
    import torch
    device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
    done = {}

    def conv(t):
        if dtype is not None and (t.is_floating_point() or t.is_complex()):
            return t.to(device=device, dtype=dtype)
        return t.to(device=device) if device is not None else t

    with torch.no_grad():
        for mod in self.modules():
            for k, p in list(mod._parameters.items()):
                if p is None:
                    continue
                if id(p) not in done:  # a parameter shared by two modules stays one
                    q = conv(p)
                    done[id(p)] = p if q is p else torch.nn.Parameter(q, requires_grad=p.requires_grad)
                mod._parameters[k] = done[id(p)]
            for k, b in list(mod._buffers.items()):
                if b is not None:
                    mod._buffers[k] = conv(b)
    return self


def frozen_hooks_skipped(torch):
    """MemTracker installs gradient hooks on every parameter, and a frozen one (LoRA's base)
    refuses them ("cannot register a hook on a tensor that doesn't require gradient"): on a
    tensor without requires_grad, whose gradient is never computed, the hook is a no-op
    handle instead."""
    from torch.utils.hooks import RemovableHandle

    class Hooks(dict):  # RemovableHandle keeps a weak reference to its dict (a plain one has none)
        pass
    for name in ("register_hook", "register_post_accumulate_grad_hook"):
        orig = getattr(torch.Tensor, name)

        def wrapped(self, hook, _orig=orig):
            if not self.requires_grad:
                return RemovableHandle(Hooks())
            return _orig(self, hook)
        setattr(torch.Tensor, name, wrapped)


def total_peak_only(mt):
    """MemTracker updates, on every op, the peak of every module it has seen that is active
    (a loop over all of them: O(ops x modules), minutes for a U-Net with PEFT's thousands of
    modules); only the total peak (get_tracker_snapshot("peak")) is read here, so the
    per-module loop is left out and the total's update kept as MemTracker writes it."""
    from copy import deepcopy
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY

    def update(peak_state):
        for dev, dev_snap in mt._curr_mem_snap.items():
            if mt._peak_mem.get(dev, 0) < dev_snap[_TOTAL_KEY]:
                mt._peak_mem[dev] = dev_snap[_TOTAL_KEY]
                mt._peak_mem_snap[dev] = deepcopy(dev_snap)
    mt._update_peak_stats = update


def trace(torch, make, cfg, steps, as_shipped=False):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    device = cfg.get("device", "cpu")
    if device not in ("cpu", "cuda"):
        raise ValueError("this peer traces on a fake CPU or CUDA device (config device: %s)" % device)
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("a fake CUDA step is traced only where a GPU is: its backward asks the device for its "
                         "context (torch.cuda.is_available() is False here)")
    torch.nn.Module.to = fake_to
    frozen_hooks_skipped(torch)
    t0 = time.perf_counter()
    with FakeTensorMode():
        try:
            st = make(torch, NoMemory(), cfg)
        except RuntimeError as e:
            if "Params4bit" not in str(e):
                raise
            raise ValueError("bitsandbytes' Params4bit (an NF4 base) cannot wrap a fake tensor, so MemTracker "
                             "cannot trace the step") from e
        t1 = time.perf_counter()
        mt = MemTracker()
        if not as_shipped:
            total_peak_only(mt)
        mt.track_external(st.model, st.opt)
        with mt:
            for _ in range(steps):  # per-module statistics are per forward (a micro-batch of an
                # accumulated step is one); the peak is kept across
                st.one_step(fake=True, each_micro=mt.reset_mod_stats)
        t2 = time.perf_counter()
        snap = mt.get_tracker_snapshot("peak")
    dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    per = snap.get(dev) or next(iter(snap.values()))
    cats, total = {}, None
    for k, v in per.items():
        if k == "Total":
            total = int(v)
        else:
            cats[getattr(k, "name", str(k))] = int(v)
    out = {"peak_bytes": total if total is not None else sum(cats.values()), "categories": cats,
           "build_seconds": round(t1 - t0, 3), "trace_seconds": round(t2 - t1, 3)}
    if as_shipped:
        out["as_shipped"] = True
    return out


def cli(doc, run, extra=None):
    """The command line both fake-tensor tools share (this one and torch_trace.py): --script,
    --config, --steps; the peer's modules imported (a missing one named); run(torch, make, cfg,
    steps) -> dict (extra(ap) adds a tool's own options; run then also gets the parsed
    arguments), emitted with the script and versions; every failure a reply."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--script", required=True, choices=sorted(PEERS), help="the peer the config belongs to")
    ap.add_argument("--config", required=True, help="the peer's setup (JSON)")
    ap.add_argument("--steps", type=int, default=2, help="training steps traced (default 2)")
    if extra:
        extra(ap)
    a = ap.parse_args()
    peer_common._claim_stdout()
    module, needs = PEERS[a.script]
    for name in ("torch",) + needs:
        try:
            importlib.import_module(name)
        except ImportError as e:
            peer_common.emit({"error": f"cannot import {name}: {e}", "missing": name})
            return 1
    import torch
    try:
        cfg = json.loads(a.config)
        out = {"script": a.script, "steps": a.steps}
        out.update(run(torch, importlib.import_module(module).make, cfg, a.steps, *((a,) if extra else ())))
        out.update(versions())
    except Exception as e:  # every failure is a reply
        peer_common.emit({"error": f"{type(e).__name__}: {e}"[:400]})
        return 1
    peer_common.emit(out)
    return 0


def main():
    def shipped(ap):
        ap.add_argument("--as-shipped", action="store_true",
                        help="keep MemTracker's per-module peak loop (slower; the same total peak)")
    return cli(__doc__, lambda torch, make, cfg, steps, a: dict(
        device=cfg.get("device", "cpu") + " (fake)", **trace(torch, make, cfg, steps, a.as_shipped)), shipped)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # no interpreter teardown (seconds with torch loaded)
