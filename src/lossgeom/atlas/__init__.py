"""The symmetry audit atlas: which flatness measures survive which function-preserving transformations.

- :mod:`lossgeom.atlas.measures`: the rows (``Measure``, ``MEASURES``) and the
  Fisher-Riemannian row's cuts (``FISHER_RANK_THRESHOLD``, ``FISHER_CUTS``);
- :mod:`lossgeom.atlas.records`: where a measurement was taken (``PointRecord``,
  ``FisherRecord``, ``fisher_record``) and the cell explanations ``feature_norm_change`` and
  ``hessian_block_trace``;
- :mod:`lossgeom.atlas.columns`: the columns (the transformations, ``TRANSFORMS``,
  ``Column``) and the cells (``Cell``);
- :mod:`lossgeom.atlas.table`: the table itself (``Atlas``) and the one call ``atlas``.
"""

from lossgeom.atlas.columns import Column
from lossgeom.atlas.measures import Measure
from lossgeom.atlas.table import Atlas, atlas

__all__ = [
    "Atlas",
    "Column",
    "Measure",
    "atlas",
]
