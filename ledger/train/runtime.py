"""What a training child records about where it ran: memory growth, library versions, device.

Shared by every recipe (ledger/train/sft.py, ledger/train/dpo.py); it runs in the child.
"""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version


# --- memory measurement ------------------------------------------------------------------------
def _status() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


def memory_baseline() -> dict:
    """RSS right before the model is built. Peak RSS is reset (clear_refs 5) when the kernel and
    the sandbox allow it; otherwise the import-time peak stays in VmHWM and is reported as a floor."""
    reset = False
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:
        pass
    s = _status()
    return {"rss": s["VmRSS"], "hwm": s["VmHWM"], "reset": reset}


def memory_observed(base: dict) -> dict:
    s = _status()
    growth = s["VmHWM"] - base["rss"]
    return {"method": "peak RSS (VmHWM) minus RSS before encoding the data and building the model"
                      + ("; peak reset via /proc/self/clear_refs" if base["reset"] else "; peak not resettable here"),
            "baseline_rss_bytes": base["rss"], "peak_rss_bytes": s["VmHWM"], "peak_growth_bytes": growth,
            # Without a reset, growth below this is invisible (the import peak hides it).
            "floor_bytes": 0 if base["reset"] else base["hwm"] - base["rss"]}


def versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "peft", "safetensors", "pyarrow", "numpy", "cupy-cuda12x", "cupy-cuda13x",
                "triton", "wasmtime"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def device_info() -> dict:
    import torch  # imported by the recipe already; here only for the device facts

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {"cpu": cpu, "machine": platform.machine(), "kernel": platform.release(),
            "torch_threads": torch.get_num_threads(), "cuda": None}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info["cuda"] = {"device": props.name, "capability": f"{props.major}.{props.minor}",
                        "visible_devices": torch.cuda.device_count(),
                        "memory_bytes": props.total_memory, "cuda_runtime": torch.version.cuda,
                        "driver": torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else None}
    return info
