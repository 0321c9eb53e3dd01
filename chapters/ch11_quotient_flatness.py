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
# (ch-quotient-flatness)=
# # Quotient flatness
#
# A two-layer ReLU network $F(x) = \sum_r a_r \operatorname{ReLU}(w_r^\top x)$ computes the
# same function after every neuron's outgoing weight is divided by a positive number and
# its incoming weights are multiplied by it. The trace of the loss Hessian, the most common
# flatness number, does not survive this change of coordinates {cite}`dinh2017sharp`. Can
# flatness be measured on the space of functions-up-to-rescaling instead, and does it then
# keep the promises made for it? {cite:t}`miyagawa2026symmetry` proposes a chain of
# implications on that quotient space: linear stability of SGD bounds quotient flatness,
# quotient flatness bounds input smoothness, and input smoothness bounds the generalisation
# error. This chapter derives each link, checks it numerically through `lossgeom.quotient`,
# reproduces the source's teacher-student experiments at a laptop's scale while sweeping
# the initialisation scale the source leaves open, and draws raw and quotient loss slices of
# a classifier trained on real digits.
#
# **Claims established here:** Q1, Q2, Q3, Q4, Q5, Q6.
#
# We use sympy for the exact work, torch in float64 on one thread, and the book's package:

# %% tags=["remove-cell"]
# Only on Google Colab: install the book's package and what the chapter imports.
import subprocess, sys
if "google.colab" in sys.modules:
    book = "lossgeom[book] @ git+https://github.com/lossgeom/same-function-different-geometry@main"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", book], check=True)

# %%
import itertools

import numpy as np
import sympy as sp
import torch
import matplotlib.pyplot as plt
from IPython.display import Math, display
from scipy.stats import spearmanr
from threadpoolctl import threadpool_limits

from lossgeom import data, flatness
from lossgeom import quotient as qt
from lossgeom.contract import MeasurementContract
from lossgeom.curvature import dense_hessian
from lossgeom.display import fmt, glue_figure, glue_value, rounding_level, use_book_style
from lossgeom.landscape import plane_grid
from lossgeom.ledger import Ledger
from lossgeom.optimisers import indexed_loss, sgd, train
from lossgeom.symmetries import audit_symmetry, relu_neuron_rescaling

torch.set_default_dtype(torch.float64)
torch.set_num_threads(1)
threadpool_limits(limits=1)
use_book_style()
ledger = Ledger("Quotient flatness")

# %% [markdown]
# ## The rescaling orbit
#
# ReLU is positively homogeneous, $\operatorname{ReLU}(cz) = c\operatorname{ReLU}(z)$ for
# $c > 0$. Sympy checks it on both activation regions and at the kink:

# %%
c, q = sp.symbols("c q", positive=True)
relu = lambda t: sp.Max(0, t)
assert all(sp.simplify(relu(c * z) - c * relu(z)) == 0 for z in (q, -q, 0))

# %% [markdown]
# So the rescaling $(a_r, w_r) \mapsto (a_r / c_r,\, c_r w_r)$ does not change which neurons
# are active on which inputs. On a fixed activation pattern the network is a polynomial,
# and we can let sympy differentiate it. We take $m = 2$ neurons, $d = 2$ inputs and $n = 2$
# examples, write $s_{ri} \in \{0, 1\}$ for the indicator that neuron $r$ is active on
# $x_i$, and use the square loss $L = \frac{1}{2n}\sum_i (F(x_i) - y_i)^2$ throughout:

# %%
m, d, n = 2, 2, 2
X, y = sp.Matrix(n, d, sp.symbols("x1:5", real=True)), sp.Matrix(sp.symbols("y1:3", real=True))
S = sp.Matrix(m, n, sp.symbols("s1:5", nonnegative=True))
a, W = sp.Matrix(sp.symbols("a1:3", real=True)), sp.Matrix(m, d, sp.symbols("w1:5", real=True))
row_dot = lambda A, r, B, i: (A[r, :] * B[i, :].T)[0]


# %% [markdown]
# The network, its loss, and a helper that uses $s^2 = s$ on an activation region:

# %%
def network(a, W):
    outputs = [sum(a[r] * S[r, i] * row_dot(W, r, X, i) for r in range(m)) for i in range(n)]
    return sp.Matrix(outputs)

def square_loss(a, W):
    return sum((network(a, W)[i] - y[i]) ** 2 for i in range(n)) / (2 * n)

def on_region(expr):
    return sp.expand(expr).replace(lambda e: e.is_Pow and e.base in S, lambda e: e.base)


# %% [markdown]
# The rescaling with two independent scales $c_1, c_2 > 0$ leaves every output unchanged:

# %%
scales = sp.symbols("c1:3", positive=True)
a_moved = sp.Matrix([a[r] / scales[r] for r in range(m)])
W_moved = sp.Matrix.vstack(*[scales[r] * W[r, :] for r in range(m)])
assert sp.expand(network(a_moved, W_moved) - network(a, W)) == sp.zeros(n, 1)

# %% [markdown]
# The raw Hessian trace is another matter. Because $F$ is bilinear in $(a_r, w_r)$, its own
# Hessian has only mixed $a_r$-$w_r$ blocks, so the residual term has zero trace and
#
# $$
# \operatorname{tr} \nabla^2 L(a, W) = \sum_r (P_r + Q_r),\qquad
# P_r = \frac1n \sum_i s_{ri} (w_r^\top x_i)^2,\quad
# Q_r = \frac1n \sum_i s_{ri}\, a_r^2 \lVert x_i\rVert^2,
# $$ (eq-ch11-raw-trace)
#
# at every parameter point off the kinks, not only at minima. Sympy confirms it:

# %%
theta = [*a, *W]
raw_trace = on_region(sp.hessian(square_loss(a, W), theta).trace())
P = [sum(S[r, i] * row_dot(W, r, X, i) ** 2 for i in range(n)) / n for r in range(m)]
Q = [sum(S[r, i] * a[r] ** 2 * row_dot(X, i, X, i) for i in range(n)) / n for r in range(m)]
assert sp.expand(raw_trace - sum(P) - sum(Q)) == 0

# %% [markdown]
# Evaluating the same trace at the moved point gives its formula along the orbit:

# %%
at_moved = dict(zip(theta, [*a_moved, *W_moved]))
trace_on_orbit = on_region(raw_trace.subs(at_moved, simultaneous=True))
orbit_formula = sum(scales[r] ** 2 * P[r] + Q[r] / scales[r] ** 2 for r in range(m))
assert sp.expand(trace_on_orbit - orbit_formula) == 0
display(Math(r"\operatorname{tr}\nabla^2 L(c) = \sum_r \Big(c_r^2 P_r + \frac{Q_r}{c_r^2}\Big)"))

# %% [markdown]
# With one common scale $c$ the trace is $Pc^2 + Q/c^2$: it has a single minimum and grows
# without bound at both ends of the orbit, while the function stays the same:

# %%
P_all, Q_all = sp.symbols("P Q", positive=True)
orbit_trace = P_all * c**2 + Q_all / c**2
c_best = sp.solve(sp.diff(orbit_trace, c), c)
assert c_best == [(Q_all / P_all) ** sp.Rational(1, 4)] and sp.limit(orbit_trace, c, 0) == sp.oo
display(Math(r"c^\star = (Q/P)^{1/4},\quad \min_c \operatorname{tr}\nabla^2 L = "
             + sp.latex(sp.simplify(orbit_trace.subs(c, c_best[0])))))

# %% [markdown]
# We audit this on the source's teacher-student set-up (described in full below): a
# student of width 10 on $n = 25$ inputs in $d = 4$, at its seeded initialisation, as a
# torch module with its parameters in a dict:

# %%
task = qt.teacher_student(n=25, d=4, m_teacher=4, seed=0)
student = qt.two_layer_relu(4, 10, seed=0)
params = {name: p.detach() for name, p in student.named_parameters()}
forward = lambda p, x: torch.func.functional_call(student, p, (x,))

# %% [markdown]
# The symmetry audit (`lossgeom.symmetries.audit_symmetry`) applies
# `lossgeom.symmetries.relu_neuron_rescaling` with every $c_r = 10$, checks that the
# outputs agree, and only then recomputes the raw trace (`lossgeom.flatness.raw_hessian_trace`):

# %%
raw_trace_of = lambda p: float(flatness.raw_hessian_trace(*qt.two_layer_weights(p), task.x))
times_ten = relu_neuron_rescaling("0", "2", [10.0] * 10)
report = audit_symmetry(forward, params, times_ten, task.x, tol=1e-12, measure=raw_trace_of)


# %% [markdown]
# The audit's receipt, with the output discrepancy reported against a rounding floor:

