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
# error. This chapter derives each link, checks it numerically through `lossgeom.flatness`,
# reproduces the source's teacher-student experiments at a laptop's scale while sweeping
# the initialisation scale the source leaves open, and draws raw and quotient loss slices of
# a classifier trained on real digits.
#
# ```{admonition} Key ideas
# :class: tip
# - Rescaling each neuron keeps a ReLU network's function but changes its raw Hessian trace
#   by any factor. On the quotient by these rescalings, in the coordinates
#   $\alpha_r = a_r \lVert w_r\rVert$ and $u_r = w_r / \lVert w_r\rVert$
#   ({eq}`eq-ch11-quotient`), flatness $\operatorname{Flat}^Q$ cannot move.
# - Each link of the source's chain is an inequality we derive: linear stability of SGD
#   bounds $\operatorname{Flat}^Q$ by $2B/\eta$ ({eq}`eq-ch11-bound`), and
#   $\operatorname{Flat}^Q$ bounds input smoothness ({eq}`eq-ch11-smoothness`) and the
#   generalisation error. On trained students they hold by proof, loosely.
# - The source's experimental findings, how many step sizes and batch sizes are stable and
#   whether flatness rises while the loss falls, depend on an initialisation scale the source
#   does not state.
# - Raw loss slices of one digit classifier change under a rescaling; quotient slices do not
#   ({numref}`fig-ch11-quotient-slices`).
# ```
#
# **Claims established here:** Q1, Q2, Q3, Q4, Q5, Q6.
#
# Each status in the ledger at the end is read from the outputs by one rule, with each
# claim's criterion stated before its row: **holds** for an identity (derived exactly here;
# the numeric checks confirm, to rounding, only that the code implements it); **holds at our
# scale** when every measured part of the claim meets its criterion on the small networks
# and data here, at every initialisation scale we run (the source states none), and any
# level the source states is met or accounted for by a computation here; **differs** when a
# measured part misses its criterion and a computation here shows what moves it;
# **not reproduced** when a measured part misses its criterion and nothing here accounts
# for the gap.
#
# We use sympy for the exact work, torch in float64 on one thread, and the book's package:

# %% tags=["remove-cell"]
# Only on Google Colab: install the book's package and what the chapter imports.
import subprocess, sys
if "google.colab" in sys.modules:
    book = "lossgeom[book] @ git+https://github.com/lossgeom/same-function-different-geometry@main"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", book], check=True)

# %% tags=["hide-cell"]
from lossgeom_book.setup import setup

ledger = setup("Quotient flatness", single_thread=True)

# %% tags=["hide-input"]
import itertools

import numpy as np
import sympy as sp
import torch
import matplotlib.pyplot as plt
from IPython.display import Math, display
from scipy.stats import spearmanr

from lossgeom import flatness
from lossgeom.contract import MeasurementContract
from lossgeom.curvature import closure_hessian
from lossgeom.formatting import fmt, round_sig, rounding_level
from lossgeom.landscape import plane_grid
from lossgeom.symmetries import audit_symmetry, relu_neuron_rescaling
from lossgeom.training import adam, indexed_loss, sgd, train
from lossgeom_book import data, relu_generalisation
from lossgeom_book import relu_students
from lossgeom_book.models import regression_loss, relu_network, two_layer_relu
from lossgeom_book.display import glue_figure, glue_value

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
# \begin{aligned}
# \operatorname{tr} \nabla^2 L(a, W) &= \sum_r (P_r + Q_r),\\
# P_r &= \frac1n \sum_i s_{ri} (w_r^\top x_i)^2,\qquad
# Q_r = \frac1n \sum_i s_{ri}\, a_r^2 \lVert x_i\rVert^2,
# \end{aligned}
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
task = relu_students.teacher_student(n=25, d=4, m_teacher=4, seed=0)
student = two_layer_relu(4, 10, seed=0)
params = {name: p.detach() for name, p in student.named_parameters()}
forward = lambda p, x: torch.func.functional_call(student, p, (x,))

# %% [markdown]
# The symmetry audit (`lossgeom.symmetries.audit_symmetry`) applies
# `lossgeom.symmetries.relu_neuron_rescaling` with every $c_r = 10$, checks that the
# outputs agree, and only then recomputes the raw trace (`lossgeom.flatness.raw_hessian_trace`):

# %%
raw_trace_of = lambda p: float(flatness.raw_hessian_trace(*flatness.relu_quotient.two_layer_weights(p), task.x))
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
# (`lossgeom.curvature.closure_hessian`) at points across the orbit:

# %%
loss_of = lambda p: 0.5 * ((forward(p, task.x)[:, 0] - task.y) ** 2).mean()
orbit_scales = (0.1, 1.0, 10.0)
moved = {s: relu_neuron_rescaling("0", "2", [s] * 10)(params) for s in orbit_scales}
autograd_traces = [float(closure_hessian(loss_of, p).trace()) for p in moved.values()]
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
# \begin{aligned}
# \operatorname{Flat}^Q &= \operatorname{Flat}^Q_{\rm GN} - (d-1)\,\frac1n\sum_i r_i F(x_i),\\
# \operatorname{Flat}^Q_{\rm GN} &= \frac1n \sum_i \sum_r s_{ri}\Big((u_r^\top x_i)^2
# + \alpha_r^2\big(\lVert x_i\rVert^2 - (u_r^\top x_i)^2\big)\Big).
# \end{aligned}
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
a0, W0 = flatness.relu_quotient.two_layer_weights(params)
flat_closed = float(flatness.quotient_flatness(a0, W0, task.x, task.y))
flat_gap = abs(flatness.relu_quotient.quotient_flatness_autograd(a0, W0, task.x, task.y) / flat_closed - 1)
print(f"Flat^Q = {fmt(flat_closed)}; closed form vs autograd:", rounding_level(flat_gap, 1e-12))

# %% [markdown]
# The audit now applies twenty random per-neuron rescalings, each $c_r$ log-uniform in
# $[10^{-2}, 10^2]$, and recomputes both numbers:

# %%
generator = torch.Generator().manual_seed(0)
log_scales = [
    torch.empty(10).uniform_(-np.log(100), np.log(100), generator=generator) for _ in range(20)
]
random_rescalings = [relu_neuron_rescaling("0", "2", torch.exp(t)) for t in log_scales]
flat_of = lambda p: float(
    flatness.quotient_flatness(*flatness.relu_quotient.two_layer_weights(p), task.x, task.y)
)


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
#
# {glue:md}`con-ch11-orbit`
# ```
#
# Q1 and Q2 are identities. Q1 holds if the audit finds the outputs unchanged and the
# closed form {eq}`eq-ch11-raw-trace` agrees with dense autograd at every point of the
# orbit; Q2 holds if $\operatorname{Flat}^Q$ agrees with its autograd chart and keeps its
# value under the twenty rescalings; each to rounding (below $10^{-12}$).

