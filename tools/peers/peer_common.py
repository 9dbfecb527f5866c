"""What the PyTorch peers share: the line protocol the cases drive them with, the timed
steps, and the memory of a step (GPU: torch.cuda.max_memory_allocated; CPU: the live heap
bytes counted by build/libvlmemcount.so, preloaded by the case).

Protocol (one request per line on stdin, one JSON object per line on stdout):
  on start            -> {"hello": 1, "torch": ..., "fp16_fast": bool, "bf16_fast": bool,
                          "memory": "memcount" | "cuda" | null, "memory_why": str,
                          "cuda_capability": [major, minor] | null}
  setup <json config> -> {"ready": 1, "params_total": n, "params_trainable": n, ...}
  step <k>            -> {"times": [k seconds], "losses": [...], "peak_bytes": ...,
                          "step_extra_bytes": ..., "persistent_bytes": ...,
                          "reserved_bytes": ... (GPU: torch.cuda.max_memory_reserved)}
  quit                -> exit 0
A request that fails answers {"error": "<reason>"}; the process stays up. A module that
cannot be imported answers the hello with {"error": ..., "missing": "<module>"} and exits 3.
Anything else a library prints goes to stderr: stdout carries the replies only.

Standalone (by hand): --config JSON --warmup W --steps N runs setup, W untimed steps and N
timed ones, and prints one JSON object (the setup's and the steps' replies together)."""
import argparse
import ctypes
import gc
import json
import os
import statistics
import sys
import time

_reply_fd = None


def _claim_stdout():
    """Replies go to a private copy of stdout; fd 1 then points at stderr."""
    global _reply_fd
    if _reply_fd is None:
        sys.stdout.flush()
        _reply_fd = os.dup(1)
        os.dup2(2, 1)


def emit(obj):
    data = (json.dumps(obj, allow_nan=False) + "\n").encode()
    while data:
        n = os.write(_reply_fd, data)
        data = data[n:]


class Memory:
    """The bytes a step holds: live before it, peak during it, above the setup's base."""

    def __init__(self, torch, device):
        self.torch, self.device, self.lib, self.why = torch, device, None, ""
        if device == "cuda":
            return
        path = os.environ.get("VL_MEMCOUNT_LIB", "")
        if not path:
            self.why = "the malloc-counting library is not preloaded (VL_MEMCOUNT_LIB unset)"
            return
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            self.why = f"cannot load {path}: {e}"
            return
        for name in ("vl_memcount_live", "vl_memcount_peak"):
            getattr(lib, name).restype = ctypes.c_int64
        lib.vl_memcount_calls.restype = ctypes.c_uint64
        lib.vl_memcount_reset_peak.restype = None
        if lib.vl_memcount_calls() == 0:
            self.why = f"{path} is loaded but not preloaded (LD_PRELOAD): it sees no allocation"
            return
        self.lib = lib

    @property
    def kind(self):
        if self.device == "cuda":
            return "cuda"
        return "memcount" if self.lib else None

    def live(self):
        if self.device == "cuda":
            return self.torch.cuda.memory_allocated()
        return self.lib.vl_memcount_live() if self.lib else 0

    def reset_peak(self):
        if self.device == "cuda":
            self.torch.cuda.reset_peak_memory_stats()
        elif self.lib:
            self.lib.vl_memcount_reset_peak()

    def peak(self):
        if self.device == "cuda":
            return self.torch.cuda.max_memory_allocated()
        return self.lib.vl_memcount_peak() if self.lib else 0


def fast_half(torch, device):
    """Whether fp16 / bf16 compute has fast kernels here (CPU: oneDNN's; without them
    PyTorch runs reference loops many times slower than fp32, no fair comparison)."""
    if device == "cuda":
        return True, torch.cuda.is_bf16_supported()
    try:
        return (bool(torch.ops.mkldnn._is_mkldnn_fp16_supported()),
                bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))
    except (AttributeError, RuntimeError):
        return False, False


def numel(p):
    """A parameter's element count: an NF4 weight (bitsandbytes' Params4bit) packs two in each
    uint8 (transformers' num_parameters counts it so too)."""
    return p.numel() * (2 if getattr(p, "quant_state", None) is not None else 1)


