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
# (ch-family-of-minima)=
# # One predictor, a family of minima
#
# How much can the curvature of a minimum change while the trained predictor stays exactly
# the same? This chapter answers the question on the smallest model where it can be
# answered in closed form: two scalar weights multiplied together. Every result is derived
# symbolically with sympy and asserted exactly, then checked against torch autograd through
# `lossgeom.product`. The model makes the rescaling argument of {cite:t}`dinh2017sharp` concrete: a curve of
# zero-loss points that all implement the same function, whose Hessian's largest
# eigenvalue nevertheless runs from 2 to infinity.
#
# **Claims established here** (ids from the book's claim list): P1, P2, P3, P4, P5, P6.
#
# We load the tools once: sympy for the exact work, torch in float64 for the numeric
# checks, and the book's plot style.

# %%
import numpy as np
import sympy as sp
import torch
import matplotlib.pyplot as plt
from IPython.display import Math, display
from myst_nb import glue

from lossgeom import product
from lossgeom.contract import MeasurementContract
from lossgeom.display import fmt, glue_figure, Plain, use_book_style
from lossgeom.ledger import Ledger

torch.set_default_dtype(torch.float64)
use_book_style()
ledger = Ledger("Chapter 2: one predictor, a family of minima")

# %% [markdown]
# ## The model and its orbit
#
# The predictor is $f(a, b; x) = a b x$, trained on the single example $(x, y) = (1, 1)$
# with the square loss
#
# $$
# L(a, b) = \tfrac12 \, (a b - 1)^2 .
# $$ (eq-ch02-loss)
#
# For every $c > 0$ the point $(a, b) = (c, 1/c)$ gives the product $ab = 1$. We let sympy
# confirm that such a point implements the identity map on *every* input $x$, not just on
# the training example, and that its loss {eq}`eq-ch02-loss` is zero:

# %%
a, b, x, y = sp.symbols("a b x y", real=True)
c = sp.symbols("c", positive=True)
f = a * b * x
L = sp.Rational(1, 2) * (a * b * x - y) ** 2
L_train = L.subs({x: 1, y: 1})
on_orbit = {a: c, b: 1 / c}

assert sp.simplify(f.subs(on_orbit) - x) == 0
assert sp.simplify(L_train.subs(on_orbit)) == 0
display(Math(r"f(c, 1/c; x) = " + sp.latex(sp.simplify(f.subs(on_orbit)))))

# %% [markdown]
# The rescaling $(a, b) \mapsto (c a, b / c)$ therefore moves along a curve of minima,
# the *orbit*, without changing the function. Two parameter points on it are two names for
# one predictor; any quantity that differs between them describes the names, not the
# predictor. That is claim P1, and it is exact:

# %%
rescaled = {a: c * a, b: b / c}
assert sp.simplify(f.subs(rescaled, simultaneous=True) - f) == 0
ledger.add("P1", "Every (a,b) with ab=1 implements x -> x on every input and has zero loss on (1,1)",
           "exact: f(c,1/c;x) - x = 0 and L(c,1/c) = 0 for all c > 0 (sympy)")

# %% [markdown]
# ## Gradient and Hessian
#
# Differentiating {eq}`eq-ch02-loss` by hand gives the gradient $((ab-1)b,\ (ab-1)a)$. We
# derive it and the Hessian with sympy:

# %%
params = [a, b]
grad = sp.Matrix([sp.diff(L_train, v) for v in params])
H = sp.hessian(L_train, params)
display(Math(r"\nabla L = " + sp.latex(sp.factor(grad)) + r",\qquad \nabla^2 L = " + sp.latex(sp.expand(H))))

# %% [markdown]
# Every term that carries the residual $ab - 1$ vanishes on the orbit. Substituting
# $b = 1/a$ shows the Hessian becomes the outer product of $(b, a)$ with itself, whose
# eigenvalues are $0$ and $a^2 + b^2$:

# %%
on_curve = {b: 1 / a}
outer = sp.Matrix([b, a]) * sp.Matrix([b, a]).T
assert sp.simplify(grad.subs(on_curve)) == sp.zeros(2, 1)
assert sp.simplify(H.subs(on_curve) - outer.subs(on_curve)) == sp.zeros(2, 2)
eigs = H.subs(on_curve).eigenvals()
assert {sp.simplify(e) for e in eigs} == {0, sp.simplify((a**2 + b**2).subs(on_curve))}
display(Math(r"\nabla^2 L\big|_{ab=1} = (b, a)^\top (b, a), \quad \operatorname{spec} = \{"
             + ", ".join(sp.latex(sp.simplify(e)) for e in eigs) + r"\}"))

