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
# (ch-perturbation-sets)=
# # Perturbation sets move with the coordinates
#
# Sharpness is often measured not by a Hessian but by a perturbation experiment: the
# largest or the average loss increase when the weights are pushed by a set of
# displacements. Such a number inherits every choice of the set. This chapter asks which
# perturbation experiment is *the same experiment* at two parameter points that implement
# one predictor, and shows on the product model of {numref}`Chapter %s <ch-family-of-minima>`
# that the answer is a set that moves with the coordinates: a circle in balanced
# coordinates becomes an ellipse at the rescaled point, and every pointwise loss on it is
# preserved. A fixed Euclidean circle, by contrast, is a different experiment. The
# sampled maximum on a finite grid is only a lower bound, and we compare it with the exact
# maximum. Sharpness-aware minimisation inherits the same choice, and we follow one of its steps
# from two equivalent points. Finally, isotropic Gaussian weight noise, the intervention
# behind many flatness measures, turns out not to be one intervention on the function at
# all.
#
# **Claims established here:** P7, P8, P9, P10, M1.
#
# The set-up is the same as in the previous chapter:

# %%
import numpy as np
import sympy as sp
import sympy.stats as stats
import matplotlib.pyplot as plt
from IPython.display import Math, display
from myst_nb import glue

from lossgeom import perturbations as pt
from lossgeom import product
from lossgeom.contract import MeasurementContract
from lossgeom.display import fmt, glue_figure, Plain, use_book_style
from lossgeom.landscape import plane_grid
from lossgeom.ledger import Ledger

use_book_style()
ledger = Ledger("Chapter 3: perturbation sets move with the coordinates")

# %% [markdown]
# ## A perturbation maps to a perturbation
#
# Write the balanced coordinates as $(u, v)$ and the rescaled ones as
# $(a, b) = (c u, v / c)$. A displacement $(\delta u, \delta v)$ becomes
# $(c\,\delta u, \delta v / c)$, and the perturbed products agree exactly, cross term
# $\delta u\, \delta v$ included:
#
# $$
# (c u + c\,\delta u)\Big(\frac{v}{c} + \frac{\delta v}{c}\Big) = (u + \delta u)(v + \delta v) .
# $$ (eq-ch03-identity)

# %%
u, v, du, dv = sp.symbols("u v delta_u delta_v", real=True)
c = sp.symbols("c", positive=True)
lhs = (c * u + c * du) * (v / c + dv / c)
rhs = (u + du) * (v + dv)
assert sp.expand(lhs - rhs) == 0
loss = lambda p: sp.Rational(1, 2) * (p - 1) ** 2
assert sp.expand(loss(lhs) - loss(rhs)) == 0
display(Math(sp.latex(lhs) + " - " + sp.latex(rhs) + " = " + sp.latex(sp.expand(lhs - rhs))))
ledger.add("P7", "(a,b)=(cu,v/c) maps (du,dv) to (c du, dv/c); perturbed products agree exactly, cross terms included",
           "exact: expand(lhs - rhs) = 0 and the losses agree (sympy)")

# %% [markdown]
# Because the identity is exact, not a Taylor approximation, it holds for perturbations of
# any size: the transformed set is the same experiment on the function.
#
# ## One angle grid, three sets
#
# The source essay's finite-radius calculation samples a circle of radius $\rho$ around
# the balanced point $(1, 1)$ on a fixed angle grid $\theta_k = 2\pi k / n$. The *same
# angle list* is then pushed through the rescaling to an ellipse around $(c, 1/c)$; as a
# negative control, an untransformed circle of the same radius is drawn around
# $(c, 1/c)$. `lossgeom.perturbations.transformed_circle_receipt` evaluates the exact
# loss at all three sets of points and returns the receipt:

# %%
rho, n_angles = 0.1, 64
receipts = [pt.transformed_circle_receipt(c_val, rho, n_angles) for c_val in (2.0, 10.0)]
for r in receipts:
    assert r.max_pointwise_discrepancy <= 1e-15
    assert abs(r.sampled_max_control - r.sampled_max_balanced) > 0.1 * r.sampled_max_balanced
    print(f"c = {fmt(r.c)}, rho = {fmt(r.radius)}, grid 2 pi k/{r.n_angles}: "
          f"largest pointwise |L(ellipse) - L(circle)| = {fmt(r.max_pointwise_discrepancy, 3)}")
    print(f"   sampled max: balanced circle {fmt(r.sampled_max_balanced)}, transformed ellipse "
          f"{fmt(r.sampled_max_transformed)}, untransformed control circle {fmt(r.sampled_max_control)}")