def before_step(torch, st):
    """The tensors that exist before a step of st (a Stepper made by a peer's make): the
    model's parameters and buffers, each NF4 weight's quantisation state (absmax, code, offset,
    and its nested state's), and the batch (the tensors st.micro closes over)."""
    out = list(st.model.parameters()) + list(st.model.buffers())
    for w in st.model.parameters():
        qs = getattr(w, "quant_state", None)
        while qs is not None:
            out += [x for x in (qs.absmax, qs.code, qs.offset) if isinstance(x, torch.Tensor)]
            qs = getattr(qs, "state2", None)
    for cell in (st.micro.__closure__ or ()):
        try:
            v = cell.cell_contents
        except ValueError:  # a name the step never binds (sd_lora_peer.py: a cached rung's
            continue  # images and tokens)
        if isinstance(v, torch.Tensor):
            out.append(v)
    return out


class Stepper:
    """A model's training step, timed, with its memory. Subclasses build model, optimizer,
    batch and the loss in setup(cfg) and set self.micro (the micro-batch forward+backward)."""

    def __init__(self, torch, mem, cfg):
        self.torch, self.mem, self.cfg = torch, mem, cfg
        self.device = cfg.get("device", "cpu")
        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()
        self.base = mem.live()  # before anything of this setup exists
        self.scaler = None
        self.autocast = None

    def amp(self, compute):
        """autocast (and GradScaler for fp16) for compute fp16/bf16; fp32: none."""
        torch = self.torch
        if compute == "fp32":
            return
        dt = torch.float16 if compute == "fp16" else torch.bfloat16
        self.autocast = lambda: torch.autocast(self.device, dtype=dt)
        if compute == "fp16":
            self.scaler = torch.amp.GradScaler(self.device)

    def optimizer(self, params, t):
        torch = self.torch
        name, lr = t["optimizer"], t["lr"]
        if name == "adamw":
            return torch.optim.AdamW(params, lr=lr, betas=tuple(t["betas"]), eps=t["eps"],
                                     weight_decay=t["weight_decay"])
        if name == "sgd":
            return torch.optim.SGD(params, lr=lr, momentum=t["momentum"], weight_decay=t["weight_decay"])
        if name == "adafactor":
            from transformers.optimization import Adafactor
            return Adafactor(params, lr=lr, eps=(1e-30, t["eps2"]), clip_threshold=t["clip_threshold"],
                             decay_rate=-t["decay_pow"], beta1=t["beta1"] if t["adafactor_beta1"] else None,
                             weight_decay=t["weight_decay"], scale_parameter=False, relative_step=False,
                             warmup_init=False)
        raise ValueError(f"optimizer {name}: the peer knows adamw, sgd and adafactor")

    def one_step(self, fake=False, each_micro=None):
        """accum micro-batches, unscale, clip, update, grads set to None (PyTorch's default).
        fake: on fake tensors (tools/peers/memtracker_peer.py), where no value can be read:
        the loss is not summed (0 returned) and GradScaler's overflow check and scale update
        are left out (the optimizer steps as after a step without overflow). each_micro: called
        before each micro-batch (MemTracker's per-iteration module statistics)."""
        torch, accum = self.torch, self.cfg["train"]["accum"]
        loss_sum = 0.0
        for _ in range(accum):
            if each_micro:
                each_micro()
            if self.autocast:
                with self.autocast():
                    loss = self.micro() / accum
            else:
                loss = self.micro() / accum
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            if not fake:
                loss_sum += float(loss.detach())
        if self.scaler:
            self.scaler.unscale_(self.opt)
        clip = self.cfg["train"]["clip"]
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(self.trainable, clip)
        if self.scaler and not fake:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
            if self.scaler:  # what update() ends with: the next step may unscale again
                import collections
                from torch.amp.grad_scaler import _refresh_per_optimizer_state
                self.scaler._per_optimizer_states = collections.defaultdict(_refresh_per_optimizer_state)
        self.opt.zero_grad(set_to_none=True)
        return loss_sum

    def steps(self, k):
        torch = self.torch
        times, losses, peak, extra, persistent = [], [], 0, 0, 0
        for _ in range(k):
            if self.device == "cuda":
                torch.cuda.synchronize()
            before = self.mem.live()
            self.mem.reset_peak()
            t0 = time.perf_counter()
            losses.append(self.one_step())
            if self.device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            top = self.mem.peak()
            peak = max(peak, top - self.base)
            extra = max(extra, top - before)
            persistent = max(persistent, before - self.base)
        out = {"times": times, "losses": losses}
        if self.mem.kind:
            out.update(peak_bytes=peak, step_extra_bytes=extra, persistent_bytes=persistent)
        if self.device == "cuda":  # the caching allocator's high-water mark, context excluded
            out["reserved_bytes"] = torch.cuda.max_memory_reserved()
        return out

    def saved_bytes(self, params):
        """Bytes of the distinct tensors autograd saves in one forward of one micro-batch
        (parameters left out): None under checkpointing, whose re-run hides them."""
        torch = self.torch
        if self.cfg["train"].get("checkpoint"):
            return None
        skip = {p.untyped_storage().data_ptr() for p in params}
        seen, keep = {}, []

        def pack(t):
            # kept here, not in the graph (a saved output packed as itself would make a
            # reference cycle through the graph that is never freed), so a storage's address
            # is not reused within the forward
            st = t.untyped_storage()
            if st.data_ptr() not in skip:
                seen[st.data_ptr()] = st.nbytes()
            keep.append(t)

        def unpack(_):
            raise RuntimeError("the saved-tensor count runs no backward")

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            if self.autocast:
                with self.autocast():
                    loss = self.micro()
            else:
                loss = self.micro()
        del loss
        keep.clear()
        self.opt.zero_grad(set_to_none=True)
        return sum(seen.values())

    def ready(self, model):
        params = list(model.parameters())
        out = {"ready": 1, "params_total": sum(numel(p) for p in params),
               "params_trainable": sum(p.numel() for p in params if p.requires_grad),
               "setup_bytes": self.mem.live() - self.base if self.mem.kind else None,
               "saved_bytes": self.saved_bytes(params)}
        if self.device == "cuda":
            # the blocks the build freed (a model made in fp32 and cast to fp16: at 7B, 29 GB)
            # and the saved-tensor count's go back to the driver, so the steps' max_memory_reserved
            # is the step's own, as the mimic's estimate is
            gc.collect()
            self.torch.cuda.empty_cache()
        return out