# %% [markdown]
# The package implements the same formulas (`lossgeom.product.gradient` and
# `lossgeom.product.hessian`); we compare them with the sympy expressions and with
# torch autograd (`lossgeom.product.hessian_autograd`, which calls `torch.func.hessian`)
# at points on and off the orbit:

# %%
sym_H = sp.lambdify((a, b), H)
sym_grad = sp.lambdify((a, b), grad)
points = [(1.0, 1.0), (10.0, 0.1), (0.3, 2.0), (0.0, 0.0), (-1.5, 0.4)]
err_formula = max(np.abs(product.hessian(p, q) - np.array(sym_H(p, q), dtype=float)).max() for p, q in points)
err_autograd = max(np.abs(product.hessian(p, q) - product.hessian_autograd(p, q)).max() for p, q in points)
err_grad = max(np.abs(product.gradient(p, q) - np.array(sym_grad(p, q), dtype=float).ravel()).max() for p, q in points)
assert err_formula <= 1e-13 and err_autograd <= 1e-12 and err_grad <= 1e-13
print(f"largest entry difference: package vs sympy {fmt(err_formula, 3)}, "
      f"package vs autograd {fmt(err_autograd, 3)}, gradients {fmt(err_grad, 3)}")
ledger.add("P2", "Gradient ((ab-1)b,(ab-1)a); at ab=1 the Hessian is (b,a)(b,a)^T with eigenvalues 0 and a^2+b^2",
           {"symbolic": "exact (sympy)", "max |package - autograd|": err_autograd})

# %% [markdown]
# The three implementations agree to rounding on all five points.
#
# ## Curvature along the orbit
#
# At $(c, 1/c)$ the nonzero eigenvalue is
#
# $$
# \lambda_{\max}(c) = c^2 + c^{-2} ,
# $$ (eq-ch02-lambda)
#
# implemented as `lossgeom.product.nonzero_eigenvalue`. Sympy finds its only critical
# point for $c > 0$, its minimum value, and its limits at both ends of the orbit:

# %%
lam = sp.simplify((a**2 + b**2).subs(on_orbit))
critical = sp.solve(sp.diff(lam, c), c)
limits = (sp.limit(lam, c, 0, "+"), sp.limit(lam, c, sp.oo))
assert critical == [1] and lam.subs(c, 1) == 2 and limits == (sp.oo, sp.oo)
assert sp.simplify(sp.diff(lam, c, 2).subs(c, 1)) > 0
lam_at_10 = lam.subs(c, 10)
display(Math(r"\lambda_{\max}(c) = " + sp.latex(lam) + r",\quad \lambda_{\max}(10) = "
             + sp.latex(lam_at_10) + " = " + sp.latex(sp.Float(lam_at_10, 8))))

# %% [markdown]
# So the balanced point $c = 1$ is the flattest member of the family, with
# $\lambda_{\max} = 2$, and $c = 10$ already has $\lambda_{\max} = 10001/100$, about fifty
# times more, for the same function. We check {eq}`eq-ch02-lambda` against the eigenvalues
# of the autograd Hessian over the declared range $c \in [10^{-1}, 10^{1}]$:

# %%
c_grid = np.geomspace(0.1, 10.0, 41)
auto_eigs = np.array([np.linalg.eigvalsh(product.hessian_autograd(*product.orbit_point(ci))) for ci in c_grid])
closed = product.nonzero_eigenvalue(c_grid)
rel_err = np.max(np.abs(auto_eigs[:, 1] - closed) / closed)
zero_err = np.max(np.abs(auto_eigs[:, 0]) / closed)
assert rel_err <= 1e-13 and zero_err <= 1e-13
lam10_autograd = auto_eigs[-1, 1]
print(f"41 points, c in [0.1, 10]: max relative error of c^2 + c^-2 vs autograd = {fmt(rel_err, 3)}; "
      f"largest |zero eigenvalue| / lambda_max = {fmt(zero_err, 3)}")
print(f"lambda_max at c = 10: closed form {fmt(product.nonzero_eigenvalue(10.0))}, autograd {fmt(lam10_autograd)}")
glue("ch02-lam10", float(lam10_autograd), display=False)
glue("ch02-lam-relerr", Plain(fmt(rel_err, 2)), display=False)