# %% tags=["remove-cell"]
ROUNDING = 1e-12
identity_status = lambda *gaps: "holds" if max(gaps) < ROUNDING else "differs"
identity_note = lambda status: "" if status == "holds" else "the code departs from the derivation"
q1_status = identity_status(report.max_output_discrepancy, closed_vs_autograd)
q2_status = identity_status(output_gap, flat_gap, flat_change)
ledger.add("Q1", r"$(a_r, w_r) \mapsto (a_r/c_r,\, c_r w_r)$ preserves $F$; the raw Hessian trace "
           r"is $\sum_r (c_r^2 P_r + Q_r/c_r^2)$",
           f"trace {', '.join(fmt(t, 3) for t in closed_traces)} at $c$ = "
           f"{', '.join(fmt(c_) for c_ in orbit_scales)}; vs autograd: "
           f"{rounding_level(closed_vs_autograd, 1e-12)}",
           details={"formula": "derived (sympy, exact, every point off the kinks)",
                    "raw trace at c = 0.1, 1, 10": closed_traces,
                    "closed form vs dense autograd": str(rounding_level(closed_vs_autograd, 1e-12))},
           status=q1_status, note=identity_note(q1_status))
ledger.add("Q2", r"$\operatorname{Flat}^Q$ (Riemannian Hessian trace, product metric on "
           r"$(\mathbb{R} \times S^{d-1})^m$) is invariant: an identity, since it is a function of "
           r"$a_r \lVert w_r\rVert$ and $w_r/\lVert w_r\rVert$",
           rf"$\operatorname{{Flat}}^Q$ = {fmt(flat_closed, 3)}, change "
           f"{rounding_level(flat_change, 1e-12)}; raw trace x{fmt(min(raw_ratios), 3)} to "
           f"x{fmt(max(raw_ratios), 3)}",
           details={"Flat^Q": flat_closed,
                    "closed form vs autograd chart": str(rounding_level(flat_gap, 1e-12)),
                    "largest change, 20 rescalings": str(rounding_level(flat_change, 1e-12)),
                    "raw trace ratio range": [min(raw_ratios), max(raw_ratios)]}, sig=3,
           status=q2_status, note=identity_note(q2_status))

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
# $\mathbb{E}[A_I^2] v = \mu \bar A v$ (`lossgeom.flatness.critical_learning_rate`, through
# `scipy.linalg.eigh`). `lossgeom.flatness.stability` computes all of this from the quotient
# Jacobian (`quotient_jacobian`, `active_jacobian`, `batch_moments`, `stability_operator`,
# `stability_lambda_max`, and `stable_pair_grid` for a whole grid of pairs).
#
# **The experiment.** The source's set-up: a teacher of width $m_t = 4$ on $n = 25$ inputs
# uniform on $S^3$ ($d = 4$) labels the data, and a student of width $m = 10$ is trained
# "with SGD" to $\hat L < 10^{-7}$; then each pair $(\eta, B)$ of a grid is classified as
# stable or not. The source does not say how its teacher and student are initialised, nor
# the learning rate and batch size of its SGD. Our teacher has unit $w_r$ and
# $a_r \sim N(0, 1/m_t)$; our students start from PyTorch's default initialisation times a
# scale that we sweep over five values, with four seeds each:

# %%
ETAS = (0.01, 0.05, 0.10, 0.20, 0.30, 0.40, 0.50, 0.70, 1.00)
BATCH_SIZES = (1, 5, 15)
INIT_SCALES = (0.5, 1.0, 2.0, 4.0, 8.0)
start_a, start_W, q4_labels = relu_students.init_students(4, [10], range(4), INIT_SCALES)

# %% [markdown]
# Reaching the source's $10^{-7}$ is a matter of the optimiser. We train the twenty students
# twice on the full batch with `lossgeom_book.relu_students.fit_students`, which applies an update rule
# of `lossgeom.training` to closed-form gradients and freezes each student at the first
# check, every 100 steps, where its loss is below `Q4_TARGET`: once with Adam at learning
# rate 0.01 for at most `Q4_STEPS` steps, and once with gradient descent at learning rate
# 0.1, the source's rate for its other experiment, for `GD_STEPS`:

# %%
Q4_TARGET, Q4_STEPS, GD_STEPS = 1e-7, 15_000, 10_000
q4_rules = {"Adam": (adam(0.01), Q4_STEPS), "GD": (sgd(0.1), GD_STEPS)}
q4_runs = {
    name: relu_students.fit_students(
        start_a, start_W, task.x, task.y, rule, target_loss=Q4_TARGET, max_steps=steps
    )
    for name, (rule, steps) in q4_rules.items()
}

# %% [markdown]
# How many students pass each loss level (`first_check_below`), how many more steps
# gradient descent would need at the pace of its last 5,000 steps (`steps_at_recent_pace`),
# and how much slower that pace is than over the 5,000 steps before (`loss_pace`):

# %%
LEVELS = (1e-4, 1e-5, 1e-6, 1e-7)
first_below = {name: relu_students.first_check_below(run, LEVELS) for name, run in q4_runs.items()}
passed = {name: (index >= 0).sum(axis=0) for name, index in first_below.items()}
gd_needed = relu_students.steps_at_recent_pace(q4_runs["GD"], Q4_TARGET, window=5_000)
gd_slowdown = relu_students.loss_pace(
    q4_runs["GD"], 5_000, end_step=5_000
) / relu_students.loss_pace(q4_runs["GD"], 5_000)

# %%
for name, counts_passed in passed.items():
    print(
        f"{name:4s} students below "
        + ", ".join(f"{fmt(level)}: {int(k):2d}" for level, k in zip(LEVELS, counts_passed))
    )
print(
    f"GD, steps still needed to reach 1e-7 at its final pace: median "
    f"{fmt(np.median(gd_needed), 1)}, "
    f"largest {fmt(gd_needed.max(), 1)}; that pace is slower than the one before by a median "
    f"factor "
    f"{fmt(np.median(gd_slowdown), 2)}"
)

# %% [markdown]
# Adam brings almost every student to the source's target; gradient descent at learning rate
# 0.1 brings none there, because its loss falls slowly and ever more slowly:

# %%
assert passed["Adam"][-1] >= 0.9 * len(q4_labels) and passed["GD"][-1] == 0
assert np.median(gd_needed) > GD_STEPS and np.median(gd_slowdown) > 1

# %% [markdown]
# The headline count is therefore taken on the Adam students that reached $10^{-7}$, at the
# first check where they did (Adam's learning rate is one more setting the source leaves
# open; change it in `q4_rules`). For each of them we classify the 27 pairs three ways:
# batches with replacement (the headline count), without replacement, and with the loss
# normalised as torch's `MSELoss` (without the $\frac12$), which doubles every $A_I$ and so
# acts as doubling $\eta$:

# %%
reached = np.flatnonzero(first_below["Adam"][:, -1] >= 0)
q4_a, q4_W = (t[reached] for t in q4_runs["Adam"].final)  # frozen at the first check below 1e-7
stable = flatness.stability.stable_pair_grid(q4_a, q4_W, task.x, ETAS, BATCH_SIZES)
stable_without = flatness.stability.stable_pair_grid(q4_a, q4_W, task.x, ETAS, BATCH_SIZES, replacement=False)
stable_mse = flatness.stability.stable_pair_grid(q4_a, q4_W, task.x, 2 * np.array(ETAS), BATCH_SIZES)

# %% [markdown]
# Each student's $\operatorname{Flat}^Q$ (its loss is below $10^{-7}$) and its three counts.
# $\operatorname{Flat}^Q$ is shown to two digits: Adam's last steps along the nearly flat
# valley of interpolants amplify rounding, and another machine's kernels move the third digit
# of some students (the counts do not move):

