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

from lossgeom.atlas.columns import LAYER_TRANSFORMS, SHORT_TITLES, TRANSFORMS, Cell, Column
from lossgeom.atlas.measures import FISHER_CUTS, FISHER_RANK_THRESHOLD, MEASURES, Measure
from lossgeom.atlas.records import (
    ROUNDING_FLOOR,
    FisherRecord,
    PointRecord,
    feature_norm_change,
    fisher_record,
    hessian_block_trace,
)
from lossgeom.atlas.table import Atlas, atlas

__all__ = [
    "FISHER_CUTS",
    "FISHER_RANK_THRESHOLD",
    "LAYER_TRANSFORMS",
    "MEASURES",
    "ROUNDING_FLOOR",
    "SHORT_TITLES",
    "TRANSFORMS",
    "Atlas",
    "Cell",
    "Column",
    "FisherRecord",
    "Measure",
    "PointRecord",
    "atlas",
    "feature_norm_change",
    "fisher_record",
    "hessian_block_trace",
]
