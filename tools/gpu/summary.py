#!/usr/bin/env python3
"""summary.py WORK MODE ELAPSED BUDGET: the markdown summary of tools/gpu/first-light.sh from
what its stages left in WORK (stages.tsv, logs/, results/), on stdout. Standard library only
(it runs under the GPU machine's Python and this one's). Reads whatever is there: a stage cut
short leaves fewer tables, never an error."""
import glob
import json
import os
import re
import subprocess
import sys

GB = 1e9
# Dense fp16/bf16 tensor-core peaks (no sparsity), for MFU; the card name decides.
PEAKS = [("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12),
         ("L40S", 362e12), ("RTX 4090", 165e12)]


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def gb(x):
    """Bytes as GB (MB below 1 GB: the dry run's tiny scale)."""
    if x is None:
        return "–"
    return f"{x / GB:.2f} GB" if abs(x) >= GB else f"{x / 1e6:.1f} MB"


def flops(x):
    return "–" if not x else f"{x / 1e12:.1f} T" if x >= 1e12 else f"{x / 1e9:.2f} G"


def planned_peak(rung, run):
    """The run's planned peak: its own (CPU runs), else the rung's plan when the run ran at the
    plan's scale (a GPU run at full scale: the plan is exact there)."""
    v = num(run, "planned_peak_bytes")
    if v is None and run.get("scale") == dig(rung, "plan", "scale"):
        v = num(rung, "plan", "peak_bytes")
    return v


def dig(o, *keys):
    for k in keys:
        o = o.get(k) if isinstance(o, dict) else None
    return o


def num(o, *keys):
    o = dig(o, *keys)
    return o if isinstance(o, (int, float)) and not isinstance(o, bool) else None


def meminfo(log):
    """The backend's VRAMLAB_CUDA_MEMINFO lines: [{when, total, used, arena, arena_peak}]."""
    out = []
    for m in re.finditer(r"vramlab-cuda-meminfo: when=(\w+) (.*)", log):
        d = {"when": m.group(1)}
        for kv in m.group(2).split():
            k, _, v = kv.partition("=")
            if v.isdigit():
                d[k] = int(v)
        out.append(d)
    return out


def smi_peak(path):
    """Largest and first nvidia-smi memory.used sample (MiB) of a run, in bytes."""
    vals = [int(v) for v in text(path).split() if v.isdigit()]
    return (max(vals) * 1048576, vals[0] * 1048576) if vals else (None, None)


def main():
    work, mode, elapsed, budget = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    res = os.path.join(work, "results")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        commit = subprocess.run(["git", "-C", root, "describe", "--always", "--dirty"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    if not commit:  # the device tool's copy has no .git: the tree pack.sh saw
        m = re.search(r"^# tree: (\S+)", text(os.path.join(root, ".gpu-pack", "MANIFEST")), re.M)
        commit = f"{m.group(1)} (when pack.sh ran)" if m else ""
    p = print
    p(f"# vramlab first light ({'GPU' if mode == 'gpu' else 'dry run, CPU device'})\n")
    p(f"Commit {commit or 'unknown'}; {elapsed} s of the {budget} s budget. Written by "
      "tools/gpu/first-light.sh (tools/gpu/README.md); logs and results JSON in first-light.tar.gz.\n")

    p("## Stages\n\n| # | stage | status | seconds | note |\n|---|---|---|---|---|")
    for line in text(os.path.join(work, "stages.tsv")).splitlines()[1:]:
        f = (line.split("\t") + [""] * 5)[:5]
        p("| " + " | ".join(x.replace("|", "/") for x in f) + " |")
    p()

    build = text(os.path.join(work, "logs", "1-build.log")) or text(os.path.join(work, "logs", "1-configure.log"))
    gpu_name = None
    smi = re.search(r"^name, driver_version.*\n(.+)$", build, re.M)
    if smi:
        gpu_name = smi.group(1).split(",")[0].strip()
        p(f"## Device\n\n`{smi.group(1).strip()}` (name, driver, memory, max SM clock, power limit)\n")
    for pat in (r"^Cuda compilation tools.*$", r"^configure: .*$", r"^build: .*$", r"^library closure: .*$",
                r"^test_core: .*$", r"^cuDNN wheel: .*$"):
        m = re.search(pat, build, re.M)
        if m:
            p(f"- {m.group(0)}")
    outside = re.findall(r"^(NOT from the pack|OUTSIDE|MISSING).*$", build, re.M)
    for o in re.finditer(r"^(NOT from the pack|OUTSIDE|MISSING).*$", build, re.M):
        p(f"- **{o.group(0)}**")
    if not outside and "library closure: complete" in build:
        p("- every library the binaries load comes from the pack or the assumed base image")
    p()

    gc = text(os.path.join(res, "gpu-check.txt"))
    if gc:
        counts = {k: len(re.findall(rf"\b{k}\b", gc)) for k in ("PASS", "FAIL", "SKIP")}
        p(f"## gpu-check: every operation, CUDA vs CPU\n\n{counts['PASS']} passed, {counts['FAIL']} failed, "
          f"{counts['SKIP']} skipped.\n\n```\n" + "\n".join(gc.splitlines()[:400]) + "\n```\n")

    peak = next((v for k, v in PEAKS if gpu_name and k in gpu_name), None)
    rows = []
    for d in sorted(glob.glob(os.path.join(res, "*", "*", "latest.json"))):
        name = d.split(os.sep)[-3]
        if not (name.startswith("mem-") or name.startswith("full-")):
            continue
        r = load(d) or {}
        log = text(os.path.join(res, name + ".log"))
        mi = meminfo(log)
        init = next((m for m in mi if m["when"] == "init"), None)
        fini = [m for m in mi if m["when"] == "fini"]
        smax, s0 = smi_peak(os.path.join(res, name + ".smi"))
        for rung in r.get("rungs", []):
            for run in rung.get("runs", []):
                t = num(run, "step_time", "median")
                fl = num(run, "model_flops_per_step")
                tf = fl / t if fl and t else None
                ctx = num(rung, "plan", "cuda_context_bytes")
                out_arena = None
                if fini:
                    out_arena = max(m.get("used", 0) - m.get("arena", 0) for m in fini)
                rows.append([name, rung.get("name", "?"), run.get("scale", "?"), run.get("device", "?"),
                             str(run.get("batch", "?")), f"{t:.4f}" if t else "–",
                             flops(tf),
                             f"{100 * tf / peak:.1f}%" if tf and peak else "–",
                             gb(planned_peak(rung, run)), gb(num(run, "measured_peak_bytes")),
                             gb(init["used"]) if init else "–", gb(out_arena), gb(ctx),
                             gb(smax - s0) if smax is not None else "–"])
    if rows:
        p("## Planned vs measured (stages 3 and 4)\n")
        p("Arena: the planned peak and the arena's measured peak (bytes the engine allocated). Device: "
          "the CUDA driver's own count (cudaMemGetInfo): `ctx+cuBLAS` is what was used before the arena "
          "was taken (context, cuBLAS handle, scratch), `outside arena` what was used beside the arena at "
          "the end (adds cuDNN's handle and anything else outside it); the plan assumes `cuda_context`. "
          "`nvidia-smi` is the largest sample of the card's used memory (every 100 ms) less the first. "
          f"MFU against {'%.0f TFLOP/s (%s dense fp16/bf16)' % (peak / 1e12, gpu_name) if peak else 'no known peak'}.\n")
        p("| run | rung | scale | device | batch | step s | FLOP/s | MFU | planned peak | arena peak "
          "| ctx+cuBLAS | outside arena | assumed ctx | nvidia-smi |")
        p("|" + "---|" * 14)
        for row in rows:
            p("| " + " | ".join(row) + " |")
        p()
    # where the step's time goes: runs made with --profile (CUDA events around each operation)
    for f in sorted(glob.glob(os.path.join(res, "*", "*", "2*.json"))):
        r = load(f) or {}
        for rung in r.get("rungs", []):
            for run in rung.get("runs", []):
                prof = run.get("profile")
                if not prof:
                    continue
                steps = num(run, "profile_steps") or 1
                total = num(run, "profile_seconds") or 0
                p(f"### Where the time goes: {os.path.basename(os.path.dirname(os.path.dirname(f)))} "
                  f"`{rung.get('name')}` ({run.get('device')}, {run.get('scale')} scale, batch {run.get('batch')}; "
                  f"{steps:.0f} timed steps, {total / steps:.4f} s a step, "
                  f"{(num(run, 'profile_other_seconds') or 0) / steps:.4f} s a step outside every operation)\n")
                p("| operation | calls a step | s a step | share of the step | FLOP/s | bytes/s |")
                p("|---|---|---|---|---|---|")
                for e in prof[:12]:
                    sec = num(e, "seconds") or 0
                    p(f"| {e.get('op')} | {(num(e, 'calls') or 0) / steps:.0f} | {sec / steps:.4f} | "
                      f"{100 * (num(e, 'share') or 0):.1f}% | {flops(num(e, 'flops_per_s'))} | "
                      f"{gb((num(e, 'bytes') or 0) / sec) + '/s' if sec else '–'} |")
                if len(prof) > 12:
                    p(f"| ({len(prof) - 12} more) | | | | | |")
                p()
    runs = text(os.path.join(res, "runs.txt")).split("\n")
    bad = [x for x in runs if x and not x.endswith(" exit 0")]
    if bad:
        p("Runs that failed: " + "; ".join(f"`{b}`" for b in bad) + " (their logs: results/NAME.log).\n")

    plans = sorted(glob.glob(os.path.join(res, "plan-*.json")))
    if plans:
        p("## Full scale, planned (`vramlab plan CASE --scale full --step after --json`)\n")
        p("| case | batch | fits the cap | planned peak | cap | FLOP per step | ideal s at 800 TFLOP/s |")
        p("|---|---|---|---|---|---|---|")
        for f in plans:
            pl = load(f) or {}
            for rung in pl.get("rungs", [pl]):
                q = rung.get("plan", rung)
                fl = num(q, "flops_per_step")
                p(f"| {os.path.basename(f)[5:-5]} | {q.get('batch', '?')} | {q.get('fits', '?')} | "
                  f"{gb(num(q, 'peak_bytes'))} | {gb(num(q, 'cap_bytes'))} | "
                  f"{flops(fl)} | {fl / 800e12:.3f} |" if fl else f"| {f} | ? |")
        p()

    def mimic(o, k):
        return gb(num(o, k)) if num(o, k) else ("not mimicked" if o.get("mimic_why") else "–")

    def vs(a, b):
        return f"{100 * (a - b) / b:+.1f}%" if a and b else "–"

    prow = []
    for d in sorted(glob.glob(os.path.join(res, "peers-*", "*", "latest.json"))):
        r = load(d) or {}
        pe = (r.get("case_metrics") or {}).get("peers") or {}
        for o in pe.get("rungs", []):
            if o.get("not_measured"):
                prow.append(f"| {r.get('case')} | {o.get('rung')} | not measured: {o['not_measured']} ||||||||")
                continue
            prow.append("| " + " | ".join([str(r.get("case")), str(o.get("rung")),
                                           f"{num(o, 'engine_median') or 0:.4f}", f"{num(o, 'peer_median') or 0:.4f}",
                                           f"{num(o, 'speedup') or 0:.2f}", gb(num(o, "engine_planned_peak_bytes")),
                                           gb(num(o, "peer_peak_bytes")), gb(num(o, "peer_reserved_bytes")),
                                           mimic(o, "mimic_peak_bytes"), mimic(o, "mimic_max_reserved_bytes"),
                                           vs(num(o, "mimic_peak_bytes"), num(o, "peer_peak_bytes"))]) + " |")
        if not pe.get("rungs") and pe:
            prow.append(f"| {r.get('case')} | – | not measured: {pe.get('why') or pe.get('not_measured') or '?'} ||||||||")
    if prow:
        p("## PyTorch side by side (stage 5)\n")
        p("| case | rung | engine s | PyTorch s | PyTorch / engine | planned peak | PyTorch peak (GPU: "
          "max_memory_allocated) | max_memory_reserved | mimic's peak (CUDA: max_memory_allocated) | "
          "mimic's max_memory_reserved | mimic vs PyTorch |\n|---|---|---|---|---|---|---|---|---|---|---|")
        p("\n".join(prow) + "\n")

    sp = load(os.path.join(res, "sdpa-probe.json")) or {}
    if sp:
        p("## SDPA on this card (stage 5, tools/gpu/sdpa_probe.py)\n")
        if sp.get("not_measured"):
            p(f"not measured: {sp['not_measured']}\n")
        else:
            p(f"torch {sp.get('torch')}, {sp.get('device')}, sm {sp.get('capability')}; B 4, T 512, 32 heads of 128, "
              "causal; bytes on the second step\n")
            p("| dtype | KV heads | kernel | forward keeps | backward peak | backward beyond dq, dk, dv | "
              "mimic's flash buffers |\n|---|---|---|---|---|---|---|")
            for c in sp.get("cases", []):
                p(f"| {c.get('dtype')} | {c.get('KV')} | {c.get('backend', c.get('error', '?'))} | "
                  f"{c.get('fwd_kept_bytes', '–')} | {c.get('bw_peak_bytes', '–')} | {c.get('bw_extra_bytes', '–')} | "
                  f"{c.get('mimic_bw_extra_bytes') if c.get('mimic_bw_extra_bytes') is not None else '–'} |")
            p("")

    tp = load(os.path.join(res, "torch-full-peer.json")) or {}
    tm = load(os.path.join(res, "torch-full-memtracker.json")) or {}
    tq = (load(os.path.join(res, "torch-full-plan.json")) or {}).get("pytorch") or {}
    if tp or tq:
        p("## PyTorch's 7B `lora` step at full scale (stage 8)\n")
        if tp.get("error"):
            p(f"PyTorch's step: {tp['error']}\n")
        p("| | max_memory_allocated | max_memory_reserved | step s (median) |\n|---|---|---|---|")
        med = num(tp, "median")
        p(f"| PyTorch measured (this card) | {gb(num(tp, 'peak_bytes'))} | {gb(num(tp, 'reserved_bytes'))} | "
          f"{f'{med:.3f}' if med else '–'} |")
        p(f"| mimic (planned) | {gb(num(tq, 'max_allocated_bytes'))} | {gb(num(tq, 'max_reserved_bytes'))} | – |")
        p(f"| mimic vs measured | {vs(num(tq, 'max_allocated_bytes'), num(tp, 'peak_bytes'))} | "
          f"{vs(num(tq, 'max_reserved_bytes'), num(tp, 'reserved_bytes'))} | – |")
        p(f"| MemTracker, fake CUDA tensors (batch not counted) | "
          f"{gb(num(tm, 'peak_bytes')) if num(tm, 'peak_bytes') else tm.get('error', '–')} | – | "
          f"trace {num(tm, 'trace_seconds') or '–'} s |")
        p(f"\nThe mimic's verdict on the 24 GB card: fits {tq.get('fits', '?')}.\n")

    rg = text(os.path.join(res, "regress.txt"))
    if rg:
        p("## Regress baseline (stage 6)\n\n```\n" + "\n".join(rg.splitlines()[-60:]) + "\n```\n")
    co = text(os.path.join(work, "logs", "7-collective.log"))
    if co and "skipped" not in co:
        p("## Collective (stage 7)\n\n```\n" + "\n".join(co.splitlines()[-40:]) + "\n```\n")


if __name__ == "__main__":
    main()