# %%
def show_audit(report):
    print(f"{report.symmetry}\nlargest output discrepancy on {report.probe_size} inputs: "
          f"{rounding_level(report.max_output_discrepancy, 1e-12)}")
    if report.measure_name is not None:
        print(f"measure before {fmt(report.measure_before)}, after {fmt(report.measure_after)}")

show_audit(report)

# %% [markdown]
# The outputs agree to rounding and the raw trace changes many-fold. The closed form
# {eq}`eq-ch11-raw-trace` agrees with the dense autograd Hessian
# (`lossgeom.curvature.dense_hessian`) at points across the orbit:

# %%
loss_of = lambda p: 0.5 * ((forward(p, task.x)[:, 0] - task.y) ** 2).mean()
orbit_scales = (0.1, 1.0, 10.0)
moved = {s: relu_neuron_rescaling("0", "2", [s] * 10)(params) for s in orbit_scales}
autograd_traces = [float(dense_hessian(loss_of, p).trace()) for p in moved.values()]
closed_traces = [raw_trace_of(p) for p in moved.values()]

# %%
closed_vs_autograd = max(abs(t / u - 1) for t, u in zip(closed_traces, autograd_traces))
print("raw trace at c = 0.1, 1, 10:", ", ".join(fmt(t) for t in closed_traces),
      "| closed form vs autograd:", rounding_level(closed_vs_autograd, 1e-12))

# %% [markdown]
# ## Coordinates on the quotient
#
# The invariants of the rescaling are
#
# $$
# \alpha_r = a_r \lVert w_r\rVert \in \mathbb{R}, \qquad u_r = w_r / \lVert w_r\rVert \in S^{d-1},
# \qquad F(x) = \sum_r \alpha_r \operatorname{ReLU}(u_r^\top x),
# $$ (eq-ch11-quotient)
#
# defined wherever every $w_r \neq 0$ (the regular part of the quotient). Sympy checks the
# invariance for one neuron in $d = 3$:

# %%
w_vec, a_scalar = sp.Matrix(sp.symbols("v1:4", real=True)), sp.Symbol("a", real=True)
norm = lambda v: sp.sqrt((v.T * v)[0])
assert sp.simplify(a_scalar / c * norm(c * w_vec) - a_scalar * norm(w_vec)) == 0
assert sp.simplify(c * w_vec / norm(c * w_vec) - w_vec / norm(w_vec)) == sp.zeros(3, 1)

# %% [markdown]
# We give the quotient $(\mathbb{R}\times S^{d-1})^m$ the product metric: Euclidean in
# each $\alpha_r$, the round metric of the unit sphere in each $u_r$. **Quotient flatness**
# $\operatorname{Flat}^Q$ is the trace of the Riemannian Hessian of $L$ in that metric
# {cite}`absil2008optimization`. Two facts give it in closed form. First, the quotient
# gradient of $F(x)$ has, for neuron $r$, the components
# $\operatorname{ReLU}(u_r^\top x)$ along $\alpha_r$ and
# $\alpha_r s_r (I - u_r u_r^\top) x$ on the sphere. Second, $F$ is linear along $u_r$ away
# from the kink, so its Riemannian Hessian on the sphere is $-(u_r^\top \nabla_{u_r} F)$
# times the identity on the tangent space, whose trace summed over neurons is $-(d-1)F$.
# Hence, with residuals $r_i = F(x_i) - y_i$,
#
# $$
# \operatorname{Flat}^Q = \underbrace{\frac1n \sum_i \sum_r s_{ri}\Big((u_r^\top x_i)^2
# + \alpha_r^2\big(\lVert x_i\rVert^2 - (u_r^\top x_i)^2\big)\Big)}_{\operatorname{Flat}^Q_{\rm GN}}
# \; - \; (d-1)\,\frac1n\sum_i r_i F(x_i).
# $$ (eq-ch11-flatq)
#
# The first term is the Gauss-Newton part; at an interpolant (every $r_i = 0$) it is all of
# $\operatorname{Flat}^Q$. For $d = 2$ the angle $\varphi_r$ with
# $u_r = (\cos\varphi_r, \sin\varphi_r)$ is an arc-length chart of the circle, so the ordinary
# Hessian in $(\alpha, \varphi)$ is the Riemannian one. Sympy computes its trace:

# %%
alpha, phi = sp.Matrix(sp.symbols("alpha1:3", real=True)), sp.symbols("phi1:3", real=True)
U = sp.Matrix([[sp.cos(p), sp.sin(p)] for p in phi])
U_perp = sp.Matrix([[-sp.sin(p), sp.cos(p)] for p in phi])
quotient_trace = on_region(sp.hessian(square_loss(alpha, U), [*alpha, *phi]).trace())

# %% [markdown]
# It equals {eq}`eq-ch11-flatq`, where in $d = 2$ the term $\lVert x\rVert^2 - (u^\top x)^2$
# is $(u_\perp^\top x)^2$:

# %%
F_q = network(alpha, U)
neuron_term = lambda r, i: row_dot(U, r, X, i) ** 2 + alpha[r] ** 2 * row_dot(U_perp, r, X, i) ** 2
gauss_newton = sum(S[r, i] * neuron_term(r, i) for r in range(m) for i in range(n)) / n
residual_term = -(d - 1) * sum((F_q[i] - y[i]) * F_q[i] for i in range(n)) / n
assert on_region(quotient_trace - gauss_newton - residual_term) == 0
pythagoras = row_dot(X, 0, X, 0) - row_dot(U, 0, X, 0) ** 2 - row_dot(U_perp, 0, X, 0) ** 2
assert sp.simplify(pythagoras) == 0

# %% [markdown]
# For $d \ge 3$ there is no arc-length chart, so we use the retraction
# $u(v) = (u + E v)/\lVert u + E v\rVert$ with $E$ an orthonormal basis of $u^\perp$. At
# $u = e_1$ in $d = 3$ it is an isometry at $v = 0$:

# %%
v, x3 = sp.symbols("v1:3", real=True), sp.Matrix(sp.symbols("z1:4", real=True))
chart = sp.Matrix([1, v[0], v[1]]) / sp.sqrt(1 + v[0] ** 2 + v[1] ** 2)
at_zero = {v[0]: 0, v[1]: 0}
assert chart.jacobian(v).subs(at_zero) == sp.Matrix([[0, 0], [1, 0], [0, 1]])

# %% [markdown]
# Its second derivatives at $v = 0$ are normal to the sphere, so the Hessian of a function
# composed with it is the Riemannian Hessian {cite}`absil2008optimization`, and the trace
# of that Hessian for $u^\top x$ is $-(d-1)\,u^\top x$:

# %%
normal = lambda k, l: -sp.eye(2)[k, l] * sp.eye(3)[:, 0]
assert all(chart.diff(v[k], v[l]).subs(at_zero) == normal(k, l) for k in range(2) for l in range(2))
assert sp.hessian((chart.T * x3)[0], v).subs(at_zero) == -x3[0] * sp.eye(2)

# %% [markdown]
# `lossgeom.flatness.quotient_flatness` evaluates {eq}`eq-ch11-flatq`;
# `quotient_flatness_autograd` builds that retraction chart for every neuron and takes the
# trace of torch's dense Hessian. On the student above the two agree:

# %%
a0, W0 = qt.two_layer_weights(params)
flat_closed = float(flatness.quotient_flatness(a0, W0, task.x, task.y))
flat_gap = abs(flatness.quotient_flatness_autograd(a0, W0, task.x, task.y) / flat_closed - 1)
print(f"Flat^Q = {fmt(flat_closed)}; closed form vs autograd:", rounding_level(flat_gap, 1e-12))

# %% [markdown]
# The audit now applies twenty random per-neuron rescalings, each $c_r$ log-uniform in
# $[10^{-2}, 10^2]$, and recomputes both numbers:

# %%
generator = torch.Generator().manual_seed(0)
log_scales = [torch.empty(10).uniform_(-np.log(100), np.log(100), generator=generator)
              for _ in range(20)]
random_rescalings = [relu_neuron_rescaling("0", "2", torch.exp(t)) for t in log_scales]
flat_of = lambda p: float(flatness.quotient_flatness(*qt.two_layer_weights(p), task.x, task.y))


# %%
def audits(measure, name):
    return [audit_symmetry(forward, params, sym, task.x, tol=1e-10, measure=measure,
                           measure_name=name) for sym in random_rescalings]

flat_reports, raw_reports = audits(flat_of, "Flat^Q"), audits(raw_trace_of, "raw trace")

