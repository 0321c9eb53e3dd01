"""Function-preserving transforms, the symmetry registry and the symmetry audit.

A :class:`Symmetry` maps a parameter dict to another parameter dict that should
implement the same function. :func:`audit_symmetry` is the audit protocol:

1. evaluate the model's real-valued outputs (or logits, never labels) on a declared
   probe set, before and after the transform;
2. report the largest discrepancy and compare it with a stated tolerance: if it is
   larger, the transform is not a same-predictor control and the audit says so;
3. only then recompute the geometry measure before and after.

Two guards make a wrong certificate impossible to produce silently: a transform never
sees the caller's tensors (it gets private copies, and one that edits its input in place
is refused), and a ``forward`` whose outputs do not depend on the parameters it is given
is refused (its outputs could not reveal a non-symmetry).

:func:`audit` is the same protocol for a plain ``torch.nn.Module``: the registry
(:func:`find_symmetries`) reads the model's computation graph (``torch.fx``) and finds the
symmetries it can identify safely, so no transform has to be written by hand:

- the per-unit positive rescaling of ReLU and LeakyReLU hidden units (or channels)
  between two Linear or two Conv layers (``relu(c z) = c relu(z)`` for ``c > 0``);
- the permutation of hidden units or channels between two such layers (through any
  element-wise activation);
- the softmax common-row shift of a final Linear layer that feeds a softmax cross-entropy
  (or a final softmax / log-softmax).

Hand-written symmetries for other models plug in by returning a :class:`Symmetry`: a
ReLU rescaling and a unit permutation of named layers (:func:`relu_neuron_rescaling`, :func:`unit_permutation`)
and the common-row shift of a classifier (:func:`softmax_row_shift`).

The modules:

- :mod:`lossgeom.symmetries.core`: :class:`Symmetry`, :func:`compose`, the audit
  protocol (:func:`audit_symmetry`, ``check_forward_reads``), its receipt
  (:class:`AuditReport`) and the reporting floor ``ROUNDING_FLOOR``;
- :mod:`lossgeom.symmetries.layers`: the symmetries of named layers and the softmax gauge;
- :mod:`lossgeom.symmetries.graph`: reading a module's ``torch.fx`` graph;
- :mod:`lossgeom.symmetries.normalised`: batch-norm scale invariance and channel permutations,
  layer-norm rescalings (:func:`batchnorm_scale_invariance`, :func:`batchnorm_channel_permutation`,
  :func:`layernorm_rescaling`); some act on buffers too (:attr:`Symmetry.buffers`,
  ``lossgeom.parameters.params_of(model, buffers=True)``, :meth:`Symmetry.applied`);
- :mod:`lossgeom.symmetries.attention`: attention head gauges and head permutations
  (:func:`attention_head_gauge`, :func:`head_permutation`, :func:`attention_gauge_dimension`);
- :mod:`lossgeom.symmetries.decoder`: the symmetries of LLaMA-style and GPT-2 decoders
  (rotary, grouped-query and SwiGLU gauges, norm gains, the residual-stream rotation), and
  :mod:`lossgeom.symmetries.decoder_search`, which recognises them by module structure
  (:func:`decoder_gauge_dimensions`);
- :mod:`lossgeom.symmetries.registry`: :func:`find_symmetries` and the atlas's searches;
- :mod:`lossgeom.symmetries.module_audit`: :func:`audit` and its ``AuditTable``.
"""

from lossgeom.symmetries.attention import (
    attention_gauge_dimension,
    attention_head_gauge,
    head_permutation,
)
from lossgeom.symmetries.core import (
    AuditReport,
    Symmetry,
    audit_symmetry,
    compose,
)
from lossgeom.symmetries.decoder_search import decoder_gauge_dimensions
from lossgeom.symmetries.layers import (
    homogeneous_neuron_rescaling,
    layer_rescaling,
    linear_layer_mixing,
    normalisation_rescaling,
    relu_neuron_rescaling,
    softmax_row_shift,
    unit_permutation,
)
from lossgeom.symmetries.module_audit import audit
from lossgeom.symmetries.normalised import (
    batchnorm_channel_permutation,
    batchnorm_scale_invariance,
    layernorm_rescaling,
)
from lossgeom.symmetries.registry import (
    find_symmetries,
)

__all__ = [
    "AuditReport",
    "Symmetry",
    "attention_gauge_dimension",
    "attention_head_gauge",
    "audit",
    "audit_symmetry",
    "batchnorm_channel_permutation",
    "batchnorm_scale_invariance",
    "compose",
    "decoder_gauge_dimensions",
    "find_symmetries",
    "head_permutation",
    "homogeneous_neuron_rescaling",
    "layer_rescaling",
    "layernorm_rescaling",
    "linear_layer_mixing",
    "normalisation_rescaling",
    "relu_neuron_rescaling",
    "softmax_row_shift",
    "unit_permutation",
]
