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
# (ch-certificates)=
# # Certificates need the first-order term
#
# Can a curvature bound at a minimum of the training loss be turned into a robustness
# certificate, a radius inside which no example's loss rises by more than a tolerance?
# {cite:t}`walter2026flatness` invert the last-layer relative-flatness proxy $B_{\rm raw}$ of
# {numref}`Chapter %s <ch-softmax-gauge>` into such a radius. Their Equation 5 still carries
# the pointwise first-order term $\Delta\lVert W\rVert_F\lVert\nabla_W \ell_x(W)\rVert_F$;
# their Proposition 8 drops it at a *pointwise* minimum of $\ell_x$ (which softmax
# cross-entropy never attains at finite $W$ when $\phi(x) \ne 0$). The faulty step is
# Proposition 9: it assumes only a minimum of the *empirical risk* and applies Proposition 8
# to each example, although $\nabla_W R_S(W) = 0$ does not make every $\nabla_W \ell_x(W)$
# vanish {cite}`opazo2026flatness`. This chapter derives, exactly, a three-example dataset
# minimum where the certified radius contains a perturbation that raises one example's loss
# more than two hundred times above the published expression, derives a sound replacement that
# keeps the first-order term, shows its constant cannot be improved, and measures both on the
# learned features of networks trained here.
#
# ```{admonition} Key ideas
# :class: tip
# - At a minimum of the average loss each example's own loss still has a gradient, so an
#   expression with curvature terms only cannot bound every example's loss increase.
# - A three-example dataset minimum that meets every condition the published theorem states
#   shows its expression understating a loss increase by a factor {glue:text}`ch09-ratio`
#   inside the radius it certifies.
# - Keeping the first-order term and bounding the curvature by the largest distance between
#   class rows gives a sound bound: its constant cannot be improved, and it is the same at
#   every representative of the softmax gauge.
# - On the learned features of small trained networks the sound bound covers every response
#   and is nearly tight for small steps.
# ```
#
# **Claims established here:** S5, S6, S7, S8, S9.
#
# The tools are those of the previous chapter plus `lossgeom_book.certificates`:

# %% tags=["remove-cell"]
# Only on Google Colab: install the book's package and what the chapter imports.
import subprocess, sys
if "google.colab" in sys.modules:
    book = "lossgeom[book] @ git+https://github.com/lossgeom/same-function-different-geometry@main"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", book], check=True)

# %% tags=["hide-cell"]
from lossgeom_book.setup import setup

ledger = setup("certificates need the first-order term", single_thread=True)

# %% tags=["hide-input"]
import math

import numpy as np
import sympy as sp
import torch
import matplotlib.pyplot as plt
from IPython.display import Math, display
from scipy.stats import spearmanr

from lossgeom import flatness
from lossgeom.contract import MeasurementContract
from lossgeom.formatting import fmt, rounding_level
from lossgeom_book import data
from lossgeom_book import certificates as cert
from lossgeom_book import classifiers as toy_classifiers
from lossgeom_book.display import glue_figure, glue_value

# %% [markdown]
# ## The first-order obstruction
#
# Let $\ell$ be differentiable at a feature $h$ with gradient $g_h \ne 0$. Along
# $d_\rho = \rho\, g_h / \lVert g_h\rVert$ Taylor's theorem gives
#
# $$
# \ell(h + d_\rho) - \ell(h) = \rho \lVert g_h \rVert + o(\rho),
# $$ (eq-ch09-first-order)
#
# so any expression $q(\rho) = o(\rho)$, a quadratic-plus-cubic one included, is eventually
# smaller than the loss increase. Sympy makes this concrete for one logistic example,
# $\ell(s) = \log(1 + e^{-\beta s})$, against a generic $q(\rho) = a\rho^2 + b\rho^3$. First
# the loss and its slope:

# %%
rho, beta, s0 = sp.symbols("rho beta s0", positive=True)
a_q, b_q = sp.symbols("a b", positive=True)
logistic_loss = sp.log(1 + sp.exp(-beta * s0))
slope = sp.Abs(sp.diff(logistic_loss, s0))

# %% [markdown]
# Then the increase per unit step along the ascent direction $-s$, and the same limit for $q$:

# %%
step_back = logistic_loss.subs(s0, s0 - rho)
increase_per_rho = sp.simplify(sp.limit((step_back - logistic_loss) / rho, rho, 0))
assert sp.simplify(increase_per_rho - slope) == 0
assert sp.limit((a_q * rho**2 + b_q * rho**3) / rho, rho, 0) == 0
limit_text = r"\lim_{\rho\to 0}\tfrac{\ell(s_0-\rho)-\ell(s_0)}{\rho} = "
display(Math(limit_text + sp.latex(increase_per_rho)))

# %% [markdown]
# The limit is the slope $|\ell'(s_0)| > 0$, while $q(\rho)/\rho \to 0$: near $s_0$ the linear
# term wins.

# %% tags=["remove-cell"]
ledger.add("S5", "Along the loss gradient the increase is $\\rho \\lVert g_h\\rVert + o(\\rho)$: "
           "no $o(\\rho)$ expression bounds it",
           "increase over $\\rho$ tends to $" + sp.latex(increase_per_rho) + "$; $q/\\rho$ to 0",
           details={"limit of increase / rho": "$|\\ell'(s_0)| = " + sp.latex(increase_per_rho) + "$",
            "limit of q / rho": 0})

