"""Compare the stores and tables of two bench_gpu output folders, file by file (sha256 of the bytes)."""
import hashlib, sys, json
from pathlib import Path
a, b = Path(sys.argv[1]), Path(sys.argv[2])
def files(root):
    out = {}
    for sub in ("store", "tables"):
        for p in sorted((root / sub).rglob("*")):
            if p.is_file(): out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out
fa, fb = files(a), files(b)
common = sorted(set(fa) & set(fb))
diff = [k for k in common if fa[k] != fb[k]]
print(json.dumps({"a": str(a), "b": str(b), "files_a": len(fa), "files_b": len(fb), "common": len(common),
                  "identical": len(common) - len(diff), "differ": len(diff),
                  "differ_not_meta_json": [k for k in diff if not k.endswith("meta.json")],
                  "differ_meta_json": sum(k.endswith("meta.json") for k in diff),
                  "only_a": sorted(set(fa) - set(fb)), "only_b": sorted(set(fb) - set(fa))}))
