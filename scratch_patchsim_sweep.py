# TEMPORARY sweep script for ref_patchsim recipes (deleted after use; not part of the package)
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from xbench.datasets import load_dataset  # noqa: E402
from xbench.models.reference import NEGATIVE_TEMPLATES, POSITIVE_TEMPLATES, PatchSimModel, tokenize  # noqa: E402
from xbench.train_reference import _grounding, _shift, _upsample, centre_prior_map, phantom_tensors  # noqa: E402

DATA = "/tmp/sweepdata.pt"


def prep(max_cases):
    tr = load_dataset("phantom", split="train", cases=max_cases)
    te = load_dataset("phantom", split="test")
    xp, yp = phantom_tensors(tr)
    xt, yt = phantom_tensors(te)
    samples = list(te)
    masks = {}
    for c, f in enumerate(te.findings):
        pos = np.flatnonzero(yt[:, c].numpy() == 1)
        masks[f] = (pos, np.stack([samples[i].mask(f) for i in pos]))
    prompts = [te.prompts[f] for f in te.findings]
    torch.save({"xp": xp.half(), "yp": yp, "xt": xt, "yt": yt, "masks": masks, "prompts": prompts, "findings": te.findings}, DATA)


def forward(model, x, pos, neg, cfg):
    tokens = model.image(x)
    b, d, h, w = tokens.shape
    p = F.normalize(tokens.flatten(2).transpose(1, 2), dim=-1)
    s = model.log_scale.exp().clamp(max=100.0) if cfg.get("learn_scale", True) else cfg["scale"]
    cp, cn = p @ pos.T, p @ neg.T
    n = cp.shape[1]

    def pool(z):
        if cfg["agg"] == "lme":
            return torch.logsumexp(z, 1) - math.log(n)
        return z.topk(cfg["k"], dim=1).values.mean(1)

    mode = cfg["mode"]
    if mode == "diff":
        logit = pool(s * (cp - cn))
    elif mode == "sep":
        logit = pool(s * cp) - pool(s * cn)
    elif mode == "sepmean":
        logit = pool(s * cp) - s * cn.mean(1)
    elif mode == "bias":
        logit = pool(s * cp) + model.bias
    return logit, cp.transpose(1, 2).reshape(b, -1, h, w)


