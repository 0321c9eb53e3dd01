# ---
# jupyter:
#   jupytext:
#     default_lexer: ipython3
#     formats: ipynb,md:myst,py:percent
#     notebook_metadata_filter: kernelspec,jupytext
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
# (ch-softmax-gauge)=
# # The softmax gauge
#
# A softmax classifier does not see its weight matrix, only the differences between its
# rows: adding one vector to every row adds the same number to every logit, and softmax
# removes it. Which last-layer flatness numbers notice this *gauge* freedom, and how large
# is it in classifiers as they come out of training? This chapter derives, exactly, the
# curvature of softmax cross-entropy in the classifier, the last-layer relative flatness
# $\kappa_{\rm exact}$ of {cite:t}`petzka2021relative`, the operational upper bound
# $B_{\rm raw}$ used for certificates {cite}`walter2026flatness` and as a regulariser
# {cite}`han2025flatness`, and its orbit-minimised version $B_{\rm quot}$, following
# {cite:t}`opazo2026flatness`. It then measures the gauge in small classifiers trained
# here, on sklearn's digits and on modular arithmetic, sweeping the settings that decide
# it instead of tuning one run.
#
# ```{admonition} Key ideas
# :class: tip
# - Softmax sees only the differences between the rows of the classifier: adding one vector
#   to every row (the *gauge*) changes no prediction.
# - The curvature of cross-entropy in the classifier is exactly $P(p) \otimes hh^\top$, and the
#   relative flatness $\kappa_{\rm exact}$ is that Hessian weighted by the layer's own rows.
# - $\kappa_{\rm exact}$ and the centred bound $B_{\rm quot}$ are the same at every equivalent
#   classifier; the raw bound $B_{\rm raw}$ grows without limit along the gauge and doubles
#   on average under a reference-class convention.
# - How much gauge a trained classifier stores records how it was trained (initialisation,
#   optimiser, weight decay), not what it predicts.
# - Even $B_{\rm quot}$ is loose, by about $K - 1$ for $K$ classes: heads with about a hundred
#   classes show a hundredfold gap.
# ```
#
# **Claims established here:** S1, S2, S3, S4, S14.
#
# Each status in the ledger at the end is read from the outputs by one rule, with each
# claim's criterion stated before its row: **holds** for an identity (derived exactly here;
# the numeric checks confirm, to rounding, only that the code implements it); **holds at our
# scale** when every measured part of the claim meets its criterion on the small classifiers
# here, and every level the source states is met here or accounted for by a computation here;
# **differs** when the effect the claim describes is measured but a measured part goes the
# other way, or a level the source states is missed and nothing here accounts for the gap;
# **not reproduced** when the measurements show none of the effect the source reports.
#
# We load sympy for the exact work, torch in float64 (one thread, so that timings under
# load stay short), and the book's package:

# %% tags=["remove-cell"]
# Only on Google Colab: install the book's package and what the chapter imports.
import subprocess, sys
if "google.colab" in sys.modules:
    book = "lossgeom[book] @ git+https://github.com/lossgeom/same-function-different-geometry@main"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", book], check=True)

# %% tags=["hide-cell"]
from lossgeom_book.setup import setup

ledger = setup("the softmax gauge", single_thread=True)

# %% tags=["hide-input"]
import numpy as np
import sympy as sp
import torch
from torch import nn
import matplotlib.pyplot as plt
from IPython.display import Math, display

from lossgeom import flatness, training
from lossgeom.contract import MeasurementContract
from lossgeom.curvature import closure_hessian
from lossgeom.flatness import softmax_gauge as sm
from lossgeom.formatting import fmt, rounding_level
from lossgeom.symmetries import audit_symmetry
from lossgeom_book import data, tasks
from lossgeom_book import classifiers as toy_classifiers
from lossgeom_book.display import glue_figure, glue_value

# %% [markdown]
# Printed numbers carry six significant digits for closed-form and short computations,
# three or four for quantities that come out of training runs, and discrepancies at the
# level of float64 rounding are reported only as lying below a stated floor.
#
# ## One matrix, two meanings
#
# A classifier $W \in \mathbb{R}^{K \times d}$ maps a feature $h \in \mathbb{R}^d$ to
# logits $z = W h$ and probabilities $p = \operatorname{softmax}(z)$. The matrix
#
# $$
# P(p) = \operatorname{Diag}(p) - p p^\top
# $$ (eq-ch08-cov)
#
# is both the covariance of the one-hot label $e_Y$ with $Y \sim \operatorname{Cat}(p)$
# and the Jacobian $\partial p / \partial z$. We check both for $K = 3$, writing
# $u_k = e^{z_k}$ so that every entry is a rational function sympy can cancel exactly.
# First the symbols and the softmax:

# %%
K_small = 3  # the number of classes in the symbolic examples
z = sp.symbols("z0:3", real=True)
u = sp.symbols("u0:3", positive=True)  # u_k stands for exp(z_k)
exp_to_u = {sp.exp(z_k): u_k for z_k, u_k in zip(z, u)}
p_of_z = sp.Matrix([sp.exp(z_k) for z_k in z]) / sum(sp.exp(z_k) for z_k in z)

# %% [markdown]
# Then $P(p)$ and the covariance of the one-hot label, $\sum_c p_c (e_c - p)(e_c - p)^\top$:

# %%
p_sym = p_of_z.subs(exp_to_u)
P_sym = sp.diag(*p_sym) - p_sym * p_sym.T
onehot = sp.eye(K_small)
label_covariance = sum((p_sym[c] * (onehot[:, c] - p_sym) * (onehot[:, c] - p_sym).T
                        for c in range(K_small)), sp.zeros(K_small, K_small))

# %% [markdown]
# Both agree with the softmax Jacobian entry by entry, and $P(p)\mathbf{1} = 0$:

# %%
cancels_to_zero = lambda M: M.applyfunc(sp.cancel) == sp.zeros(*M.shape)
softmax_jacobian = p_of_z.jacobian(z).subs(exp_to_u)
assert cancels_to_zero(label_covariance - P_sym) and cancels_to_zero(softmax_jacobian - P_sym)
assert cancels_to_zero(P_sym * sp.ones(K_small, 1))

# %% [markdown]
# Displayed, a diagonal and an off-diagonal entry read:

# %%
display(Math(r"P_{00} = " + sp.latex(sp.factor(P_sym[0, 0]))
             + r",\qquad P_{01} = " + sp.latex(sp.factor(P_sym[0, 1]))))

# %% [markdown]
# The two displayed entries are $p_0(1 - p_0)$ and $-p_0 p_1$ in the variables $u_k$; the
# rows sum to zero, so a common logit offset is invisible to first order, as it must be.
#
# ## The classifier Hessian
#
# For one example with label $y$, cross-entropy is
# $\ell = \log \sum_k e^{z_k} - z_y$. Its Hessian in the logits is $P(p)$:

# %%
cross_entropy = sp.log(sum(sp.exp(z_k) for z_k in z)) - z[0]
assert cancels_to_zero(sp.hessian(cross_entropy, z).subs(exp_to_u) - P_sym)

# %% [markdown]
# Since $z = W h$ is linear in $W$ with Jacobian $I_K \otimes h^\top$ (row-major
# $\operatorname{vec} W$), the Hessian in the classifier is
#
# $$
# \nabla^2_{W} \ell = (I_K \otimes h^\top)^\top P(p)\, (I_K \otimes h^\top) = P(p) \otimes h h^\top .
# $$ (eq-ch08-hessian)
#
# Sympy confirms the second step for a general symmetric $P$ and $d = 2$; we set up the
# classifier, the feature and the logit Jacobian:

# %%
W_sym = sp.Matrix(K_small, 2, sp.symbols("w0:6", real=True))
h_sym = sp.Matrix(sp.symbols("h0:2", real=True))
logit_jacobian = (W_sym * h_sym).jacobian(list(W_sym))  # I_K kron h^T for row-major vec W
P_general = sp.Matrix(K_small, K_small, lambda i, j: sp.Symbol(f"P_{min(i, j)}{max(i, j)}"))

# %% [markdown]
# and check {eq}`eq-ch08-hessian` entry by entry:

# %%
chain_rule = logit_jacobian.T * P_general * logit_jacobian
assert sp.expand(chain_rule - sp.kronecker_product(P_general, h_sym * h_sym.T)) == sp.zeros(6, 6)
display(Math(r"J_W = " + sp.latex(logit_jacobian)))

# %% [markdown]
# The Jacobian is $I_3 \otimes h^\top$, as claimed. Numerically, we take a digit image
# (average-pooled to 4 x 4, so $d = 16$) and a random classifier:

# %%
split = data.digits(n_train=600, n_test=400, seed=0)
x_train, y_train, x_test, y_test = split.x_train, split.y_train, split.x_test, split.y_test
x_pooled = torch.nn.functional.avg_pool2d(x_train[0].reshape(1, 8, 8), 2).reshape(16)
W_random16 = 0.3 * torch.randn(10, 16, generator=torch.Generator().manual_seed(0))

# %% [markdown]
# The torch autograd Hessian of cross-entropy (`lossgeom.curvature.closure_hessian`) matches
# {eq}`eq-ch08-hessian` built from `lossgeom.flatness.softmax_gauge.covariance`:

# %%
loss_of_W = lambda q: torch.nn.functional.cross_entropy((q["W"] @ x_pooled)[None], y_train[:1])
autograd_hessian = closure_hessian(loss_of_W, {"W": W_random16})
P_pooled = sm.covariance(sm.probabilities(W_random16, x_pooled))
kronecker_hessian = torch.kron(P_pooled, torch.outer(x_pooled, x_pooled))

# %% [markdown]
# and compare them entry by entry, relative to the largest entry:

# %%
largest_entry = kronecker_hessian.abs().max()
hessian_gap = float((autograd_hessian - kronecker_hessian).abs().max() / largest_entry)
print("160 x 160 Hessian, max |autograd - P kron hh^T| / max entry:", rounding_level(hessian_gap))

