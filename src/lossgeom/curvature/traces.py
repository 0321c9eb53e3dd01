r"""Stochastic trace estimators with standard errors: Hutchinson and Hutch++.

The trace of a curvature matrix is the sum of its eigenvalues; without forming the
matrix it is estimated from products with random sign (Rademacher) vectors :math:`z`,
for which :math:`\mathbb{E}[z z^\top] = I` and so :math:`\mathbb{E}[z^\top A z] = \operatorname{tr} A`:

- :func:`hutchinson_trace` (Girard 1989, Hutchinson 1990): the mean of
  :math:`z_j^\top A z_j`; its standard error is the sample standard deviation over
  :math:`\sqrt{m}`.
- :func:`hutchpp_trace` (Meyer, Musco, Musco and Woodruff 2021): the exact trace on a
  sketched top subspace :math:`Q = \operatorname{orth}(A S)` plus Hutchinson on the rest,
  :math:`\operatorname{tr}(Q^\top A Q) + \frac{1}{m} \sum_j g_j^\top P A P g_j` with
  :math:`P = I - Q Q^\top`. When the spectrum decays, the sketch holds most of the trace
  and the remainder :math:`B = P A P` has a much smaller Frobenius norm, so the error is
  far smaller at the same number of products.

Both take the product budget as ``n_probes``: Hutchinson spends it on ``n_probes``
random probes, Hutch++ on three blocks of ``n_probes // 3`` products (the sketch, the
sketched subspace and the probes), so the two are compared at equal cost.

Hutch++'s standard error. Given :math:`Q` the estimate is exact on the sketch, so its
error is that of Hutchinson on :math:`B` alone, with variance
:math:`\operatorname{Var}(g^\top B g) / m` and, for Rademacher :math:`g`,
:math:`\operatorname{Var}(g^\top B g) = 2 (\lVert B \rVert_F^2 - \sum_i B_{ii}^2)`. The
sample standard deviation of the :math:`m` values :math:`g_j^\top B g_j` estimates this
from only :math:`m` numbers, so the z-score (error over standard error) follows Student's
t with :math:`m - 1` degrees of freedom (standard deviation
:math:`\sqrt{(m - 1) / (m - 3)}`, 1.7 at :math:`m = 4`) and is skewed when a few
eigenvalues of :math:`B` dominate. :func:`hutchpp_trace` instead estimates the two terms
of the variance formula from the same products: :math:`\lVert B g_j \rVert^2` is an
unbiased estimate of :math:`\lVert B \rVert_F^2` (an average over :math:`n` coordinates,
which concentrates), and :math:`\sum_i B_{ii}^2` is estimated without bias from the pairs
:math:`j \ne l` of the diagonal estimates :math:`g_j \odot B g_j` (Bekas, Kokiopoulou and
Saad 2007). The tests check the z-scores against exact traces over many seeds.

Probes are drawn by ``numpy.random.default_rng(seed)`` as ``(n, m)`` blocks in row-major
order, stored as signs (one byte each) and multiplied in column blocks in the
operator's dtype, so the estimators run at a million parameters without dense float64
``n x m`` copies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from lossgeom._validation import positive, positive_int
from lossgeom.curvature.base import CountingView, OperatorLike
from lossgeom.curvature.factory import as_operator
from lossgeom.progress import advance_to, progress_bar

#: rows of signs drawn per call of the generator (bounds the float64 temporary)
_ROWS_PER_DRAW = 2**16


@dataclass(frozen=True)
class TraceEstimate:
    r"""A stochastic trace estimate: value, standard error, products and probes used.

    Attributes:
        estimate: the estimate of :math:`\operatorname{tr} A`.
        std_error: its standard error.
        n_hvp: the matrix-vector products spent.
        n_probes: the random probes drawn (Hutch++: :math:`2m`, sketch and Hutchinson).
    """

    estimate: float
    std_error: float
    n_hvp: int
    n_probes: int


class SignBlock:
    """An ``(n, m)`` block of Rademacher signs, stored as int8, drawn row-major from ``rng``.

    Draws exactly the numbers of ``rng.choice([-1.0, 1.0], size=(n, m))`` (row chunks of
    one row-major stream give the same values), without holding them in float64.
    """

    def __init__(self, rng: np.random.Generator, n: int, m: int) -> None:
        signs = np.empty((n, m), dtype=np.int8)
        rows = max(1, _ROWS_PER_DRAW // max(m, 1))
        for start in range(0, n, rows):
            stop = min(n, start + rows)
            signs[start:stop] = rng.choice(np.array([-1.0, 1.0]), size=(stop - start, m))
        self.signs = torch.from_numpy(signs)
        self.n, self.m = n, m

    def columns(self, start: int, stop: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        """Columns ``start:stop`` as a float tensor of ``dtype`` on ``device``.

        Args:
            start: the first column.
            stop: one past the last column.
            dtype: the floating dtype of the result.
            device: the device of the result.

        Returns:
            The ``(n, stop - start)`` tensor of signs ``+-1``.
        """
        return self.signs[:, start:stop].to(dtype=dtype, device=device)


def _block(counted: CountingView) -> int:
    return counted.operator.block_columns


def _dot_columns(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Column-wise inner products (torch's pairwise summation in the blocks' dtype), as float64."""
    return torch.einsum("ij,ij->j", a, b).to(torch.float64)


