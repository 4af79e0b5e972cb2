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

    def __call__(self, s: np.ndarray, cache: SwapCache | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Rows of A' and B' (each (P, K), the statistic's column order) for swaps ``s`` (P, n) of 0 / 1;
        ``cache``: the :class:`SwapCache` of ``s`` shared by the pairs of one comparison (default: a fresh one)."""
        cache = SwapCache(s) if cache is None else cache
        s = cache.s
        x = s @ self.lin_d
        lin = (self.lin_a + x, self.lin_b - x)
        out = []
        with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            g = self.g(s, [v[:, :self.split] for v in lin]) if self.g is not None else None
            r = self.r(cache, [v[:, self.split:] for v in lin]) if self.r is not None else None
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


class SwapCache:
    """A batch of swaps ``s`` (P, n) and what each model's classes read of it, computed once for all the pairs
    of a comparison: per (model, class) the cumulative count of swapped images over the model's known cases in
    decreasing score order, of all of them and of the positives (integers). ``reads`` (:func:`shared_reads`) keeps
    only the rows the pairs read (all rows without it)."""

    def __init__(self, s: np.ndarray, reads: dict[int, tuple] | None = None):
        self.s = np.ascontiguousarray(s, dtype=np.float64)
        self.reads = reads or {}
        self._t: np.ndarray | None = None
        self._t8: np.ndarray | None = None
        self._cumulative: dict[int, tuple] = {}

    @property
    def t(self) -> np.ndarray:
        """The swaps transposed, (n, P) float64."""
        if self._t is None:
            self._t = np.ascontiguousarray(self.s.T)
        return self._t

    @property
    def t8(self) -> np.ndarray:
        """The swaps transposed, (n, P) int8."""
        if self._t8 is None:
            self._t8 = self.t.astype(np.int8)
        return self._t8

    def cumulative(self, col: tuple, rows: np.ndarray, rows_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``rows`` (``rows_pos``) of the cumulative counts of a model's class column ``col`` (its cases sorted
        by decreasing score): row ``j`` counts the swapped images among its first ``j`` known cases (positives)."""
        key = id(col)
        if key not in self._cumulative:
            case, y, _ = col
            kept = self.reads.get(key)
            full, full_pos = _cumulative_rows(self.t8[case]), _cumulative_rows(self.t8[case[y == 1]])
            if kept is not None:
                full, full_pos = full[kept[1]], full_pos[kept[2]]
            self._cumulative[key] = (col, full, full_pos, kept)
        _, full, full_pos, kept = self._cumulative[key]
        if kept is None:
            return full[rows], full_pos[rows_pos]
        return full[np.searchsorted(kept[1], rows)], full_pos[np.searchsorted(kept[2], rows_pos)]


def shared_reads(pairs: list[SwappedPair]) -> dict[int, tuple]:
    """The cumulative-count rows (all, positives) each model's class columns are read at by ``pairs``, for
    :class:`SwapCache` to keep: ``id(column) → (column, rows, positive rows)``."""
    rows: dict[int, list] = {}
    for pair in pairs:
        for col in pair.r.cols if pair.r is not None else ():
            if not col or "theta" not in col:
                continue
            for name in ("a", "b"):
                entry = rows.setdefault(id(col["col_" + name]), [col["col_" + name], [], []])
                for side in ("right", "left"):
                    entry[1].append(col[name, side])
                    entry[2].append(col[name, side, "pos"])
    return {k: (c, np.unique(np.concatenate(a)), np.unique(np.concatenate(p))) for k, (c, a, p) in rows.items()}


def _cumulative_rows(x: np.ndarray) -> np.ndarray:
    """``[0, x[0], x[0] + x[1], …]`` along axis 0 as int32: (len(x) + 1, P)."""
    out = np.zeros((len(x) + 1, x.shape[1]), np.int32)
    np.cumsum(x, axis=0, dtype=np.int32, out=out[1:])
    return out


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
                                 "delta": np.hstack([d_b - d_a, j_b - j_a, (c_b - c_a)[:, None]])})

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
        nt, rows = t.size, np.arange(p)
        out = []
        shared = [s[:, x["cases"]] @ x["delta"] for x in self.classes]  # (P, 2T + 1): Dice, IoU sums, pairs
        for side, sign in enumerate((1.0, -1.0)):
            cls = np.full((p, self.nc, 3), np.nan)
            nums, dens, blocks, ious = [], [], [], []
            for c, (x, moved) in enumerate(zip(self.classes, shared)):
                tot_d, tot_j, tot_c = x["tot"][side]
                num, den = tot_d + sign * moved[:, :nt], tot_c + sign * moved[:, -1]
                iou = tot_j + sign * moved[:, nt:2 * nt]
                block = [(_Weights(s, x["case_a"], side == 0), x["d_a"]), (_Weights(s, x["case_b"], side == 1),
                                                                           x["d_b"])]
                a, best, ok = _choose(num, den, t, block)
                cls[:, c] = np.stack([best, iou[rows, a] / np.where(ok, den, 1.0), t[a]], axis=1)
                cls[~ok, c] = np.nan
                nums.append(num), dens.append(den), blocks.extend(block), ious.append(iou)
            pooled = np.full((p, 3), np.nan)
            if len(nums) == 1:  # one class: the pooled pairs are its pairs
                pooled = cls[:, 0].copy()
            elif nums:
                den = np.sum(dens, axis=0)
                a, best, ok = _choose(np.sum(nums, axis=0), den, t, blocks)
                pooled = np.stack([best, sum(j[rows, a] for j in ious) / np.where(ok, den, 1.0), t[a]], axis=1)
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
            if ranks:
                self.cols.append(_thresholds(col_a, col_b) or self._ranks(col_a, col_b, n))
            else:
                self.cols.append({})
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

    def __call__(self, cache: SwapCache, lin: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per side (A', B'): class columns (P, 4·nc) and Hamming accuracy (P,)."""
        p = len(cache.s)
        out = [np.full((p, self.nc, 4), np.nan) for _ in range(2)]
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
                ranked = _auc_ap_cumulative(cache, col) if "theta" in col else self._auc_ap(cache.t, col)
                for side, (auc, ap) in enumerate(ranked):
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


def _thresholds(col_a: tuple, col_b: tuple) -> dict | None:
    """Where A' and B' read both models' cumulative counts (:meth:`SwapCache.cumulative`) for AUC / AP: at every
    positive's two scores θ (A's, then B's), the number of each model's cases (and positives) scoring ≥ θ and > θ.
    None when the two columns do not hold the same cases with the same labels (then :meth:`_RecognitionSwap._ranks`)."""
    (ca, ya, sa), (cb, yb, sb) = col_a, col_b
    oa, ob = np.argsort(ca, kind="stable"), np.argsort(cb, kind="stable")
    if len(ca) != len(cb) or not (np.array_equal(ca[oa], cb[ob]) and np.array_equal(ya[oa], yb[ob])):
        return None
    pos_a = np.flatnonzero(ya == 1)
    case = ca[pos_a]
    score_b = np.empty(len(ca))
    score_b[oa] = sb[ob]  # B's score of each of A's cases (A's order)
    theta = np.r_[sa[pos_a], score_b[pos_a]]
    out = {"theta": theta, "case": np.r_[case, case], "k": len(pos_a), "n": len(ca),
           "from_a": np.r_[np.ones(len(pos_a)), np.zeros(len(pos_a))][:, None],
           "alone": bool(len(np.unique(np.r_[sa, sb])) == 2 * len(sa)), "col_a": col_a, "col_b": col_b}
    for name, (sc, yc) in (("a", (sa, ya)), ("b", (sb, yb))):
        for side in ("right", "left"):  # ≥ θ, > θ
            out[name, side] = np.searchsorted(-sc, -theta, side=side)
            out[name, side, "pos"] = np.searchsorted(-sc[yc == 1], -theta, side=side)
    return out


def _auc_ap_cumulative(cache: SwapCache, col: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    """AUC and average precision of A' and B' from each model's cumulative counts (:func:`_thresholds`): A' holds
    ``#(A ≥ θ) − (swapped among them) + (swapped among B ≥ θ)`` cases scoring ≥ θ, B' the rest of both; every
    count is an integer held exactly in float64."""
    k, n = col["k"], col["n"]
    if k == 0 or k == n:
        nan = np.full(len(cache.s), np.nan)
        return [(nan, nan), (nan, nan)]
    def held_by_a(side: str) -> tuple[np.ndarray, np.ndarray]:
        """A''s cases and positives scoring ≥ θ (``side="right"``) or > θ (``"left"``), each (2k, P) int32."""
        ca, cb = col["a", side], col["b", side]
        pa, pb = col["a", side, "pos"], col["b", side, "pos"]
        g_a, gp_a = cache.cumulative(col["col_a"], ca, pa)
        g_b, gp_b = cache.cumulative(col["col_b"], cb, pb)
        total = g_b - g_a
        total += ca[:, None].astype(np.int32)
        tp = gp_b - gp_a
        tp += pa[:, None].astype(np.int32)
        return total, tp

    ge, ge_p = held_by_a("right")
    both_ge = (col["a", "right"] + col["b", "right"])[:, None]  # A' and B' together hold both models' cases
    both_ge_p = (col["a", "right", "pos"] + col["b", "right", "pos"])[:, None]
    fp_a = ge - ge_p
    fp_b = (both_ge - both_ge_p) - fp_a
    if col["alone"]:  # no tied scores: a held positive's own score is the only one at θ
        fp_twice = [2 * fp_a, 2 * fp_b]
    else:
        gt, gt_p = held_by_a("left")
        fp_gt_a = gt - gt_p
        fp_gt_b = ((col["a", "left"] + col["b", "left"]) - (col["a", "left", "pos"] + col["b", "left", "pos"]))[:, None] - fp_gt_a
        fp_twice = [fp_a + fp_gt_a, fp_b + fp_gt_b]
    swapped = cache.t8[col["case"]]
    held = np.where(col["from_a"] == 1, 1 - swapped, swapped)  # A' holds A's score where s = 0, B's where s = 1
    precision = [ge_p / np.maximum(ge, 1), (both_ge_p - ge_p) / np.maximum(both_ge - ge, 1)]
    n_neg = n - k
    out = []
    for side in range(2):
        h = held if side == 0 else 1 - held
        # AUC: each held positive beats the negatives below θ and half those tied with it (exact integer sums)
        beaten = (h * fp_twice[side]).sum(axis=0, dtype=np.int64)
        auc = (k * n_neg - 0.5 * beaten) / (k * n_neg)
        ap = (h * precision[side]).sum(axis=0) / k
        out.append((auc, ap))
    return out