# %%
counts, counts_without, counts_mse = (
    grid.sum(axis=(1, 2)) for grid in (stable, stable_without, stable_mse)
)
q4_flat = flatness.quotient_flatness(q4_a, q4_W, task.x, task.y, part="gauss_newton").numpy()
assert bool((regression_loss(q4_a, q4_W, task.x, task.y) < Q4_TARGET).all())

# %%
for k, i in enumerate(reached):
    scale, _, seed = q4_labels[i]
    print(
        f"scale {fmt(scale):3s} seed {seed}: Flat^Q {fmt(q4_flat[k], 2):4s} stable pairs "
        f"{counts[k]:2d} "
        f"(without replacement {counts_without[k]:2d}, MSE {counts_mse[k]:2d})"
    )

# %% [markdown]
# The theorem is checked on every pair of these students and of the gradient-descent
# students where they stopped: no stable pair violates the bound. Because
# {eq}`eq-ch11-bound` is proven, that count of zero is an identity, which can only fail
# through a bug; what the experiment measures is how many pairs are stable:

# %%
gd_a, gd_W = q4_runs["GD"].final
gd_stable = flatness.stability.stable_pair_grid(gd_a, gd_W, task.x, ETAS, BATCH_SIZES)
gd_flat = flatness.quotient_flatness(gd_a, gd_W, task.x, task.y, part="gauss_newton").numpy()
two_B_over_eta = 2 * np.array(BATCH_SIZES)[:, None] / np.array(ETAS)[None, :]

# %%
checked = [(stable, q4_flat), (gd_stable, gd_flat)]
violations = sum(
    int((grid & (flat[:, None, None] > two_B_over_eta)).sum()) for grid, flat in checked
)
loose_unstable = int((~stable & (q4_flat[:, None, None] <= two_B_over_eta)).sum())
assert violations == 0
print(
    f"{int(stable.sum() + gd_stable.sum())} stable pairs over {len(reached) + len(q4_labels)} "
    f"trained "
    f"students, {violations} violate the bound; {loose_unstable} unstable pairs satisfy it anyway"
)

# %% [markdown]
# The count depends on the initialisation scale and, at the largest scale, on the optimiser.
# Per scale, the median and range over the seeds, for Adam at $10^{-7}$ and for gradient
# descent where it stopped, beside the source's 11 for its single student:

# %%
scale_of = np.array([lab[0] for lab in q4_labels])
by_scale = {
    "Adam at 1e-7": (counts, scale_of[reached]),
    f"GD after {GD_STEPS} steps": (gd_stable.sum(axis=(1, 2)), scale_of),
}
count_ranges = {
    name: {s: values[at == s] for s in INIT_SCALES} for name, (values, at) in by_scale.items()
}

# %%
gd_loss = regression_loss(gd_a, gd_W, task.x, task.y)
for s in INIT_SCALES:
    print(
        f"init scale {fmt(s)}: "
        + "; ".join(
            f"{name} median {fmt(float(np.median(v[s])))}, range {v[s].min()}-{v[s].max()}"
            for name, v in count_ranges.items()
        )
        + f" (GD loss {fmt(float(gd_loss[scale_of == s].min()), 1)} to "
          f"{fmt(float(gd_loss[scale_of == s].max()), 1)})"
    )

# %% [markdown]
# Across the Adam students the count falls as $\operatorname{Flat}^Q$ grows (Spearman's rank
# correlation, `scipy.stats.spearmanr`):

# %%
rank_correlation = float(spearmanr(q4_flat, counts).statistic)
assert rank_correlation < -0.5
print(f"rank correlation between Flat^Q and the number of stable pairs: {fmt(rank_correlation, 2)}")

# %% [markdown]
# How the count moves with training length, for every student: for Adam at the first
# checks below $10^{-4}, \dots, 10^{-7}$, for gradient descent after 2,500, 5,000 and
# 10,000 steps (`stable_counts`; a dash where a student never got there):

# %%
GD_CHECKS = (2_500, 5_000, 10_000)
gd_index = np.tile(np.searchsorted(q4_runs["GD"].steps, GD_CHECKS), (len(q4_labels), 1))
along = {
    "Adam": relu_students.stable_counts(
        q4_runs["Adam"], task.x, ETAS, BATCH_SIZES, first_below["Adam"]
    ),
    "GD": relu_students.stable_counts(q4_runs["GD"], task.x, ETAS, BATCH_SIZES, gd_index),
}

# %%
show = lambda row: " ".join("  -" if np.isnan(v) else f"{int(v):3d}" for v in row)
print("                 Adam at 1e-4 1e-5 1e-6 1e-7 | GD after 2.5k 5k 10k steps")
for i, (scale, _, seed) in enumerate(q4_labels):
    print(
        f"scale {fmt(scale):3s} seed {seed}:       {show(along['Adam'][i])} |         "
        f"{show(along['GD'][i])}"
    )

# %%
change = {name: np.nanmax(v, axis=1) - np.nanmin(v, axis=1) for name, v in along.items()}
largest_change = {
    name: {fmt(s): int(c[scale_of == s].max()) for s in INIT_SCALES} for name, c in change.items()
}
for name, by in largest_change.items():
    print(f"{name}: largest change of a student's count along its run, by init scale: {by}")
assert max(max(by.values()) for by in largest_change.values()) <= 2
assert bool((gd_loss[scale_of == 8.0] > 1e-4).all())  # GD at scale 8 has not reached 1e-4

# %% tags=["hide-cell"]
default_counts = count_ranges["Adam at 1e-7"][1.0]
large_adam, large_gd = (
    count_ranges["Adam at 1e-7"][8.0],
    count_ranges[f"GD after {GD_STEPS} steps"][8.0],
)
for name, value in {
    "reached": len(reached),
    "students": len(q4_labels),
    "gd-1e-6": int(passed["GD"][2]),
    "gd-1e-7": int(passed["GD"][3]),
    "gd-needed": f"{round_sig(float(np.median(gd_needed)), 1):,g}",
    "gd-slowdown": float(np.median(gd_slowdown)),
    "stable-total": int(stable.sum()),
    "loose": loose_unstable,
    "default-min": int(default_counts.min()),
    "default-max": int(default_counts.max()),
    "large-adam-min": int(large_adam.min()),
    "large-adam-max": int(large_adam.max()),
    "large-gd-min": int(large_gd.min()),
    "large-gd-max": int(large_gd.max()),
    "adam-change": max(largest_change["Adam"].values()),
    "gd-change": max(largest_change["GD"].values()),
    "gd-large-loss": float(gd_loss[scale_of == 8.0].min()),
    "rank-correlation": rank_correlation,
}.items():
    glue_value(f"ch11-q4-{name}", value, sig=2)