# %% [markdown]
# Every transformed loss equals its balanced counterpart to rounding, which is a stronger
# check than comparing only the maxima (two maxima can agree by accident). The control
# circle around $(c, 1/c)$ gives a different maximum: it perturbs the predictor
# differently, so it measures a different thing, not a contradiction.

# %%
angles = pt.angular_grid(n_angles)
balanced = pt.circle(np.array([1.0, 1.0]), rho, angles)
c_show = 2.0
ellipse = product.rescale(balanced, c_show)
control = pt.circle(np.array(product.orbit_point(c_show)), rho, angles)
circle_contract = MeasurementContract(
    centre="(1, 1) for the circle; (c, 1/c) with c = 2 for the ellipse and the control",
    directions="unit vectors (cos t, sin t) in balanced coordinates, mapped by (u, v) -> (c u, v / c) for the ellipse",
    normalisation="Euclidean in balanced coordinates (circle, ellipse); Euclidean in (a, b) (control)",
    radius="rho = 0.1", loss="L = 1/2 (ab - 1)^2", reduction="single example", data="(x, y) = (1, 1)",
    model_mode="n/a (no layers with state)", resolution="64 angles t = 2 pi k / 64", precision="float64",
)
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9.0, 3.6))
orbit_a = np.linspace(0.8, 2.4, 200)
ax0.plot(orbit_a, 1 / orbit_a, "k:", lw=1, label="orbit ab = 1")
ax0.plot(*balanced.T, ".", ms=3, label="circle around (1, 1)")
ax0.plot(*ellipse.T, ".", ms=3, label="transformed ellipse, c = 2")
ax0.plot(*control.T, "x", ms=3, label="control circle, c = 2")
ax0.set_xlabel("a")
ax0.set_ylabel("b")
ax0.set_aspect("equal")
ax0.legend(fontsize=7)
ax1.plot(angles, product.loss_at(balanced), "-", label="circle around (1, 1)")
ax1.plot(angles, product.loss_at(ellipse), "o", ms=3, mfc="none", label="transformed ellipse")
ax1.plot(angles, product.loss_at(control), "x", ms=3, label="control circle")
ax1.set_xlabel("angle t (radians)")
ax1.set_ylabel("loss at the perturbed point")
ax1.legend(fontsize=7)
glue_figure("ch03-circles", fig, circle_contract,
    "Left: the three perturbation sets in parameter space. Right: loss at each grid point; "
    "ellipse and circle coincide point by point, the control does not")

# %% [markdown]
# ```{glue:figure} fig-ch03-circles
# :name: fig-ch03-circles
#
# {glue:text}`cap-ch03-circles`
# ```
#
# ## The sampled maximum is a lower bound
#
# A maximum over 64 angles is a maximum over 64 points, not over the circle. For this
# model the continuous maximum is available exactly. With $s = \cos\theta + \sin\theta$
# the residual on the circle is a quadratic in $s$:

# %%
theta, r_, s = sp.symbols("theta rho s", real=True)
residual = (1 + r_ * sp.cos(theta)) * (1 + r_ * sp.sin(theta)) - 1
g = r_ * s + r_**2 * (s**2 - 1) / 2
assert sp.simplify(residual - g.subs(s, sp.cos(theta) + sp.sin(theta))) == 0
display(Math(r"ab - 1 = g(s) = " + sp.latex(sp.expand(g)) + r",\quad s = \cos\theta + \sin\theta \in [-\sqrt2, \sqrt2]"))

# %% [markdown]
# $g$ is convex in $s$ with its vertex at $s = -1/\rho$, outside $[-\sqrt2, \sqrt2]$ when
# $\rho < 1/\sqrt2$. Then $|g|$ is largest at the endpoint $s = \sqrt2$, i.e. at
# $\theta = \pi/4$, and the exact maximum is

# %%
exact_max_expr = sp.Rational(1, 2) * g.subs(s, sp.sqrt(2)) ** 2
L_theta = sp.Rational(1, 2) * residual**2
assert sp.simplify(sp.diff(L_theta, theta).subs(theta, sp.pi / 4)) == 0
assert sp.simplify(g.subs(s, sp.sqrt(2)) + g.subs(s, -sp.sqrt(2)) - r_**2) == 0  # |g(-sqrt 2)| < g(sqrt 2) for small rho
display(Math(r"\max_\theta L = " + sp.latex(sp.factor(exact_max_expr)) + r"\quad (\rho < 1/\sqrt{2})"))
exact_max = float(exact_max_expr.subs(r_, sp.Rational(1, 10)))
assert abs(exact_max - pt.product_circle_max(rho)) <= 1e-16
print(f"exact continuous maximum at rho = {fmt(rho)}: {fmt(exact_max)} "
      f"(lossgeom.perturbations.product_circle_max: {fmt(pt.product_circle_max(rho))})")