# %% [markdown]
# At a minimum of the *dataset* loss the per-example gradients cancel on average, but
# each one can be far from zero; the next section builds such a minimum.
#
# ## A finite dataset minimum
#
# Two classes, a one-dimensional feature $\phi(x) = x$, and the multiset
# $S = [(1, 1), (1, 1), (1, 0)]$ of (input, label) pairs. Binary softmax sees the
# classifier $W = (w_0, w_1)^\top$ only through $\beta = w_1 - w_0$, and the empirical risk is
#
# $$
# R(\beta) = \tfrac23 \log(1 + e^{-\beta}) + \tfrac13 \log(1 + e^{\beta}).
# $$ (eq-ch09-risk)
#
# Sympy finds its stationary points and its curvature:

# %%
b = sp.symbols("beta", real=True)
loss_label1, loss_label0 = sp.log(1 + sp.exp(-b)), sp.log(1 + sp.exp(b))
risk = sp.Rational(2, 3) * loss_label1 + sp.Rational(1, 3) * loss_label0
roots, curvature = sp.solve(sp.diff(risk, b), b), sp.simplify(sp.diff(risk, b, 2))
assert roots == [sp.log(2)] and sp.simplify(curvature - sp.exp(b) / (1 + sp.exp(b)) ** 2) == 0

# %% [markdown]
# One root and a positive second derivative: the minimiser is unique. At it, the two
# per-example gradients are not zero:

# %%
gradient_at = lambda loss: sp.simplify(sp.diff(loss, b).subs(b, sp.log(2)))
grads_at_min = [gradient_at(loss_label1), gradient_at(loss_label0)]
assert grads_at_min == [sp.Rational(-1, 3), sp.Rational(2, 3)]
display(Math(r"\beta_\star = " + sp.latex(roots[0]) + r",\quad R'' = " + sp.latex(curvature)
             + r",\quad \ell_1'(\beta_\star) = " + sp.latex(grads_at_min[0])
             + r",\ \ell_0'(\beta_\star) = " + sp.latex(grads_at_min[1])))

# %% [markdown]
# So every minimiser is $(c, c + \log 2)^\top$, one point up to the common-row shift, and
# $W_\star = (0, \log 2)^\top$ is the representative with $c = 0$; there $p = (1/3, 2/3)$ on
# every example, and the gradients $-1/3, -1/3, 2/3$ average to zero without vanishing.
#
# The published theorem has further conditions; we check them on this example. With
# $\mathcal{X} = [0.99, 1]$ and $r = 0.99$, $\phi$ is 1-Lipschitz, $|x| \le 1$ and
# $|\phi(x)| \ge r$. It also asks for a confident prediction, $p_y > 1/2$ (the
# high-confidence condition of the seed's Corollary 2), and $\ell_1(1) < \log 2$:

# %%
p_class1 = sp.simplify(1 / (1 + sp.exp(-sp.log(2))))  # softmax(0, log 2) for class 1
loss_class1 = sp.simplify(loss_label1.subs(b, sp.log(2)))
margin_to_log2 = sp.logcombine(sp.log(2) - loss_class1, force=True)
assert p_class1 == sp.Rational(2, 3) and margin_to_log2 == sp.log(sp.Rational(4, 3))
display(Math(r"p_1 = " + sp.latex(p_class1) + r" > \tfrac12,\qquad \ell_1(1) = "
             + sp.latex(loss_class1) + r" = \log 2 - " + sp.latex(margin_to_log2) + r" < \log 2"))

# %% [markdown]
# Both hold exactly ($\log\tfrac43 > 0$), so the example satisfies every stated condition, and
# because $\phi(x) = x$ it is a counterexample in input space, not only in feature space.
#
# Now move the input of one class-1 example from $x = 1$ to $x = 0.99$ (a step of
# $\delta = 0.01$ along that example's loss gradient) and evaluate the published expression
# $\frac{\delta^2}{2r^2} B_{\rm raw}(W_\star, \phi(x)) + \frac{\delta^3}{24 r^3} K m$ with
# $K = 2$ and $m = d = 1$, exactly:

# %%
delta, r_low, n_classes, m_dim = sp.Rational(1, 100), sp.Rational(99, 100), 2, 1
increase = sp.log(1 + 2 ** -sp.Rational(99, 100)) - sp.log(sp.Rational(3, 2))
B_raw_star = sp.log(2) ** 2 * (1 - sp.Rational(1, 9) - sp.Rational(4, 9))  # ||W||^2 |h|^2 (1-|p|^2)
cubic_term = delta**3 / (24 * r_low**3) * n_classes * m_dim
published = delta**2 / (2 * r_low**2) * B_raw_star + cubic_term

# %%
ratio = increase / published
assert sp.N(ratio) > 210
display(Math(r"\ell_1(0.99) - \ell_1(1) \approx " + sp.latex(sp.N(increase, 4))
             + r",\quad \text{published} \approx " + sp.latex(sp.N(published, 4))
             + r",\quad \text{ratio} \approx " + sp.latex(sp.N(ratio, 5))))

# %% [markdown]
# The same numbers through the package, in float64 (`lossgeom_book.certificates.loss_increase`
# evaluates $\log(1 + \sum_{k \ne y} p_k \operatorname{expm1}(\delta_k - \delta_y))$ so that
# small increases keep their digits):

# %%
W_star, h_star = torch.tensor([[0.0], [math.log(2.0)]]), torch.tensor([1.0])
increase_float = float(cert.loss_increase(W_star, h_star, 1, torch.tensor([-0.01])))
published_float = cert.published_expression(0.01, float(flatness.b_raw(W_star, h_star)), 0.99,
                                             K=2, m=1)
