"""Put this folder on PYTHONPATH with SPECSERVE_COMPILE_TRACE=<file> set: every Triton compile of
every Python process started so (the compile workers included) appends a JSON line to the file:
the kernel, its constexprs, specialisation attributes and signature, its cache hash and whether
the disk cache had it. scripts/cold_compile_ab.py --trace compares the workers' with the server's."""
import json
import os

_path = os.environ.get("SPECSERVE_COMPILE_TRACE")
if _path:
    try:
        from triton import knobs

        def _listener(src, metadata, metadata_group, times, cache_hit):
            line = {"pid": os.getpid(), "name": getattr(src, "name", "?"),
                    "constants": str(sorted(getattr(src, "constants", {}).items())),
                    "attrs": str(getattr(src, "attrs", "")),
                    "signature": str(getattr(src, "signature", "")),
                    "fn_key": getattr(getattr(src, "fn", None), "cache_key", "?"),
                    "hash": metadata.get("hash"), "hit": bool(cache_hit)}
            with open(_path, "a") as f:
                f.write(json.dumps(line) + "\n")

        knobs.compilation.listener = _listener
    except Exception as e:   # noqa: BLE001 - a diagnostic must not break the process
        print(f"compile trace not installed: {e}")