def hutchinson_trace(
    operator: OperatorLike,
    n_probes: int = 100,
    seed: int = 0,
    target_rel_se: float | None = None,
    max_probes: int = 10_000,
    batch: int = 10,
    *,
    progress: bool | None = None,
) -> TraceEstimate:
    r"""Girard-Hutchinson trace estimate :math:`\frac{1}{m} \sum_j z_j^\top A z_j`, Rademacher :math:`z_j`.

    Unbiased (Girard 1989; Hutchinson 1990); its standard error is the sample standard
    deviation of :math:`z^\top A z` over :math:`\sqrt{m}`. Costs one product per probe.
    With ``target_rel_se``, probes are added ``batch`` at a time (from ``n_probes``) until
    ``std_error <= target_rel_se * abs(estimate)`` or ``max_probes`` is reached.

    For a diagonal :math:`A` every Rademacher probe gives
    :math:`z^\top A z = \sum_i A_{ii} z_i^2 = \operatorname{tr} A` exactly, so the estimate
    is the trace with zero standard error:

    >>> import torch
    >>> from lossgeom.curvature import hutchinson_trace
    >>> A = torch.diag(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64))
    >>> result = hutchinson_trace(A, n_probes=10, seed=0)
    >>> round(result.estimate, 12), round(result.std_error, 12), result.n_hvp
    (10.0, 0.0, 10)

    Args:
        operator: a square operator (see :func:`lossgeom.curvature.factory.as_operator`; a
            stored matrix is not checked for symmetry).
        n_probes: the number of probes drawn first, >= 2.
        seed: seed of the probes.
        target_rel_se: the relative standard error to stop at, or ``None`` (exactly
            ``n_probes`` probes).
        max_probes: with ``target_rel_se``, the most probes in all.
        batch: with ``target_rel_se``, the probes added at a time.
        progress: a bar of the products (one per probe) on stderr: ``None`` in interactive
            use only, ``True`` always, ``False`` never (see ``lossgeom.progress``).

    Returns:
        A :class:`TraceEstimate`: the mean, its standard error, the products and the probes used.

    Raises:
        TypeError: if ``operator`` is not one of the forms
            :func:`lossgeom.curvature.factory.as_operator` takes, a count is not an int, or
            ``progress`` is not a bool or None.
        ValueError: if ``n_probes < 2`` (no standard error) or an argument is not positive.
    """
    counted = as_operator(operator, symmetric=False)
    n = counted.shape[0]
    n_probes = positive_int("n_probes", n_probes)
    if n_probes < 2:
        raise ValueError("n_probes must be >= 2 to estimate a standard error")
    batch = positive_int("batch", batch)
    if target_rel_se is not None:
        target = positive("target_rel_se", target_rel_se)
        max_probes = positive_int("max_probes", max_probes)
    rng = np.random.default_rng(seed)
    samples: list[float] = []
    step = _block(counted)

    with progress_bar(progress, total=n_probes, desc="Hutchinson trace", unit="product") as bar:

        def draw(m: int) -> None:
            signs = SignBlock(rng, n, m)
            for j in range(0, m, step):
                z = signs.columns(j, min(m, j + step), counted.dtype, counted.device)
                samples.extend(_dot_columns(z, counted.matmat(z)).tolist())
                advance_to(bar, len(samples))

        draw(n_probes)
        if target_rel_se is not None:
            while len(samples) < max_probes:
                s = np.asarray(samples)
                if s.std(ddof=1) / math.sqrt(len(s)) <= target * abs(s.mean()):
                    break
                more = min(batch, max_probes - len(samples))
                bar.total = len(samples) + more
                draw(more)
    s = np.asarray(samples)
    return TraceEstimate(float(s.mean()), float(s.std(ddof=1) / math.sqrt(len(s))), counted.n_hvp, len(s))