# %% [markdown]
# {glue:text}`ch11-q4-reached` of {glue:text}`ch11-q4-students` students reach the source's
# $10^{-7}$ with Adam within `Q4_STEPS`; with gradient descent at learning rate 0.1,
# {glue:text}`ch11-q4-gd-1e-6` get below $10^{-6}$ and {glue:text}`ch11-q4-gd-1e-7` below
# $10^{-7}$ in `GD_STEPS`. At the pace of its last 5,000 steps the median student would
# need about {glue:text}`ch11-q4-gd-needed` more steps, and that is an underestimate: the
# pace is already {glue:text}`ch11-q4-gd-slowdown` times slower (median) than over the
# 5,000 steps before. All {glue:text}`ch11-q4-stable-total` stable pairs of the Adam students satisfy
# the bound, and {glue:text}`ch11-q4-loose` unstable pairs satisfy it too: the bound is a
# consequence of stability, not a test for it. At PyTorch's default scale the students
# have {glue:text}`ch11-q4-default-min` to {glue:text}`ch11-q4-default-max` stable pairs out
# of 27, far more than the source's 11. Only at scale 8 do counts of 11 or fewer appear,
# and there the optimiser matters: {glue:text}`ch11-q4-large-adam-min` to
# {glue:text}`ch11-q4-large-adam-max` after Adam, {glue:text}`ch11-q4-large-gd-min` to
# {glue:text}`ch11-q4-large-gd-max` after gradient descent, whose scale-8 students have not
# even reached $10^{-4}$. The count follows $\operatorname{Flat}^Q$ (rank correlation
# {glue:text}`ch11-q4-rank-correlation`), and $\operatorname{Flat}^Q$ follows the
# initialisation and the optimiser's path. Along the runs the counts hardly move: by at
# most {glue:text}`ch11-q4-adam-change` for an Adam student between $10^{-4}$ and
# $10^{-7}$, and by at most {glue:text}`ch11-q4-gd-change` for a gradient-descent student
# between 2,500 and 10,000 steps. For gradient descent at scale 8 that is not a count at the
# target, though: those students are still at a loss of {glue:text}`ch11-q4-gd-large-loss` or
# more, and the interpolants Adam finds from the same starting points have fewer stable
# pairs. Set `GD_STEPS` higher to follow them further (every 10,000 steps add a few seconds).
# The source's 11 is one point of this dependence, from a setting the source does not
# report. {numref}`fig-ch11-stability` draws the source's figure for one student at
# the default scale, the count against the initialisation scale, and the count along the
# runs:

# %% tags=["hide-input"]
fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(12.0, 3.6), layout="constrained")
shown = list(reached).index(q4_labels.index((1.0, 10, 0)))
pair_x, pair_y = two_B_over_eta.ravel(), np.full(two_B_over_eta.size, q4_flat[shown])
is_stable = stable[shown].ravel()
ax1.scatter(
    pair_x[is_stable],
    pair_y[is_stable],
    marker="o",
    facecolors="none",
    edgecolors="C0",
    label="stable",
)
ax1.scatter(pair_x[~is_stable], pair_y[~is_stable], marker="x", color="C3", label="unstable")
ax1.loglog([1, 4000], [1, 4000], "k--", lw=0.8, label="y = x")
ax1.set_xlabel(r"$2B/\eta$"), ax1.set_ylabel(r"Flat$^Q$"), ax1.legend(fontsize=8)
for (name, values), marker, shift in zip(count_ranges.items(), ("o", "x"), (0.94, 1.06)):
    for s, v in values.items():
        ax2.plot(
            [s * shift] * len(v),
            v,
            marker,
            color="C0" if marker == "o" else "C3",
            alpha=0.6,
            label=name if s == INIT_SCALES[0] else None,
        )
ax2.axhline(11, color="grey", ls=":", label="source's count (one student)")
ax2.set_xscale("log"), ax2.set_xlabel("student initialisation scale (x PyTorch default)")
ax2.set_ylabel("stable pairs of 27"), ax2.legend(fontsize=7)
gd_losses = q4_runs["GD"].history["loss"][:, gd_index[0]]
adam_index = first_below["Adam"]
adam_losses = np.where(
    adam_index >= 0, np.take_along_axis(q4_runs["Adam"].history["loss"], adam_index, 1), np.nan
)
for i, s in enumerate(scale_of):
    colour = f"C{INIT_SCALES.index(s)}"
    ax3.plot(adam_losses[i], along["Adam"][i], "o-", color=colour, ms=3, lw=0.8)
    ax3.plot(gd_losses[i], along["GD"][i], "x--", color=colour, ms=4, lw=0.8)
ax3.set_xscale("log"), ax3.invert_xaxis(), ax3.set_xlabel("training loss (Adam: o, GD: x)")
ax3.set_ylabel("stable pairs of 27")
stability_contract = MeasurementContract(
    centre=f"width-10 students (init scales {', '.join(fmt(s) for s in INIT_SCALES)} x PyTorch "
           f"default, "
    f"seeds 0-3), full batch; left: Adam (lr 0.01) at the first check below {fmt(Q4_TARGET)}; "
    f"middle: the same, and GD (lr 0.1) after {GD_STEPS} steps; right: Adam at its first checks "
    f"below 1e-4, 1e-5, 1e-6, 1e-7 and GD after {', '.join(str(s) for s in GD_CHECKS)} steps",
    directions="the active subspace of the quotient Jacobian (singular values > 1e-6 sigma_1)",
    normalisation="quotient metric: Euclidean in alpha, round sphere in u",
    radius="n/a (linearised dynamics)",
    loss="square loss (1/2n) sum (F - y)^2; A_I Gauss-Newton from quotient gradients",
    reduction="batches of B drawn with replacement",
    data=task.description,
    model_mode="n/a (no layers with state)",
    resolution="eta in 9 values x B in {1, 5, 15}",
    precision="float64",
)
glue_figure(
    "ch11-stability",
    fig,
    stability_contract,
    "Left: the source's figure for one student (init scale 1, seed 0): Flat^Q against "
    "2B/eta, stable pairs as circles, unstable as crosses. Middle: stable pairs against "
    "the initialisation scale, four seeds each, after Adam and after GD. Right: stable "
    "pairs along each run against its training loss, coloured by initialisation scale",
)

# %% [markdown]
# ```{glue:figure} fig-ch11-stability
# :name: fig-ch11-stability
#
# {glue:text}`cap-ch11-stability`
#
# {glue:md}`con-ch11-stability`
# ```
#
# The ledger row keeps the theorem and the count apart. Part (i), the bound, is an
# identity: it holds if no stable pair violates it. Part (ii) is measured: the source's
# count of 11 stable pairs is met at an initialisation scale when it lies within the range
# of that scale's Adam students at $10^{-7}$. Q4 holds at our scale if (i) holds and the
# count is met at every scale; it differs if the count is missed but the counts over the
# scales run from below 11 to above it, so that the scale moves the count through the
# source's value; otherwise it is not reproduced. The count is met at
# {glue:text}`ch11-q4-scales-met` of the {glue:text}`ch11-q4-n-scales` scales, and the counts
# run from {glue:text}`ch11-q4-count-low` to {glue:text}`ch11-q4-count-high`.

# %% tags=["remove-cell"]
SOURCE_COUNT = 11  # the source's stable pairs (one student, reported)
adam_ranges = {s: (int(v.min()), int(v.max())) for s, v in count_ranges["Adam at 1e-7"].items()}
scales_met = sum(low <= SOURCE_COUNT <= high for low, high in adam_ranges.values())
count_low, count_high = int(counts.min()), int(counts.max())
if violations > 0:
    q4_status = "differs"
elif scales_met == len(adam_ranges):
    q4_status = "holds at our scale"
elif count_low <= SOURCE_COUNT <= count_high:
    q4_status = "differs"
else:
    q4_status = "not reproduced"
for name, value in {"scales-met": scales_met, "n-scales": len(adam_ranges),
                    "count-low": count_low, "count-high": count_high}.items():
    glue_value(f"ch11-q4-{name}", value)