# %% [markdown]
# A grid whose angles include $\pi/4$ (any $n$ divisible by 8) finds the exact maximum; a
# grid that misses it reports less. The sweep below lists the sampled maximum and its gap
# to the exact value for several grid sizes:

# %%
gaps = {}
for n in (6, 7, 8, 12, 16, 64, 100, 1000):
    sampled = product.loss_at(pt.circle(np.ones(2), rho, pt.angular_grid(n))).max()
    assert sampled <= exact_max * (1 + 1e-14)
    gaps[n] = (exact_max - sampled) / exact_max
    print(f"n = {n:4d}: sampled max {fmt(sampled)}   relative shortfall {fmt(max(gaps[n], 0.0), 3)}")
assert gaps[6] > 1e-2 and abs(gaps[8]) <= 1e-14
glue("ch03-gap6", Plain(f"{100 * gaps[6]:.3g}%"), display=False)
ledger.add("P8", "Circle vs transformed ellipse on one fixed grid: pointwise losses agree; sampled max is a lower bound; untransformed control differs",
           {"grid": "64 angles 2 pi k/64, rho = 0.1, c in {2, 10}",
            "largest pointwise discrepancy": max(r.max_pointwise_discrepancy for r in receipts),
            "exact max": exact_max, "sampled max (n=64)": receipts[0].sampled_max_balanced,
            "shortfall with n=6": gaps[6],
            "control sampled max (c=2, c=10)": [r.sampled_max_control for r in receipts]})

# %% [markdown]
# With six angles the sampled maximum falls short of the true one by
# {glue:text}`ch03-gap6`. Refining the grid makes the estimate converge, but at no
# resolution does a sampled maximum *certify* the supremum; only the derivation does.
#
# ## Contours over a square
#
# Landscape pictures are the same experiment in two dimensions. We draw the loss over a
# square of half-width $0.5$ in two ways: a *fixed* square $(c + \sigma, 1/c + \tau)$
# around each orbit point, and the *transformed* square, the image of the balanced square
# $(1 + \sigma, 1 + \tau)$ under the rescaling. `lossgeom.landscape.plane_grid` lays the
# grid; both are plotted against the grid coordinates $(\sigma, \tau)$:

# %%
half_width, resolution = 0.5, 121
scales = (1.0, 2.0, 4.0)
S, T, balanced_square = plane_grid([1.0, 1.0], [1.0, 0.0], [0.0, 1.0], half_width, resolution)
L_balanced = product.loss_at(balanced_square)
fixed, transformed = {}, {}
for c_val in scales:
    _, _, square = plane_grid(list(product.orbit_point(c_val)), [1.0, 0.0], [0.0, 1.0], half_width, resolution)
    fixed[c_val] = product.loss_at(square)
    transformed[c_val] = product.loss_at(product.rescale(balanced_square, c_val))
    disc = np.max(np.abs(transformed[c_val] - L_balanced))
    assert disc <= 1e-14
    print(f"c = {fmt(c_val)}: transformed square max |L - L_balanced| = {fmt(disc, 3)}; "
          f"fixed square: max loss {fmt(fixed[c_val].max(), 6)}, max |L - L_balanced| = "
          f"{fmt(np.max(np.abs(fixed[c_val] - L_balanced)), 6)}")
assert np.max(np.abs(fixed[4.0] - L_balanced)) > 1.0

# %%
square_contract = circle_contract.with_(
    centre="(c, 1/c) for c = 1, 2, 4",
    directions="top: fixed axes (1, 0), (0, 1) in (a, b); bottom: the balanced axes mapped by (u, v) -> (c u, v / c)",
    normalisation="top: Euclidean in (a, b); bottom: Euclidean in balanced coordinates",
    radius="square of half-width 0.5 in the grid coordinates (sigma, tau)",
    resolution="121 x 121 grid",
)
levels = np.geomspace(1e-4, 10.0, 11)
fig, axes = plt.subplots(2, 3, figsize=(9.0, 5.6), sharex=True, sharey=True)
for j, c_val in enumerate(scales):
    for i, (field, label) in enumerate(((fixed, "fixed square"), (transformed, "transformed square"))):
        cs = axes[i, j].contour(S, T, np.maximum(field[c_val], 1e-12), levels=levels, norm="log")
        axes[i, j].set_title(f"{label}, c = {fmt(c_val)}", fontsize=9)
        axes[i, j].set_aspect("equal")