# %%
flat_change = max(abs(r.measure_ratio - 1) for r in flat_reports)
raw_ratios = [r.measure_ratio for r in raw_reports]
output_gap = max(r.max_output_discrepancy for r in flat_reports)
print(f"largest output discrepancy: {rounding_level(output_gap, 1e-12)}")
print(f"Flat^Q: largest relative change {rounding_level(flat_change, 1e-12)}")
print(f"raw trace: ratio after/before from {fmt(min(raw_ratios), 3)} to {fmt(max(raw_ratios), 3)}")

# %% [markdown]
# The raw trace moves over orders of magnitude on the orbit; $\operatorname{Flat}^Q$ does
# not move at all. That is an identity rather than a finding: it is a function of
# $(\alpha, u)$, which the rescaling does not touch, and the numerical audit checks the
# code. {numref}`fig-ch11-orbit` shows the two along a one-parameter orbit:

# %% tags=["hide-input"]
orbit_c = torch.logspace(-1, 1, 41)
on_orbit = (a0 / orbit_c[:, None], W0 * orbit_c[:, None, None])
fig, ax = plt.subplots()
ax.loglog(orbit_c, flatness.raw_hessian_trace(*on_orbit, task.x),
          label="raw Hessian trace (closed form)")
ax.loglog(orbit_scales, autograd_traces, "o", label="raw trace (dense autograd)")
ax.loglog(orbit_c, flatness.quotient_flatness(*on_orbit, task.x, task.y), "--", label=r"Flat$^Q$")
ax.set_xlabel("common scale c"), ax.set_ylabel("trace"), ax.legend()
orbit_contract = MeasurementContract(
    centre="seeded width-10 student at initialisation (seed 0, PyTorch default init)",
    directions="the rescaling orbit (a_r / c, c w_r), one common c",
    normalisation="n/a (exact orbit)", radius="c in [0.1, 10]",
    loss="square loss (1/2n) sum (F(x_i) - y_i)^2", reduction="mean over 25 examples",
    data=task.description, model_mode="n/a (no layers with state)",
    resolution="41 log-spaced c", precision="float64")
glue_figure("ch11-orbit", fig, orbit_contract,
            "Raw Hessian trace and Flat^Q along the rescaling orbit")

# %% [markdown]
# ```{glue:figure} fig-ch11-orbit
# :name: fig-ch11-orbit
#
# {glue:text}`cap-ch11-orbit`
# ```
#
# The first two rows of the ledger:

# %%
ledger.add("Q1", "(a_r, w_r) -> (a_r/c_r, c_r w_r) preserves F; "
           "the raw Hessian trace is sum_r (c_r^2 P_r + Q_r/c_r^2)",
           {"formula": "derived (sympy, exact, every point off the kinks)",
            "raw trace at c = 0.1, 1, 10": closed_traces,
            "closed form vs dense autograd": str(rounding_level(closed_vs_autograd, 1e-12))})
ledger.add("Q2", "Flat^Q (Riemannian Hessian trace, product metric on (R x S^{d-1})^m) is "
           "invariant: an identity, since it is a function of a_r |w_r| and w_r/|w_r|",
           {"Flat^Q": flat_closed,
            "closed form vs autograd chart": str(rounding_level(flat_gap, 1e-12)),
            "largest change, 20 rescalings": str(rounding_level(flat_change, 1e-12)),
            "raw trace ratio range": [min(raw_ratios), max(raw_ratios)]}, sig=3)

# %% [markdown]
# ## Linear stability bounds quotient flatness
#
# Near an interpolating minimum, one SGD step on a batch $I$ of size $B$ moves a small
# displacement $\delta$ to $M_I \delta$ with $M_I = I - \eta A_I$, where
# $A_I = \frac1B\sum_{i \in I} g_i g_i^\top$ is the batch Hessian built from the quotient
# gradients $g_i$ of $F(x_i)$ (exact at zero residual). The step is **mean-square stable**
# when $\mathbb{E}\lVert M_I\delta\rVert^2 \le \lVert\delta\rVert^2$ for every $\delta$, that
# is, when
#
# $$
# \lambda_{\max}\big(\mathbb{E}[M_I^2]\big) \le 1, \qquad
# \mathbb{E}[M_I^2] = I - 2\eta \bar A + \eta^2\, \mathbb{E}[A_I^2]
# $$ (eq-ch11-stability)
#
# {cite}`wu2018sgd,ma2021linear`, on the **active subspace** spanned by the $g_i$ (outside
# it every $A_I$ vanishes and $M_I$ is the identity). As in the source, the active subspace
# is the row space of the $n \times p$ matrix of the $g_i$, cut at singular values above
# $10^{-6}\sigma_1$. With $S = \frac1n\sum_i \lVert g_i\rVert^2 g_i g_i^\top$, the second
# moment is $\mathbb{E}[A_I^2] = S/B + (1 - 1/B)\bar A^2$ for batches drawn with
# replacement and $\frac{n-B}{B(n-1)} S + \frac{n(B-1)}{B(n-1)}\bar A^2$ without. Sympy
# checks both by enumerating every batch of $B = 2$ out of $n = 3$ examples in the plane:

# %%
g = [sp.Matrix(sp.symbols(f"g{i}_1:3", real=True)) for i in range(3)]
H = [gi * gi.T for gi in g]
A_bar = sum(H, sp.zeros(2, 2)) / 3
S_moment = sum(((gi.T * gi)[0] * gi * gi.T for gi in g), sp.zeros(2, 2)) / 3


# %%
def mean_square(batches):
    return sum((((H[i] + H[j]) / 2) ** 2 for i, j in batches), sp.zeros(2, 2)) / len(batches)

with_replacement = mean_square(list(itertools.product(range(3), repeat=2)))
without_replacement = mean_square(list(itertools.combinations(range(3), 2)))

# %%
assert sp.expand(with_replacement - S_moment / 2 - A_bar**2 / 2) == sp.zeros(2, 2)
assert sp.expand(without_replacement - S_moment / 4 - 3 * A_bar**2 / 4) == sp.zeros(2, 2)

# %% [markdown]
# **The bound.** Stability gives $\eta^2 v^\top \mathbb{E}[A_I^2] v \le 2\eta\, v^\top \bar A v$
# for every $v$; summing over an orthonormal basis of the active subspace,
# $\eta \operatorname{tr}\mathbb{E}[A_I^2] \le 2\operatorname{tr}\bar A = 2\operatorname{Flat}^Q$.
# Since each $g_i g_i^\top$ has rank one, $\operatorname{tr} S = \frac1n\sum_i\lVert g_i\rVert^4
# \ge (\operatorname{tr}\bar A)^2$ (Cauchy-Schwarz), and $\operatorname{tr}\bar A^2 \ge
# (\operatorname{tr}\bar A)^2/n$ because $\bar A$ has rank at most $n$. With replacement the
# first fact alone gives $\operatorname{tr}\mathbb{E}[A_I^2] \ge (\operatorname{tr}\bar A)^2/B$;
# without replacement both facts give the same, because the coefficients combine exactly:

# %%
n_sym, B_sym = sp.symbols("n B", positive=True)
coefficient = (n_sym - B_sym) / (B_sym * (n_sym - 1)) + (B_sym - 1) / (B_sym * (n_sym - 1))
assert sp.simplify(coefficient - 1 / B_sym) == 0

# %% [markdown]
# Either way $\eta\,(\operatorname{Flat}^Q)^2/B \le 2\operatorname{Flat}^Q$:
#
# $$
# \lambda_{\max}\big(\mathbb{E}[M_I^2]\big) \le 1 \quad\Longrightarrow\quad \operatorname{Flat}^Q \le \frac{2B}{\eta}.
# $$ (eq-ch11-bound)
#
# Stability is also monotone in $\eta$: it fails first at the **critical learning rate**
# $\eta_c = 2/\mu_{\max}$, with $\mu_{\max}$ the largest generalised eigenvalue of
# $\mathbb{E}[A_I^2] v = \mu \bar A v$ (`lossgeom.quotient.critical_learning_rate`, through
# `scipy.linalg.eigh`). `lossgeom.quotient` computes all of this from the quotient Jacobian
# (`quotient_jacobian`, `active_jacobian`, `batch_moments`, `stability_operator`,
# `stability_lambda_max`, and `stable_pair_grid` for a whole grid of pairs).
#
# **The experiment.** The source's set-up: a teacher of width $m_t = 4$ on $n = 25$ inputs
# uniform on $S^3$ ($d = 4$) labels the data, and a student of width $m = 10$ is trained to
# near-interpolation; then each pair $(\eta, B)$ of a grid is classified as stable or not.
# The source does not say how its teacher and student are initialised. Our teacher has unit
# $w_r$ and $a_r \sim N(0, 1/m_t)$; our students start from PyTorch's default initialisation
# times a scale that we sweep over five values, with four seeds each:

# %%
ETAS = (0.01, 0.05, 0.10, 0.20, 0.30, 0.40, 0.50, 0.70, 1.00)
BATCH_SIZES = (1, 5, 15)
INIT_SCALES = (0.5, 1.0, 2.0, 4.0, 8.0)
start_a, start_W, q4_labels = qt.init_students(4, [10], range(4), INIT_SCALES)

# %% [markdown]
# The source trains to $\hat L < 10^{-7}$. Here full-batch gradient descent (SGD with
# $B = n$) at learning rate 0.1 gets there too slowly for this chapter's time budget, so
# the default stops at $10^{-5}$ or at 20,000 steps; set `Q4_TARGET = 1e-7` and
# `MAX_STEPS = 200_000` for the source's setting. `lossgeom.quotient.train_students` trains
# all twenty students at once with `lossgeom.optimisers.train` (their losses are summed, so
# each gradient is the student's own) and freezes each one at the first check, every 100
# steps, where its loss is below the target:

# %%
Q4_TARGET, MAX_STEPS = 1e-5, 20_000
q4_fits = qt.train_students(start_a, start_W, task.x, task.y, learning_rate=0.1,
                            target_loss=Q4_TARGET, max_steps=MAX_STEPS)
q4_a, q4_W = q4_fits.final

# %% [markdown]
# For each student we classify the 27 pairs three ways: batches with replacement (the
# headline count), without replacement, and with the loss normalised as torch's `MSELoss`
# (without the $\frac12$), which doubles every $A_I$ and so acts as doubling $\eta$:

# %%
stable = qt.stable_pair_grid(q4_a, q4_W, task.x, ETAS, BATCH_SIZES)
stable_without = qt.stable_pair_grid(q4_a, q4_W, task.x, ETAS, BATCH_SIZES, replacement=False)
stable_mse = qt.stable_pair_grid(q4_a, q4_W, task.x, 2 * np.array(ETAS), BATCH_SIZES)
counts, counts_without, counts_mse = (grid.sum(axis=(1, 2))
                                      for grid in (stable, stable_without, stable_mse))

# %% [markdown]
# Each student's final loss, its $\operatorname{Flat}^Q$ and its three counts:

# %%
q4_flat = flatness.quotient_flatness(q4_a, q4_W, task.x, task.y, part="gauss_newton").numpy()
q4_loss = qt.regression_loss(q4_a, q4_W, task.x, task.y)
for i, (scale, _, seed) in enumerate(q4_labels):
    print(f"scale {fmt(scale):3s} seed {seed}: loss {fmt(float(q4_loss[i]), 2):7s} "
          f"Flat^Q {fmt(q4_flat[i], 3):5s} stable pairs {counts[i]:2d} "
          f"(without replacement {counts_without[i]:2d}, MSE {counts_mse[i]:2d})")

# %% [markdown]
# The theorem is checked on every student and every pair: no stable pair violates the bound.
# Because {eq}`eq-ch11-bound` is proven, this can only fail through a bug; what the
# experiment measures is how many pairs are stable:

# %%
two_B_over_eta = 2 * np.array(BATCH_SIZES)[:, None] / np.array(ETAS)[None, :]
bound_holds = q4_flat[:, None, None] <= two_B_over_eta
violations, loose_unstable = int((stable & ~bound_holds).sum()), int((~stable & bound_holds).sum())
assert violations == 0
print(f"{int(stable.sum())} stable pairs over {len(q4_labels)} students, "
      f"{violations} violate the bound; {loose_unstable} unstable pairs satisfy it anyway")

# %% [markdown]
# The count depends on the initialisation scale. Per scale, the median and range over the
# four seeds, beside the source's 11 for its single student:

# %%
counts_by_scale = {s: counts[[lab[0] == s for lab in q4_labels]] for s in INIT_SCALES}
for s, values in counts_by_scale.items():
    print(f"init scale {fmt(s)}: median {fmt(float(np.median(values)))}, "
          f"range {values.min()}-{values.max()}")

# %% [markdown]
# Across all twenty students the count falls as $\operatorname{Flat}^Q$ grows (Spearman's
# rank correlation, `scipy.stats.spearmanr`):

# %%
rank_correlation = float(spearmanr(q4_flat, counts).statistic)
assert rank_correlation < -0.5
print(f"rank correlation between Flat^Q and the number of stable pairs: {fmt(rank_correlation, 2)}")

# %% [markdown]
# Training further changes little. For each student whose loss passed $10^{-4}$ we recount
# at the first check where it did:

# %%
passed = [i for i, row in enumerate(q4_fits.history["loss"]) if (row < 1e-4).any()]
first_below = {i: int(np.argmax(q4_fits.history["loss"][i] < 1e-4)) for i in passed}
earlier = {i: qt.stable_pair_grid(q4_fits.a[i, j], q4_fits.W[i, j], task.x, ETAS, BATCH_SIZES).sum()
           for i, j in first_below.items()}

# %%
recount_changed = sum(int(earlier[i] != counts[i]) for i in passed)
recount_shift = max(abs(int(earlier[i]) - int(counts[i])) for i in passed)
print(f"students whose count differs between loss 1e-4 and the end: "
      f"{recount_changed} of the {len(passed)} that passed 1e-4")

# %% tags=["hide-cell"]
low_count_scales = [fmt(s) for s, values in counts_by_scale.items() if values.min() <= 11]
for name, value in {"reached": int(q4_fits.converged.sum()), "students": len(q4_labels),
                    "worst-loss": float(q4_loss.max()), "stable-total": int(stable.sum()),
                    "loose": loose_unstable, "large-min": int(counts_by_scale[8.0].min()),
                    "default-median": fmt(float(np.median(counts_by_scale[1.0]))),
                    "changed": recount_changed, "shift": recount_shift, "passed": len(passed),
                    "rank-correlation": rank_correlation}.items():
    glue_value(f"ch11-q4-{name}", value, sig=2)

# %% [markdown]
# {glue:text}`ch11-q4-reached` of {glue:text}`ch11-q4-students` students reach $10^{-5}$
# within the budget; the slowest stops at a loss of {glue:text}`ch11-q4-worst-loss`. All
# {glue:text}`ch11-q4-stable-total` stable pairs satisfy the bound, and
# {glue:text}`ch11-q4-loose` unstable pairs satisfy it too: the bound is a consequence of
# stability, not a test for it. At PyTorch's default scale the median student has
# {glue:text}`ch11-q4-default-median` stable pairs out of 27, far more than the source's
# 11. Only at scale 8 do much smaller counts appear, down to {glue:text}`ch11-q4-large-min`,
# in the students that keep a large $\operatorname{Flat}^Q$: the count follows
# $\operatorname{Flat}^Q$ (rank correlation {glue:text}`ch11-q4-rank-correlation`), and
# $\operatorname{Flat}^Q$ follows the initialisation. The source's 11 is one point of this
# dependence, from a setting the source does not report. Stopping earlier, at $10^{-4}$,
# changes the count of {glue:text}`ch11-q4-changed` of the {glue:text}`ch11-q4-passed`
# students that got there, by at most {glue:text}`ch11-q4-shift` pairs.
# {numref}`fig-ch11-stability` draws the source's figure for one student at the default
# scale, and the count against the initialisation scale for all twenty:

# %% tags=["hide-input"]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.0, 3.6), layout="constrained")
shown_student = q4_labels.index((1.0, 10, 0))
pair_x, pair_y = two_B_over_eta.ravel(), np.full(two_B_over_eta.size, q4_flat[shown_student])
is_stable = stable[shown_student].ravel()
ax1.scatter(pair_x[is_stable], pair_y[is_stable], marker="o", facecolors="none",
            edgecolors="C0", label="stable")
ax1.scatter(pair_x[~is_stable], pair_y[~is_stable], marker="x", color="C3", label="unstable")
ax1.loglog([1, 4000], [1, 4000], "k--", lw=0.8, label="y = x")
ax1.set_xlabel(r"$2B/\eta$"), ax1.set_ylabel(r"Flat$^Q$"), ax1.legend(fontsize=8)
for s, values in counts_by_scale.items():
    ax2.plot([s] * len(values), values, "o", color="C0", alpha=0.6)
ax2.axhline(11, color="grey", ls=":", label="source's count (one student)")
ax2.set_xscale("log"), ax2.set_xlabel("student initialisation scale (x PyTorch default)")
ax2.set_ylabel("stable pairs of 27"), ax2.legend(fontsize=8)
stability_contract = MeasurementContract(
    centre=f"width-10 students after full-batch GD (eta = 0.1) to loss < {fmt(Q4_TARGET)} "
           f"or {MAX_STEPS} steps",
    directions="the active subspace of the quotient Jacobian (singular values > 1e-6 sigma_1)",
    normalisation="quotient metric: Euclidean in alpha, round sphere in u",
    radius="n/a (linearised dynamics)",
    loss="square loss (1/2n) sum (F - y)^2; A_I Gauss-Newton from quotient gradients",
    reduction="batches of B drawn with replacement", data=task.description,
    model_mode="n/a (no layers with state)", resolution="eta in 9 values x B in {1, 5, 15}",
    precision="float64")