median_by_scale = {
    name: {fmt(s): float(np.median(v)) for s, v in values.items()}
    for name, values in count_ranges.items()
}
q4_computed = {
    "(i) stable pairs violating the bound (an identity)": f"{violations} of "
                                                          f"{int(stable.sum() + gd_stable.sum())}",
    "(ii) students reaching 1e-7": {
        name: f"{int(k[-1])} of {len(q4_labels)}" for name, k in passed.items()
    },
    "(ii) stable pairs at the default scale (Adam, 1e-7)": [
        int(default_counts.min()),
        int(default_counts.max()),
    ],
    "(ii) median stable pairs by init scale": median_by_scale,
    "(ii) range of stable pairs by init scale": {
        name: {fmt(s): [int(v.min()), int(v.max())] for s, v in values.items()}
        for name, values in count_ranges.items()
    },
    "(ii) largest change along the runs by init scale (Adam 1e-4 to 1e-7; GD 2500 to 10000 steps)":
        largest_change,
}
ledger.add(
    "Q4",
    r"(i) $\lambda_{\max}(\mathbb{E}[M_I^2]) \le 1$ implies $\operatorname{Flat}^Q \le 2B/\eta$ "
    r"(a theorem); (ii) the number of stable pairs of 27 ($9\ \eta \times 3\ B$) of a width-10 "
    r"teacher-student fitted to loss $< 10^{-7}$",
    f"(i) {violations} of {int(stable.sum() + gd_stable.sum())} stable pairs violate it; (ii) "
    f"{int(default_counts.min())}-{int(default_counts.max())} stable at the default scale, "
    f"{int(large_adam.min())}-{int(large_adam.max())} at scale 8 (Adam)",
    reported=r"all 11 stable pairs satisfy the bound (one student, SGD to $< 10^{-7}$)",
    status=q4_status,
    details=q4_computed,
    note="(i) holds as an identity: the bound is proven. (ii) differs: the count is set by the "
    "initialisation scale and, at scale 8, by the optimiser, neither of which the source states; "
    "counts of 11 or fewer appear only at scale 8",
)

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
# 200,000 steps; ours stop at `FIT_STEPS`). We run exactly that grid of 32 students at the
# default initialisation, and add width 40 at scales 0.25 and 4 for the last section:

# %%
WIDTHS = (6, 8, 10, 12, 15, 20, 28, 40)
grid_a, grid_W, grid_labels = relu_students.init_students(4, WIDTHS, range(4), (1.0,))
extra_a, extra_W, extra_labels = relu_students.init_students(4, [40], range(4), (0.25, 4.0))
labels = grid_labels + extra_labels

# %% [markdown]
# All 40 train in one batch by gradient descent (`fit_students` with `sgd(0.1)`), recorded
# every 50 steps:

# %%
FIT_STEPS = 20_000
fits = relu_students.fit_students(
    torch.cat([grid_a, extra_a]),
    torch.cat([grid_W, extra_W]),
    task.x,
    task.y,
    sgd(0.1),
    target_loss=5e-5,
    max_steps=FIT_STEPS,
    check_every=50,
)
final_a, final_W = fits.final
converged = fits.converged & (torch.arange(len(labels)) < len(grid_labels))
print(
    f"{int(converged.sum())} of {len(grid_labels)} grid students reach loss 5e-5 "
    f"within {FIT_STEPS} steps"
)

# %% [markdown]
# The source reports 28 of its 32 runs converging within 200,000 steps. For every
# converged student we compute the measured smoothness, the right-hand side of
# {eq}`eq-ch11-smoothness`, and its constants (`lossgeom.flatness.input_smoothness`,
# `smoothness_constants`):

# %%
smoothness = flatness.input_smoothness(final_a, final_W, task.x)[converged]
constants = flatness.relu_quotient.smoothness_constants(final_a, final_W, task.x)
flat_gn = flatness.quotient_flatness(final_a, final_W, task.x, task.y, part="gauss_newton")
smooth_bound = (constants.factor * flat_gn)[converged]

# %%
assert bool((smoothness <= smooth_bound).all())
slack = smooth_bound / smoothness
kappa, amplitude = constants.kappa[converged], constants.amplitude[converged]
spread = lambda t: [float(f(np.asarray(t, dtype=np.float64))) for f in (np.min, np.max, np.median)]
describe = lambda t: "[{}, {}], median {}".format(*(fmt(v, 3) for v in spread(t)))

# %%
print(f"bound holds for {int((smoothness <= smooth_bound).sum())} of {int(converged.sum())}; "
      f"bound / smoothness in {describe(slack)}")
print(f"kappa_* in {describe(kappa)}; A_* in {describe(amplitude)}; "
      f"rho = {fmt(float(constants.rho[0]))}")

# %% [markdown]
# The source reports $\kappa_* \in [3.6, 14.5]$ with median 6.0 and
# $A_* \in [0.26, 0.79]$ with median 0.56. Ours beside them, with the relative gap of each
# (ours over the source's, minus one):

# %%
source_constants = {"kappa_*": (3.6, 14.5, 6.0), "A_*": (0.26, 0.79, 0.56)}
ours = {"kappa_*": spread(kappa), "A_*": spread(amplitude)}
gaps = {k: [o / r - 1 for o, r in zip(ours[k], source_constants[k])] for k in ours}
for k in ours:
    print(
        f"{k}: min, max, median ours {', '.join(fmt(v, 3) for v in ours[k])}; "
        f"source {', '.join(fmt(v) for v in source_constants[k])}; gaps "
        f"{', '.join(fmt(g, 2) for g in gaps[k])}"
    )

# %% tags=["hide-cell"]
narrowest = min(WIDTHS)
kappa_widths = np.array([lab[1] for lab, ok in zip(labels, converged) if ok])
assert kappa_widths[int(kappa.argmin())] == narrowest and kappa_widths[int(kappa.argmax())] == max(
    WIDTHS
)
for name, value in {
    "median-gap": max(abs(gaps[k][2]) for k in gaps),
    "kappa-low": ours["kappa_*"][0],
    "kappa-low-gap": gaps["kappa_*"][0],
    "A-high": ours["A_*"][1],
    "A-high-gap": gaps["A_*"][1],
}.items():
    glue_value(f"ch11-q3-{name}", value, sig=3 if "gap" not in name else 2)

# %% [markdown]
# The medians are within a relative {glue:text}`ch11-q3-median-gap` of the source's; the ends are not
# as close: our smallest $\kappa_*$ is {glue:text}`ch11-q3-kappa-low` (a relative gap of
# {glue:text}`ch11-q3-kappa-low-gap`), from a width-6 student, and our largest $A_*$
# {glue:text}`ch11-q3-A-high` ({glue:text}`ch11-q3-A-high-gap`). $\kappa_*$ grows with the
# width, since $m$ unit rows in $\mathbb{R}^4$ have $\lVert U\rVert_{\rm op}^2 \ge m/4$, so
# the smallest value belongs to the narrowest student and the largest to the widest. The
# bound holds with a margin: $\kappa_*$ and $\max(1, A_*^2)$ are worst cases over neurons and
# directions. The inequality is proven, so that it holds is an identity, not the finding; its
# slack is.
#
# The claim is stated for $\operatorname{Flat}^Q$, while the inequality derived and checked
# above is for its Gauss-Newton part $\operatorname{Flat}^Q_{\rm GN}$; the two agree at an
# interpolant. At our trained points the residual term is small but not zero:

# %%
flat_full = flatness.quotient_flatness(final_a, final_W, task.x, task.y)[converged]
residual_gap = float(((flat_full - flat_gn[converged]).abs() / flat_gn[converged]).max())
holds_with_full = int((smoothness <= constants.factor[converged] * flat_full).sum())
print(
    f"largest |Flat^Q - Flat^Q_GN| / Flat^Q_GN: {fmt(residual_gap, 1)}; the bound with Flat^Q "
    f"itself "
    f"holds for {holds_with_full} of {int(converged.sum())}"
)

# %% [markdown]
# So the check of the claim as stated, with $\operatorname{Flat}^Q$, passes too, by the same
# margins.
#
# ## From smoothness to generalisation
#
# The source's last step bounds the population error under a covering assumption. Its
# equation (14) is not in the source notes we have, so we derive a bound from the same
# ingredients ourselves. The test law $P_X$ is uniform on $\bigcup_i B(x_i, \varepsilon)$,
# $\varepsilon = 0.15$. Its density is at most $\nu$ times that of the equal mixture of the
# balls, with $\nu = n\operatorname{vol}(B)/\operatorname{vol}(\bigcup_i B_i) \ge 1$
# (`lossgeom_book.relu_generalisation.sample_ball_union` draws from $P_X$ exactly and estimates $\nu$). On
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
test = relu_generalisation.sample_ball_union(task.x, 0.15, 20_000, seed=1)
gen_error, gen_se = relu_generalisation.generalisation_error(final_a, final_W, task, test.x)
gen_bound = relu_generalisation.generalisation_bound(final_a, final_W, task, 0.15, nu=test.nu)

# %% [markdown]
# The bound is proven, so that every student lies below it is an identity: with the slack
# measured below, only a gross bug could break it. The step of the derivation that is nearly
# tight can be checked sharply instead: on every test draw in ball $i$, $D$ departs from its
# tangent plane at $x_i$ by at most $K_i$, and by nothing (up to rounding) where no kink
# crosses the ball (`tangent_departure`, over every pair of a draw and a ball holding it):

# %%
departure = relu_generalisation.tangent_departure(
    final_a[converged], final_W[converged], task, test.x, 0.15
)
assert bool((departure.ratio_max <= 1 + 1e-9).all()) and bool(
    (departure.untouched_max <= 1e-12).all()
)
assert bool((gen_error + 3 * gen_se <= gen_bound.total)[converged].all())  # the bound: an identity
print(
    f"{departure.pairs} pairs; largest |remainder| / K_i per student in "
    f"{describe(departure.ratio_max)}; "
    f"where no kink crosses: {rounding_level(float(departure.untouched_max.max()), 1e-12)}"
)

# %% [markdown]
# The largest ratios come close to 1: the worst case $K_i$ is nearly attained, so the check
# leaves little room for an error in $K_i$, and none for one in the tangent plane, where the
# remainder must vanish.
#
# How far apart the two are, how much of the bound the flatness term makes, and the bound
# $M$ on $\lvert F\rvert$ and $\lvert f_*\rvert$ over the test draws:

# %%
ratio = (gen_bound.total / gen_error)[converged]
flat_share = (gen_bound.flatness / gen_bound.total)[converged]
outputs = torch.cat(
    [
        relu_network(final_a[converged], final_W[converged], test.x).flatten(),
        relu_network(task.teacher_a, task.teacher_W, test.x),
    ]
)
M_constant = float(outputs.abs().max())

# %%
print(f"nu = {fmt(test.nu, 3)}; E_gen in {describe(gen_error[converged])}")
print(f"bound / E_gen in {describe(ratio)}")
print(f"flatness term's share of the bound in {describe(flat_share)}")
print(f"M = {fmt(M_constant, 2)}")

# %% tags=["hide-cell"]
for name, value in {"ratio-min": float(ratio.min()), "ratio-max": float(ratio.max()),
                    "share-median": float(np.median(flat_share)), "M": M_constant,
                    "slack-min": float(slack.min()), "slack-max": float(slack.max())}.items():
    glue_value(f"ch11-gen-{name}", f"{round_sig(value, 2):,g}")  # 2 digits, no trailing .0

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
#
# {glue:md}`con-ch11-smoothness`
# ```
#
# Q3 is an identity: the inequality is proven for $\operatorname{Flat}^Q_{\rm GN}$, and it
# holds if every converged student satisfies it, with $\operatorname{Flat}^Q_{\rm GN}$ and
# with $\operatorname{Flat}^Q$ itself, the claim's quantity. The source's constants
# $\kappa_*$, $A_*$ and $M$ and its count of converged runs describe its students, not the
# inequality: they do not enter the status, and the note compares them.

# %% tags=["remove-cell"]
q3_holds = int((smoothness <= smooth_bound).sum()) == holds_with_full == len(slack)
q3_status = "holds" if q3_holds else "differs"
q3_computed = {
    "students satisfying it with Flat^Q_GN (an identity: proven)":
        f"{int((smoothness <= smooth_bound).sum())} "
    f"of {len(slack)}",
    "students satisfying it with Flat^Q": f"{holds_with_full} of {len(slack)}",
    "largest |Flat^Q - Flat^Q_GN| / Flat^Q_GN": residual_gap,
    "converged students": f"{int(converged.sum())} of {len(grid_labels)}",
    "bound / smoothness (min, max, median)": spread(slack),
    "kappa_* (min, max, median)": spread(kappa),
    "A_* (min, max, median)": spread(amplitude),
    "M": M_constant,
    "generalisation bound / E_gen (min, max, median; the bound holding is an identity)": spread(
        ratio
    ),
    "kink lemma: largest |remainder| / K_i per student (min, max, median)": spread(
        departure.ratio_max
    ),
}
ledger.add(
    "Q3",
    r"The input smoothness $\frac1n \sum_i \lVert\nabla_x F(x_i)\rVert^2$ is at most "
    r"$\kappa_* \max(1, A_*^2)\, \rho^{-2} \operatorname{Flat}^Q$ (derived for $\operatorname{Flat}^Q_{\rm GN}$, its Gauss-Newton "
    r"part, which equals $\operatorname{Flat}^Q$ at interpolation; checked with both)",
    f"holds for {holds_with_full} of {len(slack)} students; bound / smoothness "
    f"{fmt(float(slack.min()), 3)} to {fmt(float(slack.max()), 3)}",
    reported=r"holds for all models in Fig. 3c; 28 of 32 converge; $\kappa_* \in [3.6, 14.5]$, "
    r"median 6.0; $A_* \in [0.26, 0.79]$; $M$ about 0.49",
    status=q3_status,
    details=q3_computed,
    note=r"the inequality is proven, so that it holds is an identity; the measurement is its "
    r"slack. Our medians of $\kappa_*$ and $A_*$ are near the source's, the ends are not; $M$ "
    "differs because the teacher's scale is not stated",
    sig=3,
)

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
# Ending higher is not the same as rising while the loss falls. `lossgeom_book.relu_students.fitting_profile`
# reads one run's records up to the point where it stopped, and measures the share of
# intervals in which the loss fell and the measure rose, where in the run the measure peaked
# (as a fraction of the run's length), what share of the loss decrease (and of its decades)
# was made before that peak, and how far the measure fell after it (relative to the peak).
# We read it for $\operatorname{Flat}^Q$ and for its Gauss-Newton part:

# %%
profile = lambda i, key: relu_students.fitting_profile(
    fits.history["loss"][i], fits.history[key][i]
)
profiles = {
    key: {s: [profile(i, key) for i in rows] for s, rows in trajectory.items()}
    for key in ("flatness", "gauss_newton")
}
median_of = lambda key, s, field: float(np.median([getattr(p, field) for p in profiles[key][s]]))

# %%
FIELDS = (
    "co_moving",
    "peak_position",
    "loss_share_before_peak",
    "decades_before_peak",
    "fall_after_peak",
)
for key in profiles:
    print(f"{key}: medians over seeds of " + ", ".join(FIELDS))
    for s in trajectory:
        print(f"  scale {fmt(s):4s}: " + ", ".join(fmt(median_of(key, s, f), 2) for f in FIELDS))

# %% [markdown]
# At PyTorch's default scale the source's picture holds: $\operatorname{Flat}^Q$ climbs for
# most of the fit and peaks near its end. At the other two scales it does not. From scale
# 0.25 it rises early and then eases down over the later decades of the loss. From scale 4
# it jumps within the first recorded interval and then declines while the loss keeps
# falling. The jump is the residual term, strongly negative at
# the start (the outputs are large and wrong) and gone at interpolation; the Gauss-Newton
# part, the curvature that remains at an interpolant, is largest at the very start and ends
# lower. What does hold at every scale is weaker: $\operatorname{Flat}^Q$ peaks only after
# most of the loss decrease has been made (the loss falls fastest early), and it ends above
# where it started. The checks behind these sentences, over every run:

# %%
runs = lambda key, s, field: np.array([getattr(p, field) for p in profiles[key][s]])
assert (
    median_of("flatness", 1.0, "peak_position") > 0.9
    and median_of("flatness", 1.0, "co_moving") > 0.5
)
assert all(median_of("flatness", s, "co_moving") < 0.5 for s in (0.25, 4.0))
assert median_of("flatness", 0.25, "peak_position") < 0.5
assert median_of("flatness", 4.0, "peak_position") <= 0.05
assert (runs("gauss_newton", 4.0, "peak_position") == 0).all()
assert (runs("gauss_newton", 4.0, "fall_after_peak") > 0).all()
assert all((runs("flatness", s, "loss_share_before_peak") > 0.9).all() for s in trajectory)
assert all(
    start_end("flatness", rows)[1] > start_end("flatness", rows)[0] for rows in trajectory.values()
)
assert all(p.loss_monotone for by_scale in profiles["flatness"].values() for p in by_scale)

# %% tags=["hide-cell"]
share_low = min(runs("flatness", s, "loss_share_before_peak").min() for s in trajectory)
decades = {s: runs("flatness", s, "decades_before_peak") for s in trajectory}
for name, value in {
    "share-low": share_low,
    "fall-025": median_of("flatness", 0.25, "fall_after_peak"),
    "fall-4": median_of("flatness", 4.0, "fall_after_peak"),
    "gn-fall-4": median_of("gauss_newton", 4.0, "fall_after_peak"),
    "decades-low": min(decades[0.25].min(), decades[4.0].min()),
    "decades-high": max(decades[0.25].max(), decades[4.0].max()),
}.items():
    glue_value(f"ch11-q6-{name}", value, sig=2)

# %% [markdown]
# In every run $\operatorname{Flat}^Q$ peaks only after at least {glue:text}`ch11-q6-share-low`
# of the loss decrease has been made. But at scales 0.25 and 4 that is only
# {glue:text}`ch11-q6-decades-low` to {glue:text}`ch11-q6-decades-high` of the decades the
# loss falls through, and over the rest $\operatorname{Flat}^Q$ falls, by a median
# {glue:text}`ch11-q6-fall-025` (scale 0.25) and {glue:text}`ch11-q6-fall-4` (scale 4) of
# its peak value; at scale 4 the Gauss-Newton part ends a median
# {glue:text}`ch11-q6-gn-fall-4` below its start. So whether "the loss falls while $\operatorname{Flat}^Q$ rises" describes
# the fit depends on the initialisation, which the source does not state.
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
fitting_contract = MeasurementContract(
    centre="width-40 students, seed 0, at init scales 0.25, 1 and 4 (x PyTorch default), along "
           "full-batch GD (lr 0.1) from initialisation until the loss is <= 5e-5",
    directions="n/a (a trace: the sum over an orthonormal basis of the quotient tangent space)",
    normalisation="quotient metric: Euclidean in alpha_r, round sphere in u_r",
    radius="n/a (second derivatives at the point, not a neighbourhood)",
    loss="square loss (1/2n) sum (F(x_i) - y_i)^2", reduction="mean over the 25 training points",
    data=task.description, model_mode="n/a (no layers with state)",
    resolution="every 50 steps", precision="float64")
glue_figure("ch11-fitting", fig, fitting_contract,
            "Training loss and Flat^Q during fitting, from three initialisation scales")

# %% [markdown]
# ```{glue:figure} fig-ch11-fitting
# :name: fig-ch11-fitting
#
# {glue:text}`cap-ch11-fitting`
#
# {glue:md}`con-ch11-fitting`
# ```
#
# $\operatorname{Flat}^Q$ rises while the loss falls at a scale when the loss falls at every
# recorded interval and, in the median run over the seeds, $\operatorname{Flat}^Q$ rises in
# more than half of those intervals and peaks in the last tenth of the run. Q6 holds at our
# scale if that is so at every scale, differs if it is so at some scales and not at others
# (the scale moves it), and is not reproduced if at none. Of the scales 0.25, 1 and 4, it
# is so at: {glue:text}`ch11-q6-rising`.

# %% tags=["remove-cell"]
loss_falls = all(p.loss_monotone for by_scale in profiles["flatness"].values() for p in by_scale)
rising = [s for s in trajectory if loss_falls and median_of("flatness", s, "co_moving") > 0.5
          and median_of("flatness", s, "peak_position") > 0.9]
q6_status = ("holds at our scale" if len(rising) == len(trajectory)
             else "differs" if rising else "not reproduced")
glue_value("ch11-q6-rising", ", ".join(fmt(s) for s in rising) or "none")
q6_computed = {
    f"scale {fmt(s)}: " + name: [median_of(key, s, f) for f in fields]
    for s in trajectory
    for name, key, fields in (
        (
            "Flat^Q share co-moving, peak position, loss share and decades before peak, fall after",
            "flatness",
            FIELDS,
        ),
        (
            "Gauss-Newton part peak position, fall after",
            "gauss_newton",
            ("peak_position", "fall_after_peak"),
        ),
    )
}
peaks = [fmt(median_of("flatness", s, "peak_position"), 2) for s in trajectory]
ledger.add(
    "Q6",
    r"During fitting the training loss falls while $\operatorname{Flat}^Q$ rises",
    rf"median peak of $\operatorname{{Flat}}^Q$ at {', '.join(peaks)} of the run from init "
    f"scales {', '.join(fmt(s) for s in trajectory)}",
    reported=r"Fig. 3a: loss falls monotonically, $\operatorname{Flat}^Q$ rises (one width-40 run)",
    status=q6_status,
    details=q6_computed,
    note="depends on the initialisation scale, which the source does not state: at PyTorch's "
    r"default $\operatorname{Flat}^Q$ rises through the fit and peaks at its end; from scales "
    "0.25 and 4 it peaks early and falls over the later decades of the loss",
    sig=2,
)

