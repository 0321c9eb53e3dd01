"""The base of every curvature operator: a symmetric matrix on the flattened parameters, never formed.

Every operator of :mod:`lossgeom.curvature` is an ``(n, n)`` symmetric matrix on the
flattened parameters (:func:`lossgeom.parameters.flatten_params`) that is never formed:
``A @ M`` multiplies it onto an ``(n, k)`` block of vectors in one batched product
(``torch.func.vmap`` or ``torch.autograd.grad(..., is_grads_batched=True)``, no Python loop
over columns), in the model's own dtype and on its device. ``n_hvp`` counts products, one
per column; ``.to_scipy()`` is a float64 ``scipy.sparse.linalg.LinearOperator`` view for
scipy's eigensolvers; ``@`` with a NumPy array returns a NumPy float64 array.

The operators themselves, one per module as in curvlinops:
:mod:`lossgeom.curvature.hessian` (``H``), :mod:`lossgeom.curvature.ggn` (``G = J^T Lambda J``),
:mod:`lossgeom.curvature.fisher` (empirical and true Fisher) and
:mod:`lossgeom.curvature.factory` (:func:`~lossgeom.curvature.factory.curvature_operator`
and :func:`~lossgeom.curvature.factory.as_operator`, any square matrix as an operator).
This module holds what they share: :class:`CurvatureOperator`, the scipy view,
:class:`CountingView`, stored matrices as operators and :func:`symmetric_matrix`.
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import torch
from scipy.sparse.linalg import LinearOperator

from lossgeom.distributed import all_reduce_sum
from lossgeom.risk import math_attention

#: bytes of one block of columns in a batched product (columns per block = this / (n * itemsize))
BLOCK_BYTES = 2**26
MAX_BLOCK_COLUMNS = 64
#: relative gap ``|fast - safe| / |safe|`` above which a fast product is not trusted (float64;
#: ``1e3`` rounding units of the dtype where that is larger)
FAST_PATH_RTOL = 1e-8


class quiet_torch_warnings:
    """Silence torch's notices that say nothing about the result.

    Forward-mode AD registers decompositions with ``torch.jit.script`` on first use (a
    deprecation warning about torch itself), and vmap notes when an operation has no
    batching rule and is computed by a slower per-column fallback (same values).
    """

    def __enter__(self) -> None:
        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=r".*performance drop.*batching rule.*", category=UserWarning)
        warnings.filterwarnings("ignore", message=r".*is_grads_batched.*", category=UserWarning)

    def __exit__(self, *exc: object) -> bool | None:
        return self._ctx.__exit__(*exc)


def probe_vector(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A fixed standard Gaussian ``(n, 1)`` block (seed 0, drawn on the CPU in float64) for set-up checks.

    Args:
        n: its number of rows.
        dtype: the dtype of the result.
        device: the device of the result.

    Returns:
        The ``(n, 1)`` tensor, the same on every call and every rank.
    """
    generator = torch.Generator().manual_seed(0)
    return torch.randn(n, 1, generator=generator, dtype=torch.float64).to(dtype=dtype, device=device)


