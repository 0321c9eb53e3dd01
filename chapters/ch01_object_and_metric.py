# ---
# jupyter:
#   jupytext:
#     default_lexer: ipython3
#     formats: ipynb,md:myst,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# (ch-object-and-metric)=
# # Geometry needs an object and a metric
#
# A trained network is two things at once: a *function* from inputs to outputs, and a
# *point* in a parameter space that someone chose. A statement such as "this minimum is
# flat" is about the point, measured with some metric; a statement such as "this model
# generalises" is about the function. This book asks what the first kind of statement
# says about the second. This chapter sets up the two instruments every later chapter
# uses: the **measurement contract**, which records what a geometry number measured, and
# the **symmetry audit**, which checks that two parameter points really are the same
# function before their geometry is compared.
#
# **Claims established here:** P11, P12, P13.

# %%
import numpy as np
import torch
import matplotlib.pyplot as plt
from myst_nb import glue

from lossgeom import product
from lossgeom.contract import MeasurementContract
from lossgeom.display import fmt, glue_figure, use_book_style
from lossgeom.ledger import Ledger
from lossgeom.symmetries import Symmetry, audit_symmetry, product_rescaling

torch.set_default_dtype(torch.float64)
use_book_style()
ledger = Ledger("Chapter 1: geometry needs an object and a metric")

# %% [markdown]
# ## What the literature established, and what it did not
#
# {cite:t}`keskar2017large` trained the same architectures with small and large batches and
# reported that large-batch runs ended at points where a particular sharpness measure was
# larger and test accuracy lower. That is evidence of an association inside their
# experimental family: their architectures, optimisers and sharpness measure. It is a
# reason to study sharpness, not a theorem that every sharp minimum generalises worse.
#
# {cite:t}`dinh2017sharp` showed that rectifier networks have parameter symmetries (a
# neuron's incoming weights can be multiplied by $c > 0$ and its outgoing weights divided
# by $c$) that leave the function unchanged while making the Hessian, and several other
# sharpness measures, as large as one likes. Their objection is about *identification*:
# a sharpness number without a convention that fixes the coordinates cannot be a property
# of the predictor. It does not show that training procedures which seek flat regions are
# useless; whether an intervention helps is a separate, empirical question
# {cite}`foret2021sharpness`.
#
# Taken together they ask every geometry claim to say which of three things it compares:
# functions, optimisation procedures, or coordinates. Correlation studies such as
# {cite:t}`jiang2020fantastic` answer a fourth question, whether a measure predicts
# generalisation across a family of training runs, and their answers too are conditional
# on the family.
#
# ## The measurement contract
#
# A flatness number can mean the loss change under additive weight noise, the curvature
# along chosen directions, the volume of a low-loss region, or the sensitivity of
# predictions to a perturbation. Each is a legitimate measurement once its object and
# metric are stated. `lossgeom.contract.MeasurementContract` makes the statement explicit:
# ten fields, every one required, rendered into the caption of every geometry figure in
# this book. For the largest Hessian eigenvalue of the product model
# $f(a, b; x) = abx$ at its balanced minimum it reads:

# %%
balanced_contract = MeasurementContract(
    centre="(a, b) = (1, 1), a zero-loss point of the product model",
    directions="all of parameter space (the full 2x2 Hessian)",
    normalisation="Euclidean coordinates (a, b), no rescaling",
    radius="n/a (a second derivative at the centre)",
    loss="L = 1/2 (abx - y)^2",
    reduction="single example",
    data="training set {(x, y) = (1, 1)}",
    model_mode="n/a (no layers with state; for real networks: eval mode, batch-norm statistics frozen)",
    resolution="exact (closed form), checked against a dense autograd Hessian",
    precision="float64",
)
print(balanced_contract)

# %% [markdown]
# A contract with a missing field is refused, with the field named; "not applicable" has
# to be written down, so that omission is a visible decision:

# %%
try:
    MeasurementContract(**{**balanced_contract.as_dict(), "normalisation": ""})
except ValueError as err:
    contract_refusal = str(err)
assert contract_refusal.startswith("normalisation must be stated")
print(contract_refusal)