# %% [markdown]
# The figure draws the closed form and marks the autograd eigenvalues; its caption
# carries the measurement contract, written once as a `MeasurementContract`:

# %%
eig_contract = MeasurementContract(
    centre="the orbit point (c, 1/c), one centre per c", directions="all of parameter space (full 2x2 Hessian)",
    normalisation="Euclidean coordinates (a, b), unnormalised", radius="n/a (second derivative at the point)",
    loss="L = 1/2 (abx - y)^2", reduction="single example", data="(x, y) = (1, 1)",
    model_mode="n/a (no layers with state)", resolution="41 log-spaced c in [0.1, 10]", precision="float64",
)
fig, ax = plt.subplots()
c_fine = np.geomspace(0.1, 10.0, 400)
ax.loglog(c_fine, product.nonzero_eigenvalue(c_fine), label=r"closed form $c^2 + c^{-2}$")
ax.loglog(c_grid, auto_eigs[:, 1], "o", ms=3, label="autograd Hessian eigenvalue")
ax.axhline(2.0, color="grey", lw=0.8, ls="--", label="minimum 2 at c = 1")
ax.set_xlabel("rescaling c (point (c, 1/c))")
ax.set_ylabel(r"largest Hessian eigenvalue $\lambda_{\max}$")
ax.legend()
glue_figure("ch02-eigenvalue", fig, eig_contract,
    "Largest Hessian eigenvalue along the zero-loss orbit; every point implements the same function x -> x")

# %% [markdown]
# ```{glue:figure} fig-ch02-eigenvalue
# :name: fig-ch02-eigenvalue
#
# {glue:text}`cap-ch02-eigenvalue`
# ```
#
# {numref}`fig-ch02-eigenvalue` is the whole argument of
# {cite:t}`dinh2017sharp` in two parameters: the autograd eigenvalue at $c = 10$ is
# {glue:text}`ch02-lam10:.8g` (largest relative deviation from the closed form over the grid:
# {glue:text}`ch02-lam-relerr`), while predictions, training loss and risk under any
# distribution are those of $c = 1$.

# %%
ledger.add("P3", "At (c,1/c) the nonzero eigenvalue is c^2+c^-2: minimum 2 at c=1, unbounded at both ends; autograd agrees",
           {"lambda_max(10), autograd": lam10_autograd, "exact": str(lam_at_10), "max rel. error on 41 c": rel_err},
           reported=100.01)

# %% [markdown]
# ## The flat direction is not a flat line
#
# The zero eigenvalue has eigenvector $(a, -b)$, and at $(c, 1/c)$ that is exactly the
# tangent of the orbit $t \mapsto (c e^{t}, e^{-t}/c)$. A zero eigenvalue is a statement
# about second order at one point. Moving a finite distance $s$ along the *straight*
# tangent line leaves the orbit, because the orbit is curved, and the loss rises as $s^4$:

# %%
t, s = sp.symbols("t s", real=True)
orbit = sp.Matrix([c * sp.exp(t), sp.exp(-t) / c])
tangent = sp.diff(orbit, t).subs(t, 0)
H_c = H.subs(on_orbit)
assert sp.simplify(H_c * tangent) == sp.zeros(2, 1)
unit = tangent / sp.sqrt(tangent.dot(tangent))
line = orbit.subs(t, 0) + s * unit
loss_line = sp.simplify(L_train.subs({a: line[0], b: line[1]}))
loss_orbit = sp.simplify(L_train.subs({a: orbit[0], b: orbit[1]}))
assert loss_orbit == 0
assert sp.simplify(loss_line - s**4 / (2 * (c**2 + c**-2) ** 2)) == 0
display(Math(r"L\big(\text{straight step } s\big) = " + sp.latex(sp.factor(loss_line))
             + r",\qquad L\big(\text{orbit}\big) = 0"))

# %% [markdown]
# At the same Euclidean step the rise is smaller for larger $c$, because the curvature of
# the orbit in these coordinates is spread over a longer tangent. We evaluate both paths
# numerically with `lossgeom.product.loss_at` for $c \in \{1, 3\}$ and compare with the
# closed form:

# %%
steps = np.linspace(-0.5, 0.5, 101)
straight = {}
for c_val in (1.0, 3.0):
    centre = np.array(product.orbit_point(c_val))
    direction = np.array([c_val, -1.0 / c_val]) / np.hypot(c_val, 1.0 / c_val)
    straight[c_val] = product.loss_at(centre + steps[:, None] * direction)
    exact = steps**4 / (2 * product.nonzero_eigenvalue(c_val) ** 2)
    assert np.max(np.abs(straight[c_val] - exact)) <= 1e-15
    orbit_pts = np.stack([c_val * np.exp(steps), np.exp(-steps) / c_val], axis=-1)
    assert np.max(product.loss_at(orbit_pts)) <= 1e-30
    print(f"c = {fmt(c_val)}: loss after a straight step of 0.5 = {fmt(straight[c_val][-1])}; "
          f"along the orbit the largest loss is {fmt(np.max(product.loss_at(orbit_pts)), 3)}")

# %%
tangent_contract = eig_contract.with_(
    centre="(c, 1/c) for c = 1 and c = 3", directions="the unit zero-eigenvalue eigenvector (c, -1/c)/|(c, -1/c)|; the orbit (c e^t, e^-t / c)",
    normalisation="straight line: Euclidean step s; orbit: parameter t = s", radius="|s| <= 0.5",
    resolution="101 steps",
)
fig, ax = plt.subplots()
for c_val, style in ((1.0, "-"), (3.0, "--")):
    ax.plot(steps, straight[c_val], style, label=f"straight tangent line, c = {fmt(c_val)}")
ax.plot(steps, np.zeros_like(steps), ":", color="k", label="along the orbit (any c)")
ax.set_xlabel("step s along the zero-eigenvalue direction")
ax.set_ylabel("training loss L")
ax.legend()
glue_figure("ch02-tangent", fig, tangent_contract,
    "Loss along the straight zero-curvature direction rises as s^4, while the curved orbit stays at zero")
ledger.add("P4", "The zero eigenvalue is the orbit's tangent, yet a finite straight step along it raises the loss",
           {"straight-line loss": "s^4 / (2 (c^2 + c^-2)^2) (sympy)", "loss at s=0.5, c=1": float(straight[1.0][-1])})

# %% [markdown]
# ```{glue:figure} fig-ch02-tangent
# :name: fig-ch02-tangent
#
# {glue:text}`cap-ch02-tangent`
# ```
#
# {numref}`fig-ch02-tangent` separates two statements that are easy to conflate: the
# quadratic model at the minimum is flat along the tangent, and the loss along a straight
# line in that direction is not.
#
# ## Away from the orbit the formula changes
#
# The outer-product form holds only where the residual vanishes. At a general point the
# Hessian's off-diagonal entry is $2ab - 1$, not $ab$, and its determinant decides whether
# there is negative curvature. Sympy factors it:

# %%
det = sp.factor(sp.expand(H.det()))
assert sp.simplify(det + (a * b - 1) * (3 * a * b - 1)) == 0
origin_eigs = H.subs({a: 0, b: 0}).eigenvals()
assert origin_eigs == {-1: 1, 1: 1}
display(Math(r"\det \nabla^2 L = " + sp.latex(det) + r",\qquad \operatorname{spec}\nabla^2 L(0,0) = \{-1, 1\}"))

# %% [markdown]
# So the Hessian has a negative eigenvalue exactly where $(ab-1)(3ab-1) > 0$, that is for
# $ab < 1/3$ or $ab > 1$: the origin is a saddle, and just beyond the orbit ($ab > 1$) the
# curvature is indefinite too. Between $1/3$ and $1$ it is positive definite. We check the
# sign rule on random points with autograd:

# %%
rng = np.random.default_rng(0)
samples = rng.uniform(-2.0, 2.0, size=(400, 2))
min_eig = np.array([np.linalg.eigvalsh(product.hessian_autograd(p, q))[0] for p, q in samples])
prod_ab = samples[:, 0] * samples[:, 1]
predicted_negative = (prod_ab - 1) * (3 * prod_ab - 1) > 0
assert np.array_equal(min_eig < 0, predicted_negative)
print(f"400 random points in [-2, 2]^2: {int(predicted_negative.sum())} have a negative eigenvalue, "
      f"all exactly where (ab - 1)(3ab - 1) > 0")
ledger.add("P5", "Away from ab=1 residual terms enter the Hessian; negative curvature near the origin",
           {"det H": str(det), "spec H(0,0)": "{-1, 1}", "random points matching the sign rule": "400 of 400"})