def run(cfg, seed, data, dev):
    prompts = data["prompts"]
    C = len(prompts)
    cases = cfg.get("cases", 2000)
    xp, yp = data["xp"][:cases].to(dev).float(), data["yp"][:cases].to(dev)
    torch.manual_seed(seed)
    model = PatchSimModel()
    if cfg.get("scale_init"):
        model.log_scale.data.fill_(math.log(cfg["scale_init"]))
    if cfg["mode"] == "bias":
        model.bias = torch.nn.Parameter(torch.tensor(-1.5))
    model.to(dev)
    g = torch.Generator().manual_seed(seed)
    lr, ep, bs = cfg.get("lr", 2e-3), cfg.get("epochs", 14), cfg.get("bs", 64)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=cfg.get("wd", 1e-4))
    steps = ep * ((cases + bs - 1) // bs)
    sch = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    pos_ids = tokenize([t.format(p) for p in prompts for t in POSITIVE_TEMPLATES])[0].to(dev)
    neg_ids = tokenize([t.format(p) for p in prompts for t in NEGATIVE_TEMPLATES])[0].to(dev)
    rows = torch.arange(C)
    t0 = time.time()
    model.train()
    for _ in range(ep):
        order = torch.randperm(cases, generator=g)
        for first in range(0, cases, bs):
            idx = order[first:first + bs].to(dev)
            x = _shift(xp[idx].cpu(), cfg.get("shift", 6), g).to(dev) if cfg.get("shift", 6) else xp[idx]
            y = yp[idx]
            pp = rows * 4 + torch.randint(0, 4, (C,), generator=g)
            pn = rows * 4 + torch.randint(0, 4, (C,), generator=g)
            pe = F.normalize(model.text(pos_ids[pp.to(dev)]), dim=-1)
            ne = F.normalize(model.text(neg_ids[pn.to(dev)]), dim=-1)
            logit, _ = forward(model, x, pe, ne, cfg)
            loss = F.binary_cross_entropy_with_logits(logit, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sch.step()
    tt = time.time() - t0
    model.eval()
    from sklearn.metrics import roc_auc_score
    with torch.no_grad():
        pe = model.class_embeddings(prompts, POSITIVE_TEMPLATES).to(dev) if False else None
        ids = tokenize([t.format(p) for p in prompts for t in POSITIVE_TEMPLATES])[0].to(dev)
        pe = F.normalize(F.normalize(model.text(ids), dim=-1).view(C, 4, -1).mean(1), dim=-1)
        ids = tokenize([t.format(p) for p in prompts for t in NEGATIVE_TEMPLATES])[0].to(dev)
        ne = F.normalize(F.normalize(model.text(ids), dim=-1).view(C, 4, -1).mean(1), dim=-1)
        xt = data["xt"].to(dev)
        logits, maps = [], []
        for i in range(0, len(xt), 100):
            lg, mp = forward(model, xt[i:i + 100], pe, ne, cfg)
            logits.append(lg.cpu())
            maps.append(mp.cpu())
        score, native = torch.cat(logits).numpy(), torch.cat(maps).numpy()
    yt = data["yt"].numpy()
    res = {}
    for c, f in enumerate(data["findings"]):
        pos, masks = data["masks"][f]
        up = _upsample(native[pos, c], masks.shape[1:])
        pt, dc = _grounding(up, masks)
        res[f] = [round(roc_auc_score(yt[:, c], score[:, c]), 3), round(pt, 3), round(dc, 3)]
    return {"cfg": cfg, "seed": seed, "train_s": round(tt, 1), "res": res,
            "macro_auc": round(float(np.mean([v[0] for v in res.values()])), 3)}


BASE = {"mode": "diff", "agg": "lme"}
CONFIGS = [
    {"name": "base_diff_lme", **BASE},
    {"name": "sep_lme", "mode": "sep", "agg": "lme"},
    {"name": "sepmean_lme", "mode": "sepmean", "agg": "lme"},
    {"name": "bias_lme", "mode": "bias", "agg": "lme"},
    {"name": "diff_top8", "mode": "diff", "agg": "topk", "k": 8},
    {"name": "sep_top8", "mode": "sep", "agg": "topk", "k": 8},
    {"name": "bias_top8", "mode": "bias", "agg": "topk", "k": 8},
    {"name": "sep_lme_long", "mode": "sep", "agg": "lme", "epochs": 30, "cases": 4000},
    {"name": "bias_lme_long", "mode": "bias", "agg": "lme", "epochs": 30, "cases": 4000},
    {"name": "diff_lme_long", "mode": "diff", "agg": "lme", "epochs": 30, "cases": 4000},
    {"name": "sep_lme_lr1", "mode": "sep", "agg": "lme", "lr": 1e-3, "epochs": 20},
    {"name": "bias_lme_lr1", "mode": "bias", "agg": "lme", "lr": 1e-3, "epochs": 20},
    {"name": "sep_lme_fix10", "mode": "sep", "agg": "lme", "learn_scale": False, "scale": 10.0},
    {"name": "bias_lme_fix10", "mode": "bias", "agg": "lme", "learn_scale": False, "scale": 10.0},
    {"name": "diff_lme_fix10", "mode": "diff", "agg": "lme", "learn_scale": False, "scale": 10.0},
    {"name": "sep_lme_wd05", "mode": "sep", "agg": "lme", "wd": 0.05},
]

if __name__ == "__main__":
    if sys.argv[1] == "prep":
        prep(int(sys.argv[2]))
    else:
        worker, nworkers, out = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
        torch.set_num_threads(2)
        data = torch.load(DATA, weights_only=False)
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        jobs = [(c, s) for c in CONFIGS for s in (0, 1, 2)]
        for j, (c, s) in enumerate(jobs):
            if j % nworkers != worker:
                continue
            r = run(c, s, data, dev)
            with open(out, "a") as fh:
                fh.write(json.dumps(r) + "\n")
            print(c["name"], s, r["macro_auc"], {k: v for k, v in r["res"].items()}, flush=True)
