#!/usr/bin/env python3
"""Every rung of a case through MemTracker, and through the case's real PyTorch peer with
the malloc counter, into a fixture (tests/fixtures/memtracker/<case>.json).

  /work/venv-torch/bin/python tools/peers/memtracker_all.py --case llm-lora [--scale small]
  /work/venv-torch/bin/python tools/peers/memtracker_all.py --case llm-lora --scale full --no-real

(the second: the article's model on fake tensors, the 7B step among them, into
tests/fixtures/memtracker/llm-lora-full.json; a full-scale step's real tensors would not fit
this machine, so --no-real). --model-config FILE (llm-lora) plans another model of the family
(vramlab's --model-config; the peer builds its transformers class): the fixture records the
file and is named CASE-STEM-SCALE.json (cases/llm-lora/configs/llama-3.2-1b.json at full scale:
llm-lora-llama-3.2-1b-full.json).

The rungs' peer setups come from `vramlab peer-config CASE --scale S` (the C side's own
serialisation: the same setup the case's side-by-side sends its peer). Per rung, each in a
fresh process (a peer that ran an earlier rung reads low on the next):
  - tools/peers/memtracker_peer.py: MemTracker's peak by category on fake tensors, and the
    seconds the trace took;
  - the case's peer (llm_lora_peer.py, seg_peer.py, sd_lora_peer.py) standalone with build/libvlmemcount.so
    preloaded: PyTorch's real CPU peak (live heap bytes above those when the setup began, the
    highest over --steps timed steps after --warmup), as the side by side measures it.
A rung no CPU peer runs (an NF4 base, batch = max) is recorded with its reason; a run that
fails or runs past --timeout records its error; a rung whose setup is an earlier rung's (a
knob PyTorch's CPU step has no part in: llm-lora's cap, seg-ckpt's loader) gets that rung's
results and "same_config_as". The fixture (stable key order, two-space
indent):
  {"case", "scale", "generator", "versions": {torch, transformers, peft, torchvision, diffusers},
   "rungs": {RUNG: {"script", "config", "memtracker": {peak_bytes, categories,
                    build_seconds, trace_seconds, steps} | {"error"},
                    "real_cpu": {peak_bytes, persistent_bytes, step_extra_bytes,
                                 median_step_seconds, warmup, steps} | {"error"}}
                  | {"script", "not_measured"}}}
test_peers (C) checks that each rung's config is still the one `vramlab peer-config` makes."""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON reply")


def run_json(argv, env, timeout):
    """The command's one JSON reply, or {"error": ...}."""
    try:
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"ran past {timeout} s (stopped)"}
    try:
        return last_json(p.stdout)
    except ValueError:
        tail = p.stderr.strip().splitlines()[-1:] or [f"exit status {p.returncode}"]
        return {"error": tail[0][:400]}


def memtracker(script, cfg, steps, timeout):
    r = run_json([sys.executable, os.path.join(HERE, "memtracker_peer.py"), "--script", script, "--config",
                  json.dumps(cfg), "--steps", str(steps)], dict(os.environ), timeout)
    if "error" in r:
        return {"error": r["error"]}, {}
    keep = ("peak_bytes", "categories", "build_seconds", "trace_seconds", "steps")
    vers = {k: r[k] for k in ("torch", "transformers", "peft", "torchvision", "diffusers") if k in r}
    return {k: r[k] for k in keep}, vers