def main(build, doc, needs):
    """The peer's main: hello, then requests (or the standalone run). build(torch, mem, cfg)
    returns (stepper, ready reply); needs: the modules it imports (named when missing)."""
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--config", help="standalone: the setup config (JSON)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    _claim_stdout()
    import importlib
    for name in ["torch"] + list(needs):
        try:
            importlib.import_module(name)
        except ImportError as e:
            emit({"error": f"cannot import {name}: {e}", "missing": name})
            return 3
    import torch
    tv = sys.modules["transformers"].__version__ if "transformers" in sys.modules else None
    device = "cuda" if torch.cuda.is_available() and os.environ.get("VL_PEER_DEVICE", "cpu") == "cuda" else "cpu"
    fp16, bf16 = fast_half(torch, device)
    mem = Memory(torch, device)
    hello = {"hello": 1, "torch": torch.__version__, "transformers": tv, "device": device,
             "threads": torch.get_num_threads(), "fp16_fast": fp16, "bf16_fast": bf16,
             "memory": mem.kind, "memory_why": mem.why,
             "cuda_capability": list(torch.cuda.get_device_capability()) if device == "cuda" else None}
    if a.config:
        cfg = json.loads(a.config)
        stepper, ready = build(torch, mem, cfg)
        stepper.steps(a.warmup)
        out = stepper.steps(a.steps)
        out.update(hello)
        out.update(ready)
        out["median"] = statistics.median(out["times"])
        emit(out)
        return 0
    emit(hello)
    stepper = None
    for line in sys.stdin:
        words = line.split(None, 1)
        if not words:
            continue
        try:
            if words[0] == "quit":
                break
            if words[0] == "setup":
                stepper = None
                cfg = json.loads(words[1])
                stepper, ready = build(torch, mem, cfg)
                emit(ready)
            elif words[0] == "step":
                if stepper is None:
                    raise ValueError("step before a successful setup")
                emit(stepper.steps(int(words[1])))
            else:
                raise ValueError(f"unknown request {words[0]!r}")
        except Exception as e:  # every failure is a reply: the case reports it, never hangs
            msg = f"{type(e).__name__}: {e}"
            if "out of memory" in msg.lower() or isinstance(e, MemoryError):
                msg = "out of memory: " + msg
            emit({"error": msg[:400]})
    os._exit(0)  # quit or end of input: no interpreter teardown (seconds with torch loaded)


def run(build, doc, needs=()):
    sys.exit(main(build, doc, needs))