# %% [markdown]
# ## The symmetry audit
#
# The source essay proposes a falsification test for any geometry measure: apply a
# transformation known to preserve the predictor, recompute the measure, and ask whether
# the theory permits the change. Its order matters, and `lossgeom.symmetries.audit_symmetry`
# enforces it:
#
# 1. compare the **outputs** (real values or logits, not labels) of the original and the
#    transformed parameters on a **declared probe set**, with a **stated tolerance**;
# 2. report the largest discrepancy; if it exceeds the tolerance the transformed model is
#    not a same-predictor control and no geometry is compared;
# 3. only then recompute the measure at both points.
#
# We audit the rescaling $(a, b) \mapsto (c a, b / c)$ of the product model, with a probe
# set that goes beyond the single training input, and with the largest Hessian eigenvalue
# as the measure:

# %%
probe = torch.linspace(-3.0, 3.0, 13)
centre = product.params(1.0, 1.0)


def largest_eigenvalue(p):
    return float(np.linalg.eigvalsh(product.hessian_autograd(p["a"].item(), p["b"].item()))[-1])


audit_scales = (0.1, 0.5, 2.0, 10.0)
reports = [audit_symmetry(product.forward, centre, product_rescaling(c), probe, tol=1e-12,
                          measure=largest_eigenvalue, measure_name="largest Hessian eigenvalue")
           for c in audit_scales]
for report in reports:
    assert report.is_symmetry
    print(report, end="\n\n")

# %% [markdown]
# Every rescaling passes the functional check on all thirteen probe inputs, and the
# measure moves from 2 to {glue:text}`ch01-lam10:.8g` at $c = 10$. The audit's verdict is
# not that the eigenvalue is wrong, but that it is not a property of the function:

# %%
lam_after = {c: r.measure_after for c, r in zip(audit_scales, reports)}
for c, value in lam_after.items():
    assert abs(value - product.nonzero_eigenvalue(c)) <= 1e-12 * value
glue("ch01-lam10", lam_after[10.0], display=False)
print("largest Hessian eigenvalue after the audited rescaling:",
      ", ".join(f"c = {fmt(c)}: {fmt(v)}" for c, v in lam_after.items()))

# %% [markdown]
# ### Why outputs and not labels
#
# Treat the sign of $abx$ as a class label. The transform $(a, b) \mapsto (2a, b)$ keeps
# every label on the probe set, yet it doubles every output: it is a different predictor,
# with a different loss. A label-only check would accept it as a control; the audit
# refuses it and names the discrepancy:

# %%
stretch = Symmetry("stretch (a, b) -> (2 a, b) (not a symmetry)", lambda p: {"a": 2 * p["a"], "b": p["b"]})
labels_before = torch.sign(product.forward(centre, probe))
labels_after = torch.sign(product.forward(stretch(centre), probe))
assert torch.equal(labels_before, labels_after)
try:
    audit_symmetry(product.forward, centre, stretch, probe, tol=1e-12)
except ValueError as err:
    refusal = str(err)
assert "is not a symmetry of the model on the probe set" in refusal
print("labels agree on all", probe.numel(), "probe inputs; the audit says:\n" + refusal)
control = audit_symmetry(product.forward, centre, stretch, probe, tol=1e-12,
                         measure=largest_eigenvalue, require_symmetry=False)
assert not control.is_symmetry and control.measure_before is None
print("\nas a negative control (require_symmetry=False):\n" + str(control))

# %% [markdown]
# When the check fails, the report carries no measure at all: a geometry change between
# two different functions says nothing about coordinate dependence. We draw the audit:

# %%
c_grid = np.geomspace(0.1, 10.0, 25)
grid_reports = [audit_symmetry(product.forward, centre, product_rescaling(c), probe, tol=1e-12,
                               measure=largest_eigenvalue) for c in c_grid]
discrepancies = np.array([r.max_output_discrepancy for r in grid_reports])
stretch_discrepancy = control.max_output_discrepancy
assert discrepancies.max() <= 1e-12
print(f"25 rescalings c in [0.1, 10]: largest output discrepancy {fmt(discrepancies.max(), 3)}; "
      f"stretch control: {fmt(stretch_discrepancy, 3)}")