def real_cpu(script, cfg, build, warmup, steps, timeout):
    lib = os.path.join(build, "libvlmemcount.so")
    if not os.path.exists(lib):
        return {"error": f"{lib} is not built"}
    env = dict(os.environ, LD_PRELOAD=lib, VL_MEMCOUNT_LIB=lib, VL_PEER_DEVICE="cpu",
               OMP_NUM_THREADS=str(cfg.get("threads", 1)), PYTHONDONTWRITEBYTECODE="1")
    r = run_json([sys.executable, os.path.join(HERE, script), "--config", json.dumps(cfg), "--warmup", str(warmup),
                  "--steps", str(steps)], env, timeout)
    if "error" in r:
        return {"error": r["error"]}
    if r.get("memory") != "memcount":
        return {"error": "memory not measured: " + str(r.get("memory_why"))}
    return {"peak_bytes": r["peak_bytes"], "persistent_bytes": r["persistent_bytes"],
            "step_extra_bytes": r["step_extra_bytes"], "median_step_seconds": round(r["median"], 4),
            "warmup": warmup, "steps": steps}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", required=True, help="llm-lora, seg-ckpt or sd-lora")
    ap.add_argument("--scale", default="small")
    ap.add_argument("--step", help="one rung only (printed, no fixture written)")
    ap.add_argument("--model-config", help="llm-lora: a Hugging Face config.json (path from the repository root)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build folder (vramlab, libvlmemcount.so)")
    ap.add_argument("--out", help="the fixture (default tests/fixtures/memtracker/CASE.json; CASE-SCALE.json "
                    "at another scale than small)")
    ap.add_argument("--steps", type=int, default=2, help="MemTracker: traced steps (default 2)")
    ap.add_argument("--real-warmup", type=int, default=1)
    ap.add_argument("--real-steps", type=int, default=2)
    ap.add_argument("--no-real", action="store_true", help="MemTracker only (with --update: the real peaks kept)")
    ap.add_argument("--update", help="RUNG[,RUNG...]: run these again, the fixture's other rungs kept")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per process")
    a = ap.parse_args()
    argv = [os.path.join(a.build, "vramlab"), "peer-config", a.case, "--scale", a.scale]
    if a.step:
        argv += ["--step", a.step]
    if a.model_config:
        argv += ["--model-config", a.model_config]
    p = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    if p.returncode:
        print(json.dumps({"error": p.stderr.strip()}))
        return 1
    pc = json.loads(p.stdout)
    out = {"case": a.case, "scale": a.scale, "generator": "tools/peers/memtracker_all.py", "versions": {},
           "rungs": {}}
    if a.model_config:
        out["model_config"] = a.model_config
    suffix = "" if a.scale == "small" else f"-{a.scale}"
    if a.model_config:
        suffix = "-" + os.path.splitext(os.path.basename(a.model_config))[0] + (suffix or "-small")
    path = a.out or os.path.join(ROOT, "tests", "fixtures", "memtracker", f"{a.case}{suffix}.json")
    again = set(a.update.split(",")) if a.update else None
    seen = {}  # a peer setup -> the first rung that has it
    if again:
        with open(path) as f:
            old = json.load(f)
        out["versions"] = old["versions"]
    for name, r in pc["rungs"].items():
        if again and name not in again:
            out["rungs"][name] = old["rungs"][name]
            if "error" not in old["rungs"][name].get("memtracker", {"error": 1}):
                seen.setdefault(json.dumps(old["rungs"][name]["config"], sort_keys=True), name)
            continue
        o = {"script": r["script"]}
        key = json.dumps(r.get("config"), sort_keys=True)
        if "not_measured" in r:
            o["not_measured"] = r["not_measured"]
        elif key in seen:  # a rung whose peer setup is an earlier rung's (llm-lora's cap: a cap
            # PyTorch's CPU step has no part in) runs the same processes: its results are that rung's
            first = out["rungs"][seen[key]]
            o.update(config=r["config"], same_config_as=seen[key], memtracker=first["memtracker"])
            if "real_cpu" in first:
                o["real_cpu"] = first["real_cpu"]
        else:
            seen[key] = name
            o["config"] = r["config"]
            print(f"{a.case} {name}: MemTracker", file=sys.stderr, flush=True)
            o["memtracker"], vers = memtracker(r["script"], r["config"], a.steps, a.timeout)
            out["versions"].update(vers)
            if a.no_real and again and "real_cpu" in old["rungs"].get(name, {}):
                o["real_cpu"] = old["rungs"][name]["real_cpu"]  # --update --no-real: kept
            elif not a.no_real:
                print(f"{a.case} {name}: real CPU peak", file=sys.stderr, flush=True)
                o["real_cpu"] = real_cpu(r["script"], r["config"], a.build, a.real_warmup, a.real_steps, a.timeout)
        out["rungs"][name] = o
        print(f"{a.case} {name}: {json.dumps(o.get('memtracker', o.get('not_measured')))[:300]}"
              f" real {json.dumps(o.get('real_cpu'))[:200]}", file=sys.stderr, flush=True)
    text = json.dumps(out, indent=2, sort_keys=False) + "\n"
    if a.step:
        sys.stdout.write(text)
        return 0
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