# %% [markdown]
# The two agree to rounding: the largest entry-wise difference is below the stated floor.
#
# ## Exact contraction and its upper bound
#
# The last-layer relative flatness of {cite:t}`petzka2021relative` contracts this Hessian
# with the layer's own scale: it weights the trace of each block $H_{s,s'}$ of the Hessian,
# the block between the rows $w_s$ and $w_{s'}$, by the inner product of those rows,
# $\kappa = \sum_{s,s'} \langle w_s, w_{s'}\rangle \operatorname{Tr} H_{s,s'}$. By
# {eq}`eq-ch08-hessian` that block is $P_{ss'}\, h h^\top$, whose trace is
# $P_{ss'} \lVert h\rVert^2$, so
# $\kappa = \lVert h\rVert^2 \sum_{s,s'} P_{ss'} \langle w_s, w_{s'}\rangle
# = \lVert h\rVert^2 \operatorname{Tr}(W^\top P(p)\, W)$. That sum is $\kappa_{\rm exact}$ below;
# beside it is $B_{\rm raw}$, the bound used in practice:
#
# $$
# \kappa_{\rm exact}(W, h) = \lVert h \rVert^2 \operatorname{Tr}\big(W^\top P(p)\, W\big),
# \qquad
# B_{\rm raw}(W, h) = \lVert W \rVert_F^2 \lVert h \rVert^2 \big(1 - \lVert p \rVert^2\big).
# $$ (eq-ch08-kappa)
#
# Sympy checks the contraction on the Hessian of {eq}`eq-ch08-hessian` computed above (the
# $2 \times 2$ blocks of `chain_rule`, for a general symmetric $P$):

# %%
block = lambda s, s2: chain_rule[2 * s:2 * s + 2, 2 * s2:2 * s2 + 2]  # H_{s,s'}
weighted_traces = sum((W_sym[s, :] * W_sym[s2, :].T)[0] * block(s, s2).trace()
                      for s in range(K_small) for s2 in range(K_small))
h_norm_sq = (h_sym.T * h_sym)[0]
assert sp.expand(weighted_traces - h_norm_sq * (W_sym.T * P_general * W_sym).trace()) == 0

# %% [markdown]
# The gap between $\kappa_{\rm exact}$ and $B_{\rm raw}$ is a trace of a product
# of two positive semi-definite matrices, $P(p)$ and $\lVert W\rVert_F^2 I - W W^\top$,
# hence non-negative; and $\operatorname{Tr} P(p) = 1 - \lVert p \rVert^2$. Sympy checks
# both for a general point of the simplex:

# %%
p0, p1 = sp.symbols("p0 p1", positive=True)
p_simplex = sp.Matrix([p0, p1, 1 - p0 - p1])
P_simplex = sp.diag(*p_simplex) - p_simplex * p_simplex.T
norm_sq = lambda M: sum(m**2 for m in M)

# %% [markdown]
# The gap is the trace of the product, and the trace of $P$ is $1 - \lVert p\rVert^2$:

# %%
bound_gap = norm_sq(W_sym) * P_simplex.trace() - (W_sym.T * P_simplex * W_sym).trace()
psd_product = P_simplex * (norm_sq(W_sym) * sp.eye(K_small) - W_sym * W_sym.T)
assert sp.expand(bound_gap - psd_product.trace()) == 0
assert sp.expand(P_simplex.trace() - (1 - norm_sq(p_simplex))) == 0

# %% [markdown]
# In words:

# %%
display(Math(r"\lVert W\rVert_F^2 \operatorname{Tr}P - \operatorname{Tr}(W^\top P W) = "
             r"\operatorname{Tr}\big(P\,(\lVert W\rVert_F^2 I - W W^\top)\big) \ge 0"))

# %% [markdown]
# The package computes $\kappa_{\rm exact}$ as $\lVert h\rVert^2$ times the variance of the
# row $w_C$ under $C \sim \operatorname{Cat}(p)$, which is the same trace without forming
# $P(p)$. We compare it with the literal dense trace (`flatness.kappa_exact_by_trace`) on 50
# digit images:

# %%
W_random64 = 0.3 * torch.randn(10, 64, generator=torch.Generator().manual_seed(1))
as_variance = flatness.kappa_exact(W_random64, x_train[:50], reduction="none")
as_trace = flatness.kappa_exact_by_trace(W_random64, x_train[:50], reduction="none")
kappa_gap = float(((as_variance - as_trace).abs() / as_trace).max())
print("kappa_exact, variance form vs dense trace, max relative gap:", rounding_level(kappa_gap))

# %% [markdown]
# The two forms agree to rounding on every image.
#
# ## The common-row orbit
#
# The gauge transform $G_v(W) = W + \mathbf{1} v^\top$ leaves $p$ unchanged, and with it
# $\kappa_{\rm exact}$, because $P(p)\mathbf{1} = 0$. $B_{\rm raw}$ changes through
# $\lVert W \rVert_F^2$. Along the line $W + t \mathbf{1} v^\top$ the norm is a quadratic
# in $t$ with leading coefficient $K \lVert v\rVert^2$, so $B_{\rm raw}$ grows without
# bound. We set up the symbols:

# %%
t = sp.symbols("t", real=True)
v_sym = sp.Matrix(sp.symbols("v0:2", real=True))
ones = sp.ones(K_small, 1)
orbit_norm = sp.expand(norm_sq(W_sym + t * ones * v_sym.T))

# %% [markdown]
# and check the quadratic and its limit:

# %%
quadratic = norm_sq(W_sym) + 2 * t * (ones.T * W_sym * v_sym)[0] + t**2 * K_small * norm_sq(v_sym)
assert sp.expand(orbit_norm - quadratic) == 0
assert sp.limit(quadratic.subs({v_sym[0]: 1, v_sym[1]: 0}), t, sp.oo) == sp.oo

# %% [markdown]
# Minimising $\lVert W + \mathbf{1}v^\top\rVert_F^2$ over $v$ gives one stationary point,
# $v = -\bar w$ (the mean row), where the Hessian $2K I$ is positive definite:

# %%
wbar_sym = W_sym.T * ones / K_small
shifted_norm = norm_sq(W_sym + ones * v_sym.T)
stationary = sp.solve([sp.diff(shifted_norm, v_i) for v_i in v_sym], list(v_sym), dict=True)
assert len(stationary) == 1 and sp.simplify(v_sym.subs(stationary[0]) + wbar_sym) == sp.zeros(2, 1)
assert sp.hessian(shifted_norm, list(v_sym)) == 2 * K_small * sp.eye(2)

# %% [markdown]
# So the centred $W_c = W - \mathbf{1}\bar w^\top$ is the unique minimum-norm representative,
# with the orthogonal split
# $\lVert W\rVert_F^2 = \lVert W_c\rVert_F^2 + K \lVert \bar w \rVert^2$:

# %%
W_c_sym = W_sym - ones * wbar_sym.T
assert sp.expand(norm_sq(W_sym) - norm_sq(W_c_sym) - K_small * norm_sq(wbar_sym)) == 0
display(Math(r"\lVert W + t\mathbf{1}v^\top\rVert_F^2 = \lVert W\rVert_F^2"
             r" + 2t\,\mathbf{1}^\top W v + t^2 K\lVert v\rVert^2,\qquad \arg\min_v = -\bar w"))

# %% [markdown]
# Consequently $B_{\rm quot}(W, h) = \lVert W_c\rVert_F^2 \lVert h\rVert^2 (1 - \lVert p\rVert^2)
# = \inf_v B_{\rm raw}(G_v(W), h)$, and since $P = \Pi P \Pi$ with the centring projector
# $\Pi$, centring keeps $\kappa_{\rm exact}$, so
# $\kappa_{\rm exact} \le B_{\rm quot} \le B_{\rm raw}$. Both $\kappa_{\rm exact}$ and
# $B_{\rm quot}$ are constant along the orbit, so their gradients are too.
#
# To check this on a real classifier we train a linear softmax model ($h$ = the 64 pixels)
# on 600 digit images with full-batch heavy-ball SGD (`lossgeom_book.classifiers.train_classifier`;
# learning rate 0.1, momentum 0.9, 150 steps, no weight decay):

# %%
linear_init = toy_classifiers.init_classifier([64, 10], seed=0)
linear, _ = toy_classifiers.train_classifier(linear_init, x_train, y_train, steps=150, lr=0.1)
W_linear = linear["weight"]

# %% [markdown]
# Its accuracy on the 400 held-out images:

# %%
predictions = lambda params: toy_classifiers.classifier_logits(params, x_test).argmax(-1)
test_accuracy = lambda params: float((predictions(params) == y_test).double().mean())
print(f"linear softmax model: test accuracy {fmt(test_accuracy(linear), 3)} ({len(y_test)} images)")

# %% [markdown]
# The symmetry audit of {numref}`Chapter %s <ch-object-and-metric>`
# (`lossgeom.symmetries.audit_symmetry`) applies a shift $v$ along the mean-row direction,
# chosen so that $\lVert W \rVert_F^2$ grows 100-fold, checks that the probabilities on the
# 400 test images agree, and only then recomputes $B_{\rm raw}$:

# %%
direction = sm.mean_row(W_linear) / sm.mean_row(W_linear).norm()
v_hundred = sm.shift_for_norm_factor(W_linear, direction, 100.0)  # ||W + 1 v^T||^2 = 100 ||W||^2
softmax_forward = lambda params, x: torch.softmax(x @ params["weight"].T, dim=-1)

# %% [markdown]
# The audit is told how to recompute $B_{\rm raw}$ on the test images:

# %%
b_raw_on_test = lambda q: float(flatness.b_raw(q["weight"], x_test))
audit = audit_symmetry(softmax_forward, {"weight": W_linear}, sm.row_shift_symmetry(v_hundred),
                       x_test, tol=1e-12, measure=b_raw_on_test, measure_name="B_raw")

# %% [markdown]
# The audit's receipt:

# %%
probability_gap = audit.max_output_discrepancy
print(f"max probability difference, {audit.probe_size} images:", rounding_level(probability_gap))
print(f"B_raw: {fmt(audit.measure_before)} -> {fmt(audit.measure_after)},"
      f" ratio {fmt(audit.measure_ratio)}")

# %% [markdown]
# The probabilities agree to rounding while $B_{\rm raw}$ is 100 times larger. That factor
# is an identity, not a finding: the shift was constructed to multiply
# $\lVert W\rVert_F^2$ by 100, and the rest of $B_{\rm raw}$ is invariant. The measurement
# is the unchanged function. The two invariant quantities and their gradients do not move
# either (`flatness.invariance_gaps` returns the relative change of a proxy's value and of its
# gradient in $W$ between two representatives):

# %%
W_far = sm.common_row_shift(W_linear, v_hundred)
invariance = {name: flatness.invariance_gaps(proxy, W_linear, W_far, x_test)
              for name, proxy in (("kappa_exact", flatness.kappa_exact),
                                  ("B_quot", flatness.b_quot))}
for name, gaps in invariance.items():
    print(f"{name}: value {rounding_level(gaps[0])}; gradient {rounding_level(gaps[1])}")

# %% [markdown]
# $B_{\rm quot}$ also equals the numerical minimum of $B_{\rm raw}$ over all 64 shift
# coordinates, found by scipy's BFGS with autograd gradients (`flatness.orbit_minimum`), at
# the shift $-\bar w$:

# %%
orbit_min, best_shift = flatness.orbit_minimum(W_linear, x_test)
orbit_min_gap = abs(orbit_min / float(flatness.b_quot(W_linear, x_test)) - 1)
argmin_gap = float((best_shift + sm.mean_row(W_linear)).norm() / sm.mean_row(W_linear).norm())
print("min_v B_raw / B_quot - 1:", rounding_level(orbit_min_gap))
print("|argmin + mean row| / |mean row|:", rounding_level(argmin_gap, floor=1e-10))

# %% [markdown]
# Finally the ordering holds example by example on all 400 test images:

# %%
per_image = [proxy(W_linear, x_test, reduction="none")
             for proxy in (flatness.kappa_exact, flatness.b_quot, flatness.b_raw)]
ordered = int(((per_image[0] <= per_image[1]) & (per_image[1] <= per_image[2])).sum())
print(f"kappa_exact <= B_quot <= B_raw on {ordered} of {len(x_test)} test images")

# %% [markdown]
# {numref}`fig-ch08-orbit` draws the three quantities along the orbit: a parabola for
# $B_{\rm raw}$ whose minimum is $B_{\rm quot}$, and two flat lines.
#
# The figure is drawn from 61 points of the orbit (code hidden in the rendered page):

# %% tags=["hide-input"]
orbit_contract = MeasurementContract(
    centre="the trained linear softmax classifier W (10 x 64), as stored",
    directions="common-row shift W + t 1 u^T, u the unit mean-row direction",
    normalisation="t in units of ||v100|| (t = 1 makes ||W||_F^2 100x larger)",
    radius="t in [-1.2, 1.2]", loss="n/a (proxies of softmax cross-entropy curvature)",
    reduction="mean over examples", data=f"{len(x_test)} held-out digits images (h = pixels / 16)",
    model_mode="n/a (no layers with state)", resolution="61 values of t", precision="float64",
)
shifts = np.linspace(-1.2, 1.2, 61)
proxies = {"B_raw": flatness.b_raw, "B_quot": flatness.b_quot, "kappa_exact": flatness.kappa_exact}
fig, ax = plt.subplots()
for (name, proxy), style in zip(proxies.items(), ("-", "--", ":")):
    along_orbit = [sm.common_row_shift(W_linear, float(s) * v_hundred) for s in shifts]
    values = [float(proxy(W_shifted, x_test)) for W_shifted in along_orbit]
    ax.semilogy(shifts, values, style, label=name)
ax.set_xlabel("shift t (W + t v100 1^T direction)")
ax.set_ylabel("mean over test images")
ax.legend()
glue_figure("ch08-orbit", fig, orbit_contract,
            "B_raw along the common-row orbit of one trained classifier; "
            "B_quot and kappa_exact are constant")

# %% [markdown]
# ```{glue:figure} fig-ch08-orbit
# :name: fig-ch08-orbit
#
# {glue:text}`cap-ch08-orbit`
# ```
#
# S1 and S2 are identities. S1 holds if the autograd Hessian matches $P(p) \otimes hh^\top$
# and the variance form of $\kappa_{\rm exact}$ matches its dense trace, to rounding (below
# $10^{-12}$; the larger gap lies {glue:text}`ch08-s1-gap`), and if
# $\kappa_{\rm exact} \le B_{\rm quot} \le B_{\rm raw}$ on every test image (here on
# {glue:text}`ch08-s1-ordered` of {glue:text}`ch08-s1-images`). S2 holds if the 100-fold shift
# changes neither $p$ nor the values and gradients of $\kappa_{\rm exact}$ and
# $B_{\rm quot}$, and BFGS finds $B_{\rm quot}$ as the minimum of $B_{\rm raw}$, to rounding
# (below $10^{-12}$; the largest gap lies {glue:text}`ch08-s2-gap`), at the shift $-\bar w$
# (below $10^{-10}$, relative; here {glue:text}`ch08-s2-argmin`).

# %% tags=["remove-cell"]
ROUNDING = 1e-12
gap_text = lambda gap, floor=ROUNDING: rounding_level(gap, floor) if gap < floor else fmt(gap, 2)
identity_note = lambda status: "" if status == "holds" else "the code departs from the derivation"
largest_invariance_gap = max(max(gaps) for gaps in invariance.values())
s1_gap = max(hessian_gap, kappa_gap)
s2_gap = max(probability_gap, largest_invariance_gap, orbit_min_gap)
s1_status = "holds" if s1_gap < ROUNDING and ordered == len(x_test) else "differs"
s2_status = "holds" if s2_gap < ROUNDING and argmin_gap < 1e-10 else "differs"
glue_value("ch08-s1-gap", gap_text(s1_gap))
glue_value("ch08-s1-ordered", ordered)
glue_value("ch08-s1-images", len(x_test))
glue_value("ch08-s2-gap", gap_text(s2_gap))
glue_value("ch08-s2-argmin", gap_text(argmin_gap, 1e-10))
ledger.add("S1", "$P(p)$ is the one-hot covariance and the softmax Jacobian; the classifier "
           "Hessian is $P(p) \\otimes hh^\\top$; $\\kappa_{\\rm exact} \\le B_{\\rm raw}$",
           "Hessian vs $P \\otimes hh^\\top$: " + str(rounding_level(hessian_gap))
           + f"; $\\kappa_{{\\rm exact}} \\le B_{{\\rm raw}}$ on {ordered} of {len(x_test)} images",
           details={"K = 3 entries, Hessian for general P (d = 2)": "exact (sympy)",
            "max |autograd - P kron hh^T| / max entry": rounding_level(hessian_gap),
            "kappa variance form vs dense trace": rounding_level(kappa_gap),
            "kappa_exact <= B_quot <= B_raw, test images": f"{ordered} of {len(x_test)}"},
           status=s1_status, note=identity_note(s1_status))
ledger.add("S2", "Common-row shifts keep $p$ and $\\kappa_{\\rm exact}$; $B_{\\rm raw}$ is "
           "unbounded along them; $W_c$ is the unique minimum-norm point; "
           "$B_{\\rm quot} = \\inf B_{\\rm raw}$; invariant gradients",
           "100-fold shift: largest change of $p$, $\\kappa_{\\rm exact}$, $B_{\\rm quot}$, "
           "gradients " + str(rounding_level(max(probability_gap, largest_invariance_gap))),
           details={"quadratic orbit norm, unique argmin -wbar": "exact (sympy)",
            "max prob. gap at the 100x shift": rounding_level(probability_gap),
            "kappa_exact, B_quot: change of value, grad.": rounding_level(largest_invariance_gap),
            "min_v B_raw / B_quot - 1 (BFGS)": rounding_level(orbit_min_gap)},
           status=s2_status,
           note="the factor 100 of $B_{\\rm raw}$ is set by the construction of the shift: "
                "an identity" if s2_status == "holds" else identity_note(s2_status))

# %% [markdown]
# ## Reference classes double the proxy on average
#
# A standard identification convention fixes one class $r$ as reference and sets its row
# to zero, $W^{(r)} = W_c - \mathbf{1} w_{c,r}^\top$. Same function, but since
# $\mathbf{1}^\top W_c = 0$,
#
# $$
# \frac{B_{\rm raw}(W^{(r)}, h)}{B_{\rm quot}(W_c, h)} = 1 + \frac{K \lVert w_{c,r}\rVert^2}{\lVert W_c\rVert_F^2},
# \qquad
# \frac1K \sum_{r=1}^K \frac{B_{\rm raw}(W^{(r)}, h)}{B_{\rm quot}(W_c, h)} = 2 .
# $$ (eq-ch08-reference)
#
# Both are identities: they hold for every classifier and every feature. The proof is the
# same for each feature column, so sympy works with one column $a_1, \dots, a_K$ with
# $\sum_k a_k = 0$ and a *symbolic* number of classes $K$. The symbols:

# %%
K = sp.Symbol("K", integer=True, positive=True)  # the number of classes, symbolic from here on
r, k = sp.symbols("r k", integer=True)
a = sp.IndexedBase("a")  # one column of W_c: a_1, ..., a_K, summing to zero
S = sp.Symbol("S", positive=True)  # S = sum_k a_k^2, this column's share of ||W_c||_F^2
factor_constants_out_of_sums = lambda e: e.replace(lambda x: isinstance(x, sp.Sum), sp.factor_terms)

# %% [markdown]
# Subtracting row $r$ from every row adds $K a_r^2$ to the column's squared norm:

# %%
expanded = factor_constants_out_of_sums(sp.Sum((a[k] - a[r]) ** 2, (k, 1, K)).expand().doit())
reference_norm = expanded.subs(sp.Sum(a[k], (k, 1, K)), 0)  # the column of W_c sums to zero
assert sp.simplify(reference_norm - (sp.Sum(a[k] ** 2, (k, 1, K)) + K * a[r] ** 2)) == 0
display(Math(r"\sum_k (a_k - a_r)^2 = " + sp.latex(reference_norm)))

# %% [markdown]
# and averaging the ratio $1 + K a_r^2 / S$ over $r$ gives exactly 2:

# %%
ratio_sum = factor_constants_out_of_sums(sp.Sum(1 + K * a[r] ** 2 / S, (r, 1, K)).expand().doit())
mean_reference_ratio = sp.simplify(ratio_sum.subs(sp.Sum(a[r] ** 2, (r, 1, K)), S) / K)
assert mean_reference_ratio == 2
display(Math(r"\frac1K\sum_r\Big(1 + \frac{K a_r^2}{S}\Big) = " + sp.latex(mean_reference_ratio)))

# %% [markdown]
# We apply the convention to each of the 10 classes of the linear model, evaluating
# $B_{\rm raw}(W^{(r)})$ and $B_{\rm quot}(W_c)$ as test-set means through the proxies
# themselves (`flatness.reference_class_ratios`) and comparing with the closed form
# (`flatness.reference_ratio`):

# %%
linear_ratios = flatness.reference_class_ratios(W_linear, x_test).numpy()
closed_form = np.array([float(flatness.reference_ratio(W_linear, c)) for c in range(10)])

# %% [markdown]
# The range of the ten ratios, the deviation of their mean from 2, and the gap to the closed form:

# %%
print(f"ratios over the 10 reference classes: {fmt(linear_ratios.min(), 4)}"
      f" to {fmt(linear_ratios.max(), 4)}")
print("mean - 2:", rounding_level(linear_ratios.mean() - 2))
print("proxies vs closed form:", rounding_level(np.abs(linear_ratios - closed_form).max()))