for ax in axes[1]:
    ax.set_xlabel(r"grid coordinate $\sigma$")
for ax in axes[:, 0]:
    ax.set_ylabel(r"grid coordinate $\tau$")
fig.colorbar(cs, ax=axes, shrink=0.8, label="training loss (log levels 1e-4 to 10)")
glue_figure("ch03-squares", fig, square_contract,
    "Loss contours over a fixed square (top) change shape with c; over the transformed square (bottom) "
    "every sampled loss equals the c = 1 value")
ledger.add("P10", "Contours over a fixed square around (c,1/c) change with c; over the transformed square every sampled loss is preserved",
           {"transformed: max discrepancy over 3 c x 121^2 points": max(np.max(np.abs(transformed[c_] - L_balanced)) for c_ in scales),
            "fixed square, c=4: max |L - L(c=1)|": float(np.max(np.abs(fixed[4.0] - L_balanced)))})

# %% [markdown]
# ```{glue:figure} fig-ch03-squares
# :name: fig-ch03-squares
#
# {glue:text}`cap-ch03-squares`
# ```
#
# Both rows of {numref}`fig-ch03-squares` are correct pictures. The top row answers "how
# does the loss change under additive noise of a fixed size in these coordinates?", the
# bottom row "how does it change under the perturbations that correspond to the balanced
# ones?". A caption that does not say which one was drawn cannot be compared across
# papers, which is why every figure here carries its contract {cite}`li2018visualizing`.
#
# ## Sharpness-aware steps from equivalent points
#
# Sharpness-aware minimisation {cite}`foret2021sharpness` replaces the loss by its maximum
# over a neighbourhood, $\max_{\lVert \varepsilon \rVert \le \rho} L(\theta + \varepsilon)$,
# and approximates the inner maximum by one normalised gradient step. The objective
# depends on the norm: the circle receipt above already showed that a Euclidean ball of
# the same radius around two equivalent points contains different perturbed functions.
# The step inherits this. `lossgeom.perturbations.sam_step` takes the step in a declared
# metric: with a preconditioner $P$,
#
# $$
# \varepsilon = \rho \, \frac{P g}{\sqrt{g^\top P g}}, \qquad
# \theta' = \theta - \eta \, P \, \nabla L(\theta + \varepsilon),
# $$ (eq-ch03-sam)
#
# which for $P = I$ is plain SAM and for $P = J J^\top$, $J = \operatorname{diag}(c, 1/c)$,
# is the balanced-coordinate SAM step mapped through the rescaling. We start from an
# off-orbit point $u_0 = (1.2, 1.1)$, whose function is $x \mapsto 1.32\,x$, and from its
# images $(1.2c, 1.1/c)$, which implement the same function, and take one step of each kind
# ($\rho = 0.05$, $\eta = 0.1$):

# %%
u0, sam_rho, sam_lr = np.array([1.2, 1.1]), 0.05, 0.1
grad_fn = lambda p: product.gradient(p[0], p[1])
balanced_next = pt.sam_step(grad_fn, u0, sam_rho, sam_lr)
sam_rows = {}
for c_val in (0.5, 2.0, 5.0, 10.0):
    start = product.rescale(u0, c_val)
    J = np.diag([c_val, 1.0 / c_val])
    euclid = pt.sam_step(grad_fn, start, sam_rho, sam_lr)
    consistent = pt.sam_step(grad_fn, start, sam_rho, sam_lr, preconditioner=J @ J.T)
    sam_rows[c_val] = (np.prod(euclid) - np.prod(balanced_next), np.prod(consistent) - np.prod(balanced_next))
    assert abs(sam_rows[c_val][1]) <= 1e-14 and abs(sam_rows[c_val][0]) > 1e-3
    print(f"c = {fmt(c_val):>4}: slope ab after one step: Euclidean SAM {fmt(np.prod(euclid))}, "
          f"transformed-set SAM {fmt(np.prod(consistent))} (balanced start: {fmt(np.prod(balanced_next))})")


