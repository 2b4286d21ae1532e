# imgbuild's framework probe: run by the image's own Python as
#   python -c SOURCE FRAMEWORK
# with FRAMEWORK one of pytorch, cupy, jax, or `detect` to list those installed. It prints one JSON object of facts on its last
# line of stdout; imgbuild, not this script, decides the verdict from them, so the rules
# live in one place and are tested there. Everything that can fail is caught and reported.
import json
import math
import sys
import traceback
import warnings

N = 512
FACTS = {"python": sys.version.split()[0]}


def error_text(exc):
    return "%s: %s" % (type(exc).__name__, exc)


def rel_error(out, ref):
    # The largest difference, relative to the largest reference value; None for NaN or
    # infinity, which JSON cannot hold.
    err = float(abs(out - ref).max() / abs(ref).max())
    return err if math.isfinite(err) else None


def pytorch():
    FACTS["stage"] = "import"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch
    FACTS["stage"] = "run"
    FACTS["version"] = torch.__version__
    FACTS["cuda"] = torch.version.cuda
    FACTS["hip"] = getattr(torch.version, "hip", None)
    try:
        FACTS["cudnn"] = torch.backends.cudnn.version()
    except Exception as exc:
        FACTS["cudnn_error"] = error_text(exc)
    if FACTS["cuda"] is None and FACTS["hip"] is None:
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    FACTS["available"] = bool(available)
    if not available:
        reasons = [str(w.message) for w in caught]
        try:
            torch.cuda.init()
        except Exception as exc:
            reasons.append(str(exc))
        FACTS["reason"] = " ".join(reasons) or "torch.cuda.is_available() is False"
        return
    count = torch.cuda.device_count()
    FACTS["device_count"] = count
    FACTS["devices"] = [
        {
            "name": torch.cuda.get_device_name(i),
            "capability": "%d.%d" % torch.cuda.get_device_capability(i),
        }
        for i in range(count)
    ]
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(N, N, device="cuda", generator=gen)
    b = torch.randn(N, N, device="cuda", generator=gen)
    ref = a @ b
    dtypes = [("float16", torch.float16)]
    if torch.cuda.is_bf16_supported():
        dtypes.append(("bfloat16", torch.bfloat16))
    FACTS["autocast"] = []
    for name, dtype in dtypes:
        with torch.autocast("cuda", dtype=dtype):
            out = a @ b
        FACTS["autocast"].append(
            {"dtype": name, "result_dtype": str(out.dtype).replace("torch.", ""),
             "max_rel_error": rel_error(out.float(), ref)}
        )
    del a, b, ref, out
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    baseline = torch.cuda.memory_allocated()
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    allocated = torch.cuda.memory_allocated()
    del x
    torch.cuda.empty_cache()
    FACTS["memory"] = {
        "baseline": baseline,
        "allocated": allocated,
        "released": torch.cuda.memory_allocated(),
        "reserved_after": torch.cuda.memory_reserved(),
    }