# %% [markdown]
# The mean is 2 to rounding, as {eq}`eq-ch08-reference` says it must be for any
# classifier. The *range* is the one empirical part: since
# $\text{ratio}_r - 1 = \lVert w_{c,r}\rVert^2 / \operatorname{mean}_s \lVert w_{c,s}\rVert^2$,
# it is the spread of the squared lengths of the centred class rows, which we measure
# below in the source's setting.
#
# ## What training stores
#
# Heavy-ball SGD never moves the mean row: the cross-entropy gradient in $W$ is
# $(p - e_y) h^\top$, whose rows sum to zero. The linear model above confirms it:

# %%
initial_mean_row = sm.mean_row(linear_init["weight"])
mean_row_drift = float((sm.mean_row(W_linear) - initial_mean_row).norm() / initial_mean_row.norm())
print("150 SGD steps, relative change of the mean row:", rounding_level(mean_row_drift))

# %% [markdown]
# So without weight decay the mean row is the one drawn at initialisation, while the
# centred part grows with training. Coupled weight decay $\lambda$ shrinks the mean row
# geometrically. Adam normalises each coordinate separately and breaks the zero row sum,
# so it can move the mean row either way. Because the factor
# $\lVert h\rVert^2(1 - \lVert p\rVert^2)$ is common to both proxies, the ratio
# $B_{\rm raw}/B_{\rm quot} = \lVert W\rVert_F^2/\lVert W_c\rVert_F^2 = 1/(1 - \text{share})$
# (`flatness.raw_quotient_ratio`) depends on $W$ alone, where the share
# $K\lVert\bar w\rVert^2/\lVert W\rVert_F^2$ is the part of $\lVert W\rVert_F^2$ that
# centring removes.
#
# ### At initialisation
#
# With i.i.d. entries of variance $\sigma^2$,
# $\mathbb{E}\lVert W_c\rVert_F^2 = \operatorname{Tr}(\Pi)\, d \sigma^2 = (K-1) d\sigma^2$
# against $\mathbb{E}\lVert W\rVert_F^2 = K d \sigma^2$:

# %%
trace_Pi = sp.Sum(1 - 1 / K, (k, 1, K)).doit()  # each diagonal entry of I - 11^T/K is 1 - 1/K
assert sp.simplify(trace_Pi - (K - 1)) == 0 and (sp.eye(4) - sp.ones(4, 4) / 4).trace() == 3
expected_ratio = sp.simplify(K / trace_Pi)
display(Math(r"\frac{\mathbb{E}\lVert W\rVert_F^2}{\mathbb{E}\lVert W_c\rVert_F^2} = "
             + sp.latex(expected_ratio) + r" = " + sp.latex(expected_ratio.subs(K, 10))))

# %% [markdown]
# That is a ratio of expectations; one draw scatters around it. For Gaussian entries the
# centring projector splits each column orthogonally, so $K\lVert\bar w\rVert^2/\sigma^2$
# and $\lVert W_c\rVert_F^2/\sigma^2$ are independent $\chi^2$ variables with $d$ and
# $(K-1)d$ degrees of freedom, and
#
# $$
# \frac{B_{\rm raw}}{B_{\rm quot}}\bigg|_{\rm init} = 1 + \frac{F}{K - 1},
# \qquad F \sim F\big(d, (K-1)d\big),
# $$ (eq-ch08-init-law)
#
# whose spread shrinks like $\sqrt{2/d}/(K-1)$ with the feature width $d$
# (`flatness.initial_ratio_quantiles`). The reported starting band, 1.103-1.118, comes from five
# ResNet-18 heads ($d = 512$, $K = 10$); our digits heads have $d = 64$. We compare the law
# with 200 seeded draws of PyTorch's default (uniform) initialisation at both widths:

# %%
levels = [0.05, 0.5, 0.95]
init_head = lambda d, seed: toy_classifiers.init_classifier([d, 10], seed=seed)["weight"]
init_ratio = lambda d, seed: float(flatness.raw_quotient_ratio(init_head(d, seed)))
draw_ratios = lambda d: np.array([init_ratio(d, seed) for seed in range(200)])

# %% [markdown]
# The draws and the law's quantiles at both widths:

# %%
init_draws = {d: draw_ratios(d) for d in (64, 512)}
init_law = {d: flatness.initial_ratio_quantiles(10, d, levels) for d in (64, 512)}

# %% [markdown]
# A helper prints three quantiles, and we count the draws inside the reported band
# 1.103-1.118:

# %%
quantile_text = lambda values: " / ".join(fmt(value, 4) for value in values)
in_band = {d: int(((draws >= 1.103) & (draws <= 1.118)).sum()) for d, draws in init_draws.items()}

# %% [markdown]
# Side by side:

# %%
for d, draws in init_draws.items():
    quantiles = np.quantile(draws, levels)
    print(f"d = {d:>3}: 5/50/95% law {quantile_text(init_law[d])},",
          f"draws {quantile_text(quantiles)};")
    print(f"         {in_band[d]} of 200 draws inside 1.103-1.118")

# %% [markdown]
# The law and the draws agree at both widths. At $d = 512$ the central 90% of starts,
# {glue:text}`ch08-law-512`, contains the reported band, and most single draws fall inside
# it: the reported start is what a ResNet-18 head's initialisation gives. At $d = 64$ the
# 90% band widens to {glue:text}`ch08-law-64`. The runs below start from two draws (the
# linear model's head and the MLP's; the initialisation scale does not change the ratio),
# at {glue:text}`ch08-our-starts`: above the reported band and in the upper half of the
# $d = 64$ law, unremarkable for heads eight times narrower than a ResNet-18's. A helper
# prints a range, and we check these statements:

# %%
span = lambda values, sig=4: f"{fmt(min(values), sig)}-{fmt(max(values), sig)}"
assert init_law[512][0] < 1.103 and init_law[512][2] > 1.118 and in_band[512] > 100

# %% tags=["remove-cell"]
glue_value("ch08-law-512", span(init_law[512][[0, 2]]))
glue_value("ch08-law-64", span(init_law[64][[0, 2]]))

# %% [markdown]
# ### Along training
#
# We train the linear model and an MLP 64-64-10 with ReLU (its $h$ is the 64 hidden units)
# for 150 full-batch steps. For the MLP the sweep is over the initialisation scale (a
# multiple of PyTorch's default) and the weight decay; the linear model gets two
# initialisation scales; both also train with Adam (learning rate 0.01):

# %%
SETTINGS = ([((64, 10), "sgd", 1.0, 0.0), ((64, 10), "sgd", 3.0, 0.0), ((64, 10), "adam", 1.0, 0.0)]
            + [((64, 64, 10), "sgd", scale, decay) for scale in (0.3, 1.0, 3.0)
               for decay in (0.0, 1e-2)]
            + [((64, 64, 10), "sgd", 1.0, 1e-3)]
            + [((64, 64, 10), "adam", 1.0, decay) for decay in (0.0, 1e-2)])
record_ratio = lambda step, params: (step, float(flatness.raw_quotient_ratio(params["weight"])))


# %% [markdown]
# One function trains a setting and records the ratio every 10 steps:

# %%
def run(sizes, optimizer, init_scale, weight_decay, seed=0, steps=150):
    params = toy_classifiers.init_classifier(sizes, seed=seed, init_scale=init_scale)
    learning_rate = 0.1 if optimizer == "sgd" else 0.01
    return toy_classifiers.train_classifier(params, x_train, y_train, steps=steps, lr=learning_rate,
                               weight_decay=weight_decay, optimizer=optimizer,
                               record_every=10, record=record_ratio)


# %% [markdown]
# Each run takes a fraction of a second; we keep the trained parameters and the history:

# %%
runs = {setting: run(*setting) for setting in SETTINGS}
for (sizes, optimizer, scale, decay), (params, history) in runs.items():
    kind = "linear" if len(sizes) == 2 else "MLP"
    print(f"{kind:>6} {optimizer:>4} init x{fmt(scale):<3} wd {fmt(decay):<5}"
          f" B_raw/B_quot {fmt(history[0][1], 4)} -> {fmt(history[-1][1], 4)}"
          f"  test acc {fmt(test_accuracy(params), 3)}")
sgd_histories = [history for (_, opt, _, _), (_, history) in runs.items() if opt == "sgd"]
assert all(history[-1][1] < history[0][1] for history in sgd_histories)

# %% [markdown]
# Every SGD run ends closer to 1 than it started, with or without weight decay: the
# centred part grows while the mean row stays (or shrinks); the larger the
# initialisation, the larger the frozen mean row and the further from 1 it ends. Adam
# without decay ends further from 1 than SGD, and the linear model's ratio even rises
# above its start; weight decay brings it back. {numref}`fig-ch08-decay` follows the ratio
# over training for the MLP at the default initialisation.
#
# The figure (code hidden in the rendered page):

# %% tags=["hide-input"]
decay_contract = orbit_contract.with_(
    centre="the classifier W of a 64-64-10 ReLU MLP along training (init x1, seed 0)",
    directions="n/a (a norm ratio, no perturbation)",
    normalisation="B_raw/B_quot = ||W||_F^2/||W_c||_F^2 (feature-independent)",
    radius="n/a", reduction="exact for every feature and any average",
    data="600 training digits; full-batch training", resolution="every 10 of 150 steps",
)
fig, ax = plt.subplots()
curves = (("sgd", 0.0, "-"), ("sgd", 1e-3, "--"), ("sgd", 1e-2, "-."), ("adam", 0.0, ":"),
          ("adam", 1e-2, (0, (5, 1, 1, 1))))
for optimizer, decay, style in curves:
    steps, ratios = np.array(runs[((64, 64, 10), optimizer, 1.0, decay)][1]).T
    ax.plot(steps, ratios, ls=style, label=f"{optimizer}, weight decay {fmt(decay)}")
ax.axhspan(1.103, 1.118, color="grey", alpha=0.2, label="reported start, ResNet-18 heads (d = 512)")
low, median, high = init_law[64]
ax.errorbar([0], [median], yerr=[[median - low], [high - median]], color="k", capsize=4,
            label="F law at init, d = 64 (5-95%)")
ax.set_xlabel("training step")
ax.set_ylabel("B_raw / B_quot")
ax.legend(fontsize=8)
glue_figure("ch08-decay", fig, decay_contract,
            "Raw/quotient ratio of the last layer over training: SGD brings it close to 1 "
            "with or without weight decay; Adam without decay ends further from 1. The bar "
            "at step 0 is the 90% band of the initialisation law for d = 64; the grey band "
            "is the reported start for d = 512")

# %% [markdown]
# ```{glue:figure} fig-ch08-decay
# :name: fig-ch08-decay
#
# {glue:text}`cap-ch08-decay`
# ```
#
# The checks behind the next paragraph, on each run's final ratio and every run's start:

# %%
final_ratio = lambda setting: runs[setting][1][-1][1]
starts = [history[0][1] for _, history in runs.values()]
adam_decay_gap = final_ratio(((64, 64, 10), "adam", 1.0, 1e-2)) - 1
assert abs(adam_decay_gap) < 1e-3 < final_ratio(((64, 64, 10), "adam", 1.0, 0.0)) - 1
assert min(starts) > max(1.118, init_law[64][1])  # above the reported band, upper half of the law

# %% tags=["remove-cell"]
glue_value("ch08-our-starts", span(starts))
glue_value("ch08-sgd-plain", final_ratio(((64, 64, 10), "sgd", 1.0, 0.0)), 4)
glue_value("ch08-sgd-decay", final_ratio(((64, 64, 10), "sgd", 1.0, 1e-2)), 4)
glue_value("ch08-adam-plain", final_ratio(((64, 64, 10), "adam", 1.0, 0.0)), 4)
glue_value("ch08-adam-linear", final_ratio(((64, 10), "adam", 1.0, 0.0)), 4)
glue_value("ch08-adam-decay", final_ratio(((64, 64, 10), "adam", 1.0, 1e-2)), 4)

# %% [markdown]
# With plain SGD the MLP's ratio falls to {glue:text}`ch08-sgd-plain` after 150 steps, and
# to {glue:text}`ch08-sgd-decay` with weight decay $10^{-2}$: weight decay is not what
# brings an SGD-trained head near 1 here, training is. Under Adam without decay the ratio
# ends at {glue:text}`ch08-adam-plain` for the MLP and at {glue:text}`ch08-adam-linear`
# for the linear model; with weight decay $10^{-2}$ the MLP's ends at
# {glue:text}`ch08-adam-decay`. Under Adam, weight decay is what brings the ratio to 1.
#
# ### Frozen-feature probes, like with like
#
# The reported share of 1.93-2.36% comes from ten linear probes on frozen CIFAR-10
# features. The comparable experiment here is ten probes (seeds 0-9) on frozen learned
# features: the hidden layer of the MLP trained above with SGD, held fixed. The source
# does not state the probes' optimiser, so we train them with both:

# %%
frozen = toy_classifiers.classifier_features(
    runs[((64, 64, 10), "sgd", 1.0, 0.0)][0], x_train
)  # held fixed


def probe_share(seed, optimizer):
    learning_rate = 0.1 if optimizer == "sgd" else 0.01
    probe, _ = toy_classifiers.train_classifier(
        toy_classifiers.init_classifier([64, 10], seed=seed),
        frozen,
        y_train,
        steps=150,
        lr=learning_rate,
        optimizer=optimizer,
    )
    return 100 * float(sm.mean_row_share(probe["weight"]))


# %% [markdown]
# Ten probes per optimiser:

# %%
probe_shares = {optimizer: [probe_share(seed, optimizer) for seed in range(10)]
                for optimizer in ("sgd", "adam")}
for optimizer, shares in probe_shares.items():
    print(f"ten {optimizer} probes on frozen MLP features: stored share {span(shares, 3)}%")
assert max(probe_shares["sgd"]) < 1.93 and min(probe_shares["adam"]) > 2.36  # the reported range

# %% [markdown]
# Every SGD probe stores a share below the reported range and every Adam probe one above
# it. A stored share is a record of how the classifier was trained
# (initialisation width and scale, optimiser, weight decay, training length), not a
# property of the predictor: the same predictor can be stored with any share.
#
# S4 has two halves and a starting level. The weight-decay half holds if, under SGD and Adam
# alike, the MLP's final ratio with weight decay $10^{-2}$ is closer to 1 than without (here
# {glue:text}`ch08-sgd-plain` against {glue:text}`ch08-sgd-decay` under SGD, and
# {glue:text}`ch08-adam-plain` against {glue:text}`ch08-adam-decay` under Adam). The reported
# start, 1.103-1.118, is accounted for if it lies inside the 5-95% band of the initialisation
# law at $d = 512$ ({glue:text}`ch08-law-512`). The share is a level: it is met if the ten
# probes of one optimiser all store a share inside the reported 1.93-2.36% (here
# {glue:text}`ch08-s4-sgd-shares`% with SGD and {glue:text}`ch08-s4-adam-shares`% with Adam).
# S4 holds at our scale if all three are met, differs if the weight-decay half holds and a
# level is missed, and is not reproduced if weight decay does not bring the ratio closer to 1.
# Its status here: {glue:text}`ch08-s4-status`.

# %% tags=["remove-cell"]
extremes = lambda values: [min(values), max(values)]
mlp_setting = lambda optimizer, decay: ((64, 64, 10), optimizer, 1.0, decay)
distance_from_one = lambda optimizer, decay: abs(final_ratio(mlp_setting(optimizer, decay)) - 1)
s4_decay = all(distance_from_one(o, 1e-2) < distance_from_one(o, 0.0) for o in ("sgd", "adam"))
s4_start = init_law[512][0] <= 1.103 and 1.118 <= init_law[512][2]
s4_share = any(all(1.93 <= share <= 2.36 for share in shares) for shares in probe_shares.values())
s4_status = ("holds at our scale" if s4_decay and s4_start and s4_share
             else "differs" if s4_decay else "not reproduced")
glue_value("ch08-s4-sgd-shares", span(probe_shares["sgd"], 3))
glue_value("ch08-s4-adam-shares", span(probe_shares["adam"], 3))
glue_value("ch08-s4-status", s4_status)
ledger.add("S4", "In trained classifiers as stored the mean-row share is small, and weight decay "
           "drives $B_{\\rm raw}/B_{\\rm quot}$ toward 1",
           f"stored share {span(probe_shares['sgd'], 3)}% (SGD probes), "
           f"{span(probe_shares['adam'], 3)}% (Adam probes)",
           details={"B_raw/B_quot at init, F law 5-95%, d = 512": list(init_law[512][[0, 2]]),
            "seeded d = 512 inits inside 1.103-1.118": f"{in_band[512]} of 200",
            "at init, F law 5-95%, d = 64": list(init_law[64][[0, 2]]),
            "MLP after 150 SGD steps, wd 0 / 1e-2": [final_ratio(((64, 64, 10), "sgd", 1.0, d))
                                                     for d in (0.0, 1e-2)],
            "after 150 Adam steps, wd 0, MLP / linear": [final_ratio((sizes, "adam", 1.0, 0.0))
                                                         for sizes in ((64, 64, 10), (64, 10))],
            "MLP after 150 Adam steps, wd 0 / 1e-2": [final_ratio(((64, 64, 10), "adam", 1.0, d))
                                                      for d in (0.0, 1e-2)],
            "share, 10 SGD probes, frozen features (%)": extremes(probe_shares["sgd"]),
            "share, 10 Adam probes (%)": extremes(probe_shares["adam"])},
           reported="1.93-2.36% share (10 frozen-feature probes); ratio starts at 1.103-1.118 "
                    "(5 ResNet-18s)",
           status=s4_status, sig=4,
           note=f"share: SGD probes store {span(probe_shares['sgd'], 3)}%, Adam probes "
                f"{span(probe_shares['adam'], 3)}%, both outside the reported range; weight decay "
                f"holds: Adam's MLP ratio {fmt(final_ratio(mlp_setting('adam', 0.0)), 4)} → "
                f"{fmt(final_ratio(mlp_setting('adam', 1e-2)), 4)} with wd 1e-2, SGD's "
                f"{fmt(final_ratio(mlp_setting('sgd', 0.0)), 4)} → "
                f"{fmt(final_ratio(mlp_setting('sgd', 1e-2)), 4)} "
                "(training alone nearly suffices); start band matches the d = 512 law")

# %% [markdown]
# ## Reference-class ratios in the source's setting
#
# The reported range 1.939-2.045 comes from five end-to-end checkpoints of one recipe, each
# centred and then given all ten reference classes. The comparable experiment is five seeds
# of one end-to-end recipe here: the MLP 64-64-10 trained with SGD for 150 steps, with and
# without weight decay $10^{-2}$ (the source's recipe uses weight decay; we show both):

# %%
checkpoints = {(seed, decay): run((64, 64, 10), "sgd", 1.0, decay, seed=seed)[0]
               for decay in (0.0, 1e-2) for seed in range(5)}
features_of = lambda q: toy_classifiers.classifier_features(q, x_test)
ratios_of = lambda q: flatness.reference_class_ratios(q["weight"], features_of(q)).numpy()
reference = {key: ratios_of(params) for key, params in checkpoints.items()}
pooled = {decay: np.concatenate([ratios for (_, d), ratios in reference.items() if d == decay])
          for decay in (0.0, 1e-2)}

# %% [markdown]
# The identity's check and the two ranges:

# %%
largest_mean_gap = max(abs(ratios.mean() - 2) for ratios in reference.values())
for decay, ratios in pooled.items():
    print(f"weight decay {fmt(decay)}: {len(ratios)} ratios from 5 seeds, {span(ratios, 3)};"
          f" sd {fmt(ratios.std(), 2)}")
print("largest |within-checkpoint mean - 2| (identity):", rounding_level(largest_mean_gap))
assert all(ratios.min() < 1.939 and ratios.max() > 2.045 for ratios in pooled.values())

# %% [markdown]
# The within-checkpoint means are 2 to rounding, as the identity requires. The ratios
# themselves spread more widely than reported, with or without weight decay
# ({numref}`fig-ch08-reference`). Within one checkpoint their standard deviation is exactly
# the coefficient of variation (CV) of the squared lengths of the centred class rows: the
# rows of these small digits models differ in length more than the reported range allows,
# which needs rows of nearly equal length. Would longer training make the rows more equal?
# We continue the five weight-decay checkpoints for 450 more steps, four times the training
# length in all (the momentum restarts), and measure the CV before and after:

# %%
longer = {
    seed: toy_classifiers.train_classifier(
        checkpoints[seed, 1e-2], x_train, y_train, steps=450, lr=0.1, weight_decay=1e-2
    )[0]
    for seed in range(5)
}
squared_rows = lambda q: (sm.centre(q["weight"]) ** 2).sum(1)
row_cv = lambda q: float(squared_rows(q).std(correction=0) / squared_rows(q).mean())
row_cvs = {
    steps: [row_cv(q) for q in models.values()]
    for steps, models in ((150, {s: checkpoints[s, 1e-2] for s in range(5)}), (600, longer))
}

# %% [markdown]
# The CV against the ratios' spread, and the ranges after 150 and 600 steps:

# %%
sd_is_cv = max(abs(reference[seed, 1e-2].std() - row_cvs[150][seed]) for seed in range(5))
longer_ratios = np.concatenate([ratios_of(q) for q in longer.values()])
print("within-checkpoint sd of the ratios vs CV of the squared rows:", rounding_level(sd_is_cv))
for steps, ratios in ((150, pooled[1e-2]), (600, longer_ratios)):
    print(
        f"{steps} steps, wd 1e-2: CV of squared row lengths {span(row_cvs[steps], 3)};"
        f" ratios {span(ratios, 3)}"
    )
assert np.mean(row_cvs[600]) > np.mean(row_cvs[150]) and np.ptp(longer_ratios) > 2 * (2.045 - 1.939)
reported_cv_bound = (
    2.045 - 1.939
) / 2  # the sd of values inside an interval is at most half its width
assert min(row_cvs[150] + row_cvs[600]) > reported_cv_bound

# %% tags=["remove-cell"]
glue_value("ch08-reported-cv", reported_cv_bound, 2)

# %% [markdown]
# Four times longer training leaves the rows no more equal: the CV rises slightly, and the
# ratios still spread over more than twice the reported range. The reported range implies
# a CV of at most {glue:text}`ch08-reported-cv` in each of the source's checkpoints (the
# standard deviation of values inside an interval is at most half its width); every one of
# ours lies above that, after 150 steps and after 600. Longer training does not close the
# gap at our scale, and what makes the source's rows more nearly equal cannot be checked
# without its checkpoints.
#
# The figure (code hidden in the rendered page):

# %% tags=["hide-input"]
reference_contract = decay_contract.with_(
    centre="5 seeds x 2 weight decays of the MLP 64-64-10 after 150 SGD steps, centred (W_c)",
    directions="reference-class shifts W_c - 1 w_c,r^T, r = 0..9",
    normalisation="B_raw(W^(r)) / B_quot(W_c)",
    reduction="mean over examples (numerator and denominator)",
    data=f"{len(x_test)} held-out digits images", resolution="10 reference classes per checkpoint",
)
fig, ax = plt.subplots()
for i, ((seed, decay), ratios) in enumerate(reference.items()):
    ax.plot(np.full(len(ratios), i), ratios, "o", ms=3, color="C0" if decay == 0 else "C1")
    ax.plot([i - 0.3, i + 0.3], [ratios.mean()] * 2, color="k", lw=1.2)
ax.axhspan(1.939, 2.045, color="grey", alpha=0.2, label="reported range (5 ResNet-18 checkpoints)")
ax.set_xlabel("checkpoint: seeds 0-4 (blue: no weight decay, orange: weight decay 1e-2)")
ax.set_ylabel("B_raw(W^(r)) / B_quot(W_c)")
ax.legend(fontsize=8)
glue_figure("ch08-reference", fig, reference_contract,
            "Raw/quotient ratio for every reference class of ten checkpoints; black bars are the "
            "within-checkpoint means, exactly 2 (an identity)")

# %% [markdown]
# ```{glue:figure} fig-ch08-reference
# :name: fig-ch08-reference
#
# {glue:text}`cap-ch08-reference`
# ```
#
# S3 has two parts. Its identity holds if every checkpoint's mean ratio is 2 and the
# ratios' standard deviation equals the CV of the squared rows, to rounding (below
# $10^{-12}$; the larger gap lies {glue:text}`ch08-s3-identity-gap`). Its range is a level the
# source states: it is met if the 50 ratios of the weight-decay recipe lie inside
# 1.939-2.045 (here {glue:text}`ch08-s3-range`), and accounted for if four times longer
# training brings every checkpoint's CV to the reported bound {glue:text}`ch08-reported-cv` or
# below (here {glue:text}`ch08-s3-cv-600`). S3 holds at our scale if the identity holds and
# the range is met or accounted for, and differs if the identity holds and the range is
# neither. Its status here: {glue:text}`ch08-s3-status`.

# %% tags=["remove-cell"]
s3_identity_gap = max(largest_mean_gap, sd_is_cv)
s3_range_met = 1.939 <= pooled[1e-2].min() and pooled[1e-2].max() <= 2.045
s3_accounted = max(row_cvs[600]) <= reported_cv_bound
s3_status = ("holds at our scale" if s3_identity_gap < ROUNDING and (s3_range_met or s3_accounted)
             else "differs")
glue_value("ch08-s3-identity-gap", gap_text(s3_identity_gap))
glue_value("ch08-s3-range", span(pooled[1e-2], 3))
glue_value("ch08-s3-cv-600", span(row_cvs[600], 3))
glue_value("ch08-s3-status", s3_status)
ledger.add("S3", "Identity: $B_{\\rm raw}(W^{(r)})/B_{\\rm quot}(W_c) = 1 + K\\lVert w_{c,r}\\rVert^2"
           "/\\lVert W_c\\rVert_F^2$, its mean over $r$ exactly 2; and the range of the ratios "
           "on trained models",
           f"ratios {span(pooled[1e-2], 3)} (weight decay), {span(pooled[0.0], 3)} (none); "
           "mean over $r$: 2 (identity)",
           details={"mean over r = 2": "identity (sympy, general K)",
            "largest |mean - 2|, 10 checkpoints": rounding_level(largest_mean_gap),
            "range, 5 seeds, SGD": extremes(pooled[0.0]),
            "range, 5 seeds, SGD + wd 1e-2": extremes(pooled[1e-2]),
            "sd of the ratios vs CV of squared rows (identity)": rounding_level(sd_is_cv),
            "CV of squared rows, wd 1e-2, 150 / 600 steps": [extremes(row_cvs[150]),
                                                              extremes(row_cvs[600])],
            "range, 5 seeds, SGD + wd 1e-2, 600 steps": extremes(longer_ratios)},
           reported="ratios 1.939-2.045 (50 ratios, 5 end-to-end ResNet-18 checkpoints)",
           status=s3_status, sig=3,
           note="the identity holds exactly; the range, measured as the source does (5 seeds of "
                "one recipe), is wider: our class rows differ more in length (the ratios' sd is "
                "the CV of squared row lengths), and four times longer training does not "
                "equalise them")

# %% [markdown]
# ## How loose is the quotient bound?
#
# Quotienting repairs the gauge, not the looseness of the trace inequality. Write
# $D_{ij} = \lVert w_i - w_j\rVert^2$ for the squared distance between two class rows.
# Two identities, each a sum over feature columns, rewrite both sides of the bound in these
# distances: $\sum_{ij} p_i p_j D_{ij} = 2\operatorname{Var}_p(w_C)$ (which is
# $\kappa_{\rm exact}/\lVert h\rVert^2$), and $\sum_{ij} D_{ij} = 2K\lVert W_c\rVert_F^2$.
# Sympy checks both on one column of a 3-class classifier at a general point of the
# simplex:

# %%
column = sp.Matrix(sp.symbols("c0:3", real=True))  # one feature column of W
distance = lambda i, j: (column[i] - column[j]) ** 2
pairs = [(i, j) for i in range(K_small) for j in range(K_small)]
second_moment = sum(p_simplex[i] * column[i] ** 2 for i in range(K_small))
variance_p = second_moment - (p_simplex.T * column)[0] ** 2
centred_column = column - ones * sum(column) / K_small

# %% [markdown]
# and check the two identities:

# %%
weighted_distances = sum(p_simplex[i] * p_simplex[j] * distance(i, j) for i, j in pairs)
assert sp.expand(2 * variance_p - weighted_distances) == 0
assert sp.expand(2 * K_small * norm_sq(centred_column) - sum(distance(i, j) for i, j in pairs)) == 0

# %% [markdown]
# Since $1 - \lVert p\rVert^2 = \sum_{i \ne j} p_i p_j$, dividing the two gives, for one
# example,
#
# $$
# \begin{aligned}
# \frac{B_{\rm quot}}{\kappa_{\rm exact}}
# &= \frac{\lVert W_c\rVert_F^2\,(1 - \lVert p\rVert^2)}{\operatorname{Var}_p(w_C)}
# = (K - 1)\,\frac{\overline{D}}{\overline{D}_p},\\
# \overline{D} &= \frac{\sum_{i\ne j} D_{ij}}{K(K-1)},\qquad
# \overline{D}_p = \frac{\sum_{i\ne j} p_i p_j D_{ij}}{\sum_{i\ne j} p_i p_j} .
# \end{aligned}
# $$ (eq-ch08-looseness)
#
# At uniform $p$ the two averages coincide and the ratio is exactly $K - 1$. Sympy derives
# this for a symbolic number of classes, on one feature column $a_1, \dots, a_K$ (both
# proxies are sums over columns of the same per-column terms, so one column suffices):
# the centred squared norm, the variance of $a_C$ under $C$ uniform, and
# $1 - \lVert p\rVert^2$ at $p_k = 1/K$:

# %%
uniform, inner = 1 / K, sp.Symbol("j", integer=True)
column_sum = sp.Sum(a[k], (k, 1, K))
centred_square = factor_constants_out_of_sums(
    sp.Sum((a[k] - sp.Sum(a[inner], (inner, 1, K)) / K) ** 2, (k, 1, K)).expand().doit()
).subs(sp.Sum(a[inner], (inner, 1, K)), column_sum)
variance_uniform = factor_constants_out_of_sums(
    (sp.Sum(uniform * a[k] ** 2, (k, 1, K)) - sp.Sum(uniform * a[k], (k, 1, K)) ** 2).doit())
hesitation_uniform = 1 - sp.Sum(uniform**2, (k, 1, K)).doit()

# %% [markdown]
# Their ratio simplifies to $K - 1$ exactly:

# %%
looseness_uniform = sp.simplify(centred_square * hesitation_uniform / variance_uniform)
assert looseness_uniform == K - 1
display(Math(r"\frac{B_{\rm quot}}{\kappa_{\rm exact}}\Big|_{p = \mathbf{1}/K} = "
             + sp.latex(looseness_uniform)))

# %% [markdown]
# Numerically, features orthogonal to every centred row give equal logits, hence exactly
# uniform $p$; on a random head with 97 classes the package's ratio is 96 to rounding:

# %%
W_random97 = torch.randn(97, 128, generator=torch.Generator().manual_seed(2))
null_rows = torch.linalg.svd(sm.centre(W_random97)).Vh[96:]  # W_c h = 0 for h in their span
h_uniform = torch.randn(5, 32, generator=torch.Generator().manual_seed(3)) @ null_rows
uniform_gap = float(flatness.quotient_looseness(W_random97, h_uniform) / 96 - 1)
print("K = 97, uniform p: B_quot / kappa_exact / 96 - 1:", rounding_level(uniform_gap, 1e-12))