# %% [markdown]
# Plain SAM moves equivalent starting points to *different* functions, and the gap grows
# with $c$; the transformed-set step moves them to the same function, up to rounding.
# Iterating shows the difference accumulating over a short run:

# %%
def sam_path(start, steps, preconditioner=None):
    path = [start]
    for _ in range(steps):
        path.append(pt.sam_step(grad_fn, path[-1], sam_rho, sam_lr, preconditioner=preconditioner))
    return np.array(path)


c_run, n_steps = 5.0, 30
J_run = np.diag([c_run, 1.0 / c_run])
slopes = {
    "balanced start, Euclidean SAM": np.prod(sam_path(u0, n_steps), axis=1),
    f"c = {fmt(c_run)}, Euclidean SAM": np.prod(sam_path(product.rescale(u0, c_run), n_steps), axis=1),
    f"c = {fmt(c_run)}, transformed-set SAM": np.prod(sam_path(product.rescale(u0, c_run), n_steps, J_run @ J_run.T), axis=1),
}
names = list(slopes)
assert np.max(np.abs(slopes[names[2]] - slopes[names[0]])) <= 1e-13
for name, values in slopes.items():
    print(f"{name:>34}: slope after {n_steps} steps {fmt(values[-1])}, final loss {fmt(0.5 * (values[-1] - 1) ** 2, 6)}")

# %%
sam_contract = circle_contract.with_(
    centre="start (1.2, 1.1) and its image (1.2 c, 1.1 / c), c = 5",
    directions="SAM ascent direction P g / sqrt(g^T P g) with P = I (Euclidean) or P = J J^T (transformed set)",
    normalisation="Euclidean in (a, b) for plain SAM; Euclidean in balanced coordinates for the transformed set",
    radius="rho = 0.05; step size 0.1", resolution="30 steps",
)
fig, ax = plt.subplots()
for (name, values), style in zip(slopes.items(), ("-", "--", "o")):
    ax.plot(np.arange(n_steps + 1), values, style, ms=3, mfc="none", label=name)
ax.axhline(1.0, color="grey", lw=0.8, ls=":", label="zero-loss slope ab = 1")
ax.set_xlabel("SAM step")
ax.set_ylabel("function: slope ab of x -> ab x")
ax.legend(fontsize=7)
glue_figure("ch03-sam", fig, sam_contract,
    "SAM trajectories in function space from two equivalent starting points: plain SAM separates them, "
    "the transformed-set step keeps them identical")
ledger.add("P9", "A SAM-type objective depends on the norm: Euclidean SAM from equivalent points gives different functions; transformed-set steps give the same",
           {"one step, slope difference Euclidean (c=0.5, 2, 5, 10)": [float(r[0]) for r in sam_rows.values()],
            "one step, slope difference transformed set": "<= 1e-14 for every c",
            "after 30 steps at c=5, Euclidean vs balanced slope": [float(slopes[names[1]][-1]), float(slopes[names[0]][-1])]})

# %% [markdown]
# ```{glue:figure} fig-ch03-sam
# :name: fig-ch03-sam
#
# {glue:text}`cap-ch03-sam`
# ```
#
# {numref}`fig-ch03-sam` separates the invariance question from the efficacy question: the
# transformed-set step is a property of the function, plain SAM is a property of the
# function *and* the coordinates. Neither statement says which one trains better; that
# needs matched training comparisons, not a symmetry argument.
#
# ## Gaussian weight noise is not one intervention
#
# Many flatness measures average the loss under isotropic Gaussian noise on the weights.
# The perturbed loss is a polynomial in independent
# $\varepsilon_1, \varepsilon_2 \sim \mathcal N(0, \sigma^2)$, so its expectation needs
# only the Gaussian moments $\mathbb E\,\varepsilon^k$, which `sympy.stats` supplies; we
# expand, then replace every monomial $\varepsilon_1^i \varepsilon_2^j$ by
# $\mathbb E\,\varepsilon^i \, \mathbb E\,\varepsilon^j$:

# %%
A, B, e1, e2 = sp.symbols("a b epsilon_1 epsilon_2", real=True)
sigma = sp.symbols("sigma", positive=True)
noise = stats.Normal("epsilon", 0, sigma)
moment = {k: sp.simplify(stats.E(noise**k)) for k in range(5)}
perturbed = sp.Poly(sp.expand(sp.Rational(1, 2) * ((A + e1) * (B + e2) - 1) ** 2), e1, e2)
expected = sp.expand(sum(coef * moment[i] * moment[j] for (i, j), coef in perturbed.terms()))
closed = sp.Rational(1, 2) * ((A * B - 1) ** 2 + sigma**2 * (A**2 + B**2) + sigma**4)
assert sp.expand(expected - closed) == 0
display(Math(r"\mathbb E\, L(a + \varepsilon_1, b + \varepsilon_2) = " + sp.latex(closed)))