def cupy():
    FACTS["stage"] = "import"
    import cupy as cp
    FACTS["stage"] = "run"
    FACTS["version"] = cp.__version__
    try:
        FACTS["cuda"] = "%d.%d" % divmod(cp.cuda.runtime.runtimeGetVersion() // 10, 100)
    except Exception as exc:
        FACTS["cuda_error"] = error_text(exc)
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:
        FACTS["available"] = False
        FACTS["reason"] = error_text(exc)
        return
    FACTS["available"] = count > 0
    if count == 0:
        FACTS["reason"] = "cupy.cuda.runtime.getDeviceCount() is 0"
        return
    FACTS["device_count"] = count
    FACTS["devices"] = []
    for i in range(count):
        props = cp.cuda.runtime.getDeviceProperties(i)
        name = props["name"]
        FACTS["devices"].append(
            {"name": name.decode() if isinstance(name, bytes) else name,
             "capability": "%d.%d" % (props["major"], props["minor"])}
        )
    rng = cp.random.default_rng(0)
    a = rng.standard_normal((N, N), dtype=cp.float32)
    b = rng.standard_normal((N, N), dtype=cp.float32)
    ref = a @ b
    out = a.astype(cp.float16) @ b.astype(cp.float16)
    FACTS["autocast"] = [
        {"dtype": "float16", "result_dtype": str(out.dtype),
         "max_rel_error": rel_error(out.astype(cp.float32), ref)}
    ]
    pool = cp.get_default_memory_pool()
    del a, b, ref, out
    pool.free_all_blocks()
    baseline = pool.used_bytes()
    x = cp.empty(64 << 20, dtype=cp.uint8)
    allocated = pool.used_bytes()
    del x
    pool.free_all_blocks()
    FACTS["memory"] = {"baseline": baseline, "allocated": allocated,
                       "released": pool.used_bytes(), "reserved_after": pool.total_bytes()}


def jax():
    FACTS["stage"] = "import"
    import jax as j
    import jax.numpy as jnp
    FACTS["stage"] = "run"
    FACTS["version"] = j.__version__
    plugins = [m for m in ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_plugins.xla_cuda12",
                           "jax_plugins.xla_cuda13", "jaxlib.cuda") if find_spec(m)]
    FACTS["cuda"] = plugins[0] if plugins else None
    if not plugins:
        return
    try:
        devices = j.devices("gpu")
    except Exception as exc:
        FACTS["available"] = False
        FACTS["reason"] = error_text(exc)
        return
    FACTS["available"] = bool(devices)
    FACTS["device_count"] = len(devices)
    FACTS["devices"] = [
        {"name": d.device_kind, "capability": getattr(d, "compute_capability", "")}
        for d in devices
    ]
    key = j.random.PRNGKey(0)
    a = j.random.normal(key, (N, N), dtype=jnp.float32)
    b = j.random.normal(j.random.split(key)[0], (N, N), dtype=jnp.float32)
    ref = jnp.dot(a, b, precision="highest")
    FACTS["autocast"] = []
    for name, dtype in (("float16", jnp.float16), ("bfloat16", jnp.bfloat16)):
        out = jnp.dot(a.astype(dtype), b.astype(dtype))
        FACTS["autocast"].append(
            {"dtype": name, "result_dtype": str(out.dtype),
             "max_rel_error": rel_error(out.astype(jnp.float32), ref)}
        )
    device = devices[0]
    def in_use():
        return device.memory_stats().get("bytes_in_use", 0)
    for arr in (a, b, ref, out):
        arr.delete()
    baseline = in_use()
    x = j.device_put(jnp.zeros(64 << 20, dtype=jnp.uint8), device)
    x.block_until_ready()
    allocated = in_use()
    x.delete()
    FACTS["memory"] = {"baseline": baseline, "allocated": allocated, "released": in_use(),
                       "reserved_after": device.memory_stats().get("bytes_reserved", 0)}


def find_spec(name):
    import importlib.util
    try:
        return importlib.util.find_spec(name) is not None
    except Exception:
        return False


# (name, module) of each framework; imgbuild's FRAMEWORKS lists the same.
MODULES = (("pytorch", "torch"), ("cupy", "cupy"), ("jax", "jax"))
PROBES = {"pytorch": pytorch, "cupy": cupy, "jax": jax}

if __name__ == "__main__":
    framework = sys.argv[1] if len(sys.argv) > 1 else ""
    FACTS["framework"] = framework
    if framework == "detect":
        FACTS["frameworks"] = [name for name, module in MODULES if find_spec(module)]
        print("\n" + json.dumps(FACTS))
        sys.exit(0)
    try:
        PROBES[framework]()
    except Exception as exc:
        FACTS["error"] = error_text(exc)
        FACTS["traceback"] = traceback.format_exc()[-4000:]
    sys.stdout.flush()
    print("\n" + json.dumps(FACTS))