# %% [markdown]
# Away from uniform the ratio is $K - 1$ times the factor $\overline{D}/\overline{D}_p$
# (`flatness.pair_distance_ratio`), which exceeds 1 when an example hesitates between classes
# whose rows are closer than an average pair. We check {eq}`eq-ch08-looseness` on the 400
# test images of the linear model, computing the right-hand side from the pairwise
# distances alone:

# %%
looseness_per_image = per_image[1] / per_image[0]
pair_form = (W_linear.shape[0] - 1) * flatness.pair_distance_ratio(W_linear, x_test)
pair_form_gap = (pair_form / looseness_per_image - 1).abs().max()
print("B_quot / kappa_exact vs 9 x pair-distance ratio:", rounding_level(pair_form_gap))
print(f"median over the test images: {fmt(float(looseness_per_image.median()), 4)} (K - 1 = 9)")

# %% [markdown]
# The looseness is therefore set by the number of classes first. We measure it as the
# ratio of training-set means on every digits checkpoint of the sweep, and on MLPs trained
# the same way on 3- and 5-class subsets of the digits:

# %%
looseness_of = lambda q, x: flatness.quotient_looseness(
    q["weight"], toy_classifiers.classifier_features(q, x)
)
train_looseness = lambda q, x: float(looseness_of(q, x))
digits_looseness = [train_looseness(params, x_train) for params, _ in runs.values()]
subsets = {
    len(classes): data.digits(n_train=300, n_test=50, seed=0, classes=classes)
    for classes in ((0, 1, 2), (0, 1, 2, 3, 4))
}

# %% [markdown]
# The subset models train as the 10-class MLP did:

# %%
train_subset = lambda n: toy_classifiers.train_classifier(
    toy_classifiers.init_classifier([64, 64, n], seed=0),
    subsets[n].x_train,
    subsets[n].y_train,
    steps=150,
    lr=0.1,
)[0]
subset_models = {n: train_subset(n) for n in subsets}
subset_looseness = {n: train_looseness(subset_models[n], subsets[n].x_train) for n in subsets}
print(f"K = 10, {len(digits_looseness)} checkpoints: {span(digits_looseness, 3)}  (K - 1 = 9)")
for n, value in subset_looseness.items():
    print(f"K = {n:>2}, one MLP: {fmt(value, 3)}  (K - 1 = {n - 1})")

# %% [markdown]
# The row-distance factor, the looseness divided by $K - 1$, over these models:

# %%
digits_factors = [value / 9 for value in digits_looseness] + [
    value / (n - 1) for n, value in subset_looseness.items()]
assert min(digits_factors) > 0.95 and max(digits_factors) < 1.5

# %% tags=["remove-cell"]
glue_value("ch08-digits-factor", span(digits_factors, 3))

# %% [markdown]
# The looseness tracks $K - 1$: on these models the row-distance factor lies in
# {glue:text}`ch08-digits-factor`. The reported looseness, 102.95-108.44, was measured on
# modular-arithmetic transformer checkpoints whose modulus the source does not state. To
# test whether $K - 1$ explains it, we build heads with about a hundred classes: the two
# families of `lossgeom_book.tasks` at modulus 97 ($K = 97$, $K - 1 = 96$), an MLP (one hidden
# layer of 128) on $a - b$ and a one-layer transformer on $a + b$. Each trains with
# full-batch AdamW (learning rate $10^{-2}$, weight decay 1, the grokking recipe;
# `lossgeom.training`) on 20% of the pairs, two seeds each, and records
# $B_{\rm quot}/\kappa_{\rm exact}$ and the training accuracy on the training pairs every
# 25 steps. The source does not state its training length; `MODULAR_STEPS` sets ours, per
# family, long enough for each to fit its training pairs (the transformer fits about three
# times more slowly):

# %%
MODULAR_STEPS = {"MLP, a - b": 100, "transformer, a + b": 300}  # raise for longer runs


def looseness_run(model, pairs, steps, every=25):
    loss = training.indexed_loss(model, nn.CrossEntropyLoss(), (pairs.x_train, pairs.y_train))

    def monitor(q):  # (B_quot / kappa_exact, training accuracy) from the same features
        h, W = tasks.features(model, q, pairs.x_train), q[tasks.CLASSIFIER]
        fitted = float(((h @ W.T).argmax(-1) == pairs.y_train).double().mean())
        return float(flatness.quotient_looseness(W, h)), fitted

    adamw = training.adam(1e-2, weight_decay=1.0)  # decoupled weight decay: AdamW
    return training.train(loss, dict(model.named_parameters()), adamw, steps,
                            monitor=monitor, monitor_every=every)


# %% [markdown]
# The tasks and the two model families:

# %%
mod97 = {operation: tasks.modular_arithmetic(97, operation, train_fraction=0.2, seed=0)
         for operation in ("add", "subtract")}
mlp_97 = lambda seed: tasks.MLPClassifier(None, (128,), 97, modulus=97, seed=seed)
transformer_97 = lambda seed: tasks.ModularTransformer(97, d_model=32, n_heads=4, d_mlp=64,
                                                       seed=seed)
families = {"MLP, a - b": (mlp_97, "subtract"), "transformer, a + b": (transformer_97, "add")}

# %% [markdown]
# The four runs train in turn; each keeps its history and its accuracy on the held-out
# pairs at the end:

# %%
modular = {}
for name, (make_model, operation) in families.items():
    for seed in (0, 1):
        model, pairs = make_model(seed), mod97[operation]
        fit = looseness_run(model, pairs, MODULAR_STEPS[name])
        held_out = tasks.accuracy(model, (pairs.x_test, pairs.y_test), params=fit.params)
        modular[name, seed] = (fit.monitored, held_out)

# %% [markdown]
# Each run's looseness at initialisation, at its peak and at the end, each with the
# training accuracy of that checkpoint:

# %%
for (name, seed), (history, held_out) in modular.items():
    peak_step, (peak, peak_fit) = max(history[1:], key=lambda record: record[1][0])
    last_step, (last, last_fit) = history[-1]
    print(
        f"{name:<18} seed {seed}: init {fmt(history[0][1][0], 3)}; peak {fmt(peak, 3)} at step "
        f"{peak_step} (train acc {fmt(peak_fit, 2)}); step {last_step}: {fmt(last, 3)} (train acc "
        f"{fmt(last_fit, 2)}, held-out acc {fmt(held_out, 2)})"
    )

# %% [markdown]
# We split each history at a training accuracy of 0.95 ("fitted" below; a threshold we
# choose, printed with every value) and check the statements made below about the
# ranges:

# %%
FITTED = 0.95
looseness_where = lambda prefix, keep: [value for (name, _), (history, _) in modular.items()
                                        if name.startswith(prefix)
                                        for _, (value, fit) in history[1:] if keep(fit)]
fitted_values = {prefix: looseness_where(prefix, lambda fit: fit >= FITTED)
                 for prefix in ("MLP", "transformer")}
transformer_before_fit = looseness_where("transformer", lambda fit: fit < FITTED)
init_looseness = [history[0][1][0] for history, _ in modular.values()]
final_fit = {key: history[-1][1][1] for key, (history, _) in modular.items()}

# %%
in_band = [
    fit
    for (name, _), (history, _) in modular.items()
    for _, (value, fit) in history
    if 102.95 <= value <= 108.44
]
assert in_band and max(in_band) < FITTED  # only unfitted checkpoints fall inside the band
assert (
    max(abs(value / 96 - 1) for value in init_looseness) < 0.01
    and min(final_fit.values()) >= FITTED
)
assert max(fitted_values["MLP"]) < 102.95 and min(fitted_values["transformer"]) > 108.44
for (name, _), (history, _) in modular.items():  # transformers peak before they fit, then fall
    peak_step, (peak, peak_fit) = max(history[1:], key=lambda record: record[1][0])
    assert name.startswith("MLP") or (peak_fit < FITTED and history[-1][1][0] < peak - 1)

# %% tags=["remove-cell"]
glue_value("ch08-init-looseness", span(init_looseness, 3))
glue_value("ch08-mlp-fitted", span(fitted_values["MLP"], 3))
glue_value("ch08-transformer-early", span(transformer_before_fit, 3))
glue_value("ch08-transformer-fitted", span(fitted_values["transformer"], 3))
glue_value(
    "ch08-transformer-final-fit",
    span([final_fit[key] for key in modular if key[0].startswith("transformer")], 2),
)
glue_value("ch08-held-out", span([held_out for _, held_out in modular.values()], 2))
glue_value("ch08-in-band-fit", max(in_band), 2)

# %% [markdown]
# At initialisation every head sits at {glue:text}`ch08-init-looseness`, within 1% of
# $K - 1 = 96$: the logits are small and $p$ is nearly uniform. The fitted MLP heads stay
# at {glue:text}`ch08-mlp-fitted`, a row-distance factor of about 1, below the reported
# band. The transformer's looseness climbs well above $K - 1$ before it fits: its
# checkpoints with training accuracy below 0.95 span {glue:text}`ch08-transformer-early`,
# and the only checkpoints inside the reported band are early ones on the way up
# (training accuracy at most {glue:text}`ch08-in-band-fit`). It peaks before it fits and
# falls back as it does, to {glue:text}`ch08-transformer-fitted` at the fitted checkpoints
# (training accuracy {glue:text}`ch08-transformer-final-fit` at the end), above the
# reported band: by {eq}`eq-ch08-looseness` its examples hesitate, on average,
# between classes whose rows are closer than an average pair
# ({numref}`fig-ch08-looseness`). None of these heads generalises in this budget
# (held-out accuracy {glue:text}`ch08-held-out`), whereas the source's checkpoints are
# trained models of a grokking study. At $K = 97$ the reported 102.95-108.44 therefore
# lies between the two families, in neither: a hundredfold looseness is what $K - 1$
# predicts for heads with about a hundred classes, and where in the band a head lands
# depends on its architecture and training through the row-distance factor.
#
# The figure (code hidden in the rendered page):

# %% tags=["hide-input"]
modular_pairs = len(mod97["add"].x_train)
looseness_contract = MeasurementContract(
    centre="checkpoints of modular-arithmetic heads, K = 97, every 25 AdamW steps (lr 1e-2, "
           f"weight decay 1): {', '.join(f'{n}: {s} steps' for n, s in MODULAR_STEPS.items())}",
    directions="n/a (a ratio of two curvature proxies)",
    normalisation="B_quot / kappa_exact, both means",
    radius="n/a", loss="softmax cross-entropy (the proxies bound its last-layer contraction)",
    reduction="ratio of the means over the training pairs",
    data=f"(a + b) and (a - b) mod 97, {modular_pairs} training pairs (20%), split seed 0",
    model_mode="n/a (no layers with state)",
    resolution="; ".join(f"{name}: {len(history)} checkpoints" for (name, seed), (history, _)
                         in modular.items() if seed == 0) + "; 2 seeds per family",
    precision="float64",
)
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9.0, 3.6), sharey=True)
for (name, seed), (history, _) in modular.items():
    steps = [step for step, _ in history]
    values, fits = np.array([record for _, record in history]).T
    style = dict(ls="-" if name.startswith("MLP") else "--", marker="o" if name.startswith("MLP")
                 else "s", ms=3, color=f"C{seed + 2 * name.startswith('transformer')}",
                 label=f"{name}, seed {seed}")
    ax0.plot(steps, values, **style)
    ax1.plot(fits, values, **style)