def fast_path_agrees(fast: torch.Tensor | None, safe: torch.Tensor, what: str, failure: str | None = None) -> bool:
    """Whether a fast product agrees with the safe (reverse-mode) one; if not, say so with a warning.

    They agree when ``|fast - safe| <= rtol max(|fast|, |safe|)`` (Frobenius norms) with
    ``rtol = max(FAST_PATH_RTOL, 1e3 eps)``, ``eps`` the machine epsilon of the dtype. A fast
    path can disagree because torch's derivative rules are not all consistent: forward
    mode differentiates ``nn.Embedding(padding_idx=...)``'s padding row while reverse mode
    holds it fixed (the gradient convention every optimiser sees).

    Args:
        fast: the fast product, or ``None`` if it failed (then ``failure`` says why).
        safe: the reverse-mode product of the same vectors.
        what: the operator and its fast path, named in the warning.
        failure: the error the fast path raised, if any.

    Returns:
        ``True`` if the fast path can be used; ``False`` after a ``RuntimeWarning`` naming
        the gap (or the failure) and the fallback.
    """
    rtol = max(FAST_PATH_RTOL, 1e3 * torch.finfo(safe.dtype).eps)
    if fast is not None:
        gap = float(torch.linalg.vector_norm(fast - safe))
        scale = max(float(torch.linalg.vector_norm(fast)), float(torch.linalg.vector_norm(safe)))
        if gap <= rtol * scale:
            return True
        failure = f"its product differs from reverse mode's by a relative {gap / scale:.3g} (above {rtol:.3g})"
    warnings.warn(
        f"{what}: {failure} on a probe vector at set-up, so reverse mode is used instead (slower; "
        "the gradient's own derivative rules: torch's forward-mode rules disagree with reverse mode "
        "for some layers, e.g. nn.Embedding(padding_idx=...))",
        RuntimeWarning,
        stacklevel=3,
    )
    return False