def hutchpp_trace(
    operator: OperatorLike, n_probes: int = 99, seed: int = 0, *, progress: bool | None = None
) -> TraceEstimate:
    r"""Hutch++ (Meyer et al. 2021): exact trace on a sketched top subspace, Hutchinson on the rest.

    With :math:`m` = ``n_probes // 3``: :math:`S, G` Rademacher :math:`(n, m)`;
    :math:`Q = \operatorname{orth}(A S)`;
    :math:`\operatorname{tr} A \approx \operatorname{tr}(Q^\top A Q) + \frac{1}{m} \sum_j g_j^\top P A P g_j`
    with :math:`P = I - Q Q^\top`. Costs :math:`3m` products (:math:`A S`, :math:`A Q`,
    :math:`A P G`), the budget ``n_probes`` rounded down to a multiple of three, so it is
    compared with :func:`hutchinson_trace` at the same ``n_probes``. The standard error
    estimates :math:`\sqrt{2 (\lVert B \rVert_F^2 - \sum_i B_{ii}^2) / m}` with
    :math:`B = P A P` from the same products (see the module docstring): calibrated where
    the sample standard deviation of :math:`m` numbers is not.

    When :math:`\operatorname{rank} A \le m` the sketch spans the range of :math:`A`, so
    :math:`B = 0` and the estimate is the trace, here :math:`3 + 2 + 1 = 6`:

    >>> import torch
    >>> from lossgeom.curvature import hutchpp_trace
    >>> A = torch.diag(torch.tensor([3.0, 2.0, 1.0] + [0.0] * 17, dtype=torch.float64))
    >>> result = hutchpp_trace(A, n_probes=12, seed=0)
    >>> round(result.estimate, 10), round(result.std_error, 10), result.n_hvp, result.n_probes
    (6.0, 0.0, 12, 8)

    Args:
        operator: a square operator (see :func:`lossgeom.curvature.factory.as_operator`; a
            stored matrix is not checked for symmetry).
        n_probes: the product budget; ``3 * (n_probes // 3)`` products are used.
        seed: seed of the sketch and the probes.
        progress: a bar of the ``3 m`` products (``2 m + n`` if ``n < m``) on stderr:
            ``None`` in interactive use only, ``True`` always, ``False`` never (see
            ``lossgeom.progress``).

    Returns:
        A :class:`TraceEstimate`: the estimate, its standard error, the products used and
        ``2 m`` probes (sketch and Hutchinson).

    Raises:
        TypeError: if ``operator`` is not one of the forms
            :func:`lossgeom.curvature.factory.as_operator` takes, ``n_probes`` is not an int,
            or ``progress`` is not a bool or None.
        ValueError: if ``n_probes < 6`` (three blocks of at least two probes).
    """
    counted = as_operator(operator, symmetric=False)
    n = counted.shape[0]
    n_probes = positive_int("n_probes", n_probes)
    m = n_probes // 3
    if m < 2:
        raise ValueError(f"n_probes must be >= 6 (three blocks of >= 2 products), got {n_probes}")
    rng = np.random.default_rng(seed)
    dtype, device, step = counted.dtype, counted.device, _block(counted)

    start = counted.n_hvp
    with progress_bar(progress, total=2 * m + min(n, m), desc="Hutch++ trace", unit="product") as bar:
        sketch_signs = SignBlock(rng, n, m)
        sketch = torch.empty(n, m, dtype=dtype, device=device)
        for j in range(0, m, step):
            stop = min(m, j + step)
            sketch[:, j:stop] = counted.matmat(sketch_signs.columns(j, stop, dtype, device))
            advance_to(bar, counted.n_hvp - start)
        del sketch_signs
        if n >= m:  # Householder QR in two steps, so that at most two n x m blocks are alive at once
            reflectors, tau = torch.geqrf(sketch)
            del sketch
            q = torch.linalg.householder_product(reflectors, tau)
            del reflectors
        else:
            q = torch.linalg.qr(sketch, mode="reduced").Q  # (n, n): the sketch spans everything
            del sketch
        low_rank = 0.0
        for j in range(0, q.shape[1], step):
            block = q[:, j : j + step]
            low_rank += float(_dot_columns(block, counted.matmat(block)).sum())
            advance_to(bar, counted.n_hvp - start)

        # the probes G continue the generator's stream after S (drawn only now, to save memory)
        probe_signs = SignBlock(rng, n, m)
        samples, frobenius, diagonal_sum = [], [], torch.zeros(n, dtype=torch.float64, device=device)
        diagonal_squares = 0.0
        for j in range(0, m, step):
            g = probe_signs.columns(j, min(m, j + step), dtype, device)
            g_perp = g - q @ (q.T @ g)
            product = counted.matmat(g_perp)  # A P g
            advance_to(bar, counted.n_hvp - start)
            samples.extend(_dot_columns(g_perp, product).tolist())
            del g_perp
            product -= q @ (q.T @ product)  # now B g = P A P g
            frobenius.extend(_dot_columns(product, product).tolist())
            g.mul_(product)  # g * B g, whose expectation is diag(B)
            diagonal_sum += g.sum(dim=1).to(torch.float64)
            diagonal_squares += float(torch.einsum("ij,ij->", g, g))
            del g, product
    samples = np.asarray(samples)
    fro_sq = float(np.mean(frobenius))
    diag_sq = (float(diagonal_sum @ diagonal_sum) - diagonal_squares) / (m * (m - 1))
    variance = max(2.0 * (fro_sq - diag_sq), 0.0)
    return TraceEstimate(low_rank + float(samples.mean()), math.sqrt(variance / m), counted.n_hvp, 2 * m)