for ax in (ax0, ax1):
    ax.axhline(96, color="k", lw=0.8, label="K - 1 = 96 (exact at uniform p)")
    ax.axhspan(102.95, 108.44, color="grey", alpha=0.2, label="reported (modulus not stated)")
ax1.axvline(FITTED, color="grey", ls=":", lw=0.8)
ax0.set_xlabel("AdamW step")
ax1.set_xlabel("training accuracy at the checkpoint")
ax0.set_ylabel("B_quot / kappa_exact")
ax0.legend(fontsize=7)
glue_figure("ch08-looseness", fig, looseness_contract,
            "Looseness of the quotient bound for heads with 97 classes, against the training "
            "step (left) and the training accuracy (right): K - 1 at initialisation; fitted "
            "MLP heads stay near K - 1, transformer heads peak before they fit and settle "
            "above the reported band (dotted line: the 0.95 accuracy threshold)")

# %% [markdown]
# ```{glue:figure} fig-ch08-looseness
# :name: fig-ch08-looseness
#
# {glue:text}`cap-ch08-looseness`
# ```
#
# In the ledger, S14's reported band is compared at $K = 97$, the modulus we assume. S14
# holds at our scale if the fitted checkpoints of one family lie inside the reported
# 102.95-108.44; it differs if they are of the reported order but outside the band (every
# fitted value between half its lower end and twice its upper end), and is not reproduced if
# a fitted head is tighter or looser than that. The fitted checkpoints span
# {glue:text}`ch08-mlp-fitted` (MLP) and {glue:text}`ch08-transformer-fitted` (transformer);
# S14's status here: {glue:text}`ch08-s14-status`.

# %% tags=["remove-cell"]
all_fitted = fitted_values["MLP"] + fitted_values["transformer"]
s14_in_band = any(102.95 <= min(v) and max(v) <= 108.44 for v in fitted_values.values())
s14_same_order = 102.95 / 2 <= min(all_fitted) and max(all_fitted) <= 2 * 108.44
s14_status = ("holds at our scale" if s14_in_band
              else "differs" if s14_same_order else "not reproduced")
glue_value("ch08-s14-status", s14_status)
ledger.add("S14", "$B_{\\rm quot}$ is far from tight: its ratio to $\\kappa_{\\rm exact}$ on trained "
           "checkpoints",
           f"$K = 97$, fitted heads: MLP {span(fitted_values['MLP'], 3)}, transformer "
           f"{span(fitted_values['transformer'], 3)}; $K - 1 = 96$",
           details={"at uniform p, general K": "exactly K - 1 (sympy; an identity)",
            "K = 97, uniform p: ratio / 96 - 1": rounding_level(uniform_gap, 1e-12),
            "K = 97 heads at init (2 families x 2 seeds)": extremes(init_looseness),
            "K = 97 MLP (a - b), train acc >= 0.95": extremes(fitted_values["MLP"]),
            "K = 97 transformer (a + b), train acc < 0.95": extremes(transformer_before_fit),
            "K = 97 transformer, train acc >= 0.95": extremes(fitted_values["transformer"]),
            "train acc at the end, MLP / transformer":
                [extremes([final_fit[key] for key in modular if key[0].startswith(prefix)])
                 for prefix in ("MLP", "transformer")],
            "held-out acc at the end, all four runs": extremes([h for _, h in modular.values()]),
            "K = 10 digits checkpoints": extremes(digits_looseness),
            "K = 3, K = 5 digits MLPs": [subset_looseness[3], subset_looseness[5]]},
           reported="about 100x (102.95-108.44 on modular checkpoints; modulus not stated)",
           status=s14_status, sig=3,
           note="assuming $K = 97$ (modulus not stated): $K - 1 = 96$ sets the scale, but no "
                "fitted head lands in the reported band (MLP below, transformer above); our heads "
                "memorise without generalising; the source's model, training fraction, weight "
                "decay and length are not stated")

# %% [markdown]
# ## What this establishes
#
# {numref}`Chapter %s <ch-certificates>` turns from the gauge to a separate question: whether
# such a bound can certify robustness at all. The three proxies of this chapter, and the
# relative flatness they approximate, are audited on trained networks next to a dozen other
# measures in the atlas rows {ref}`relative flatness <atlas-relative-flatness>`,
# {ref}`kappa_exact <atlas-kappa-exact>`, {ref}`B_raw <atlas-b-raw>` and
# {ref}`B_quot <atlas-b-quot>`.
#
# ```{admonition} What you now know, and what does not follow
# :class: important
# **You now know**
# - that $\kappa_{\rm exact}$ and $B_{\rm quot}$ are functions of the predictor (for this
#   symmetry): their values and gradients are the same at every representative of a
#   classifier's orbit;
# - that $B_{\rm raw}$ is a function of the representative: it is unbounded along the orbit
#   and doubles on average under reference-class conventions (an identity);
# - that in trained models as stored, the mean-row share records the initialisation width
#   and scale, the optimiser, the weight decay and the training length, and that the reported
#   starting band is what initialisation gives a 512-wide head.
#
# **What does not follow**
# - that $B_{\rm quot}$ is a good measure of flatness: it is still a loose trace bound, by
#   $K - 1$ times a row-distance factor;
# - that a stored share or a looseness value describes the predictor: the reported share is
#   one recipe's record (SGD and Adam probes store less and more), and where a head lands near
#   the reported looseness band depends on its architecture and training.
# ```
#
# ## Exercises
#
# ```{admonition} Exercise: reference classes in a three-class head
# :class: tip
# Change the number of classes from 10 to 3 (the MLP trained on the digits 0, 1 and 2
# above) and predict the mean of its three reference-class ratios, and the largest value a
# single ratio could take. (Hint: which parts of {eq}`eq-ch08-reference` depend on $K$?)
# ```
#
# ```{admonition} Solution
# :class: dropdown
# The mean is still exactly 2: the identity holds for every $K$ and every classifier. A
# single ratio $1 + K\lVert w_{c,r}\rVert^2/\lVert W_c\rVert_F^2$ is at most
# $1 + (K - 1) = K$, because a centred row can carry at most a fraction $(K-1)/K$ of
# $\lVert W_c\rVert_F^2$; with three classes the ratios lie between 1 and 3. Both are
# identities, so the cell below labels them as such; what it checks is that the proxies,
# evaluated on the test images, agree with the closed form computed from the row lengths.
# ```

# %% tags=["hide-cell"]
ratios_three = ratios_of(subset_models[3])  # through the proxies B_raw and B_quot
rows_three = squared_rows(subset_models[3]).numpy()  # ||w_c,r||^2, r = 0, 1, 2
closed_gap = np.abs(ratios_three - (1 + 3 * rows_three / rows_three.sum())).max()
assert closed_gap < 1e-12  # proxies against 1 + K ||w_c,r||^2 / ||W_c||_F^2
assert abs(ratios_three.mean() - 2) < 1e-12 and ratios_three.min() >= 1 and ratios_three.max() <= 3
print(f"three classes: ratios {span(ratios_three, 3)}; proxies vs row-norm closed form",
      rounding_level(closed_gap))
print("identities: mean - 2", rounding_level(ratios_three.mean() - 2), "and 1 <= ratio <= K = 3")

# %% [markdown]
# ```{admonition} Exercise: a wider head at initialisation
# :class: tip
# Change the feature width of a freshly initialised 10-class head from $d = 512$ to
# $d = 4096$ and predict the centre and the width of the 5-95% band of
# $B_{\rm raw}/B_{\rm quot}$. (Hint: {eq}`eq-ch08-init-law`.)
# ```
#
# ```{admonition} Solution
# :class: dropdown
# The centre stays near $K/(K-1) = 10/9$, and the band narrows like $\sqrt{2/d}$: eight
# times the width gives a band $\sqrt 8 \approx 2.8$ times narrower. The cell below
# compares the law with 100 seeded draws at $d = 4096$.
# ```

# %% tags=["hide-cell"]
wide_draws = np.quantile([init_ratio(4096, seed) for seed in range(100)], levels)
wide_law = flatness.initial_ratio_quantiles(10, 4096, levels)
assert np.max(np.abs(wide_draws - wide_law)) < 0.5 * (wide_law[2] - wide_law[0])
narrowing = (init_law[512][2] - init_law[512][0]) / (wide_law[2] - wide_law[0])
print(f"d = 4096: law {quantile_text(wide_law)}, draws {quantile_text(wide_draws)};",
      f"{fmt(narrowing, 3)}x narrower than at d = 512")

# %% [markdown]
# ```{admonition} Exercise: a smaller modulus
# :class: tip
# Change the modulus of the MLP head on $a - b$ from 97 to 23 and predict
# $B_{\rm quot}/\kappa_{\rm exact}$ at initialisation. (Hint: {eq}`eq-ch08-looseness` at
# nearly uniform $p$.)
# ```
#
# ```{admonition} Solution
# :class: dropdown
# About $K - 1 = 22$: at initialisation the logits are small, $p$ is close to uniform, and
# the row-distance factor is close to 1. The cell below measures it on the training pairs
# of $(a - b) \bmod 23$.
# ```

# %% tags=["hide-cell"]
mod23 = tasks.modular_arithmetic(23, "subtract", train_fraction=0.5, seed=0)
small_head = tasks.MLPClassifier(None, (128,), 23, modulus=23, seed=0)
params23 = {name: value.detach() for name, value in small_head.named_parameters()}
features23 = tasks.features(small_head, params23, mod23.x_train)
looseness23 = float(flatness.quotient_looseness(params23[tasks.CLASSIFIER], features23))
assert abs(looseness23 / 22 - 1) < 0.05
print(f"modulus 23 at initialisation: B_quot / kappa_exact = {fmt(looseness23, 3)} (K - 1 = 22)")

# %% [markdown]
# ## Results ledger
#
# The table is rendered from the values computed above (the same rows are stored as JSON
# for the claims appendix):

# %%
ledger

# %% [markdown]
# The other claims of the same series are established next: S5-S9 in
# {numref}`Chapter %s <ch-certificates>` and S10-S13 in
# {numref}`Chapter %s <ch-regulariser-updates>`.