# %% [markdown]
# ## How a Hessian transforms
#
# If parameters are written as $\theta = \varphi(\psi)$ with Jacobian $J = D\varphi$, the
# chain rule gives
#
# $$
# \nabla^2_\psi (L \circ \varphi) = J^\top \, \nabla^2_\theta L \, J
#   + \sum_k \partial_{\theta_k} L \; \nabla^2_\psi \varphi_k .
# $$ (eq-ch02-chain)
#
# At a critical point the second term vanishes and only the congruence $J^\top H J$
# remains. Congruence keeps the signs of the eigenvalues (Sylvester's law of inertia) but
# not their sizes. The linear rescaling is the cleanest case: with
# $J = \operatorname{diag}(c, 1/c)$, the Hessian at $(c, 1/c)$ maps back to the Hessian at
# $(1, 1)$:

# %%
J_lin = sp.diag(c, 1 / c)
pulled = sp.simplify(J_lin.T * H_c * J_lin)
assert sp.simplify(pulled - H.subs({a: 1, b: 1})) == sp.zeros(2, 2)
display(Math(r"J^\top \nabla^2 L(c, 1/c)\, J = " + sp.latex(pulled)
             + r"\quad\text{whose eigenvalues are } \{0, 2\}, \text{ not } \{0, c^2 + c^{-2}\}"))

# %% [markdown]
# A nonlinear reparametrisation shows the second term of {eq}`eq-ch02-chain`. In
# logarithmic coordinates $a = e^{\alpha}$, $b = e^{\beta}$ the orbit becomes the straight
# line $\alpha + \beta = 0$, and the extra term is $(ab - 1)\,ab\, I$, which vanishes only
# on the orbit:

# %%
al, be = sp.symbols("alpha beta", real=True)
phi = {a: sp.exp(al), b: sp.exp(be)}
L_log = L_train.subs(phi)
H_log = sp.hessian(L_log, [al, be])
J_log = sp.Matrix([[sp.exp(al), 0], [0, sp.exp(be)]])
extra = sp.simplify(H_log - J_log.T * H.subs(phi) * J_log)
expected_extra = ((a * b - 1) * a * b * sp.eye(2)).subs(phi)
assert sp.simplify(extra - expected_extra) == sp.zeros(2, 2)
assert sp.simplify(extra.subs(be, -al)) == sp.zeros(2, 2)
display(Math(r"\nabla^2_{(\alpha,\beta)} L - J^\top \nabla^2 L\, J = " + sp.latex(sp.simplify(extra))))


# %% [markdown]
# The same identity, numerically: at the non-critical point $(a, b) = (2, 1)$ the autograd
# Hessian in log coordinates differs from $J^\top H J$ by $(ab-1)ab\,I = 2I$, and at the
# critical point $(2, 1/2)$ by nothing:

# %%
def log_coordinate_hessian(a_val, b_val):
    log_params = {"alpha": torch.tensor(np.log(a_val)), "beta": torch.tensor(np.log(b_val))}
    loss_fn = lambda p: product.loss({"a": torch.exp(p["alpha"]), "b": torch.exp(p["beta"])})
    from lossgeom.curvature import dense_hessian
    return dense_hessian(loss_fn, log_params).numpy()


for a_val, b_val in ((2.0, 1.0), (2.0, 0.5)):
    J_num = np.diag([a_val, b_val])
    gap = log_coordinate_hessian(a_val, b_val) - J_num.T @ product.hessian(a_val, b_val) @ J_num
    predicted = (a_val * b_val - 1) * a_val * b_val * np.eye(2)
    assert np.max(np.abs(gap - predicted)) <= 1e-12
    print(f"(a, b) = ({fmt(a_val)}, {fmt(b_val)}): H_log - J^T H J = diag({fmt(gap[0, 0], 6)}, {fmt(gap[1, 1], 6)})")
ledger.add("P6", "Under a reparametrisation the Hessian at a critical point becomes J^T H J; elsewhere an extra gradient term appears",
           {"linear rescaling": "J^T H(c,1/c) J = H(1,1) (sympy)", "log coordinates extra term": str(sp.simplify(expected_extra))})

# %% [markdown]
# ## What this establishes
#
# On one exactly solvable model: the training loss, the predictions on every input and
# hence the risk under every distribution are constant along the orbit $ab = 1$, while the
# largest Hessian eigenvalue takes every value in $[2, \infty)$. A number such as
# $\lambda_{\max}$ is therefore a property of the *parametrisation together with* the
# predictor; reporting it as a property of the predictor alone needs a convention that
# fixes the coordinates. The chapter does not say that curvature is useless: within one
# declared parametrisation it still governs step-size stability (Part II). The next chapter
# asks the same question of perturbation-based sharpness.
#
# ## Results ledger

# %%
ledger
