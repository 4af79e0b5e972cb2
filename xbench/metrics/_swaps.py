"""Every row of two models' tables for a batch of paired swaps, without recomputing the table per swap: the engine
of the permutation test (:func:`xbench.metrics.compare.permutation_p_values`).

A swap ``s ∈ {0, 1}^n`` gives model A' the images of B where ``s_i = 1`` and of A elsewhere, and B' the others:
the weights ``[1 − s, s]`` and ``[s, 1 − s]`` of :meth:`_Statistic.paired <xbench.metrics.stats._Statistic.paired>`.
Both are computed for a batch of swaps ``S`` (P, n) at once, row for row as that statistic computes them:

* **ratios of per-image sums** (per class and pooled means of the per-pair metrics, F1, accuracy, Hamming
  accuracy): a sum of A' is ``sum(A) + S @ (B − A per image)`` and of B' ``sum(B) − S @ (B − A)`` — one matrix
  product for every such row;
* **best τ** (``dice@best``, ``iou@best``, ``best_tau``): a class's Dice sums over τ of A' are
  ``sums(A) + S @ (B − A per image)``, its pair count likewise; τ is chosen by the table's own rule
  (:func:`~xbench.metrics.stats._choose`: exact ties → the smallest τ, decided on the chosen pairs), IoU read at it;
* **AUC and AUPRC**: one stable sort of both models' scores of a class; A' selects one of each image's two scores,
  so its true / false positives at or above every score are cumulative counts of its selection, and B' selects the
  rest (its counts are the totals minus A''s). AUC and average precision then follow
  :func:`~xbench.metrics.recognition.weighted_auc_ap` (one threshold per distinct score, ties half credit).

Values equal the paired statistic's up to the order of float summation (integer counts are exact);
tests/metrics/test_swaps.py compares both on random tables of every kind.
"""
from __future__ import annotations

import warnings

import numpy as np

from .recognition import _group_starts
from .stats import _choose, _Grounding, _Recognition, _Statistic