assert math.isclose(increase_float, float(increase), rel_tol=1e-12)
assert math.isclose(published_float, float(published), rel_tol=1e-12)

# %% [markdown]
# At the centred representative of the same minimiser the expression uses $B_{\rm quot}$:

# %%
published_centred = cert.published_expression(0.01, float(flatness.b_quot(W_star, h_star)), 0.99,
                                               2, 1)
print(f"loss increase {fmt(increase_float, 4)}, published expression {fmt(published_float, 4)}, "
      f"ratio {fmt(increase_float / published_float, 5)}")
print(f"at the centred representative (-log2/2, log2/2): expression {fmt(published_centred, 4)}, "
      f"ratio {fmt(increase_float / published_centred, 5)}")

# %% tags=["remove-cell"]
glued = {"ch09-increase": (increase_float, 3), "ch09-published": (published_float, 3),
         "ch09-ratio": (increase_float / published_float, 5)}
for name, (value, digits) in glued.items():
    glue_value(name, value, digits)

# %% [markdown]
# The loss rises by {glue:text}`ch09-increase`, the expression allows
# {glue:text}`ch09-published`: a factor {glue:text}`ch09-ratio`, matching the reported
# 2.32e-3, 1.10e-5 and "over 210" to the stated digits. At the centred representative
# the expression is smaller still, because $B_{\rm raw}$ halves: the gauge of
# {numref}`Chapter %s <ch-softmax-gauge>` and the missing first-order term are two separate
# defects.

# %% tags=["remove-cell"]
ledger.add("S6", "At the dataset minimum $W_\\star = (0, \\log 2)$ the move $x = 1 \\to 0.99$ for "
           "$y = 1$ raises the loss far above the published expression; every stated condition "
           "holds there",
           f"increase {fmt(increase_float)} vs expression {fmt(published_float)}: ratio "
           f"{fmt(increase_float / published_float)}",
           details={"minimiser beta*": "log(2) (sympy, unique)", "p_y": "2/3 > 1/2 (sympy)",
            "l_1(1)": "log(3/2) < log 2 (sympy)", "loss increase": increase_float,
            "published expression": published_float, "ratio": increase_float / published_float,
            "ratio at centred W": increase_float / published_centred},
           reported="2.32e-3 vs 1.10e-5, over 210x; $p_y = 2/3 > 1/2$; "
                    "$\\ell_1(1) = \\log(3/2) < \\log 2$")

# %% [markdown]
# ## The falsely certified radius
#
# Setting the published expression equal to a tolerance $\epsilon$ and solving for $\delta$
# gives the radius it certifies. At $\epsilon = 10^{-4}$, with the same $r = 0.99$, the
# expression is a cubic in $\delta$ that increases on $\delta > 0$, so it has one positive
# root. Sympy finds it to 30 digits:

# %%
d_sym = sp.symbols("delta", positive=True)
expression = d_sym**2 / (2 * r_low**2) * B_raw_star + d_sym**3 / (24 * r_low**3) * n_classes * m_dim
radius_exact = sp.nsolve(expression - sp.Rational(1, 10**4), d_sym, 0.03, prec=30)

# %% [markdown]
# `lossgeom_book.certificates.published_radius` (Brent's method) agrees, and the violating step
# lies inside the radius:

# %%
radius_float = cert.published_radius(1e-4, float(flatness.b_raw(W_star, h_star)), r=0.99, K=2, m=1)
assert math.isclose(radius_float, float(radius_exact), rel_tol=1e-12)
assert 0.01 < radius_float and increase_float > 1e-4
print(f"certified radius delta_pub = {fmt(radius_float, 6)} (r = 0.99); the step 0.01 lies "
      f"inside it and raises the loss by {fmt(increase_float, 4)} > tolerance 1e-4")

# %% tags=["remove-cell"]
ledger.add("S7", "The published expression certifies a radius at tolerance $10^{-4}$ that "
           "contains the violating perturbation",
           f"radius {fmt(radius_float)} contains the step 0.01 (loss increase "
           f"{fmt(increase_float)})",
           details={"delta_pub (r = 0.99)": radius_float, "violating step": 0.01,
            "its loss increase": increase_float}, reported=2.99e-2)

# %% [markdown]
# ## A sound bound
#
# Keep the first-order term and bound the second-order one uniformly. For target $y$ the
# feature gradient is $g_h = W^\top(p - e_y)$ and the feature Hessian at $h + t d$ is
# $W^\top P(q_t) W$. For a unit vector $u$, $u^\top W^\top P(q) W u$ is the variance of the
# scalar $u^\top w_C$ with $C \sim \operatorname{Cat}(q)$, at most a quarter of its squared
# range (Popoviciu's inequality), hence at most $D_W^2/4$ with
# $D_W = \max_{i,j}\lVert w_i - w_j\rVert$. Taylor's theorem and Cauchy-Schwarz then give,
# for every $d$,
#
# $$
# \begin{aligned}
# \ell_y(h + d) - \ell_y(h) &\le \lVert d\rVert \lVert g_h\rVert + \frac{D_W^2}{8}\lVert d\rVert^2,\\
# \rho_{\rm cert} &= \frac{2\epsilon}{\lVert g_h\rVert + \sqrt{\lVert g_h\rVert^2 + D_W^2\epsilon/2}} .
# \end{aligned}
# $$ (eq-ch09-sound)
#
# Sympy checks the pieces. The binary variance $q(1-q)D^2$ is at most $D^2/4$, with equality
# only at $q = 1/2$:

# %%
q, Dw, s, g, e_sym = sp.symbols("q D s g epsilon", positive=True)
slack = Dw**2 / 4 - q * (1 - q) * Dw**2
assert sp.factor(slack) == Dw**2 * (2 * q - 1) ** 2 / 4

# %% [markdown]
# Along the row difference of a balanced binary classifier the remainder after the linear
# term is $D_W^2 s^2/8 + O(s^4)$, so the constant $D_W^2/4$ is attained and no smaller uniform
# constant is valid:

# %%
loss_balanced = sp.log(1 + sp.exp(-Dw * s))  # rows D u apart, logits equal at s = 0
linear_part = loss_balanced.subs(s, 0) + sp.diff(loss_balanced, s).subs(s, 0) * s
remainder = sp.series(loss_balanced - linear_part, s, 0, 4).removeO()
assert sp.simplify(remainder - Dw**2 * s**2 / 8) == 0

# %% [markdown]
# The radius is the positive root of the bound set equal to $\epsilon$:

# %%
roots_rho = sp.solve(sp.Eq(rho * g + Dw**2 / 8 * rho**2, e_sym), rho)
closed_radius = 2 * e_sym / (g + sp.sqrt(g**2 + Dw**2 * e_sym / 2))
assert len(roots_rho) == 1 and sp.simplify(roots_rho[0] - closed_radius) == 0
display(Math(r"\rho_{\rm cert} = " + sp.latex(closed_radius)))

# %% [markdown]
# And the gradient does not see a common-row shift, because $\mathbf{1}^\top(p - e_y) = 0$:

# %%
p0, e0, v_shift, w0, w1 = sp.symbols("p_0 e_0 v w_0 w_1", real=True)
residual, rows = sp.Matrix([p0 - e0, (1 - p0) - (1 - e0)]), sp.Matrix([w0, w1])
shifted_gradient = (rows + v_shift * sp.ones(2, 1)).T * residual
assert sp.expand(shifted_gradient - rows.T * residual) == sp.zeros(1, 1)

# %% [markdown]
# On the counterexample the bound covers the violating step with little room, and the
# radius it certifies at $\epsilon = 10^{-4}$ is far smaller than the published one:

# %%
bound_star = float(cert.sound_bound(W_star, h_star, 1, 0.01))
rho_star = float(cert.sound_radius(W_star, h_star, 1, 1e-4))
at_radius = float(cert.loss_increase(W_star, h_star, 1, torch.tensor([-rho_star])))
assert increase_float <= bound_star and at_radius <= 1e-4

# %%
print(f"step 0.01: increase {fmt(increase_float, 5)} <= sound bound {fmt(bound_star, 5)} "
      f"(bound/actual {fmt(bound_star / increase_float, 5)})")
print(f"sound radius at 1e-4: {fmt(rho_star, 4)} (published: {fmt(radius_float, 4)}); "
      f"loss increase at the sound radius {fmt(at_radius, 4)}")

# %% [markdown]
# Next, the bound on random instances (`sound_bound_on_random_instances`): 120 classifiers
# with 2 to 10 classes, feature dimension 1 to 8 and row scales from 0.1 to 10, each with 10
# features, random labels, and perturbations in random directions and along the gradient, of
# sizes from $10^{-4}$ to 10. We record the smallest bound/actual ratio among the positive
# increases:

# %%
worst_ratio, n_positive = cert.sound_bound_on_random_instances(n_classifiers=120, seed=0)
assert worst_ratio >= 1
print(f"{n_positive} positive loss increases: smallest bound/actual ratio = 1 + "
      f"{fmt(worst_ratio - 1, 2)} (the bound is never violated)")

# %% [markdown]
# The closest cases are the smallest steps along the gradient, where the linear term
# dominates both sides and the bound is tight. Finally, shift invariance: on a random
# 5-class classifier a large common-row shift leaves the sound radius unchanged and moves
# the published one (computed here with $r = \lVert h\rVert$, $m = d$):

# %%
gen = torch.Generator().manual_seed(1)
W5, h5, y5 = torch.randn(5, 3, generator=gen), torch.randn(3, generator=gen), 2
W5_shifted = flatness.common_row_shift(W5, 4.0 * torch.randn(3, generator=gen))
radii = [float(cert.sound_radius(Wx, h5, y5, 0.1)) for Wx in (W5, W5_shifted)]
published_radii = [cert.published_radius(0.1, float(flatness.b_raw(Wx, h5)), r=float(h5.norm()),
                                         K=5, m=3) for Wx in (W5, W5_shifted)]

# %%
radius_change = abs(radii[1] / radii[0] - 1)
norm_factor = float((W5_shifted**2).sum() / (W5**2).sum())
print(f"||W + 1v^T||^2 / ||W||^2 = {fmt(norm_factor, 4)}: relative change of the sound radius "
      f"{rounding_level(radius_change, 1e-12)}; published radius "
      f"{fmt(published_radii[0], 4)} -> {fmt(published_radii[1], 4)}")