audit_contract = balanced_contract.with_(
    centre="(1, 1) and its images (c, 1/c)",
    resolution="25 log-spaced c in [0.1, 10]; probe set: 13 inputs x in [-3, 3]; output tolerance 1e-12",
)
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9.0, 3.4))
ax0.loglog(c_grid, [r.measure_after for r in grid_reports], "o-", ms=3)
ax0.set_xlabel("rescaling c")
ax0.set_ylabel("largest Hessian eigenvalue")
ax1.semilogx(c_grid, np.maximum(discrepancies, 1e-18), "o", ms=3, label="rescalings (symmetries)")
ax1.axhline(1e-12, color="grey", ls="--", lw=0.8, label="tolerance 1e-12")
ax1.axhline(stretch_discrepancy, color="C3", lw=1, label="stretch (a, b) -> (2a, b)")
ax1.set_yscale("log")
ax1.set_xlabel("rescaling c")
ax1.set_ylabel("largest output discrepancy on the probe set")
ax1.legend(fontsize=7)
glue_figure("ch01-audit", fig, audit_contract,
    "The symmetry audit of the product model: the measure changes (left) while the outputs on the "
    "probe set do not (right, zero discrepancies drawn at 1e-18); the stretch is refused")

# %% [markdown]
# ```{glue:figure} fig-ch01-audit
# :name: fig-ch01-audit
#
# {glue:text}`cap-ch01-audit`
# ```
#
# {numref}`fig-ch01-audit` is the template for every audit in the book: first the
# functional check with its tolerance, then the geometry. Later parts plug other symmetries
# into the same function: the per-neuron ReLU rescaling and the softmax common-row shift.

# %%
ledger.add("P12", "The symmetry audit: function-preserving transform, outputs compared on a declared probe set with a tolerance, then the measure recomputed",
           {"probe set": "13 inputs in [-3, 3]", "tolerance": 1e-12,
            "largest discrepancy over 25 rescalings": float(discrepancies.max()),
            "measure at c=1 and c=10": [reports[0].measure_before, lam_after[10.0]],
            "label-preserving non-symmetry refused, discrepancy": stretch_discrepancy})
ledger.add("P13", "A measurement contract is recorded with every geometry figure and number",
           {"fields": list(balanced_contract.as_dict()), "a contract without a normalisation": contract_refusal,
            "figures with the contract in their caption": "every figure of Chapters 1-3"})

# %% [markdown]
# ## Margins need a declared normalisation
#
# The same logic applies to outputs. Multiplying every class score by $s > 0$ changes no
# predicted label, but it multiplies the raw margin (top score minus runner-up) by $s$. A
# normalised margin, here the raw margin divided by the Euclidean norm of the score
# vector, does not move. We check this on seeded random scores for ten examples and four
# classes:

# %%
rng = np.random.default_rng(0)
scores = rng.normal(size=(10, 4))


def raw_margin(z):
    top2 = np.sort(z, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


for scale in (0.1, 10.0):
    scaled = scale * scores
    assert np.array_equal(scaled.argmax(axis=1), scores.argmax(axis=1))
    assert np.allclose(raw_margin(scaled), scale * raw_margin(scores), rtol=1e-14)
    normalised_change = np.max(np.abs(raw_margin(scaled) / np.linalg.norm(scaled, axis=1)
                                      - raw_margin(scores) / np.linalg.norm(scores, axis=1)))
    assert normalised_change <= 1e-14
    print(f"scale {fmt(scale)}: labels unchanged; mean raw margin {fmt(raw_margin(scores).mean(), 6)} -> "
          f"{fmt(raw_margin(scaled).mean(), 6)}; largest change of the normalised margin {fmt(normalised_change, 2)}")
ledger.add("P11", "Scaling all output scores changes the raw margin but no label; a normalised margin is unchanged",
           {"labels changed": 0, "raw margin factor": "equals the scale s (s = 0.1, 10)",
            "normalised margin change": "<= 1e-14"})

# %% [markdown]
# Which normalisation is right is a modelling decision; what the contract demands is that
# it is chosen before looking at which version correlates best with test error
# {cite}`neyshabur2017exploring`.
#
# ## What this establishes
#
# Two instruments, both in `lossgeom`: a contract that makes every geometry number carry
# its centre, directions, normalisation, radius, loss, reduction, data, model mode,
# resolution and precision; and an audit that refuses to compare geometry across a
# transform until the outputs on a declared probe set agree within a stated tolerance.
# On the product model the audit shows the largest Hessian eigenvalue changing fifty-fold
# across one predictor. The next chapter derives that family of minima exactly.
#
# ## Results ledger

# %%
ledger