glue_figure("ch11-stability", fig, stability_contract,
            "Left: the source's figure for one student (init scale 1, seed 0): Flat^Q against "
            "2B/eta, stable pairs as circles, unstable as crosses. Right: stable pairs against "
            "the initialisation scale, four seeds each")

# %% [markdown]
# ```{glue:figure} fig-ch11-stability
# :name: fig-ch11-stability
#
# {glue:text}`cap-ch11-stability`
# ```

# %%
median_by_scale = {fmt(s): float(np.median(v)) for s, v in counts_by_scale.items()}
ledger.add("Q4", "lambda_max E[M_I^2] <= 1 implies Flat^Q <= 2B/eta (derived); "
           "teacher-student grid 9 eta x 3 B",
           {"stable pairs violating the bound": violations,
            "stable pairs (20 students)": int(stable.sum()),
            "median stable pairs by init scale": median_by_scale,
            "students reaching the target": f"{int(q4_fits.converged.sum())} of {len(q4_labels)}"},
           reported="all 11 stable pairs satisfy the bound", status="holds at our scale",
           note=f"the bound holds for every stable pair (a theorem); the number of stable pairs "
                f"depends on the student's initialisation scale, unstated in the source (11 or "
                f"fewer only at scale {', '.join(low_count_scales)}); trained to {Q4_TARGET:g}, "
                f"not 1e-7, within {MAX_STEPS} GD steps")

# %% [markdown]
# ## Quotient flatness controls input smoothness
#
# The input gradient of the network is $\nabla_x F(x) = \sum_r \alpha_r s_r(x)\, u_r =
# U^\top(\alpha \odot s(x))$, with $U$ the matrix of rows $u_r$. So
# $\lVert\nabla_x F(x)\rVert^2 \le \kappa_* \sum_r s_r \alpha_r^2$ with
# $\kappa_* = \lVert U\rVert_{\rm op}^2$. Neuron $r$'s term in
# $\operatorname{Flat}^Q_{\rm GN}$ is $\lVert x\rVert^2\,(t + \alpha_r^2(1-t))$ with
# $t = (u_r^\top x)^2/\lVert x\rVert^2 \in [0, 1]$, which is at least
# $\lVert x\rVert^2 \min(1, \alpha_r^2)$, and $\alpha_r^2 \le \max(1, A_*^2)\min(1, \alpha_r^2)$
# with $A_* = \max_r\lvert\alpha_r\rvert$. Averaging over the data, with
# $\rho = \min_i\lVert x_i\rVert$:
#
# $$
# \frac1n\sum_i\lVert\nabla_x F(x_i)\rVert^2 \;\le\; \kappa_*\max(1, A_*^2)\,\rho^{-2}\,\operatorname{Flat}^Q_{\rm GN}.
# $$ (eq-ch11-smoothness)
#
# The first scalar step is two factorisations whose signs can be read off: with
# $p = \alpha_r^2$, $t + p(1-t)$ exceeds $p$ by $t(1-p)$, non-negative when $p \le 1$, and
# exceeds $1$ by $(p-1)(1-t)$, non-negative when $p \ge 1$:

# %%
t, p_sq = sp.symbols("t p", nonnegative=True)
gn_term = t + p_sq * (1 - t)
assert sp.expand(gn_term - p_sq - t * (1 - p_sq)) == 0
assert sp.expand(gn_term - 1 - (p_sq - 1) * (1 - t)) == 0

# %% [markdown]
# The second, $p \le \max(1, A_*^2)\min(1, p)$ for $p \le A_*^2$, is immediate in the two
# cases $p \le 1$ and $p > 1$.
#
# The source's experiment trains students of widths 6 to 40, four seeds each, by full-batch
# gradient descent at learning rate 0.1 until $\hat L \le 5\cdot 10^{-5}$ (for up to
# 200,000 steps; ours stop at `MAX_STEPS`). We run exactly that grid of 32 students at the
# default initialisation, and add width 40 at scales 0.25 and 4 for the last section:

# %%
WIDTHS = (6, 8, 10, 12, 15, 20, 28, 40)
grid_a, grid_W, grid_labels = qt.init_students(4, WIDTHS, range(4), (1.0,))
extra_a, extra_W, extra_labels = qt.init_students(4, [40], range(4), (0.25, 4.0))
labels = grid_labels + extra_labels

# %% [markdown]
# All 40 train in one batch:

# %%
fits = qt.train_students(torch.cat([grid_a, extra_a]), torch.cat([grid_W, extra_W]), task.x, task.y,
                         learning_rate=0.1, target_loss=5e-5, max_steps=MAX_STEPS, check_every=50)
final_a, final_W = fits.final
converged = fits.converged & (torch.arange(len(labels)) < len(grid_labels))
print(f"{int(converged.sum())} of {len(grid_labels)} grid students reach loss 5e-5 "
      f"within {MAX_STEPS} steps")

# %% [markdown]
# The source reports 28 of its 32 runs converging within 200,000 steps. For every
# converged student we compute the measured smoothness, the right-hand side of
# {eq}`eq-ch11-smoothness`, and its constants (`lossgeom.quotient.input_smoothness`,
# `smoothness_constants`):

# %%
smoothness = qt.input_smoothness(final_a, final_W, task.x)[converged]
constants = qt.smoothness_constants(final_a, final_W, task.x)
flat_gn = flatness.quotient_flatness(final_a, final_W, task.x, task.y, part="gauss_newton")
smooth_bound = (constants.factor * flat_gn)[converged]

# %%
assert bool((smoothness <= smooth_bound).all())
slack = smooth_bound / smoothness
kappa, amplitude = constants.kappa[converged], constants.amplitude[converged]
def describe(t):
    low, high, middle = (fmt(float(v), 3) for v in (t.min(), t.max(), t.median()))
    return f"[{low}, {high}], median {middle}"


# %%
print(f"bound holds for {int((smoothness <= smooth_bound).sum())} of {int(converged.sum())}; "
      f"bound / smoothness in {describe(slack)}")
print(f"kappa_* in {describe(kappa)}; A_* in {describe(amplitude)}; "
      f"rho = {fmt(float(constants.rho[0]))}")

# %% [markdown]
# The source reports $\kappa_* \in [3.6, 14.5]$ with median 6.0 and
# $A_* \in [0.26, 0.79]$ with median 0.56. Our ranges are close to these; $\kappa_*$ grows
# with the width, since $m$ unit rows in $\mathbb{R}^4$ have $\lVert U\rVert_{\rm op}^2 \ge m/4$.
# The bound holds with a wide margin: $\kappa_*$ and $\max(1, A_*^2)$ are worst cases over
# neurons and directions. The inequality is proven, so that it holds is not the finding;
# its slack is.
#
# ## From smoothness to generalisation
#
# The source's last step bounds the population error under a covering assumption. Its
# equation (14) is not in the source notes we have, so we derive a bound from the same
# ingredients ourselves. The test law $P_X$ is uniform on $\bigcup_i B(x_i, \varepsilon)$,
# $\varepsilon = 0.15$. Its density is at most $\nu$ times that of the equal mixture of the
# balls, with $\nu = n\operatorname{vol}(B)/\operatorname{vol}(\bigcup_i B_i) \ge 1$
# (`lossgeom.quotient.sample_ball_union` draws from $P_X$ exactly and estimates $\nu$). On
# ball $i$ write $x = x_i + h$ and $D = F - f_*$. Then $D(x) = r_i + \nabla D(x_i)^\top h
# + R_i(h)$, where the remainder comes only from neurons whose kink crosses the ball and is
# at most $K_i = \sum_r \lvert\alpha_r\rvert(\varepsilon - \lvert u_r^\top x_i\rvert)_+$,
# summed over student and teacher (`kink_remainder`). For $h$ uniform in the ball,
# $\mathbb{E}[hh^\top] = \varepsilon^2 I/(d+2)$: by symmetry it is $\mathbb{E}\lVert h\rVert^2 I/d$,
# and $\lVert h\rVert$ has density $d r^{d-1}/\varepsilon^d$:

# %%
radius, eps, dim = sp.symbols("r epsilon d", positive=True)
mean_square_norm = sp.integrate(radius**2 * dim * radius ** (dim - 1) / eps**dim, (radius, 0, eps))
assert sp.simplify(mean_square_norm / dim - eps**2 / (dim + 2)) == 0