# %% tags=["remove-cell"]
ledger.add("S8", "$\\ell(h + d) - \\ell(h) \\le \\lVert d\\rVert \\lVert g_h\\rVert + "
           "\\frac{D_W^2}{8} \\lVert d\\rVert^2$; the Hessian constant $D_W^2/4$ is sharp; "
           "radius formula; shift invariant",
           f"never violated: smallest bound/actual over {n_positive} random increases is "
           f"1 + {fmt(worst_ratio - 1, 2)}",
           details={"sharpness": "remainder D^2 s^2/8 + O(s^4) at a balanced binary softmax (sympy)",
            "counterexample bound/actual at 0.01": bound_star / increase_float,
            "sound radius at 1e-4": rho_star, "random positive increases": n_positive,
            "smallest bound/actual - 1": fmt(worst_ratio - 1, 2),
            "sound radius change under shift": rounding_level(radius_change, 1e-12)})

# %% [markdown]
# ## On learned features
#
# Does the omitted term matter on trained representations, or only in a constructed
# example? We train five MLPs 64-64-10 (ReLU, seeds 0-4; heavy-ball SGD, learning rate 0.1,
# 150 full-batch steps) on 600 digit images as in {numref}`Chapter %s <ch-softmax-gauge>` and
# take the 400 held-out images: 2,000 (model, image) pairs.

# %%
split = data.digits(n_train=600, n_test=400, seed=0)
train = lambda seed: toy_classifiers.train_classifier(
    toy_classifiers.init_classifier([64, 64, 10], seed=seed),
    split.x_train,
    split.y_train,
    steps=150,
    lr=0.1,
)[0]
models = [train(seed) for seed in range(5)]

# %%
test_accuracy = lambda mp: (
    toy_classifiers.classifier_logits(mp, split.x_test).argmax(-1) == split.y_test
)
accuracies = [float(test_accuracy(mp).double().mean()) for mp in models]
print(f"5 MLPs: test accuracy {fmt(min(accuracies), 3)} to {fmt(max(accuracies), 3)}")

# %% [markdown]
# Each feature $h$ (the 64 hidden units) is moved along $u = g_h/\lVert g_h\rVert$, with the
# image's true label, by $d = \Delta \lVert h\rVert u$. The *retained raw quadratic* is the
# published expression's quadratic with the most favourable feature bound $r = \lVert h\rVert$,
# $\tfrac{\Delta^2}{2} B_{\rm raw}(W, h)$. `responses_along_gradient` records, per pair and
# $\Delta$, the realised increase, that quadratic, the linear term and the sound bound:

# %%
DELTAS = (1e-5, 1e-4, 1e-3, 3e-3, 1e-2)
features_of = lambda mp: toy_classifiers.classifier_features(mp, split.x_test)
per_model = [cert.responses_along_gradient(mp["weight"], features_of(mp), split.y_test, DELTAS)
             for mp in models]
pooled = cert.pool_responses(per_model)
n_pairs = len(pooled[DELTAS[0]]["actual"])

# %% [markdown]
# The summary per $\Delta$, next to Table 1 of {cite:t}`opazo2026flatness` (ResNet-18
# penultimate features on CIFAR-10, 10,240 pairs): the share of pairs whose realised increase
# exceeds the retained quadratic, the median of linear/raw, the share covered by the sound
# bound, and the median and 90th percentile of bound/actual. A reported cell is filled only
# where the source's text states the value; "covers all 71,680 responses" states coverage at
# every $\Delta$:

# %%
summary = cert.summarise_responses(pooled)
REPORTED = {1e-5: {"tight_median": 1.039, "tight_p90": 1.093}, 1e-3: {"lin_raw": 10.60}}
stated = lambda dlt: {"covered": 1.0, **({"exceed": 1.0} if dlt <= 3e-3 else {})}
REPORTED = {dlt: {**stated(dlt), **REPORTED.get(dlt, {})} for dlt in DELTAS}
print(cert.response_table(summary, REPORTED))

# %% [markdown]
# The sound bound covers every response, and at the smallest $\Delta$ its median is within a
# few percent of the realised increase; its 90th percentile is looser than reported (we test
# why below). The realised increase exceeds the retained quadratic in
# every pair up to $\Delta = 10^{-3}$ and in all but a handful at $3\cdot 10^{-3}$.
#
# Two columns are not measurements. The ratio of the linear term to the retained quadratic
# is $2\lVert g_h\rVert / (\Delta \lVert h\rVert \lVert W\rVert_F^2 (1 - \lVert p\rVert^2))$, so
# median(linear/raw) $\times\,\Delta$ is the same number at every $\Delta$ by algebra: the
# $1/\Delta$ scaling is an identity ({numref}`fig-ch09-learned`), and only its level, the
# median at one $\Delta$, says something about the features:

# %%
scaled = {dlt: summary[dlt]["lin_raw"] * dlt for dlt in DELTAS}
TIGHTNESS = ("tight_median", "tight_p90")
assert max(scaled.values()) / min(scaled.values()) - 1 <= 1e-9  # identity, checked
all_covered = all(row["covered"] == 1.0 for row in summary.values())
assert all_covered
print(f"median(linear/raw) x Delta = {fmt(scaled[1e-3], 4)} at every Delta (identity); "
      f"level at Delta = 1e-3: {fmt(summary[1e-3]['lin_raw'], 4)} (reported 10.60)")

# %% [markdown]
# Our level is below the reported one: on our features the omitted linear term is
# {glue:text}`ch09-lin-raw` times the retained quadratic at $\Delta = 10^{-3}$, on the source's
# 10.60 times.
#
# Two of our levels differ from the source's, and the obvious suspect is confidence. At small
# $\Delta$ the sound bound exceeds the realised increase by at most about
# $D_W^2\lVert d\rVert / (8\lVert g_h\rVert)$ relative to it, and
# $\lVert g_h\rVert \to 0$ as the probability $p_y$ of the true label goes to 1, so very
# confident pairs should make the tail of bound/actual loose. If confidence is the reason,
# the loose tail consists of the most confident pairs, leaving them out brings the 90th
# percentile near equality, and the level of linear/raw moves with confidence too. We test
# this on our own pairs, grouped by $p_y$:

# %%
true_label_probability = lambda mp: flatness.probabilities(mp["weight"], features_of(mp))[
    torch.arange(len(split.y_test)), split.y_test
]
p_true = torch.cat([true_label_probability(mp) for mp in models]).numpy()
tightness = pooled[1e-5]["bound"] / pooled[1e-5]["actual"]
linear_over_raw = pooled[1e-3]["linear"] / pooled[1e-3]["raw"]

# %%
CONFIDENCE_LEVELS = (0.9, 0.99, 0.999, 0.9999)
rank_correlation = spearmanr(tightness, p_true).statistic
by_confidence = {level: (p_true <= level) for level in CONFIDENCE_LEVELS}
for level, kept in by_confidence.items():
    print(f"p_y <= {level}: {fmt(100 * kept.mean(), 3)}% of pairs | bound/actual at 1e-5, p90 "
          f"{fmt(np.quantile(tightness[kept], 0.9), 4)} | linear/raw at 1e-3, median "
          f"{fmt(np.median(linear_over_raw[kept]), 4)}")
print(f"rank correlation of bound/actual at 1e-5 with p_y: {fmt(rank_correlation, 3)}")

# %% [markdown]
# We check the two readings of this table against the reported 90th percentile and level:

# %%
p90_without_confident = np.quantile(tightness[by_confidence[0.999]], 0.9)
lin_raw_by_group = [np.median(linear_over_raw[kept]) for kept in by_confidence.values()]
assert rank_correlation > 0.9 and p90_without_confident < 1.093  # the reported p90
assert max(lin_raw_by_group) < 10.60  # the reported level, in every group

# %% tags=["remove-cell"]
span_text = lambda values: f"{fmt(min(values), 3)} to {fmt(max(values), 3)}"
glue_value("ch09-lin-raw", summary[1e-3]["lin_raw"], 4)
glue_value("ch09-rank", rank_correlation, 3)
glue_value("ch09-confident-share", fmt(100 * (1 - by_confidence[0.999].mean()), 3) + "%")
glue_value("ch09-p90-rest", p90_without_confident, 4)
glue_value("ch09-lin-raw-groups", span_text(lin_raw_by_group))

# %% [markdown]
# The tightness is almost a function of confidence (rank correlation {glue:text}`ch09-rank`):
# without the {glue:text}`ch09-confident-share` of pairs with $p_y > 0.999$ the 90th percentile
# falls to {glue:text}`ch09-p90-rest`, below the reported 1.093. So our loose tail is our most
# confident pairs; whether the source's pairs are less confident, its text does not say. The
# level of linear/raw does not follow: across the groups its median ranges over
# {glue:text}`ch09-lin-raw-groups`, below the reported 10.60 even among the least confident pairs. Confidence
# accounts for the tightness tail but not for the level, and what does set the level we have
# not tested.

# %% tags=["hide-input"]
learned_contract = MeasurementContract(
    centre="penultimate features h of 5 trained 64-64-10 ReLU MLPs (seeds 0-4), one per image",
    directions="u = g_h / ||g_h||, the feature gradient of the true-label loss",
    normalisation="step d = Delta ||h|| u (relative to the feature norm)",
    radius="Delta in {1e-5, 1e-4, 1e-3, 3e-3, 1e-2}",
    loss="softmax cross-entropy of one example", reduction="none (per pair); medians, 90th pct.",
    data=f"{n_pairs} (model, image) pairs: 400 held-out digits images x 5 models",
    model_mode="n/a (no layers with state)", resolution="5 values of Delta", precision="float64",
)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8.4, 3.4))
ds = np.array(DELTAS)
ax1.loglog(ds, [summary[dl]["lin_raw"] for dl in DELTAS], "o-", label="median linear / raw")
ax1.loglog(ds, scaled[1e-3] / ds, ":", color="k", label="1/Delta (identity)")
ax1.plot([1e-3], [10.60], "s", color="grey", label="reported at 1e-3 (ResNet-18)")
ax1.set_xlabel("Delta")
ax1.legend(fontsize=7)
for dlt in (1e-5, 1e-3, 1e-2):
    tightness = np.log10(pooled[dlt]["bound"] / pooled[dlt]["actual"])
    ax2.hist(tightness, bins=40, histtype="step", label=f"Delta = {fmt(dlt)}")
ax2.set_xlabel("log10(sound bound / realised increase)")
ax2.legend(fontsize=7)
glue_figure("ch09-learned", fig, learned_contract,
            "Left: the omitted linear term relative to the retained raw quadratic; its 1/Delta "
            "slope is an identity, its level is the measurement. Right: tightness of the sound "
            "bound (0 = equality; never negative)")

# %% [markdown]
# ```{glue:figure} fig-ch09-learned
# :name: fig-ch09-learned
#
# {glue:text}`cap-ch09-learned`
#
# {glue:md}`con-ch09-learned`
# ```
#
# Two more rows of the comparison. First, the radius from raw curvature alone: where
# $\tfrac12\rho^2 \lVert W\rVert_F^2(1 - \lVert p\rVert^2)$ reaches the tolerance 0.10, how
# often does the loss along $u$ at that radius rise above 0.10?