# %% [markdown]
# At a zero-loss point the expected increase is $\sigma^2 (a^2 + b^2)/2 + \sigma^4/2$,
# which is exactly half the trace of the Hessian times $\sigma^2$ plus a fourth-order
# term. At the two points $(1, 1)$ and $(10, 0.1)$ with $\sigma = 0.01$:

# %%
sd = sp.Rational(1, 100)
increase = {pt_: closed.subs({A: pt_[0], B: pt_[1], sigma: sd}) for pt_ in
            ((1, 1), (10, sp.Rational(1, 10)))}
for (a_val, b_val), inc in increase.items():
    display(Math(rf"\Delta(({sp.latex(a_val)}, {sp.latex(b_val)})) = {sp.latex(inc)} = {sp.latex(sp.Float(inc, 10))}"))
ratio = increase[(10, sp.Rational(1, 10))] / increase[(1, 1)]
display(Math(r"\text{ratio} = " + sp.latex(ratio) + " = " + sp.latex(sp.Float(ratio, 10))))

# %% [markdown]
# The same predictor suffers a fifty times larger expected loss increase at $(10, 0.1)$.
# The reason is visible in function space: the noise perturbs the predictor's slope $ab$
# with variance $\sigma^2(a^2 + b^2) + \sigma^4$, so "noise of size 0.01" is a different
# distribution over functions at the two points. A Monte Carlo check with
# `lossgeom.perturbations.monte_carlo_expected_loss` (numpy's `default_rng`, $10^6$
# samples, seed 0) agrees with the closed form within its standard error:

# %%
mc_rows = {}
for (a_val, b_val), inc in increase.items():
    a_f, b_f = float(a_val), float(b_val)
    mean, se = pt.monte_carlo_expected_loss(a_f, b_f, 0.01, 1_000_000, seed=0)
    exact_f = float(inc)
    z = (mean - exact_f) / se
    assert abs(z) < 4
    assert abs(exact_f - pt.gaussian_expected_loss(a_f, b_f, 0.01)) <= 1e-15
    slope_sd = float(sp.sqrt(sd**2 * (a_val**2 + b_val**2) + sd**4))
    mc_rows[(a_f, b_f)] = (exact_f, mean, se)
    print(f"(a, b) = ({fmt(a_f)}, {fmt(b_f)}): exact {fmt(exact_f)}, Monte Carlo {fmt(mean, 6)} +- {fmt(se, 2)} "
          f"(z = {z:+.2f}); sd of the perturbed slope ab: {fmt(slope_sd, 6)}")
glue("ch03-noise-ratio", float(ratio), display=False)
ledger.add("M1", "Isotropic Gaussian noise (sd 0.01) at (1,1) and at (10,0.1) is not the same intervention on the function",
           {"E increase at (1,1)": str(increase[(1, 1)]), "E increase at (10,0.1)": str(increase[(10, sp.Rational(1, 10))]),
            "ratio": float(ratio), "Monte Carlo (1e6 samples)": [m[1] for m in mc_rows.values()]})

# %% [markdown]
# The ratio of expected increases is {glue:text}`ch03-noise-ratio:.8g`: half the ratio of
# Hessian traces, to within the fourth-order term. Noise-based sharpness is therefore no
# more coordinate-free than the Hessian; it becomes meaningful only with a declared noise
# model that says why weights, rather than functions, are perturbed
# {cite}`neyshabur2017exploring`.
#
# ## What this establishes
#
# A perturbation experiment is invariant under a reparametrisation exactly when its set is
# transformed with the coordinates; the product identity {eq}`eq-ch03-identity` makes that
# exact for finite perturbations, and the grid receipt confirms it point by point. A fixed
# Euclidean set, a fixed square in a landscape plot, or isotropic weight noise of fixed
# size, each applied at two equivalent points, are different experiments on the same
# function, and a SAM step taken with a Euclidean radius sends equivalent points to
# different functions. Grid maxima are lower bounds; the exact maximum here needed a derivation. None
# of this says which perturbation set is scientifically right; that is a modelling
# decision the measurement contract must state.
#
# ## Results ledger

# %%
ledger