# %% [markdown]
# One more algebraic fact is needed: $3(p^2+q^2+s^2) - (p+q+s)^2$ is a sum of squares:

# %%
p_, q_, s_ = sp.symbols("p q s", real=True)
squares = (p_ - q_) ** 2 + (q_ - s_) ** 2 + (p_ - s_) ** 2
assert sp.expand(3 * (p_**2 + q_**2 + s_**2) - (p_ + q_ + s_) ** 2 - squares) == 0

# %% [markdown]
# Minkowski's inequality in $L^2$, $(p+q+s)^2 \le 3(p^2+q^2+s^2)$ and
# {eq}`eq-ch11-smoothness` then give, with $S_*$ the teacher's input smoothness and
# $\mathcal{E}_{\rm gen} = \mathbb{E}_{P_X}[\tfrac12 D^2] - \hat L$,
#
# $$
# \mathcal{E}_{\rm gen} \le \nu\Big[3\hat L
# + \frac{3\varepsilon^2}{d+2}\Big(\kappa_*\max(1, A_*^2)\rho^{-2}\operatorname{Flat}^Q_{\rm GN} + S_*\Big)
# + \frac{3}{2n}\sum_i K_i^2\Big] - \hat L .
# $$ (eq-ch11-generalisation)
#
# We measure $\mathcal{E}_{\rm gen}$ on 20,000 draws from $P_X$ and evaluate
# {eq}`eq-ch11-generalisation` term by term (`generalisation_error`, `generalisation_bound`):

# %%
test = qt.sample_ball_union(task.x, 0.15, 20_000, seed=1)
gen_error, gen_se = qt.generalisation_error(final_a, final_W, task, test.x)
gen_bound = qt.generalisation_bound(final_a, final_W, task, 0.15, nu=test.nu)
assert bool((gen_error + 3 * gen_se <= gen_bound.total)[converged].all())

# %% [markdown]
# How far apart the two are, how much of the bound the flatness term makes, and the bound
# $M$ on $\lvert F\rvert$ and $\lvert f_*\rvert$ over the test draws:

# %%
ratio = (gen_bound.total / gen_error)[converged]
flat_share = (gen_bound.flatness / gen_bound.total)[converged]
outputs = torch.cat([qt.relu_network(final_a[converged], final_W[converged], test.x).flatten(),
                     qt.relu_network(task.teacher_a, task.teacher_W, test.x)])
M_constant = float(outputs.abs().max())

# %%
print(f"nu = {fmt(test.nu, 3)}; E_gen in {describe(gen_error[converged])}")
print(f"bound / E_gen in {describe(ratio)}")
print(f"flatness term's share of the bound in {describe(flat_share)}")
print(f"M = {fmt(M_constant, 2)}")

# %% tags=["hide-cell"]
for name, value in {"ratio-min": float(ratio.min()), "ratio-max": float(ratio.max()),
                    "share-median": float(flat_share.median()), "M": M_constant}.items():
    glue_value(f"ch11-gen-{name}", value, sig=2)

# %% [markdown]
# Every converged student lies below the bound, which exceeds the measured error by a factor
# between {glue:text}`ch11-gen-ratio-min` and {glue:text}`ch11-gen-ratio-max`, and the
# flatness term makes most of the bound (median share {glue:text}`ch11-gen-share-median`).
# The chain of implications holds and is loose at each link. Our
# $M \approx$ {glue:text}`ch11-gen-M` is larger than the source's 0.49 because our
# teacher's outputs are larger (the source does not state its teacher's scale).
# {numref}`fig-ch11-smoothness` draws the source's panels (b)-(d):

# %% tags=["hide-input"]
widths_converged = np.array([lab[1] for lab, ok in zip(labels, converged) if ok])
flat_converged = flat_gn[converged].numpy()
fig, axes = plt.subplots(1, 3, figsize=(10.5, 3.4), layout="constrained")
flat_label, gen_label = r"Flat$^Q_{\rm GN}$", r"$\mathcal{E}_{\rm gen}$"
panels = [(flat_converged, gen_error[converged], flat_label, gen_label),
          (flat_converged, smoothness, flat_label, r"$\frac{1}{n}\sum_i\|\nabla_x F(x_i)\|^2$"),
          (gen_bound.total[converged], gen_error[converged], "bound (right-hand side)", gen_label)]
for ax, (xs, ys, x_label, y_label) in zip(axes, panels):
    coloured = ax.scatter(xs, ys, c=np.log(widths_converged), cmap="viridis", s=18)
    ax.set_xscale("log"), ax.set_yscale("log"), ax.set_xlabel(x_label), ax.set_ylabel(y_label)
axes[1].scatter(flat_converged, smooth_bound, marker="_", color="C3", label="its bound")
axes[1].legend(fontsize=7)
bound_values = gen_bound.total[converged]
diagonal = np.array([float(bound_values.min()) / 1e4, float(bound_values.max())])
axes[2].plot(diagonal, diagonal, "k--", lw=0.8)
fig.colorbar(coloured, ax=axes[2], label="log width")
smoothness_contract = MeasurementContract(
    centre=f"students of widths {WIDTHS[0]}-{WIDTHS[-1]}, 4 seeds, after full-batch GD "
           "(eta = 0.1) to loss <= 5e-5",
    directions="n/a (input gradients at the training points; test error by sampling)",
    normalisation="quotient metric for Flat^Q; Euclidean input norm",
    radius="test balls of radius eps = 0.15",
    loss="square loss (1/2n) sum (F - y)^2; E_gen = E[(F - f_*)^2 / 2] - training loss",
    reduction="mean over 25 training points; 20,000 test draws (seed 1)", data=task.description,
    model_mode="n/a (no layers with state)",
    resolution=f"{int(converged.sum())} converged students", precision="float64")
glue_figure("ch11-smoothness", fig, smoothness_contract,
            "Left: generalisation error against Flat^Q_GN. Middle: input smoothness (dots) and "
            "its bound (red bars). Right: generalisation error against the bound derived here, "
            "with y = x")

# %% [markdown]
# ```{glue:figure} fig-ch11-smoothness
# :name: fig-ch11-smoothness
#
# {glue:text}`cap-ch11-smoothness`
# ```

# %%
spread = lambda t: [float(t.min()), float(t.max()), float(t.median())]
ledger.add("Q3", "(1/n) sum |grad_x F(x_i)|^2 <= kappa_* max(1, A_*^2) rho^-2 Flat^Q "
           "(derived; checked on every converged student)",
           {"students satisfying it": f"{int((smoothness <= smooth_bound).sum())} of {len(slack)}",
            "converged students": f"{int(converged.sum())} of {len(grid_labels)}",
            "bound / smoothness (min, max, median)": spread(slack),
            "kappa_* (min, max, median)": spread(kappa),
            "A_* (min, max, median)": spread(amplitude),
            "M": M_constant, "generalisation bound / E_gen (min, max, median)": spread(ratio)},
           reported="holds for all models in Fig. 3c; 28 of 32 converge; kappa_* in [3.6, 14.5], "
                    "median 6.0; A_* in [0.26, 0.79]; M about 0.49", status="holds",
           note="our own generalisation bound (the source's eq. 14 is not in our notes) also holds "
                "for every student; M differs because the teacher's scale is not stated", sig=3)

# %% [markdown]
# ## Flatness during fitting
#
# The source shows one width-40 run in which the loss falls while $\operatorname{Flat}^Q$
# rises. {eq}`eq-ch11-flatq` suggests why it might: early on the residual term
# $-(d-1)\frac1n\sum_i r_i F(x_i)$ can be large, and the Gauss-Newton part grows with the
# output weights $\alpha_r^2$. Both depend on the initialisation scale, so we follow the
# width-40 students at scales 0.25, 1 and 4 (four seeds each), recorded every 50 steps:

# %%
trajectory = {s: [i for i, lab in enumerate(labels) if lab[1] == 40 and lab[0] == s]
              for s in (0.25, 1.0, 4.0)}
start_end = lambda key, rows: (float(np.median(fits.history[key][rows, 0])),
                               float(np.median(fits.history[key][rows, -1])))

# %%
for s, rows in trajectory.items():
    (f0, f1), (g0, g1) = start_end("flatness", rows), start_end("gauss_newton", rows)
    print(f"scale {fmt(s):4s}: Flat^Q {fmt(f0, 3)} -> {fmt(f1, 3)}, "
          f"Gauss-Newton part {fmt(g0, 3)} -> {fmt(g1, 3)} (medians over seeds)")