# %% [markdown]
# ## Raw and quotient slices of a digits classifier
#
# The source's first figure compares a raw loss slice of a width-128 two-layer ReLU
# classifier on MNIST with a slice in quotient coordinates. We use sklearn's 8 x 8 digits
# (`lossgeom_book.data.digits`: 1,000 training and 500 test images) and the same architecture
# with ten outputs, $F(x) = \sum_r a_r\operatorname{ReLU}(w_r^\top x)$ with
# $a_r \in \mathbb{R}^{10}$, trained on cross-entropy by heavy-ball SGD:

# %%
digits = data.digits(n_train=1000, n_test=500, seed=0)
classifier = two_layer_relu(64, 128, 10, seed=0)
start = {name: p.detach() for name, p in classifier.named_parameters()}
digits_loss = indexed_loss(
    classifier, torch.nn.CrossEntropyLoss(), (digits.x_train, digits.y_train)
)
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
# (`lossgeom_book.relu_students.slice_directions`). In raw coordinates they are filter-normalised
# {cite}`li2018visualizing`: each neuron's incoming weights and each output unit's weights
# get the norm of the corresponding trained weights. In quotient coordinates the plane lies
# in $(\alpha, u)$: each $\alpha_r$ part gets the norm of $\alpha_r$, each $u_r$ part is
# tangent to the sphere with unit norm, and $u_r$ is renormalised at every point
# (`slice_cross_entropy`). The grid is `lossgeom.landscape.plane_grid`:

# %%
SLICE_RADIUS, SLICE_RESOLUTION = 1.0, 21
x_slice, y_slice = digits.x_train[:500], digits.y_train[:500]
networks = {"trained": flatness.relu_quotient.two_layer_weights(fitted),
            "rescaled": flatness.relu_quotient.two_layer_weights(rescaling(fitted))}


# %%
def slice_losses(a_net, W_net, coordinates):
    centre, d1, d2 = relu_students.slice_directions(a_net, W_net, seed=0, coordinates=coordinates)
    grid_s, grid_t, points = plane_grid(centre, d1, d2, SLICE_RADIUS, SLICE_RESOLUTION)
    return (
        grid_s,
        grid_t,
        relu_students.slice_cross_entropy(points, x_slice, y_slice, 128, 10, coordinates),
    )


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
    centre="left: width-128 two-layer ReLU classifier (init seed 0) after 300 full-batch steps of "
           "heavy-ball SGD (lr 0.5, momentum 0.9); right: the same function after the per-neuron "
           "rescaling (a_r, w_r) -> (a_r / c_r, c_r w_r), c_r log-uniform in [1/5, 5] (seed 1)",
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
#
# {glue:md}`con-ch11-raw-slices`
# ```
#
# ```{glue:figure} fig-ch11-quotient-slices
# :name: fig-ch11-quotient-slices
#
# {glue:text}`cap-ch11-quotient-slices`
#
# {glue:md}`con-ch11-quotient-slices`
# ```
#
# Q5 holds at our scale if, for a rescaling that keeps the classifier's function (the
# audit above would have stopped the chapter otherwise), the two raw slices of that one
# function differ somewhere by more than one contour step of the figures
# ({glue:text}`ch11-q5-step`) and the two quotient slices agree to rounding (below
# $10^{-12}$, an identity). The source states no level to compare; our scale is 8 x 8 digits
# in place of MNIST. The raw slices differ by up to {glue:text}`ch11-q5-raw-gap`.

# %% tags=["remove-cell"]
contour_step = float(levels[1] - levels[0])
q5_holds = slice_gap["raw"] > contour_step and slice_gap["quotient"] < ROUNDING
q5_status = "holds at our scale" if q5_holds else "not reproduced"
glue_value("ch11-q5-step", contour_step, 2)
glue_value("ch11-q5-raw-gap", slice_gap["raw"], 3)
ledger.add("Q5", "Raw vs quotient 2-D slices of a width-128 two-layer ReLU classifier on "
           "real digit images",
           f"raw mean loss {fmt(raw_means[0], 3)} vs {fmt(raw_means[1], 3)} rescaled; quotient "
           f"slices differ {rounding_level(slice_gap['quotient'], 1e-12)}",
           details={"test accuracy": test_accuracy,
                    "raw slice mean loss, trained vs rescaled": raw_means,
                    "raw largest pointwise difference": slice_gap["raw"],
                    "quotient largest pointwise difference":
                        str(rounding_level(slice_gap["quotient"], 1e-12))},
           reported="seed 002 Fig. 1 (MNIST, width 128)", status=q5_status,
           note=r"sklearn $8 \times 8$ digits instead of MNIST; the quotient slices' agreement is "
                "an identity",
           sig=3)

# %% [markdown]
# ## What this establishes
#
# ```{admonition} What you now know, and what does not follow
# :class: important
# **You now know**
#
# - On the quotient of a two-layer ReLU network by its rescalings, flatness is a number about
#   the function's parametrisation-free coordinates: the raw Hessian trace runs over the
#   whole orbit as $\sum_r(c_r^2P_r + Q_r/c_r^2)$, while $\operatorname{Flat}^Q$ stays put.
# - The source's chain holds link by link, because each link is an inequality we could
#   derive: mean-square stability bounds $\operatorname{Flat}^Q$ by $2B/\eta$, and
#   $\operatorname{Flat}^Q$ bounds input smoothness and, with kink and teacher terms, the
#   generalisation error. That they hold on every trained student is therefore an identity.
# - What the experiments add is the size of the gaps: the smoothness bound exceeds the
#   measured smoothness by a factor of {glue:text}`ch11-gen-slack-min` to
#   {glue:text}`ch11-gen-slack-max`, the generalisation bound the measured error by
#   {glue:text}`ch11-gen-ratio-min` to {glue:text}`ch11-gen-ratio-max`.
#
# **What does not follow**
#
# - The source's headline count of 11 stable learning-rate/batch pairs as a property of the
#   task: the count is set by the student's initialisation scale and, at large scales, by the
#   optimiser, neither of which the source states; whether $\operatorname{Flat}^Q$ rises
#   while the loss falls depends on the initialisation too.
# - Anything about larger runs. Ours are small: 25 training points, the stability students
#   trained by Adam to $10^{-7}$ ({glue:text}`ch11-q4-reached` of
#   {glue:text}`ch11-q4-students`), the smoothness students by gradient descent to
#   $5\cdot 10^{-5}$, and 8 x 8 digits in place of MNIST.
# - That $\operatorname{Flat}^Q$ survives symmetries other than these rescalings: the atlas
#   row {ref}`Flat^Q <atlas-flat-q>` audits it under every transformation the registry
#   finds, beside the raw {ref}`trace <atlas-trace>`.
# ```
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
edge_lambda = flatness.stability_lambda_max(g_single, edge_eta, 1)
edge_flat_ratio = float(flatness.stability.batch_moments(g_single, 1)[0].trace()) / (2 / edge_eta)
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
# The cell below checks it on the Adam students of the stability experiment.
# ```

# %% tags=["hide-cell"]
assert bool((stable_without >= stable).all()) and bool((stable_without[:, 0] == stable[:, 0]).all())
print(f"stable pairs, Adam students at 1e-7: {int(stable.sum())} with replacement, "
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

# %% [markdown]
# The remaining claim of the Q series, Q7 (Fisher-Riemannian sharpness), is established in
# {numref}`Chapter %s <ch-high-dimensions>`.