# %%
fails = [cert.curvature_only_radius_fails(mp["weight"], features_of(mp), split.y_test, 0.10)
         for mp in models]
fail_share = float(torch.cat(fails).double().mean())
print(f"curvature-only radius at tolerance 0.10 admits an increase above 0.10 for "
      f"{fmt(100 * fail_share, 4)}% of {n_pairs} pairs (reported: 24.43%)")

# %% tags=["remove-cell"]
glue_value("ch09-fail-share", fmt(100 * fail_share, 3) + "%")


# %% [markdown]
# Second, the gauge: for each model a common-row shift along the mean-row direction that
# makes $\lVert W\rVert_F^2$ 100 times larger. That the raw quadratic of every pair is then
# multiplied by 100 holds by construction ($B_{\rm raw}$ is proportional to
# $\lVert W\rVert_F^2$); the measurement is that probabilities and loss responses do not move:

# %%
def shifted_classifier(W, factor=100.0):
    """W + 1 v^T with ||W + 1 v^T||_F^2 = factor ||W||_F^2, v along the mean row."""
    return flatness.common_row_shift(
        W, flatness.softmax_gauge.shift_for_norm_factor(W, flatness.mean_row(W), factor)
    )


# %%
def shift_effect(mp):
    W, h = mp["weight"], features_of(mp)
    base, moved = (
        cert.responses_along_gradient(Wx, h, split.y_test, (1e-3,))[1e-3]
        for Wx in (W, shifted_classifier(W))
    )
    probability_gap = (
        flatness.probabilities(shifted_classifier(W), h) - flatness.probabilities(W, h)
    ).abs()
    response_gap = (moved["actual"] - base["actual"]).abs()
    return moved["raw"] / base["raw"], float(probability_gap.max()), float(response_gap.max())


# %%
effects = [shift_effect(mp) for mp in models]
raw_factor = torch.cat([e[0] for e in effects])
assert float((raw_factor / 100 - 1).abs().max()) <= 1e-9  # identity, checked
largest_gap = max(max(e[1], e[2]) for e in effects)
print(f"raw quadratic x100 for every pair (identity); largest change of a probability or loss "
      f"response: {rounding_level(largest_gap, 1e-12)} (reported: at most 3.8e-14)")

# %% [markdown]
# The shift multiplies the certificate's curvature term a hundredfold and leaves the
# function, and therefore every loss response, unchanged. We enter the comparison in the
# ledger, with only the source's stated values as reported. Its status follows one rule: the
# row holds at our scale only if every level the source states is met here, or a computation
# here accounts for the difference. Coverage, near-universal exceedance, the median tightness
# and the failure share agree; the p90 tightness is accounted for only on our side (the source
# does not report its confidences) and the level of linear/raw not at all, so the row differs.

# %% tags=["remove-cell"]
ledger.add("S9", "On learned features: realised increase vs retained quadratic, level of "
           "linear/quadratic, sound bound covers every response, its tightness",
           f"bound covers all; p90 bound/actual {fmt(summary[1e-5]['tight_p90'], 4)}; median "
           f"linear/raw {fmt(summary[1e-3]['lin_raw'], 4)}",
           details={"pairs": n_pairs,
            "actual > raw, Delta = 1e-5..3e-3": [summary[dl]["exceed"] for dl in DELTAS[:4]],
            "median linear/raw at 1e-3": summary[1e-3]["lin_raw"],
            "sound bound covers": f"all {len(DELTAS)} x {n_pairs} responses",
            "bound/actual median, p90 at 1e-5": [summary[1e-5][k] for k in TIGHTNESS],
            "curvature-only radius fails at tol 0.10": fail_share,
            "probabilities, responses under matched shift": rounding_level(largest_gap, 1e-12),
            "p90 at 1e-5 without p_y > 0.999": p90_without_confident,
            "rank correlation of bound/actual at 1e-5 with p_y": round(rank_correlation, 3),
            "median linear/raw at 1e-3 in p_y groups": [min(lin_raw_by_group),
                                                        max(lin_raw_by_group)],
            "identities (not findings)": "median(linear/raw) x Delta constant; raw factor x100"},
           reported={"actual > raw": "100% through Delta = 3e-3",
                     "median linear/raw at 1e-3": 10.60, "covers": "all 71,680 responses",
                     "bound/actual at 1e-5": [1.039, 1.093],
                     "curvature-only failures at 0.10": 0.2443,
                     "changes under shift": "at most 3.8e-14"},
           status="differs", sig=4,
           note=f"digits MLP features, {n_pairs} pairs: coverage and exceedance hold; p90 "
                f"tightness {fmt(summary[1e-5]['tight_p90'], 4)} (reported 1.093) is set by the "
                f"most confident pairs (tested: {fmt(p90_without_confident, 4)} without "
                f"p_y > 0.999); linear/raw {fmt(summary[1e-3]['lin_raw'], 4)} (reported 10.60) "
                "stays below in every confidence group, reason untested")