class SwappedPair:
    """``(A', B')`` rows of two models' statistics (built on the same cases) for a batch of swaps.

    Parameters
    ----------
    a, b : _Statistic
        The two models' statistics (:attr:`ScoredTable.statistic <xbench.metrics.stats.ScoredTable>`).
    n : int
        The number of cases (images) both index.
    curves, ranks : bool
        Whether to compute the best-τ rows and the AUC / AUPRC rows (left NaN otherwise: their work dominates).
    """

    def __init__(self, a: _Statistic, b: _Statistic, n: int, *, curves: bool = True, ranks: bool = True):
        if (a.grounding is None) != (b.grounding is None) or (a.recognition is None) != (b.recognition is None):
            raise ValueError("paired statistics need the same sections (grounding / recognition) in both models")
        self.over_classes = a.over_classes  # the paired statistic averages classes by A's rule (as _Statistic.paired)
        self.g = _GroundingSwap(a.grounding, b.grounding, n, curves) if a.grounding is not None else None
        self.r = _RecognitionSwap(a.recognition, b.recognition, n, ranks) if a.recognition is not None else None
        parts = [x for x in (self.g, self.r) if x is not None]
        self.lin_a = np.concatenate([x.lin_a for x in parts])
        self.lin_b = np.concatenate([x.lin_b for x in parts])
        self.lin_d = np.concatenate([x.lin_d for x in parts], axis=1)
        self.split = len(self.g.lin_a) if self.g is not None else 0

    def __call__(self, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows of A' and B' (each (P, K), the statistic's column order) for swaps ``s`` (P, n) of 0 / 1."""
        s = np.ascontiguousarray(s, dtype=np.float64)
        x = s @ self.lin_d
        lin = (self.lin_a + x, self.lin_b - x)
        out = []
        with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            g = self.g(s, [v[:, :self.split] for v in lin]) if self.g is not None else None
            r = self.r(s, [v[:, self.split:] for v in lin]) if self.r is not None else None
            for side in range(2):
                parts, pooled = [], None
                if g is not None:
                    parts.append(g[side][0])
                    pooled = g[side][1]
                if r is not None:
                    parts.append(r[side][0])
                cls = np.concatenate(parts, axis=1)
                extra = self.over_classes.replicates(cls)
                if r is not None:
                    extra.append(r[side][1])
                if pooled is not None:
                    extra.extend(pooled.T)
                out.append(np.concatenate([cls, np.stack(extra, axis=1)], axis=1))
        return out[0], out[1]


def _per_case(n: int, case: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Sums of ``values`` (rows indexed by ``case``) per case: (n, …)."""
    out = np.zeros((n, *values.shape[1:]))
    np.add.at(out, case, values)
    return out


class _GroundingSwap:
    """The grounding section (:class:`~xbench.metrics.stats._Grounding`) for swaps."""

    def __init__(self, ga: _Grounding, gb: _Grounding, n: int, curves: bool):
        if ga.classes != gb.classes or ga.k != gb.k or not np.array_equal(ga.t, gb.t):
            raise ValueError(f"paired grounding sections need the same classes and thresholds; got {ga.classes} "
                             f"and {gb.classes}")
        self.t, self.k, self.nc, self.curves = ga.t, ga.k, len(ga.classes), curves

        def linear(g: _Grounding) -> np.ndarray:
            cols = np.hstack([g.sums, g.defined, np.stack(g.pooled_sums, axis=1), np.stack(g.pooled_defined, axis=1)])
            return _per_case(n, g.pair_case, cols)

        la, lb = linear(ga), linear(gb)
        self.lin_a, self.lin_b, self.lin_d = la.sum(axis=0), lb.sum(axis=0), lb - la
        self.classes = []
        for ca, da, ja, cb, db, jb in zip(ga.cls_case, ga.cls_d, ga.cls_j, gb.cls_case, gb.cls_d, gb.cls_j):
            cases = np.union1d(ca, cb)
            ia, ib = np.searchsorted(cases, ca), np.searchsorted(cases, cb)
            m = len(cases)
            d_a, d_b = _per_case(m, ia, da), _per_case(m, ib, db)
            j_a, j_b = _per_case(m, ia, ja), _per_case(m, ib, jb)
            c_a, c_b = np.bincount(ia, minlength=m).astype(float), np.bincount(ib, minlength=m).astype(float)
            self.classes.append({"cases": cases, "case_a": ca, "case_b": cb, "d_a": da, "d_b": db,
                                 "tot": [(d_a.sum(axis=0), j_a.sum(axis=0), c_a.sum()),
                                         (d_b.sum(axis=0), j_b.sum(axis=0), c_b.sum())],
                                 "dd": d_b - d_a, "dj": j_b - j_a, "dc": c_b - c_a})

    def __call__(self, s: np.ndarray, lin: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per side (A', B'): class columns (P, nc·(k+3)) and pooled columns (P, k+3)."""
        p, k, nc = len(s), self.k, self.nc
        kn = k * nc
        out = []
        sides = [self._curves(s, side) if self.curves else None for side in range(2)]
        for side, v in enumerate(lin):
            cols = np.full((p, nc, k + 3), np.nan)
            cols[:, :, :k] = (v[:, :kn] / v[:, kn:2 * kn]).reshape(p, k, nc).transpose(0, 2, 1)
            pooled = np.full((p, k + 3), np.nan)
            pooled[:, :k] = v[:, 2 * kn:2 * kn + k] / v[:, 2 * kn + k:]
            if sides[side] is not None:
                cols[:, :, k:], pooled[:, k:] = sides[side]
            out.append((cols.reshape(p, nc * (k + 3)), pooled))
        return out

    def _curves(self, s: np.ndarray, side: int) -> tuple[np.ndarray, np.ndarray]:
        """Best-τ columns (P, nc, 3) per class and (P, 3) pooled of side 0 (A') or 1 (B')."""
        p, t = len(s), self.t
        sign = 1.0 if side == 0 else -1.0
        cls = np.full((p, self.nc, 3), np.nan)
        nums, dens, blocks, ious = [], [], [], []
        for c, x in enumerate(self.classes):
            sc = s[:, x["cases"]]
            tot_d, tot_j, tot_c = x["tot"][side]
            num = tot_d + sign * (sc @ x["dd"])
            den = tot_c + sign * (sc @ x["dc"])
            keep_a, take_b = 1.0 - s[:, x["case_a"]], s[:, x["case_b"]]
            block = [(keep_a, x["d_a"]), (take_b, x["d_b"])] if side == 0 else [(1.0 - keep_a, x["d_a"]),
                                                                                (1.0 - take_b, x["d_b"])]
            iou = _IouAt(tot_j, sign, sc, x["dj"])
            a, best, ok = _choose(num, den, t, block)
            cls[:, c] = np.stack([best, iou(a) / np.where(ok, den, 1.0), t[a]], axis=1)
            cls[~ok, c] = np.nan
            nums.append(num), dens.append(den), blocks.extend(block), ious.append(iou)
        pooled = np.full((p, 3), np.nan)
        if nums:
            den = np.sum(dens, axis=0)
            a, best, ok = _choose(np.sum(nums, axis=0), den, t, blocks)
            pooled = np.stack([best, sum(f(a) for f in ious) / np.where(ok, den, 1.0), t[a]], axis=1)
            pooled[~ok] = np.nan
        return cls, pooled


class _IouAt:
    """A side's IoU sums of a class at one τ index per row: ``tot[a] + sign · Σ_i s_i Δ[i, a]``."""

    def __init__(self, tot: np.ndarray, sign: float, s: np.ndarray, delta: np.ndarray):
        self.tot, self.sign, self.s, self.delta = tot, sign, s, delta

    def __call__(self, a: np.ndarray) -> np.ndarray:
        return self.tot[a] + self.sign * np.einsum("pi,ip->p", self.s, self.delta[:, a])


class _RecognitionSwap:
    """The recognition section (:class:`~xbench.metrics.stats._Recognition`) for swaps."""

    def __init__(self, ra: _Recognition, rb: _Recognition, n: int, ranks: bool):
        if ra.classes != rb.classes or ra.n_cases != rb.n_cases:
            raise ValueError(f"paired recognition sections need the same classes and cases; got {ra.classes} "
                             f"and {rb.classes}")
        self.nc, self.ranks = len(ra.classes), ranks
        thr = ra.prob_threshold
        lin_a, lin_b = [], []
        self.cols: list[dict | None] = []
        for col_a, col_b in zip(ra.cols, rb.cols):
            if col_a is None or col_b is None:
                self.cols.append(None)
                continue
            for (case, y, s), out in ((col_a, lin_a), (col_b, lin_b)):
                pred = (s >= thr).astype(np.float64)
                # tp, fp, fn, positives, cases (weighted_f1_accuracy's sums)
                out.append(_per_case(n, case, np.stack([pred * y, pred * (1 - y), (1 - pred) * y, y,
                                                        np.ones_like(y)], axis=1)))
            self.cols.append(self._ranks(col_a, col_b) if ranks else {})
        lin_a.append(_per_case(n, np.arange(n), np.stack([ra.correct, ra.n_known], axis=1)))
        lin_b.append(_per_case(n, np.arange(n), np.stack([rb.correct, rb.n_known], axis=1)))
        la, lb = np.concatenate(lin_a, axis=1), np.concatenate(lin_b, axis=1)
        self.lin_a, self.lin_b, self.lin_d = la.sum(axis=0), lb.sum(axis=0), lb - la

    @staticmethod
    def _ranks(col_a: tuple, col_b: tuple) -> dict:
        """Both models' known cases of a class sorted together by decreasing score (stable, A's first, as the
        paired column), with the positions AUC / AP read: per positive its group's end and the end before it."""
        case = np.concatenate([col_a[0], col_b[0]])
        y = np.concatenate([col_a[1], col_b[1]])
        s = np.concatenate([col_a[2], col_b[2]])
        from_b = np.r_[np.zeros(len(col_a[0]), bool), np.ones(len(col_b[0]), bool)]
        order = np.argsort(-s, kind="stable")
        case, y, s, from_b = case[order], y[order], s[order], from_b[order]
        starts = _group_starts(s)
        group = np.cumsum(np.r_[False, s[1:] != s[:-1]])  # group of each element
        ends = np.r_[starts[1:], len(s)] - 1
        pos = np.flatnonzero(y == 1)
        n_pos_upto = np.cumsum(y == 1)  # positives at or before each index
        end, before = ends[group[pos]], starts[group[pos]] - 1
        return {"case": case, "from_a": (~from_b).astype(np.int8), "pos": pos, "end": end, "before": before,
                "pos_end": n_pos_upto[end] - 1, "pos_before": np.where(before >= 0, n_pos_upto[before] - 1, -1)}

    def __call__(self, s: np.ndarray, lin: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per side (A', B'): class columns (P, 4·nc) and Hamming accuracy (P,)."""
        p = len(s)
        out = [np.full((p, self.nc, 4), np.nan) for _ in range(2)]
        s8 = s.astype(np.int8) if self.ranks else None
        j = 0
        for c, col in enumerate(self.cols):
            if col is None:
                continue
            for side in range(2):
                tp, fp, fn, total_p, total = lin[side][:, 5 * j:5 * j + 5].T
                ok = (total_p > 0) & (total_p < total)
                out[side][:, c, 2] = np.where(ok, 2 * tp / (2 * tp + fp + fn), np.nan)
                out[side][:, c, 3] = np.where(ok, (total - fp - fn) / total, np.nan)
            if self.ranks:
                for side, (auc, ap) in enumerate(self._auc_ap(s8, col)):
                    out[side][:, c, 0], out[side][:, c, 1] = auc, ap
            j += 1
        ham = [v[:, -2] / v[:, -1] for v in lin]
        return [(o.reshape(p, -1), h) for o, h in zip(out, ham)]

    @staticmethod
    def _auc_ap(s8: np.ndarray, col: dict) -> list[tuple[np.ndarray, np.ndarray]]:
        """AUC and average precision of A' and B' (each (P,)) from the cumulative counts of A''s selection."""
        sel = np.take(s8, col["case"], axis=1) ^ col["from_a"]  # A' keeps A's score where s = 0, takes B's where 1
        m = sel.shape[1]
        upto = np.cumsum(sel, axis=1, dtype=np.int32)  # A''s selected elements at or before each position
        tp_upto = np.cumsum(sel[:, col["pos"]], axis=1, dtype=np.int32)  # … of them positive, at each positive
        pos, end, before, pos_end, pos_before = (col[k] for k in ("pos", "end", "before", "pos_end", "pos_before"))
        out = []
        for side in range(2):
            if side == 0:
                chosen, all_end, tp_end = sel[:, pos], upto[:, end], tp_upto[:, pos_end]
                all_before = np.where(before >= 0, upto[:, np.maximum(before, 0)], 0)
                tp_before = np.where(pos_before >= 0, tp_upto[:, np.maximum(pos_before, 0)], 0)
                total_p, total = tp_upto[:, -1] if len(pos) else np.zeros(len(sel)), upto[:, -1]
            else:  # B' holds every element A' does not
                chosen = 1 - sel[:, pos]
                all_end, tp_end = (end + 1) - upto[:, end], (pos_end + 1) - tp_upto[:, pos_end]
                all_before = np.where(before >= 0, (before + 1) - upto[:, np.maximum(before, 0)], 0)
                tp_before = np.where(pos_before >= 0, (pos_before + 1) - tp_upto[:, np.maximum(pos_before, 0)], 0)
                total_p = (len(pos) - tp_upto[:, -1]) if len(pos) else np.zeros(len(sel))
                total = m - upto[:, -1]
            total_p, total = total_p.astype(np.float64), total.astype(np.float64)
            total_n = total - total_p
            fp_end, fp_before = all_end - tp_end, all_before - tp_before
            chosen = chosen.astype(np.float64)
            auc = (chosen * (total_n[:, None] - 0.5 * (fp_end + fp_before))).sum(axis=1) / (total_p * total_n)
            ap = (chosen * (tp_end / np.where(all_end > 0, all_end, 1))).sum(axis=1) / total_p
            ok = (total_p > 0) & (total_n > 0)
            out.append((np.where(ok, auc, np.nan), np.where(ok, ap, np.nan)))
        return out