# %% [markdown]
# Ending higher is not the same as rising while the loss falls. For each run we take the
# recorded intervals before it stopped, and measure the share in which the loss fell and
# $\operatorname{Flat}^Q$ rose, and where in the run $\operatorname{Flat}^Q$ peaked (as a
# fraction of the run's length):

# %%
def co_movement(i):
    moving = np.flatnonzero(np.diff(fits.history["loss"][i]) != 0)  # frozen runs stop changing
    loss_falls = np.diff(fits.history["loss"][i])[moving] < 0
    flat_rises = np.diff(fits.history["flatness"][i])[moving] > 0
    peak = np.argmax(fits.history["flatness"][i][: moving[-1] + 2]) / (moving[-1] + 1)
    return float((loss_falls & flat_rises).mean()), float(peak)


# %%
co_moving = {s: np.array([co_movement(i) for i in rows]) for s, rows in trajectory.items()}
for s, values in co_moving.items():
    print(f"scale {fmt(s):4s}: loss falls while Flat^Q rises in a median "
          f"{fmt(float(np.median(values[:, 0])), 2)} of the intervals; Flat^Q peaks at a median "
          f"{fmt(float(np.median(values[:, 1])), 2)} of the run")

# %% [markdown]
# At PyTorch's default scale the source's picture holds: $\operatorname{Flat}^Q$ climbs
# for most of the fit and peaks near its end. At the other scales it does not. From scale
# 0.25 it rises early, while the output weights grow, and then eases down. From scale 4 it
# jumps within the first recorded interval and then declines over the rest of the fit
# (rising in only a minority of the later intervals) while the loss keeps falling. The jump
# is the residual term, strongly negative at the start (the outputs are large and wrong) and
# gone at interpolation; the Gauss-Newton part ends lower than it starts. The checks behind
# these sentences:

# %%
median_share = {s: float(np.median(v[:, 0])) for s, v in co_moving.items()}
median_peak = {s: float(np.median(v[:, 1])) for s, v in co_moving.items()}
assert median_peak[1.0] > 0.5 and median_peak[0.25] < median_peak[1.0] and median_peak[4.0] <= 0.05
assert median_share[1.0] > max(median_share[0.25], median_share[4.0]) and median_share[4.0] < 0.5
assert start_end("gauss_newton", trajectory[4.0])[1] < start_end("gauss_newton", trajectory[4.0])[0]

# %% [markdown]
# {numref}`fig-ch11-fitting` shows one seed per scale:

# %% tags=["hide-input"]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.0, 3.4), layout="constrained")
for k, (s, rows) in enumerate(trajectory.items()):
    ax1.semilogy(fits.steps, fits.history["loss"][rows[0]], color=f"C{k}", label=f"scale {fmt(s)}")
    ax2.plot(fits.steps, fits.history["flatness"][rows[0]], color=f"C{k}",
             label=rf"Flat$^Q$, scale {fmt(s)}")
    ax2.plot(fits.steps, fits.history["gauss_newton"][rows[0]], ":", color=f"C{k}")
ax1.set_xlabel("gradient-descent step"), ax1.set_ylabel("training loss"), ax1.legend(fontsize=8)
ax2.set_xlabel("gradient-descent step")
ax2.set_ylabel(r"Flat$^Q$ (solid), Gauss-Newton part (dotted)")
ax2.set_xscale("symlog", linthresh=100), ax2.legend(fontsize=7)
fitting_contract = smoothness_contract.with_(
    centre="width-40 students (seed 0) along full-batch GD, eta = 0.1, until loss <= 5e-5",
    directions="n/a (trace of the quotient Hessian)", radius="n/a",
    reduction="mean over 25 training points", resolution="every 50 steps")
glue_figure("ch11-fitting", fig, fitting_contract,
            "Training loss and Flat^Q during fitting, from three initialisation scales")

# %% [markdown]
# ```{glue:figure} fig-ch11-fitting
# :name: fig-ch11-fitting
#
# {glue:text}`cap-ch11-fitting`
# ```

# %%
ledger.add("Q6", "During fitting the training loss falls while Flat^Q rises",
           {**{f"scale {s:g}: median Flat^Q start, end": start_end("flatness", rows)
               for s, rows in trajectory.items()},
            **{f"scale {s:g}: median share co-moving, median peak position":
               list(np.median(v, axis=0)) for s, v in co_moving.items()}},
           reported="Fig. 3a: loss falls monotonically, Flat^Q rises (one width-40 run)",
           status="holds at our scale",
           note="holds at the default initialisation; from scale 0.25 Flat^Q peaks early and "
                "eases, "
                "from scale 4 it jumps in the first steps (residual term vanishing) and then falls "
                "while the loss falls", sig=2)

# %% [markdown]
# ## Raw and quotient slices of a digits classifier
#
# The source's first figure compares a raw loss slice of a width-128 two-layer ReLU
# classifier on MNIST with a slice in quotient coordinates. We use sklearn's 8 x 8 digits
# (`lossgeom.data.digits`: 1,000 training and 500 test images) and the same architecture
# with ten outputs, $F(x) = \sum_r a_r\operatorname{ReLU}(w_r^\top x)$ with
# $a_r \in \mathbb{R}^{10}$, trained on cross-entropy by heavy-ball SGD:

# %%
digits = data.digits(n_train=1000, n_test=500, seed=0)
classifier = qt.two_layer_relu(64, 128, 10, seed=0)
start = {name: p.detach() for name, p in classifier.named_parameters()}
digits_loss = indexed_loss(classifier, digits.x_train, digits.y_train)
fitted = train(digits_loss, start, sgd(0.5, momentum=0.9), 300).params

# %%
classifier_forward = lambda p, x: torch.func.functional_call(classifier, p, (x,))
predictions = classifier_forward(fitted, digits.x_test).argmax(1)
test_accuracy = float((predictions == digits.y_test).double().mean())
print(f"test accuracy {fmt(test_accuracy, 2)} on {len(digits.y_test)} held-out images")

# %% [markdown]
# We rescale every neuron by its own $c_r$, log-uniform in $[1/5, 5]$, and audit it:

# %%
log_c = torch.empty(128).uniform_(-np.log(5), np.log(5), generator=torch.Generator().manual_seed(1))
rescaling = relu_neuron_rescaling("0", "2", torch.exp(log_c))
show_audit(audit_symmetry(classifier_forward, fitted, rescaling, digits.x_test, tol=1e-10))

# %% [markdown]
# A slice is a plane through the trained point spanned by two seeded Gaussian directions
# (`lossgeom.quotient.slice_directions`). In raw coordinates they are filter-normalised
# {cite}`li2018visualizing`: each neuron's incoming weights and each output unit's weights
# get the norm of the corresponding trained weights. In quotient coordinates the plane lies
# in $(\alpha, u)$: each $\alpha_r$ part gets the norm of $\alpha_r$, each $u_r$ part is
# tangent to the sphere with unit norm, and $u_r$ is renormalised at every point
# (`slice_cross_entropy`). The grid is `lossgeom.landscape.plane_grid`:

# %%
SLICE_RADIUS, SLICE_RESOLUTION = 1.0, 21
x_slice, y_slice = digits.x_train[:500], digits.y_train[:500]
networks = {"trained": qt.two_layer_weights(fitted),
            "rescaled": qt.two_layer_weights(rescaling(fitted))}


# %%
def slice_losses(a_net, W_net, coordinates):
    centre, d1, d2 = qt.slice_directions(a_net, W_net, seed=0, coordinates=coordinates)
    grid_s, grid_t, points = plane_grid(centre, d1, d2, SLICE_RADIUS, SLICE_RESOLUTION)
    return grid_s, grid_t, qt.slice_cross_entropy(points, x_slice, y_slice, 128, 10, coordinates)


# %%
cases = itertools.product(networks.items(), ("raw", "quotient"))
slices = {(name, coordinates): slice_losses(*weights, coordinates)
          for (name, weights), coordinates in cases}
slice_gap = {key: float(np.abs(slices[("trained", key)][2] - slices[("rescaled", key)][2]).max())
             for key in ("raw", "quotient")}
raw_means = [float(slices[(name, "raw")][2].mean()) for name in networks]

# %%
print(f"raw slices: mean loss {fmt(raw_means[0], 3)} (trained) vs {fmt(raw_means[1], 3)} "
      f"(rescaled), largest pointwise difference {fmt(slice_gap['raw'], 3)}")
print("quotient slices: largest pointwise difference",
      rounding_level(slice_gap["quotient"], 1e-12))

# %% [markdown]
# The two raw slices of one function differ completely: filter normalisation follows each
# neuron's incoming scale but not the per-neuron scale of the output weights, so the same
# plane radius means different perturbations. The two quotient slices agree to rounding,
# which again is an identity: both networks have the same $(\alpha, u)$ and the directions
# are drawn in those coordinates. {numref}`fig-ch11-raw-slices` and
# {numref}`fig-ch11-quotient-slices` show them on one colour scale:

# %% tags=["hide-input"]
slice_contract = MeasurementContract(
    centre="width-128 two-layer ReLU classifier after 300 steps of heavy-ball SGD "
           "(lr 0.5, momentum 0.9)",
    directions="two seeded Gaussian directions (seed 0) in raw coordinates (A, W)",
    normalisation="filter-normalised: rows of W to |w_r|, output units' weights to their "
                  "trained norms",
    radius=f"s, t in [-{fmt(SLICE_RADIUS)}, {fmt(SLICE_RADIUS)}]", loss="softmax cross-entropy",
    reduction="mean over 500 training images", data=digits.description,
    model_mode="n/a (no layers with state)",
    resolution=f"{SLICE_RESOLUTION} x {SLICE_RESOLUTION} grid", precision="float64")
quotient_contract = slice_contract.with_(
    directions="two seeded Gaussian directions (seed 0) in quotient coordinates (alpha, u)",
    normalisation="alpha_r parts to |alpha_r|, u_r parts tangent with unit norm; u_r "
                  "renormalised at each point")

# %% tags=["hide-input"]
levels = np.linspace(0.0, 5.0, 26)
for key, contract in (("raw", slice_contract), ("quotient", quotient_contract)):
    fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.5), layout="constrained")
    for ax, name in zip(axes, networks):
        grid_s, grid_t, losses = slices[(name, key)]
        contour = ax.contourf(grid_s, grid_t, np.clip(losses, 0, 5), levels=levels)
        ax.plot(0, 0, "*", color="white", ms=10)
        ax.set_title(f"{name} network"), ax.set_xlabel("s"), ax.set_ylabel("t")
    fig.colorbar(contour, ax=axes, label="cross-entropy (clipped at 5)")
    glue_figure(f"ch11-{key}-slices", fig, contract,
                f"{key.capitalize()} 2-D slices of one trained classifier (left) and of the same "
                "function after a random per-neuron rescaling (right); the star is the trained "
                "point")

# %% [markdown]
# ```{glue:figure} fig-ch11-raw-slices
# :name: fig-ch11-raw-slices
#
# {glue:text}`cap-ch11-raw-slices`
# ```
#
# ```{glue:figure} fig-ch11-quotient-slices
# :name: fig-ch11-quotient-slices
#
# {glue:text}`cap-ch11-quotient-slices`
# ```

# %%
ledger.add("Q5", "Raw vs quotient 2-D slices of a width-128 two-layer ReLU classifier on "
           "real digit images",
           {"test accuracy": test_accuracy, "raw slice mean loss, trained vs rescaled": raw_means,
            "raw largest pointwise difference": slice_gap["raw"],
            "quotient largest pointwise difference":
                str(rounding_level(slice_gap["quotient"], 1e-12))},
           reported="seed 002 Fig. 1 (MNIST, width 128)", status="holds at our scale",
           note="sklearn 8x8 digits instead of MNIST; the quotient slices' agreement is an "
                "identity",
           sig=3)

# %% [markdown]
# ## What this establishes
#
# On the quotient of a two-layer ReLU network by its rescalings, flatness is a number about
# the function's parametrisation-free coordinates: the raw Hessian trace runs over the
# whole orbit as $\sum_r(c_r^2P_r + Q_r/c_r^2)$, while $\operatorname{Flat}^Q$ stays put.
# The chain of the source holds link by link, because each link is an inequality we could
# derive: mean-square stability bounds $\operatorname{Flat}^Q$ by $2B/\eta$, and
# $\operatorname{Flat}^Q$ bounds input smoothness and, with kink and teacher terms, the
# generalisation error. What the experiments add is the size of the gaps: the smoothness
# and generalisation bounds are loose by orders of magnitude here, and the number of stable
# learning-rate/batch pairs, the source's headline 11, is set by the student's
# initialisation scale, which the source leaves open. The runs are small: 25 training
# points, students trained to $10^{-5}$ or $5\cdot 10^{-5}$, and 8 x 8 digits in place of MNIST.
#
# The atlas row {ref}`Flat^Q <atlas-flat-q>` audits quotient flatness under every
# transformation the registry finds, beside the raw {ref}`trace <atlas-trace>`.
#
# ## Exercises
#
# ```{admonition} Exercise: the bound is sharp
# :class: tip
# Take a single example ($n = 1$) with quotient gradient $g$, batch size $B = 1$ and
# $\eta = 2/\lVert g\rVert^2$. Predict $\lambda_{\max}(\mathbb{E}[M_I^2])$ and compare
# $\operatorname{Flat}^Q$ with $2B/\eta$. (Hint: $A_I = gg^\top$ for every batch.)
# ```
#
# ```{admonition} Solution
# :class: dropdown
# $M_I = I - \eta gg^\top$ has eigenvalue $1 - \eta\lVert g\rVert^2 = -1$ along $g$, so
# $\lambda_{\max}(\mathbb{E}[M_I^2]) = 1$: the step is exactly at the edge of stability, and
# $\operatorname{Flat}^Q = \lVert g\rVert^2 = 2/\eta = 2B/\eta$. The bound
# {eq}`eq-ch11-bound` is attained, so no smaller constant can replace 2. The cell below
# checks it with the chapter's functions.
# ```

# %% tags=["hide-cell"]
g_single = torch.tensor([[0.6, -1.2, 0.8]])
edge_eta = 2 / float((g_single**2).sum())
edge_lambda = qt.stability_lambda_max(g_single, edge_eta, 1)
edge_flat_ratio = float(qt.batch_moments(g_single, 1)[0].trace()) / (2 / edge_eta)
assert abs(edge_lambda - 1) <= 1e-12 and abs(edge_flat_ratio - 1) <= 1e-12
print(f"lambda_max = {fmt(edge_lambda)}, Flat^Q / (2B/eta) = {fmt(edge_flat_ratio)}")

# %% [markdown]
# ```{admonition} Exercise: sampling without replacement
# :class: tip
# Draw the batches without replacement instead of with. Predict whether each student's
# number of stable pairs goes up or down. (Hint: compare the two formulas for
# $\mathbb{E}[A_I^2]$.)
# ```
#
# ```{admonition} Solution
# :class: dropdown
# The difference is $\mathbb{E}_{\rm with}[A_I^2] - \mathbb{E}_{\rm without}[A_I^2] =
# \frac{B-1}{B(n-1)}(S - \bar A^2)$, and $S - \bar A^2 = \frac1n\sum_i H_i^2 - \bar A^2$ is the
# covariance of the per-example Hessians $H_i = g_i g_i^\top$, positive semi-definite. So
# $\mathbb{E}[M_I^2]$ is smaller without replacement and every pair stable with replacement
# stays stable: the count goes up or stays (it stays at $B = 1$, where the two coincide).
# The cell below checks it on the twenty students.
# ```

# %% tags=["hide-cell"]
assert bool((stable_without >= stable).all()) and bool((stable_without[:, 0] == stable[:, 0]).all())
print(f"stable pairs, all students: {int(stable.sum())} with replacement, "
      f"{int(stable_without.sum())} without")

# %% [markdown]
# ```{admonition} Exercise: one neuron's scale
# :class: tip
# Rescale only neuron 0 of the student at initialisation by $c_0 = 3$. Predict the change
# of the raw Hessian trace from {eq}`eq-ch11-raw-trace`. (Hint: only $P_0$ and $Q_0$ move.)
# ```
#
# ```{admonition} Solution
# :class: dropdown
# The trace changes by $(c_0^2 - 1)P_0 + (c_0^{-2} - 1)Q_0 = 8P_0 - \tfrac89 Q_0$, where
# $P_0$ and $Q_0$ are neuron 0's two terms, while $\operatorname{Flat}^Q$ does not change.
# The cell below computes both terms from the weights and compares with the closed form.
# ```

# %% tags=["hide-cell"]
active0 = (task.x @ W0[0] > 0).double()
P0 = float((active0 * (task.x @ W0[0]) ** 2).mean())
Q0 = float((active0 * a0[0] ** 2 * (task.x**2).sum(1)).mean())
one_neuron = relu_neuron_rescaling("0", "2", [3.0] + [1.0] * 9)(params)
predicted, measured = 8 * P0 - 8 / 9 * Q0, raw_trace_of(one_neuron) - raw_trace_of(params)
assert abs(predicted - measured) <= 1e-12 * raw_trace_of(params)
assert abs(flat_of(one_neuron) / flat_closed - 1) <= 1e-12
print(f"predicted change {fmt(predicted)}, measured {fmt(measured)}")

# %% [markdown]
# ## Results ledger

# %%
ledger