# %% [markdown]
# ## What this establishes
#
# A curvature bound is not a certificate. The proxy behind the published certificate moves
# along the gauge orbit; the atlas rows {ref}`B_raw <atlas-b-raw>` and
# {ref}`B_quot <atlas-b-quot>` show it on trained networks under every symmetry at once.
#
# ```{admonition} What you now know, and what does not follow
# :class: important
# **You now know**
# - that at a minimum of the average loss each example keeps a first-order term, and that the
#   three-example minimum, which meets every condition the published theorem states, shows the
#   expression understating a loss increase by a factor {glue:text}`ch09-ratio` inside the
#   radius it certifies;
# - a sound replacement: keep the gradient and bound the curvature by the row diameter; the
#   bound is valid everywhere, cannot be sharpened in its constant, and is the same at every
#   representative of the softmax gauge;
# - that on learned features the sound bound is close to the realised increase for small
#   steps, while the curvature-only radius admits an increase above tolerance for
#   {glue:text}`ch09-fail-share` of pairs.
#
# **What does not follow**
# - an input-space certificate: the bound is a feature-space statement, and turning it into an
#   input-space one needs a separately justified Lipschitz constant for the feature map, which
#   this chapter does not supply;
# - what sets the level of linear/raw: confidence accounts for our loose tightness tail but
#   not for that level, and what does set it is not tested here.
# ```
#
# ## Exercises
#
# ```{admonition} Exercise: a more confident minimum
# :class: tip
# Add a third class-1 example, $S = [(1,1),(1,1),(1,1),(1,0)]$. Predict the minimiser
# $\beta_\star$, the confidence $p_1$ there, and whether the published expression still
# understates the loss increase of the move $x = 1 \to 0.99$. (Hint: $R'(\beta)$ is
# $\sigma(\beta)$ minus the share of class-1 labels.)
# ```
#
# ```{admonition} Solution
# :class: dropdown
# $R'(\beta) = \sigma(\beta) - 3/4$ vanishes at $\beta_\star = \log 3$, where $p_1 = 3/4$. The
# class-1 gradient is $-1/4$, still far from zero, so the increase is about
# $0.01 \cdot \log 3 / 4 \approx 2.7\cdot 10^{-3}$ while the quadratic-plus-cubic expression
# stays near $2\cdot 10^{-5}$: still more than a hundredfold. The cell below checks it with the
# chapter's functions.
# ```

# %% tags=["hide-cell"]
W_three = torch.tensor([[0.0], [math.log(3.0)]])
rise = float(cert.loss_increase(W_three, h_star, 1, torch.tensor([-0.01])))
allowed = cert.published_expression(0.01, float(flatness.b_raw(W_three, h_star)), 0.99, K=2, m=1)
assert float(flatness.probabilities(W_three, h_star)[1]) > 0.74 and rise / allowed > 100
print(f"increase {fmt(rise, 3)}, published expression {fmt(allowed, 3)}, "
      f"ratio {fmt(rise / allowed, 3)}")

# %% [markdown]
# ```{admonition} Exercise: a larger tolerance
# :class: tip
# On the counterexample, raise the tolerance of the sound radius from $10^{-4}$ to $10^{-2}$.
# Predict whether the radius grows by more or less than the factor 100. (Hint: compare
# $\lVert g_h\rVert^2$ with $D_W^2\epsilon/2$ in {eq}`eq-ch09-sound`.)
# ```
#
# ```{admonition} Solution
# :class: dropdown
# Here $\lVert g_h\rVert = \log 2/3 \approx 0.23$ and $D_W = \log 2$, so even at
# $\epsilon = 10^{-2}$ the term $D_W^2\epsilon/2 \approx 0.0024$ is small against
# $\lVert g_h\rVert^2 \approx 0.053$: the radius is nearly linear in $\epsilon$ and grows by a
# little less than 100, because the curvature term starts to count. The cell below checks it.
# ```

# %% tags=["hide-cell"]
radius_at = lambda tolerance: float(cert.sound_radius(W_star, h_star, 1, tolerance))
growth = radius_at(1e-2) / radius_at(1e-4)
assert 95 < growth < 100
print(f"radius at 1e-2 / radius at 1e-4 = {fmt(growth, 4)}")

# %% [markdown]
# ```{admonition} Exercise: shift the minimiser
# :class: tip
# Replace $W_\star = (0, \log 2)^\top$ by the equivalent $(3, 3 + \log 2)^\top$. Predict what
# happens to the published radius at $\epsilon = 10^{-4}$ and to the sound radius.
# ```
#
# ```{admonition} Solution
# :class: dropdown
# The shift leaves the predictor, $g_h$ and $D_W$ unchanged, so the sound radius does not move.
# $\lVert W\rVert_F^2$ grows from $(\log 2)^2 \approx 0.48$ to $9 + (3 + \log 2)^2 \approx 22.6$,
# so $B_{\rm raw}$ and the dominant quadratic term grow about 47-fold and the published radius
# shrinks by roughly $\sqrt{47} \approx 6.9$. The cell below checks both.
# ```

# %% tags=["hide-cell"]
W_moved = flatness.common_row_shift(W_star, torch.tensor([3.0]))
b_raw_moved = float(flatness.b_raw(W_moved, h_star))
shrink = radius_float / cert.published_radius(1e-4, b_raw_moved, 0.99, K=2, m=1)
sound_change = abs(float(cert.sound_radius(W_moved, h_star, 1, 1e-4)) / rho_star - 1)
assert 6 < shrink < 7.5 and sound_change <= 1e-12
print(f"published radius shrinks {fmt(shrink, 3)}-fold; relative change of the sound radius: "
      f"{rounding_level(sound_change, 1e-12)}")

# %% [markdown]
# ## Results ledger

# %%
ledger

# %% [markdown]
# The other claims of the same series are established in the neighbouring chapters: S1-S4
# and S14 in {numref}`Chapter %s <ch-softmax-gauge>`, S10-S13 in
# {numref}`Chapter %s <ch-regulariser-updates>`.