class CurvatureOperator:
    """A symmetric ``(n, n)`` operator on flattened parameters, torch-native, counting products.

    Subclasses implement ``_matmat(M)`` for an ``(n, k)`` tensor ``M`` in the operator's
    dtype and device, returning ``A M`` of the same shape. :meth:`matmat` splits ``M`` into
    blocks of at most ``block_columns`` columns (bounding memory at large ``n``) and counts
    one product per column in ``n_hvp``.

    Attributes:
        shape: ``(n, n)``.
        dtype, device: those of the parameters (products are computed in them).
        n_hvp: products so far (one per column); :meth:`reset_count` zeroes it.
        stores_matrix: whether the operator holds its matrix (then ``dense()`` costs no products).
        group: the ``torch.distributed`` process group whose ranks' local products are summed
            (one ``all_reduce`` of the ``(n, k)`` block per product), or ``None`` (one process).
    """

    stores_matrix = False
    group = None

    def __init__(self, n: int, dtype: torch.dtype, device: torch.device) -> None:
        self.shape = (int(n), int(n))
        self.dtype, self.device = dtype, torch.device(device)
        self.n_hvp = 0
        itemsize = torch.finfo(dtype).bits // 8 if dtype.is_floating_point else 8
        self._block_columns = int(max(1, min(MAX_BLOCK_COLUMNS, BLOCK_BYTES // max(1, self.shape[0] * itemsize))))

    # -- products --------------------------------------------------------------------
    def _matmat(self, m: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def block_columns(self) -> int:
        """The number of columns per block of a product, ``BLOCK_BYTES / (n * itemsize)`` clipped to 1-64."""
        return self._block_columns

    def matmat(self, m: torch.Tensor) -> torch.Tensor:
        """``A M`` for an ``(n, k)`` tensor (cast to the operator's dtype and device).

        The product is computed in blocks of at most :attr:`block_columns` columns and adds
        ``k`` to ``n_hvp``; with a :attr:`group`, the local products are summed over its
        ranks (one ``all_reduce``).

        Args:
            m: the ``(n, k)`` block of vectors.

        Returns:
            The detached ``(n, k)`` tensor ``A M`` in the operator's dtype and on its device.

        Raises:
            TypeError: if ``m`` is not a ``torch.Tensor``.
            ValueError: if ``m`` does not have shape ``(n, k)``.
        """
        if not isinstance(m, torch.Tensor):
            raise TypeError(f"matmat takes a torch.Tensor, got {type(m).__name__}; use A @ array for NumPy")
        if m.dim() != 2 or m.shape[0] != self.shape[0]:
            raise ValueError(f"the block must have shape ({self.shape[0]}, k), got {tuple(m.shape)}")
        if m.dtype != self.dtype or m.device != self.device:
            m = m.to(dtype=self.dtype, device=self.device)
        k = m.shape[1]
        if k == 0:
            return m.clone()
        step = self.block_columns
        with self._product_context():
            if k <= step:
                out = self._matmat(m).detach()
            else:
                out = torch.cat([self._matmat(m[:, j : j + step]).detach() for j in range(0, k, step)], dim=1)
        self.n_hvp += k
        return all_reduce_sum(out, self.group)

    def _product_context(self) -> contextlib.AbstractContextManager:
        """The context products run in (composite attention, torch's notices silenced)."""
        stack = contextlib.ExitStack()
        stack.enter_context(quiet_torch_warnings())
        stack.enter_context(math_attention())
        return stack

    def matvec(self, v: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """``A v`` for a vector (tensor in, tensor out; array in, float64 array out).

        Args:
            v: a tensor or array-like with ``n`` entries.

        Returns:
            ``A v`` with the shape of ``v``: a tensor in the operator's dtype for a tensor,
            otherwise a NumPy float64 array.

        Raises:
            ValueError: if ``v`` does not have ``n`` entries.
        """
        if isinstance(v, torch.Tensor):
            if v.numel() != self.shape[0]:
                raise ValueError(f"vector must have {self.shape[0]} entries, got {v.numel()}")
            return self.matmat(v.reshape(-1, 1)).view(v.shape)
        arr = np.asarray(v, dtype=np.float64)
        if arr.size != self.shape[0]:
            raise ValueError(f"vector must have {self.shape[0]} entries, got {arr.size}")
        out = self.matmat(torch.as_tensor(arr.reshape(-1, 1)))
        return out.to(torch.float64).cpu().numpy().reshape(arr.shape)

    def __matmul__(self, other: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        """``A @ X``: a tensor gives a tensor (operator dtype), an array a float64 array."""
        if isinstance(other, torch.Tensor):
            if other.ndim == 1:
                return self.matvec(other)
            return self.matmat(other)
        arr = np.asarray(other, dtype=np.float64)
        if arr.ndim == 1:
            return self.matvec(arr)
        if arr.ndim != 2:
            raise ValueError(f"A @ X needs a vector or an (n, k) matrix, got shape {arr.shape}")
        out = self.matmat(torch.as_tensor(arr))
        return out.to(torch.float64).cpu().numpy()

    def reset_count(self) -> None:
        """Set the product counter ``n_hvp`` back to zero."""
        self.n_hvp = 0

    @property
    def T(self) -> CurvatureOperator:  # noqa: N802 - the matrix transpose, as in NumPy
        """The operator itself, which is its own transpose (it is symmetric)."""
        return self

    def adjoint(self) -> CurvatureOperator:
        """The adjoint: the operator itself (real symmetric).

        Returns:
            ``self``.
        """
        return self

    def to_scipy(self) -> LinearOperator:
        """A float64 ``scipy.sparse.linalg.LinearOperator`` view (products counted here).

        Returns:
            A symmetric ``(n, n)`` float64 ``LinearOperator`` whose products go through
            :meth:`matvec` and ``@``, so they count in this operator's ``n_hvp``.
        """
        return _ScipyView(self)

    def dense(self) -> np.ndarray:
        """The full matrix as a float64 array, by ``n`` products (small models only).

        The matrix is ``A I``, the product with the ``(n, n)`` identity.

        Returns:
            The ``(n, n)`` NumPy float64 array of the operator.
        """
        eye = torch.eye(self.shape[0], dtype=self.dtype, device=self.device)
        return self.matmat(eye).to(torch.float64).cpu().numpy()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.shape[0]}, dtype={self.dtype}, n_hvp={self.n_hvp})"


#: what the spectral tools and trace estimators take (see
#: :func:`lossgeom.curvature.factory.as_operator`; also objects with ``to_scipy()``)
OperatorLike = CurvatureOperator | LinearOperator | torch.Tensor | np.ndarray


class _ScipyView(LinearOperator):
    """A float64 scipy view of a :class:`CurvatureOperator`."""

    def __init__(self, operator: CurvatureOperator) -> None:
        super().__init__(dtype=np.dtype(np.float64), shape=operator.shape)
        self.operator = operator

    def _matvec(self, v: np.ndarray | torch.Tensor) -> np.ndarray:
        return self.operator.matvec(np.asarray(v, dtype=np.float64).reshape(-1)).reshape(np.shape(v))

    def _matmat(self, m: torch.Tensor) -> torch.Tensor:
        return self.operator @ np.asarray(m, dtype=np.float64)

    def _rmatvec(self, v: np.ndarray | torch.Tensor) -> np.ndarray:
        return self._matvec(v)

    def _adjoint(self) -> _ScipyView:
        return self


class _DenseOperator(CurvatureOperator):
    """A stored matrix as an operator."""

    stores_matrix = True

    def __init__(self, matrix: torch.Tensor) -> None:
        super().__init__(matrix.shape[0], matrix.dtype, matrix.device)
        self.matrix = matrix

    def _matmat(self, m: torch.Tensor) -> torch.Tensor:
        return self.matrix @ m

    def dense(self) -> np.ndarray:
        return self.matrix.to(torch.float64).cpu().numpy()


class _ScipyOperator(CurvatureOperator):
    """A scipy ``LinearOperator`` (or anything ``aslinearoperator`` takes) as a float64 operator."""

    def __init__(self, operator: LinearOperator) -> None:
        super().__init__(operator.shape[0], torch.float64, torch.device("cpu"))
        self.operator = operator

    @property
    def block_columns(self) -> int:
        return self.shape[0]

    def _matmat(self, m: torch.Tensor) -> torch.Tensor:
        out = (
            self.operator.matmat(m.cpu().numpy())
            if m.shape[1] > 1
            else self.operator.matvec(m[:, 0].cpu().numpy()).reshape(-1, 1)
        )
        return torch.as_tensor(np.asarray(out, dtype=np.float64))


class CountingView(CurvatureOperator):
    """Counts the products one algorithm makes with an operator (the operator's own count goes on too)."""

    def __init__(self, operator: CurvatureOperator) -> None:
        super().__init__(operator.shape[0], operator.dtype, operator.device)
        self.operator = operator

    @property
    def block_columns(self) -> int:
        """Every column in one block (the wrapped operator blocks its own products)."""
        return self.shape[0]

    def _product_context(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # the wrapped operator sets up its own

    def _matmat(self, m: torch.Tensor) -> torch.Tensor:
        return self.operator.matmat(m)

    def dense(self) -> np.ndarray:
        """The full matrix as a float64 array: the wrapped operator's stored one, or ``A I`` by ``n`` products.

        Returns:
            The ``(n, n)`` NumPy float64 array of the wrapped operator.
        """
        if self.operator.stores_matrix:
            return self.operator.dense()
        return super().dense()


def symmetric_matrix(matrix: torch.Tensor, argument: str = "operator") -> torch.Tensor:
    """Refuse a square matrix that is not symmetric to rounding (``1e3`` units of its dtype).

    ``max |A - A^T| <= 1e3 eps max |A|`` with ``eps`` the machine epsilon of the dtype.

    Args:
        matrix: the ``(n, n)`` tensor.
        argument: its name in the error message.

    Returns:
        ``matrix`` itself.

    Raises:
        ValueError: if it is not square or not symmetric to that tolerance.
    """
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"{argument} must be square, got shape {tuple(matrix.shape)}")
    scale = float(matrix.abs().max()) if matrix.numel() else 0.0
    asym = float((matrix - matrix.T).abs().max()) if matrix.numel() else 0.0
    tol = 1e3 * torch.finfo(matrix.dtype).eps * scale
    if asym > tol:
        raise ValueError(
            f"{argument} must be symmetric: max |A - A^T| = {asym:.3g} is above {tol:.3g} "
            "(1e3 rounding units of its largest entry); the eigensolvers here assume a "
            "symmetric matrix"
        )
    return matrix


__all__ = [
    "BLOCK_BYTES",
    "MAX_BLOCK_COLUMNS",
    "CountingView",
    "CurvatureOperator",
    "quiet_torch_warnings",
    "symmetric_matrix",
]
