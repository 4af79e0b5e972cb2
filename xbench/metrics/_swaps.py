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
        best = self._curves(s) if self.curves else None
        for side, v in enumerate(lin):
            cols = np.full((p, nc, k + 3), np.nan)
            cols[:, :, :k] = (v[:, :kn] / v[:, kn:2 * kn]).reshape(p, k, nc).transpose(0, 2, 1)
            pooled = np.full((p, k + 3), np.nan)
            pooled[:, :k] = v[:, 2 * kn:2 * kn + k] / v[:, 2 * kn + k:]
            if best is not None:
                cols[:, :, k:], pooled[:, k:] = best[side]
            out.append((cols.reshape(p, nc * (k + 3)), pooled))
        return out

    def _curves(self, s: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per side (A', B'): best-τ columns (P, nc, 3) per class and (P, 3) pooled."""
        p, t = len(s), self.t
        out = []
        shared = []
        for x in self.classes:
            sc = s[:, x["cases"]]
            shared.append((sc, sc @ x["dd"], sc @ x["dc"]))
        for side, sign in enumerate((1.0, -1.0)):
            cls = np.full((p, self.nc, 3), np.nan)
            nums, dens, blocks, ious = [], [], [], []
            for c, (x, (sc, dd, dc)) in enumerate(zip(self.classes, shared)):
                tot_d, tot_j, tot_c = x["tot"][side]
                num, den = tot_d + sign * dd, tot_c + sign * dc
                block = [(_Weights(s, x["case_a"], side == 0), x["d_a"]), (_Weights(s, x["case_b"], side == 1),
                                                                           x["d_b"])]
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
            out.append((cls, pooled))
        return out


class _Weights:
    """One model's pairs' weights in a side, row by row (only rows with a near tie of τ are read, by
    :func:`~xbench.metrics.stats._choose`): ``1 − s`` of their cases where the side keeps them, else ``s``."""

    def __init__(self, s: np.ndarray, case: np.ndarray, keep: bool):
        self.s, self.case, self.keep = s, case, keep

    def __getitem__(self, row: int) -> np.ndarray:
        w = self.s[row, self.case]
        return 1.0 - w if self.keep else w


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
            self.cols.append(self._ranks(col_a, col_b, n) if ranks else {})
        lin_a.append(_per_case(n, np.arange(n), np.stack([ra.correct, ra.n_known], axis=1)))
        lin_b.append(_per_case(n, np.arange(n), np.stack([rb.correct, rb.n_known], axis=1)))
        la, lb = np.concatenate(lin_a, axis=1), np.concatenate(lin_b, axis=1)
        self.lin_a, self.lin_b, self.lin_d = la.sum(axis=0), lb.sum(axis=0), lb - la

    @staticmethod
    def _ranks(col_a: tuple, col_b: tuple, n: int) -> dict:
        """Both models' known cases of a class sorted together by decreasing score (stable, A's first, as the
        paired column), and what AUC / AP read of A''s cumulative counts: per positive its group's end (and the
        end of the group before, where scores tie), as sparse maps from the swaps to counts between those ends."""
        from scipy.sparse import csr_matrix

        y = np.concatenate([col_a[1], col_b[1]])
        s = np.concatenate([col_a[2], col_b[2]])
        case = np.concatenate([col_a[0], col_b[0]])
        from_a = np.r_[np.ones(len(col_a[0])), np.zeros(len(col_b[0]))]  # A' holds A's elements where s = 0 …
        sign = 1.0 - 2.0 * from_a  # … and B's where s = 1: held = from_a + sign · s[case]
        order = np.argsort(-s, kind="stable")
        case, y, s, from_a, sign = case[order], y[order], s[order], from_a[order], sign[order]
        m = len(s)
        starts = _group_starts(s)
        group = np.cumsum(np.r_[False, s[1:] != s[:-1]])  # group of each element
        ends = np.r_[starts[1:], m] - 1
        pos = np.flatnonzero(y == 1)
        end, before = ends[group[pos]], starts[group[pos]] - 1
        alone = bool((end == before + 1).all())  # no positive shares its score: fp before it = fp at it
        marks = np.unique(np.r_[end, [] if alone else before[before >= 0], m - 1]).astype(np.int64)
        seg = np.searchsorted(marks, np.arange(m))  # elements in (marks[q − 1], marks[q]] form segment q

        def counts(keep: np.ndarray) -> tuple[np.ndarray, csr_matrix]:
            const = np.bincount(seg[keep], weights=from_a[keep], minlength=len(marks))
            return const, csr_matrix((sign[keep], (seg[keep], case[keep])), shape=(len(marks), n))

        n_pos_upto = np.cumsum(y == 1)
        return {"alone": alone, "m": m, "k": len(pos), "all": counts(np.ones(m, bool)), "pos": counts(y == 1),
                "held": (from_a[pos], sign[pos], case[pos]), "marks": marks, "pos_upto": n_pos_upto[marks],
                "end": np.searchsorted(marks, end),
                "before": np.where(before >= 0, np.searchsorted(marks, np.maximum(before, 0)), -1)}

    def __call__(self, s: np.ndarray, lin: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per side (A', B'): class columns (P, 4·nc) and Hamming accuracy (P,)."""
        p = len(s)
        out = [np.full((p, self.nc, 4), np.nan) for _ in range(2)]
        st = np.ascontiguousarray(s.T) if self.ranks else None  # (n, P): rows of swaps per case
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
                for side, (auc, ap) in enumerate(self._auc_ap(st, col)):
                    out[side][:, c, 0], out[side][:, c, 1] = auc, ap
            j += 1
        ham = [v[:, -2] / v[:, -1] for v in lin]
        return [(o.reshape(p, -1), h) for o, h in zip(out, ham)]

    @staticmethod
    def _auc_ap(st: np.ndarray, col: dict) -> list[tuple[np.ndarray, np.ndarray]]:
        """AUC and average precision of A' and B' (each (P,)) from A''s cumulative counts at the marked positions
        (``st``: the swaps transposed, (n, P)); every count is an integer held exactly in float64."""
        m, k, marks = col["m"], col["k"], col["marks"]
        if k == 0:
            nan = np.full(st.shape[1], np.nan)
            return [(nan, nan), (nan, nan)]
        const, sparse = col["all"]
        upto = np.cumsum(const[:, None] + sparse @ st, axis=0)  # A''s elements at or before each mark
        const, sparse = col["pos"]
        tp_upto = np.cumsum(const[:, None] + sparse @ st, axis=0)  # … of them positive
        from_a, sign, case = col["held"]
        held = from_a[:, None] + sign[:, None] * st[case]  # (k, P): A' holds the positive
        end = col["end"]
        all_end, tp_end = upto[end], tp_upto[end]
        ends = [(all_end, tp_end), ((marks[end] + 1)[:, None] - all_end, col["pos_upto"][end][:, None] - tp_end)]
        total, total_p = upto[-1], tp_upto[-1]
        totals = [(total_p, total - total_p), (k - total_p, (m - total) - (k - total_p))]
        if not col["alone"]:
            b, has = np.maximum(col["before"], 0), (col["before"] >= 0)[:, None]
            all_b, tp_b = np.where(has, upto[b], 0.0), np.where(has, tp_upto[b], 0.0)
            befores = [(all_b, tp_b), (np.where(has, (marks[b] + 1)[:, None] - all_b, 0.0),
                                       np.where(has, col["pos_upto"][b][:, None] - tp_b, 0.0))]
        out = []
        for side in range(2):
            all_e, tp_e = ends[side]
            fp_twice = 2 * (all_e - tp_e) if col["alone"] else (all_e - tp_e) + (befores[side][0] - befores[side][1])
            h = held if side == 0 else 1.0 - held
            total_p, total_n = totals[side]
            # AUC: each held positive beats the negatives below its group and half those tied with it
            auc = (total_p * total_n - 0.5 * (h * fp_twice).sum(axis=0)) / (total_p * total_n)
            ap = (h * (tp_e / np.maximum(all_e, 1))).sum(axis=0) / total_p
            ok = (total_p > 0) & (total_n > 0)
            out.append((np.where(ok, auc, np.nan), np.where(ok, ap, np.nan)))
        return out
